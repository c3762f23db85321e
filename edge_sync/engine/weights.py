"""Weights shared between the sessions of a model's versions (docs/reference/daemon.md, hot swap).

A fine-tune changes some tensors and leaves the rest as they were.  ONNX Runtime lets a
session take its initializers from the caller (``SessionOptions.add_initializer``) and
keeps no copy of them when nothing rewrites them (graph optimizations off, prepacking
off).  So a model is loaded here as two parts:

* the **skeleton**: the ONNX file with each large tensor cut out and marked as external
  data (``registry.tensors``: the cut CI signs digests over, made by walking the
  protobuf wire format, never parsing it with ``onnx``, which would copy every weight
  into the heap first).  ONNX Runtime only checks that the external file it names
  exists (:func:`stub_folder` keeps an empty one): every cut tensor is given to it;
* the **weights**: each cut tensor as an array over a read-only memory map (its own
  pages: nothing is copied, untouched pages cost nothing).  A version installed with a
  signed tensor manifest names each tensor by digest (:class:`TensorRef`): a digest any
  loaded engine already maps, of this model or another, is not mapped again (the new
  session gets the same value).  A version without one is split here, and a tensor whose
  bytes equal the serving version's tensor of the same name, type and shape is shared:
  the comparison reads the new bytes with ``pread`` a block at a time, so a tensor that
  turns out shared never enters this process's resident set twice.

:class:`Weights` holds the values an engine's session uses; while any session holds a
value, its memory stays mapped.
"""

from __future__ import annotations

import math
import mmap
import os
import tempfile
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from edge_sync.errors import WeightError
from registry.onnx_wire import WireFormatError, external_initializers
from registry.schema import file_name_problem
from registry.tensors import DTYPES, MIN_TENSOR_BYTES, STORE_LOCATION, Piece, TensorCutError
from registry.tensors import split as cut

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "MAP_AT_LEAST",
    "Graph",
    "Held",
    "TensorRef",
    "TensorSpan",
    "Weights",
    "external_tensors",
    "split_model",
    "stub_folder",
]

MAP_AT_LEAST: Final = MIN_TENSOR_BYTES
"""Tensors at least this large are memory-mapped; smaller ones stay in the graph (a
mapping costs a page-table entry and a file handle-sized kernel object; a few KB copied
is cheaper)."""
_COMPARE_BLOCK: Final = 1 << 20

TensorSpan = Piece
"""Where one tensor's bytes lie in a file: name, dtype, dims, offset, length."""


@dataclass(frozen=True, slots=True)
class TensorRef:
    """One tensor a version's engine maps, named by its signed digest: where its
    verified bytes lie (``length`` bytes of ``path`` from ``offset``) and the blob that
    holds them (kept while an engine maps it)."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    sha256: str
    path: Path
    offset: int
    length: int
    blob: str


@dataclass(frozen=True, slots=True)
class Graph:
    """A model split in two: the skeleton (bytes ONNX Runtime loads) and where each cut
    tensor's bytes lie in the file."""

    graph: bytes
    tensors: tuple[TensorSpan, ...]


def split_model(buf: Any) -> Graph:
    """Split the serialized model ``buf`` (bytes or a memory map) with
    ``registry.tensors.split``.

    Raises:
        WeightError: not a protobuf message this can walk.
    """
    try:
        found = cut(buf)
    except TensorCutError as e:
        raise WeightError(str(e)) from None
    return Graph(found.skeleton, found.pieces)


_stub_lock = threading.Lock()
_stub: Path | None = None


def stub_folder() -> Path:
    """A folder of this process holding the empty file every skeleton names
    (``registry.tensors.STORE_LOCATION``): ONNX Runtime checks it exists, and reads
    nothing from it."""
    global _stub  # noqa: PLW0603 - one per process, made on first use
    with _stub_lock:
        if _stub is None or not (_stub / STORE_LOCATION).is_file():
            folder = Path(tempfile.mkdtemp(prefix="modelreg-weights-"))
            (folder / STORE_LOCATION).touch(mode=0o400)
            _stub = folder
        return _stub


def external_tensors(graph: Any) -> dict[str, tuple[TensorSpan, ...]]:
    """The graph's initializers stored as ONNX external data, by data file name.

    Raises:
        WeightError: the graph does not parse, a location is not a plain file name
            (the signed graph passed CI's check; this one would not), or a tensor has no
            numpy dtype.
    """
    try:
        spans = external_initializers(graph)
    except WireFormatError as e:
        raise WeightError(str(e)) from None
    found: dict[str, list[TensorSpan]] = {}
    for span in spans:
        t = span.tensor
        problem = file_name_problem(span.location)
        if problem is not None:
            raise WeightError(f"external data location {span.location!r} {problem}")
        dtype = DTYPES.get(t.data_type)
        if dtype is None:
            raise WeightError(f"external tensor {t.name!r} has type {t.data_type}")
        name = t.name.decode("utf-8", "replace")
        found.setdefault(span.location, []).append(
            TensorSpan(name, dtype, t.dims, t.offset, t.length)
        )
    return {file: tuple(tensors) for file, tensors in found.items()}


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Held:
    """One tensor's value: the array (over a memory map), the OrtValue over it, and the
    blob whose pages it maps (kept on disk while any engine maps it)."""

    array: npt.NDArray[Any]
    value: Any
    blob: str
    source: tuple[Path, tuple[int, int, int, int]] | None = None
    """The file it maps and that file's (device, inode, modification and change
    times) when it was mapped (values shared by digest only)."""

    def intact(self) -> bool:
        """Whether the file it maps is still the one mapped, unwritten since: a value
        whose file was replaced (the store removed it as altered) or written to is
        never shared again."""
        if self.source is None:
            return True
        path, stamp = self.source
        try:
            return _stamp(path.stat()) == stamp
        except OSError:
            return False


@dataclass
class Weights:
    """The initializer values of one session, by name, and how many bytes of them this
    session brought (``own_bytes``: those not shared with the version it replaced)."""

    values: dict[str, Held] = field(default_factory=dict)
    own_bytes: int = 0
    shared_bytes: int = 0

    def blobs(self) -> set[str]:
        """The blobs these values map (the engine's own and those it shares)."""
        return {held.blob for held in self.values.values()}

    def merge(self, other: Weights) -> None:
        """Add the values of another file of the same model (an external data file)."""
        self.values.update(other.values)
        self.own_bytes += other.own_bytes
        self.shared_bytes += other.shared_bytes

    @classmethod
    def load(
        cls, path: Path, tensors: tuple[TensorSpan, ...], base: Weights | None, blob: str = ""
    ) -> Weights:
        """The values of ``tensors`` in ``path`` (the blob ``blob``); each equal to
        ``base``'s tensor of the same name, dtype and shape is taken from ``base``.

        Raises:
            OSError: the file cannot be read or mapped.
            WeightError: a tensor's span does not fit its file, dtype and shape.
        """
        import numpy as np
        import onnxruntime as ort

        weights = cls()
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            size = os.fstat(fd).st_size
            view: mmap.mmap | None = None
            for t in tensors:
                dtype = np.dtype(t.dtype)
                count = math.prod(t.dims)
                if t.offset + t.length > size or count * dtype.itemsize != t.length:
                    raise WeightError(f"initializer {t.name!r}: its bytes do not fit {t.dims}")
                old = base.values.get(t.name) if base is not None else None
                if old is not None and _same(fd, t, old.array):
                    weights.values[t.name] = old
                    weights.shared_bytes += t.length
                    continue
                if view is None:  # one mapping (and one file handle) for the whole file
                    view = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
                array = np.frombuffer(view, dtype=dtype, count=count, offset=t.offset)
                array = array.reshape(t.dims)
                weights.values[t.name] = Held(array, ort.OrtValue.ortvalue_from_numpy(array), blob)
                weights.own_bytes += t.length
        finally:
            os.close(fd)
        return weights

    @classmethod
    def mapped(cls, refs: Sequence[TensorRef]) -> Weights:
        """The values of ``refs``: each digest a loaded engine maps already is taken
        from it (whatever model or version), the others mapped from their files (one
        mapping per file).

        Raises:
            OSError: a file cannot be read or mapped.
            WeightError: a tensor's span does not fit its file, dtype and shape.
        """
        import numpy as np
        import onnxruntime as ort

        weights = cls()
        views: dict[Path, tuple[mmap.mmap, tuple[int, int, int, int]]] = {}
        for ref in refs:
            dtype = np.dtype(ref.dtype)
            held = _BY_DIGEST.get(ref.sha256)
            if held is not None and not held.intact():
                _BY_DIGEST.pop(ref.sha256, None)  # its pages may no longer be the signed bytes
                held = None
            if held is not None and held.array.dtype == dtype and held.array.shape == ref.dims:
                weights.values[ref.name] = held
                weights.shared_bytes += ref.length
                continue
            count = math.prod(ref.dims)
            if count * dtype.itemsize != ref.length:
                raise WeightError(f"tensor {ref.name!r}: {ref.length} bytes do not fit {ref.dims}")
            found = views.get(ref.path)
            if found is None:
                found = views[ref.path] = _map(ref.path)
            view, stamp = found
            if ref.offset + ref.length > len(view):
                raise WeightError(f"tensor {ref.name!r}: its bytes lie past the end of its file")
            array = np.frombuffer(view, dtype=dtype, count=count, offset=ref.offset)
            array = array.reshape(ref.dims)
            value = ort.OrtValue.ortvalue_from_numpy(array)
            held = Held(array, value, ref.blob, (ref.path, stamp))
            _BY_DIGEST[ref.sha256] = held
            weights.values[ref.name] = held
            weights.own_bytes += ref.length
        return weights


_BY_DIGEST: weakref.WeakValueDictionary[str, Held] = weakref.WeakValueDictionary()
"""Every tensor a live engine maps, by its signed digest (an entry goes with the last
engine that holds it)."""


def _map(path: Path) -> tuple[mmap.mmap, tuple[int, int, int, int]]:
    """A read-only map of the whole file (its handle closed: the map keeps the pages),
    and the file's identity when mapped (see :meth:`Held.intact`)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        return mmap.mmap(fd, 0, prot=mmap.PROT_READ), _stamp(os.fstat(fd))
    finally:
        os.close(fd)


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def _same(fd: int, t: TensorSpan, old: npt.NDArray[Any]) -> bool:
    """Whether the file's bytes of ``t`` equal ``old``'s (same dtype and shape first)."""
    import numpy as np

    if old.dtype != np.dtype(t.dtype) or old.shape != t.dims or old.nbytes != t.length:
        return False
    flat = old.reshape(-1).view(np.uint8)
    block = bytearray(min(_COMPARE_BLOCK, t.length))
    view = memoryview(block)
    pos = 0
    while pos < t.length:
        n = os.preadv(fd, [view[: min(len(block), t.length - pos)]], t.offset + pos)
        if n <= 0:
            return False
        if not np.array_equal(flat[pos : pos + n], np.frombuffer(block, np.uint8, n)):
            return False
        pos += n
    return True
