"""Weights shared between the sessions of a model's versions (docs/reference/daemon.md, hot swap).

A fine-tune changes some tensors and leaves the rest as they were.  ONNX Runtime lets a
session take its initializers from the caller (``SessionOptions.add_initializer``) and
keeps no copy of them when nothing rewrites them (graph optimizations off, prepacking
off).  So a model is loaded here as two parts:

* the **graph**: the ONNX file with each top-level initializer's ``raw_data`` replaced by
  a reference to where those bytes lie in the file (external data: ``location``,
  ``offset``, ``length``).  The graph of a 100 MB model is a few KB, made in well under a
  millisecond by walking the protobuf wire format (``registry.onnx_wire``, which the
  delta codec walks with too): parsing it with ``onnx`` would copy
  every weight into the heap first (100 MB more resident for a moment, which is what the
  swap must not cost);
* the **weights**: the large tensors as arrays over one read-only memory map of the
  verified blob (its own pages: nothing is copied, untouched pages cost nothing, and
  one file handle per engine), small ones left in the graph.  A tensor whose bytes
  equal the serving version's tensor of the same name, type and shape is not mapped
  again: the new session gets the old session's value.
  The comparison reads the new bytes with ``pread`` a block at a time, so a tensor
  that turns out shared never enters this process's resident set twice.

:class:`Weights` holds the values an engine's session uses; while any session holds a
value, its memory stays mapped.
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from edge_sync.errors import WeightError
from registry.onnx_wire import (
    WireFormatError,
    encode_varint,
    external_initializers,
    fields,
    varint,
)
from registry.schema import file_name_problem

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "ONNX_DTYPES",
    "Graph",
    "Held",
    "TensorSpan",
    "Weights",
    "external_tensors",
    "split_model",
]

MAP_AT_LEAST: Final = 64 << 10
"""Tensors at least this large are memory-mapped; smaller ones are read (a mapping
costs a page-table entry and a file handle-sized kernel object; a few KB copied is
cheaper)."""
_COMPARE_BLOCK: Final = 1 << 20
ONNX_DTYPES: Final = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64",
}  # fmt: skip
"""``TensorProto.DataType`` codes that map onto a numpy dtype (others stay in the graph)."""

# Field numbers of onnx.proto3 this module reads.
_MODEL_GRAPH, _GRAPH_NODE, _GRAPH_INITIALIZER = 7, 1, 5
_N_OUTPUT, _N_OP_TYPE, _N_ATTRIBUTE, _N_DOMAIN = 2, 4, 5, 7
_A_NAME, _A_TENSOR = 1, 5
_T_DIMS, _T_TYPE, _T_NAME, _T_RAW, _T_EXTERNAL, _T_LOCATION = 1, 2, 8, 9, 13, 14
_T_TYPED = frozenset({4, 5, 6, 7, 10, 11})  # float_data ... uint64_data: left as they are
_SIGN = 1 << 63
_LEN, _VARINT = 2, 0


@dataclass(frozen=True, slots=True)
class TensorSpan:
    """Where one initializer's bytes lie in the model file."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Graph:
    """A model split in two: the graph (bytes ONNX Runtime loads) and its weights."""

    graph: bytes
    tensors: tuple[TensorSpan, ...]


def _varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    try:
        return varint(buf, pos, end)
    except WireFormatError as e:
        raise WeightError(str(e)) from None


_encode = encode_varint


def _fields(buf: Any, start: int, end: int) -> list[tuple[int, int, int, tuple[int, int], int]]:
    """(field, wire type, first byte of the key, payload span, end) for each field
    (``registry.onnx_wire.fields``, the project's one wire walker)."""
    try:
        found = fields(buf, start, end)
    except WireFormatError as e:
        raise WeightError(str(e)) from None
    return [(f.number, f.wire, f.key_at, (f.start, f.end), f.end) for f in found]


def _entry(key: bytes, value: bytes) -> bytes:
    """A ``StringStringEntryProto`` as a length-delimited field 13 of a TensorProto."""
    body = b"\x0a" + _encode(len(key)) + key + b"\x12" + _encode(len(value)) + value
    return _key(_T_EXTERNAL, _LEN) + _encode(len(body)) + body


def _key(number: int, wire: int) -> bytes:
    return _encode(number << 3 | wire)


def _dims(buf: Any, wire: int, key_at: int, span: tuple[int, int], end: int) -> list[int]:
    """The dimensions one ``dims`` field holds (packed or one varint)."""
    if wire == _VARINT:
        return [_varint(buf, key_at + 1, end)[0]]
    found, (pos, stop) = [], span
    while pos < stop:
        value, pos = _varint(buf, pos, stop)
        found.append(value)
    return found


def _tensor(
    buf: Any, span: tuple[int, int], location: bytes, rename: bytes | None = None
) -> tuple[bytes, TensorSpan | None]:
    """A TensorProto with its raw data replaced by a reference into the file, when it
    has at least :data:`MAP_AT_LEAST` bytes of raw data of a plain type (``rename``:
    the name it gets)."""
    dims: list[int] = []
    dtype, name, raw = 0, "", None
    out = bytearray()
    if rename is not None:
        out += _key(_T_NAME, _LEN) + _encode(len(rename)) + rename
        name = rename.decode("utf-8", "replace")
    for number, wire, key_at, (a, b), end in _fields(buf, *span):
        if number == _T_NAME and rename is not None:
            continue
        if number == _T_RAW and wire == _LEN:
            raw = (a, b)
            continue
        if number in (_T_EXTERNAL, _T_LOCATION) or number in _T_TYPED:
            # external already, or typed data (not raw bytes): left as it is
            return bytes(buf[span[0] : span[1]]), None
        if number == _T_DIMS:
            dims += _dims(buf, wire, key_at, (a, b), end)
        elif number == _T_TYPE and wire == _VARINT:
            dtype = _varint(buf, key_at + 1, end)[0]
        elif number == _T_NAME and wire == _LEN:
            name = bytes(buf[a:b]).decode("utf-8", "replace")
        out += buf[key_at:end]
    if any(d >= _SIGN for d in dims):  # int64 dims: a negative one is no shape to map
        raw = None
    if raw is None or dtype not in ONNX_DTYPES or not name or raw[1] - raw[0] < MAP_AT_LEAST:
        # small: left in the graph (shape inference reads small constants, and a few
        # KB per session are not worth a mapping)
        if rename is not None and raw is not None:
            out += _key(_T_RAW, _LEN) + _encode(raw[1] - raw[0]) + buf[raw[0] : raw[1]]
            return bytes(out), None
        return bytes(buf[span[0] : span[1]]), None
    offset, length = raw[0], raw[1] - raw[0]
    out += _entry(b"location", location)
    out += _entry(b"offset", str(offset).encode())
    out += _entry(b"length", str(length).encode())
    out += _key(_T_LOCATION, _VARINT) + _encode(1)  # EXTERNAL
    return bytes(out), TensorSpan(name, ONNX_DTYPES[dtype], tuple(dims), offset, length)


def _constant(buf: Any, span: tuple[int, int]) -> tuple[bytes, tuple[int, int]] | None:
    """(output name, span of the tensor) of a ``Constant`` node of the default domain
    whose one attribute is ``value``; None for any other node."""
    op, outputs, attributes, domain = b"", [], [], b""
    for number, wire, _key_at, (a, b), _end in _fields(buf, *span):
        if wire != _LEN:
            continue
        if number == _N_OP_TYPE:
            op = bytes(buf[a:b])
        elif number == _N_OUTPUT:
            outputs.append(bytes(buf[a:b]))
        elif number == _N_ATTRIBUTE:
            attributes.append((a, b))
        elif number == _N_DOMAIN:
            domain = bytes(buf[a:b])
    if op != b"Constant" or domain not in (b"", b"ai.onnx") or len(outputs) != 1:
        return None
    if len(attributes) != 1:
        return None
    name, tensors = b"", []
    for number, wire, _key_at, (a, b), _end in _fields(buf, *attributes[0]):
        if number == _A_NAME and wire == _LEN:
            name = bytes(buf[a:b])
        elif number == _A_TENSOR and wire == _LEN:
            tensors.append((a, b))
    # a tensor field twice is merged by protobuf (dims joined): left to ONNX Runtime
    if name != b"value" or len(tensors) != 1:
        return None
    tensor = tensors[0]
    return outputs[0], tensor


def split_model(buf: Any, location: str) -> Graph:
    """Split the serialized model ``buf`` (bytes or a memory map) into its graph and the
    spans of its top-level initializers' raw data; the graph refers to the bytes as
    external data in ``location`` (the file's name).

    Raises:
        WeightError: not a protobuf message this can walk.
    """
    where = location.encode()
    out = bytearray()
    tensors: list[TensorSpan] = []
    found_graph = False
    for number, wire, key_at, span, end in _fields(buf, 0, len(buf)):
        if number != _MODEL_GRAPH or wire != _LEN:
            out += buf[key_at:end]
            continue
        found_graph = True
        graph = bytearray()
        for g_number, g_wire, g_key_at, g_span, g_end in _fields(buf, *span):
            constant = _constant(buf, g_span) if g_number == _GRAPH_NODE else None
            if constant is None and (g_number != _GRAPH_INITIALIZER or g_wire != _LEN):
                graph += buf[g_key_at:g_end]
                continue
            if constant is not None:  # ONNX Runtime makes it an initializer anyway
                output, value = constant
                body, tensor = _tensor(buf, value, where, rename=output)
                if tensor is None:
                    graph += buf[g_key_at:g_end]
                    continue
            else:
                body, tensor = _tensor(buf, g_span, where)
            graph += _key(_GRAPH_INITIALIZER, _LEN) + _encode(len(body)) + body
            if tensor is not None:
                tensors.append(tensor)
        out += _key(_MODEL_GRAPH, _LEN) + _encode(len(graph)) + graph
    if not found_graph:
        raise WeightError("no graph in the model")
    return Graph(bytes(out), tuple(tensors))


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
        dtype = ONNX_DTYPES.get(t.data_type)
        if dtype is None:
            raise WeightError(f"external tensor {t.name!r} has type {t.data_type}")
        name = t.name.decode("utf-8", "replace")
        found.setdefault(span.location, []).append(
            TensorSpan(name, dtype, t.dims, t.offset, t.length)
        )
    return {file: tuple(tensors) for file, tensors in found.items()}


@dataclass(frozen=True, slots=True)
class Held:
    """One tensor's value: the array (over a memory map), the OrtValue over it, and the
    blob whose pages it maps (kept on disk while any engine maps it)."""

    array: npt.NDArray[Any]
    value: Any
    blob: str


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
