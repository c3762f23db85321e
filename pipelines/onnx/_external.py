"""ONNX external data: which files beside an ``.onnx`` hold its weights, and whether the
graph's references to them are safe to follow.

A model over 2 GB cannot be one protobuf message, so ONNX stores its large initializers in
other files (``external_data``: ``location``, ``offset``, ``length``).  The graph is
untrusted input (a pull request to CI), and a ``location`` is a path that the ONNX checker,
shape inference and ONNX Runtime all follow: a pull request once had the build read the
checkout's ``.git/config`` into a weight (``location: ../../.git/config``) and print it back
through the goldens.  So a reference is accepted only when

* it sits on a top-level graph initializer (what ``onnx.save(...,
  save_as_external_data=True)`` writes); tensors in node attributes, sparse initializers,
  subgraphs and functions must be inline;
* its ``location`` is a plain file name in the model's own folder
  (:func:`registry.schema.file_name_problem`: no ``/``, ``\\``, ``..``, leading dot, NUL
  or control character, not the model itself, not a ``.dvc`` pointer);
* the file is a regular file, not a link (opened with ``O_NOFOLLOW``, checked with
  ``fstat``);
* its keys are ONNX's (``location``, ``offset``, ``length``, ``checksum``), each once,
  with decimal offsets and lengths; the tensor has a fixed-width dtype, its ``length`` is
  exactly its shape's byte size and ``offset + length`` lies within the file;
* no two tensors' byte ranges overlap (one byte cannot be two weights), and the counts of
  files and tensors stay under :class:`ExternalDataLimits`.

Nothing here reads tensor bytes: only ``fstat`` of each named file.
"""

from __future__ import annotations

import itertools
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipelines.errors import ArtifactError
from registry.errors import quote
from registry.schema import file_name_problem

if TYPE_CHECKING:
    import onnx

__all__ = [
    "ExternalData",
    "ExternalDataLimits",
    "ExternalTensor",
    "external_data",
]

# Bytes per element of TensorProto.DataType values stored as raw bytes (strings have no
# fixed width; 4-bit types pack two to a byte and are left out rather than special-cased).
_ITEMSIZE: Final = {
    1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8,
    14: 8, 15: 16, 16: 2, 17: 1, 18: 1, 19: 1, 20: 1,
}  # fmt: skip
_KEYS: Final = frozenset({"location", "offset", "length", "checksum"})
_NOFOLLOW: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True, slots=True)
class ExternalDataLimits:
    """Caps on what a graph may ask for.

    Attributes:
        max_files: distinct external data files of one model.
        max_tensors: tensors stored in them.
    """

    max_files: int = 64
    max_tensors: int = 1 << 20


@dataclass(frozen=True, slots=True)
class ExternalTensor:
    """One initializer whose bytes lie in an external data file.

    Attributes:
        name: the initializer's name.
        data_type: its ``TensorProto.DataType``.
        dims: its shape.
        location: the data file's name (beside the model).
        offset: where its bytes start in that file.
        length: how many bytes (its shape's byte size).
    """

    name: str
    data_type: int
    dims: tuple[int, ...]
    location: str
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class ExternalData:
    """The external data of one model: its files (sorted) and tensors (graph order).

    Attributes:
        files: the distinct ``location`` names, sorted; empty for a self-contained model.
        tensors: every external tensor.
        sizes: each file's size in bytes (empty when no folder was checked).
    """

    files: tuple[str, ...] = ()
    tensors: tuple[ExternalTensor, ...] = ()
    sizes: tuple[int, ...] = ()


def _top_initializers(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    yield from model.graph.initializer


def _nested_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor except the top-level initializers (which may be external)."""
    from onnx import AttributeProto

    def tensors(graph: Any, *, top: bool) -> Iterator[Any]:
        if not top:
            yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        for node in graph.node:
            yield from node_tensors(node)

    def node_tensors(node: Any) -> Iterator[Any]:
        for attr in node.attribute:
            if attr.type == AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == AttributeProto.TENSORS:
                yield from attr.tensors
            elif attr.type == AttributeProto.SPARSE_TENSOR:
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices
            elif attr.type == AttributeProto.GRAPH:
                yield from tensors(attr.g, top=False)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from tensors(sub, top=False)

    yield from tensors(model.graph, top=True)
    for function in model.functions:
        for node in function.node:
            yield from node_tensors(node)


def _where(tensor: Any) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


def _entry(tensor: Any, display: str, model_name: str | None) -> ExternalTensor:
    """The checked external data entry of one initializer (pure).

    Raises:
        ArtifactError: a key is unknown or repeated, a number is not decimal, the location
            is not a plain file name, the dtype has no fixed width, or the length is not
            the shape's byte size.
    """
    shown = f"tensor {quote(tensor.name)}"
    values: dict[str, str] = {}
    for entry in tensor.external_data:
        if entry.key not in _KEYS:
            raise ArtifactError(display, f"{shown}: unknown external data key {quote(entry.key)}")
        if entry.key in values:
            raise ArtifactError(display, f"{shown}: external data key {quote(entry.key)} repeated")
        values[entry.key] = entry.value
    location = values.get("location", "")
    refused = file_name_problem(location, model_name)
    if refused is not None:
        raise ArtifactError(display, f"{shown}: external data location {quote(location)} {refused}")
    numbers: dict[str, int] = {}
    for key in ("offset", "length"):
        text = values.get(key)
        if text is None:
            continue
        if not text.isascii() or not text.isdigit() or len(text) > 19:
            raise ArtifactError(
                display, f"{shown}: external data {key} {quote(text)} is not a size"
            )
        numbers[key] = int(text)
    itemsize = _ITEMSIZE.get(tensor.data_type)
    if itemsize is None:
        raise ArtifactError(
            display, f"{shown}: element type {tensor.data_type} cannot be stored as external data"
        )
    dims = tuple(int(d) for d in tensor.dims)
    if any(d < 0 for d in dims):
        raise ArtifactError(display, f"{shown}: negative dimension in {list(dims)}")
    size = math.prod(dims) * itemsize
    length = numbers.get("length", size)
    if length != size:
        raise ArtifactError(
            display, f"{shown}: external data length {length} is not its shape's {size} bytes"
        )
    return ExternalTensor(
        tensor.name, tensor.data_type, dims, location, numbers.get("offset", 0), length
    )


def _file_size(folder: Path, name: str, display: str) -> int:
    """The size of regular file ``folder/name``, opened without following a link.

    Raises:
        ArtifactError: missing, a link, or not a regular file.
    """
    try:
        fd = os.open(folder / name, _NOFOLLOW)
    except FileNotFoundError:
        raise ArtifactError(display, f"external data file {quote(name)} is missing") from None
    except OSError as e:
        if (folder / name).is_symlink():
            raise ArtifactError(
                display,
                f"external data file {quote(name)} is a symbolic link; links are never followed",
            ) from None
        raise ArtifactError(
            display, f"external data file {quote(name)} cannot be opened ({e.strerror})"
        ) from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ArtifactError(display, f"external data file {quote(name)} is not a regular file")
    return info.st_size


def external_data(
    model: onnx.ModelProto,
    display: str,
    folder: Path | None,
    *,
    model_name: str | None = None,
    limits: ExternalDataLimits = ExternalDataLimits(),  # frozen: one shared default is safe
) -> ExternalData:
    """Check and list the external data of a loaded ``onnx.ModelProto``.

    Args:
        model: the model, loaded without its external data.
        display: its name in messages.
        folder: the folder of the ``.onnx`` file, where each data file must be a regular
            file; None when the model came as bytes, which have no folder (then any
            external tensor is refused).
        model_name: the ``.onnx`` file's name (a location may not name it).
        limits: caps on files and tensors.

    Returns:
        The files and tensors; empty for a self-contained model.

    Raises:
        ArtifactError: a reference is refused (see the module docstring), one line.
    """
    from onnx import TensorProto

    for tensor in _nested_tensors(model):
        if tensor.data_location == TensorProto.EXTERNAL:
            raise ArtifactError(
                display,
                f"tensor {quote(tensor.name)} is stored in another file "
                f"({quote(_where(tensor))}) but is not a graph initializer; only the graph's "
                "initializers may be external data",
            )
    entries: list[ExternalTensor] = []
    for tensor in _top_initializers(model):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        if folder is None:
            raise ArtifactError(
                display,
                f"tensor {quote(tensor.name)} is stored in another file "
                f"({quote(_where(tensor))}); a model given as bytes has no folder to find it in",
            )
        entries.append(_entry(tensor, display, model_name))
        if len(entries) > limits.max_tensors:
            raise ArtifactError(display, f"more than {limits.max_tensors} external tensors")
    if not entries or folder is None:  # no folder: refused in the loop above
        return ExternalData()
    files = tuple(sorted({e.location for e in entries}))
    if len(files) > limits.max_files:
        raise ArtifactError(
            display, f"{len(files)} external data files; at most {limits.max_files} are allowed"
        )
    sizes = tuple(_file_size(folder, name, display) for name in files)
    by_file = dict(zip(files, sizes, strict=True))
    _check_spans(entries, by_file, display)
    return ExternalData(files, tuple(entries), sizes)


def _check_spans(entries: list[ExternalTensor], sizes: dict[str, int], display: str) -> None:
    """Every span within its file, no two overlapping (pure).

    Raises:
        ArtifactError: a span runs past its file's end, or two spans share a byte.
    """
    for e in entries:
        if e.offset + e.length > sizes[e.location]:
            raise ArtifactError(
                display,
                f"tensor {quote(e.name)}: bytes {e.offset}..{e.offset + e.length} lie beyond "
                f"the end of {quote(e.location)} ({sizes[e.location]} bytes)",
            )
    ordered = sorted((e for e in entries if e.length), key=lambda e: (e.location, e.offset))
    for prev, cur in itertools.pairwise(ordered):
        if prev.location == cur.location and cur.offset < prev.offset + prev.length:
            raise ArtifactError(
                display,
                f"tensors {quote(prev.name)} and {quote(cur.name)} overlap in "
                f"{quote(cur.location)}; each byte of external data belongs to one tensor",
            )
