"""A model as its graph and its weights by digest (docs/reference/tensors.md): the one
place that cuts an ONNX file into the two and puts them back together, byte for byte.

CI signs, for each released version, the SHA-256 of every large weight tensor and of
the *skeleton*: the model file with each such tensor's ``raw_data`` taken out and the
tensor marked as ONNX external data at :data:`STORE_LOCATION` (``length`` only).  A
device then holds weights by digest, fetches only the tensors it lacks, and builds an
engine from the skeleton and its tensors; the whole file is never rebuilt to run it.

The cut is **reversible**: :func:`join` puts every tensor's bytes back where they were,
and CI publishes a tensor manifest only when the join gives the file's exact bytes
(``pipelines.publish``).  So the signed whole-file digest and the signed per-tensor
digests describe the same bytes, and a device can write the verified whole file from
its tensors (``modelreg edge export``).

A tensor is cut out only when all of these hold, else it stays in the skeleton (part
of the graph, never guessed): it is an initializer or a ``Constant`` node's value, of
the main graph or of a subgraph a node holds (``If``, ``Loop``, ``Scan``; other
attribute tensors, sparse tensors and function bodies stay); no other such tensor of
the model has its name (a device gives ONNX Runtime each tensor by name); it holds
``raw_data`` of at least :data:`MIN_TENSOR_BYTES` of a type numpy has (:data:`DTYPES`),
whose length is its shape's; it has a name; and its fields are in protobuf's canonical
order around ``raw_data`` (every writer of ONNX files writes them so), so the join knows
where the bytes go back.

A model stored with **external data** is cut the same way when :func:`split` is told its
data files: a tensor whose bytes lie in one of them (``location``, ``offset``, ``length``
as ONNX writes them, then ``data_location = EXTERNAL``, nothing after) is cut whatever its
size, its piece naming the file and the offset in it.  :func:`joined` with the pieces'
places gives the ``.onnx`` back, :func:`join_data` each data file (its tensors in offset
order, zeros between them); a file that holds anything else is not described by its
tensors, and the caller keeps it whole.

Pure: bytes in, bytes out (a memory map works as the input: tensor bytes are never
copied by :func:`split`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from registry.onnx_wire import WireFormatError, encode_varint, fields, varint

__all__ = [
    "DTYPES",
    "MIN_TENSOR_BYTES",
    "STORE_LOCATION",
    "Joined",
    "Piece",
    "Split",
    "TensorCutError",
    "data_files",
    "external_locations",
    "itemsize",
    "join",
    "join_data",
    "joined",
    "relocate",
    "split",
]

STORE_LOCATION: Final = "modelreg.tensors"
"""The external data location every cut tensor names in a skeleton.  Nothing is ever
read there: a device gives ONNX Runtime each tensor itself (it checks the file exists,
so the device keeps an empty one of that name)."""
MIN_TENSOR_BYTES: Final = 64 << 10
"""Tensors at least this large are cut out (smaller ones cost more as separate objects
and mappings than they save)."""
DTYPES: Final = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64",
}  # fmt: skip
"""``TensorProto.DataType`` codes that map onto a numpy dtype, by numpy name."""
_ITEMSIZE: Final = {
    "float32": 4, "uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "int32": 4, "int64": 8,
    "bool": 1, "float16": 2, "float64": 8, "uint32": 4, "uint64": 8,
}  # fmt: skip

# onnx.proto3 field numbers read here
_MODEL_GRAPH, _GRAPH_NODE, _GRAPH_INITIALIZER = 7, 1, 5
_N_OUTPUT, _N_OP_TYPE, _N_ATTRIBUTE, _N_DOMAIN = 2, 4, 5, 7
_A_NAME, _A_TENSOR = 1, 5
_A_GRAPHS = frozenset({6, 11})  # AttributeProto.g, .graphs
_T_DIMS, _T_TYPE, _T_NAME, _T_RAW, _T_EXTERNAL, _T_LOCATION = 1, 2, 8, 9, 13, 14
_T_TYPED = frozenset({4, 5, 6, 7, 10, 11})  # float_data ... uint64_data
_E_KEY, _E_VALUE = 1, 2
_VARINT, _LEN = 0, 2
_SIGN = 1 << 63
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL


class TensorCutError(Exception):
    """The bytes are not a model (or a skeleton) this module can walk."""


def itemsize(dtype: str) -> int:
    """Bytes per element of a :data:`DTYPES` name."""
    return _ITEMSIZE[dtype]


@dataclass(frozen=True, slots=True)
class Piece:
    """One cut tensor: its name, numpy dtype and shape, and where its bytes lie
    (``offset``, ``length``): in the model file itself, or in external data file
    ``file``."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    offset: int
    length: int
    file: str | None = None


@dataclass(frozen=True, slots=True)
class Split:
    """A model cut in two: the skeleton's bytes and the tensors cut out, in file order."""

    skeleton: bytes
    pieces: tuple[Piece, ...]


@dataclass(frozen=True, slots=True)
class Joined:
    """How a skeleton and its tensors make the whole file: the file's bytes in order,
    each a run of skeleton bytes or the index of a piece, every cut tensor in skeleton
    order (offsets in the whole file; a piece put back as external data names its file
    and offset there and is in no segment) and the whole file's length."""

    segments: tuple[bytes | int, ...]
    pieces: tuple[Piece, ...]
    length: int


def _walk(buf: Any, start: int, end: int) -> list[Any]:
    try:
        return fields(buf, start, end)
    except WireFormatError as e:
        raise TensorCutError(str(e)) from None


def _key(number: int, wire: int) -> bytes:
    return encode_varint(number << 3 | wire)


def _len_field(number: int, payload_length: int) -> bytes:
    """The key and length prefix of a length-delimited field."""
    return _key(number, _LEN) + encode_varint(payload_length)


def _entry(key: str, value: str) -> bytes:
    """A ``StringStringEntryProto`` as field 13 of a TensorProto."""
    k, v = key.encode(), value.encode()
    body = _len_field(_E_KEY, len(k)) + k + _len_field(_E_VALUE, len(v)) + v
    return _len_field(_T_EXTERNAL, len(body)) + body


def _suffix(length: int, location: str = STORE_LOCATION, offset: int | None = None) -> bytes:
    """What a cut tensor ends with: its location (the store's in a skeleton), offset
    (a relocated one only), length and ``data_location = EXTERNAL``."""
    where = _entry("location", location)
    if offset is not None:
        where += _entry("offset", str(offset))
    return (
        where
        + _entry("length", str(length))
        + _key(_T_LOCATION, _VARINT)
        + encode_varint(_EXTERNAL)
    )


def _dims(buf: Any, f: Any) -> list[int]:
    if f.wire == _VARINT:
        return [f.value]
    found, pos = [], f.start
    while pos < f.end:
        try:
            value, pos = varint(buf, pos, f.end)
        except WireFormatError as e:
            raise TensorCutError(str(e)) from None
        found.append(value)
    return found


@dataclass
class _Tensor:
    """A TensorProto's fields as the cut reads them."""

    before: list[tuple[int, int]]
    after: list[tuple[int, int]]
    raw: tuple[int, int] | None
    name: str
    dtype: str
    dims: tuple[int, ...]


Part = bytes | Piece
"""A run of a message's bytes, or a tensor's bytes (a piece, its ``length`` long)."""


def _size(parts: list[Part]) -> int:
    return sum(p.length if isinstance(p, Piece) else len(p) for p in parts)


def _wrap(number: int, parts: list[Part]) -> list[Part]:
    """``parts`` as the payload of a length-delimited field ``number``."""
    return [_len_field(number, _size(parts)), *parts]


def _message(
    buf: Any, start: int, end: int, replace: Callable[[Any], list[Part] | None]
) -> list[Part]:
    """A message's fields, each as it is or as ``replace`` gives it (None: as it is)."""
    parts: list[Part] = []
    for f in _walk(buf, start, end):
        new = replace(f)
        parts.extend([bytes(buf[f.key_at : f.end])] if new is None else new)
    return parts


def _fields_of(buf: Any, spans: list[tuple[int, int]]) -> bytes:
    return b"".join(bytes(buf[s:e]) for s, e in spans)


def _scan(buf: Any, start: int, end: int, alias: str | None) -> tuple[_Tensor, list[Any]] | None:
    """A TensorProto's fields split around ``raw_data`` (see the module doc for when a
    tensor is cut), and the fields; None when the order is not canonical or the
    tensor holds typed or external data.  ``alias``: the name it goes by (a
    ``Constant`` node's output)."""
    before: list[tuple[int, int]] = []
    after: list[tuple[int, int]] = []
    raw: tuple[int, int] | None = None
    name, code, dims, high = b"", 0, [], False
    found = _walk(buf, start, end)
    for f in found:
        number = f.number
        if number in _T_TYPED:
            return None
        if number == _T_RAW and f.wire == _LEN:
            if raw is not None or high:
                return None  # twice, or after a later field: no canonical place
            raw = (f.start, f.end)
            continue
        if number < _T_RAW and (raw is not None or high):
            return None
        high = high or number > _T_RAW
        (after if high else before).append((f.key_at, f.end))
        if number == _T_DIMS:
            dims += _dims(buf, f)
        elif number == _T_TYPE and f.wire == _VARINT:
            code = f.value
        elif number == _T_NAME and f.wire == _LEN:
            name = bytes(buf[f.start : f.end])
    dtype = DTYPES.get(code)
    if dtype is None or any(d >= _SIGN for d in dims):
        return None
    try:
        text = alias if alias is not None else name.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not text:
        return None
    return _Tensor(before, after, raw, text, dtype, tuple(dims)), found


def _read_tensor(buf: Any, start: int, end: int, alias: str | None) -> _Tensor | None:
    """The tensor's fields around its ``raw_data``; None when it is not one to cut."""
    scanned = _scan(buf, start, end, alias)
    if scanned is None:
        return None
    tensor, found = scanned
    if tensor.raw is None or any(f.number in (_T_EXTERNAL, _T_LOCATION) for f in found):
        return None
    length = tensor.raw[1] - tensor.raw[0]
    if length < MIN_TENSOR_BYTES or math.prod(tensor.dims) * _ITEMSIZE[tensor.dtype] != length:
        return None
    return tensor


def _read_external(
    buf: Any, start: int, end: int, alias: str | None, files: frozenset[str]
) -> tuple[_Tensor, str, int, int] | None:
    """A tensor whose bytes lie in one of ``files`` as ONNX writes it (see the module
    doc): the tensor (``after`` without its place), the file, offset and length; None
    when it is not one to cut."""
    scanned = _scan(buf, start, end, alias)
    if scanned is None:
        return None
    tensor, found = scanned
    if tensor.raw is not None or len(found) < 4:
        return None
    *rest, loc, off, size, where = found
    if where.number != _T_LOCATION or where.wire != _VARINT or where.value != _EXTERNAL:
        return None
    if any(f.number in (_T_EXTERNAL, _T_LOCATION) for f in rest):
        return None
    values = []
    for f, key in ((loc, "location"), (off, "offset"), (size, "length")):
        if f.number != _T_EXTERNAL or f.wire != _LEN:
            return None
        entry = _walk(buf, f.start, f.end)
        try:
            value = bytes(buf[entry[-1].start : entry[-1].end]).decode("utf-8") if entry else ""
        except UnicodeDecodeError:
            return None
        if bytes(buf[f.key_at : f.end]) != _entry(key, value):
            return None  # other keys, other order, or not as ONNX writes them
        values.append(value)
    file, offset, length = values
    if file not in files or not all(_plain_number(v) for v in (offset, length)):
        return None
    if not 0 < int(length) == math.prod(tensor.dims) * _ITEMSIZE[tensor.dtype]:
        return None
    kept = _Tensor(tensor.before, tensor.after[:-4], None, tensor.name, tensor.dtype, tensor.dims)
    return kept, file, int(offset), int(length)


def _plain_number(text: str) -> bool:
    """Whether ``text`` is a number as ``str(int)`` writes it (so it joins back)."""
    return text.isdigit() and text.isascii() and len(text) <= 18 and str(int(text)) == text


def _cut_tensor(buf: Any, start: int, end: int, alias: str | None) -> tuple[_Tensor, int] | None:
    """A skeleton tensor that was cut (``raw`` None) and its length; None for a
    tensor left whole.

    Raises:
        TensorCutError: it ends as a cut tensor does but is not one :func:`split` makes.
    """
    found = _walk(buf, start, end)
    if len(found) < 3:
        return None
    loc, size, where = found[-3:]
    if where.number != _T_LOCATION or where.wire != _VARINT or where.value != _EXTERNAL:
        return None
    if bytes(buf[loc.key_at : loc.end]) != _entry("location", STORE_LOCATION):
        return None
    if size.number != _T_EXTERNAL or size.wire != _LEN:
        raise TensorCutError("a cut tensor without its length")
    entry = _walk(buf, size.start, size.end)
    text = bytes(buf[entry[-1].start : entry[-1].end]) if entry else b""
    if not _plain_number(text.decode("ascii", "replace")) or bytes(
        buf[size.key_at : size.end]
    ) != _entry("length", text.decode()):
        raise TensorCutError("a cut tensor's length is not a plain number")
    length = int(text)
    scanned = _scan(buf, start, loc.key_at, alias)
    if scanned is None:
        raise TensorCutError("a cut tensor holds data of its own or is out of order")
    tensor, rest = scanned
    if tensor.raw is not None or any(f.number in (_T_EXTERNAL, _T_LOCATION) for f in rest):
        raise TensorCutError(f"tensor {tensor.name!r} is cut and holds data of its own")
    if math.prod(tensor.dims) * _ITEMSIZE[tensor.dtype] != length:
        raise TensorCutError(
            f"tensor {tensor.name!r}: {length} bytes do not fit {list(tensor.dims)} {tensor.dtype}"
        )
    return tensor, length


def _constant(buf: Any, start: int, end: int) -> tuple[str, Any, Any] | None:
    """(output name, attribute field, tensor field) of a ``Constant`` node of the
    default domain whose one attribute is ``value`` holding one tensor; else None."""
    by_number: dict[int, list[Any]] = {}
    for f in _walk(buf, start, end):
        if f.wire == _LEN:
            by_number.setdefault(f.number, []).append(f)

    def text(number: int) -> bytes:
        found = by_number.get(number, [])
        return bytes(buf[found[0].start : found[0].end]) if len(found) == 1 else b""

    outputs, attributes = by_number.get(_N_OUTPUT, []), by_number.get(_N_ATTRIBUTE, [])
    if text(_N_OP_TYPE) != b"Constant" or text(_N_DOMAIN) not in (b"", b"ai.onnx"):
        return None
    if len(outputs) != 1 or len(attributes) != 1:
        return None
    attribute = attributes[0]
    inner = [f for f in _walk(buf, attribute.start, attribute.end) if f.wire == _LEN]
    names = [bytes(buf[f.start : f.end]) for f in inner if f.number == _A_NAME]
    tensors = [f for f in inner if f.number == _A_TENSOR]
    if names != [b"value"] or len(tensors) != 1:
        return None
    try:
        return bytes(buf[outputs[0].start : outputs[0].end]).decode("utf-8"), attribute, tensors[0]
    except UnicodeDecodeError:
        return None


def _model(buf: Any, tensor: Callable[[Any, str | None], list[Part] | None]) -> list[Part]:
    """The model's bytes with each initializer and each ``Constant`` node's tensor, of
    the main graph and of every subgraph a node's attribute holds, as ``tensor(field,
    alias)`` gives it (None: as it is).  A message none of whose tensors changed keeps
    its bytes as they are."""

    def node(f: Any, depth: int) -> list[Part] | None:
        constant = _constant(buf, f.start, f.end)
        if constant is None:
            return subgraphs(f, depth)
        output, attribute, value = constant
        new = tensor(value, output)
        if new is None:
            return None

        def in_attribute(a: Any) -> list[Part] | None:
            return new if a.key_at == value.key_at else None

        def in_node(n: Any) -> list[Part] | None:
            if n.key_at != attribute.key_at:
                return None
            return _wrap(n.number, _message(buf, n.start, n.end, in_attribute))

        return _wrap(f.number, _message(buf, f.start, f.end, in_node))

    def subgraphs(f: Any, depth: int) -> list[Part] | None:
        """A node with the graphs its attributes hold (``If``, ``Loop``, ``Scan``) as
        :func:`graph` gives them; None when none changed."""
        changed = False

        def in_node(n: Any) -> list[Part] | None:
            nonlocal changed
            if n.number != _N_ATTRIBUTE or n.wire != _LEN:
                return None
            inner = False

            def in_attribute(a: Any) -> list[Part] | None:
                nonlocal inner
                if a.wire != _LEN or a.number not in _A_GRAPHS:
                    return None
                new = graph(a, depth + 1)
                inner = inner or new is not None
                return new

            parts = _message(buf, n.start, n.end, in_attribute)
            if not inner:
                return None  # kept as written
            changed = True
            return _wrap(n.number, parts)

        parts = _message(buf, f.start, f.end, in_node)
        return _wrap(f.number, parts) if changed else None

    def graph(g: Any, depth: int) -> list[Part] | None:
        if depth > _MAX_DEPTH:
            raise TensorCutError("the model nests deeper than a graph may")
        changed = False

        def in_graph(x: Any) -> list[Part] | None:
            nonlocal changed
            if x.wire != _LEN:
                return None
            if x.number == _GRAPH_INITIALIZER:
                new = tensor(x, None)
            elif x.number == _GRAPH_NODE:
                new = node(x, depth)
            else:
                return None
            changed = changed or new is not None
            return new

        parts = _message(buf, g.start, g.end, in_graph)
        return _wrap(g.number, parts) if changed else None

    found = False

    def in_model(f: Any) -> list[Part] | None:
        nonlocal found
        if f.number != _MODEL_GRAPH or f.wire != _LEN:
            return None
        found = True
        return graph(f, 0)

    parts = _message(buf, 0, len(buf), in_model)
    if not found:
        raise TensorCutError("no graph in the model")
    return parts


def _tensor_names(buf: Any) -> Counter[str]:
    """How many times each name of a tensor :func:`_model` reaches occurs (an
    initializer's name, a ``Constant``'s output), in every graph.  Read in place: no
    field is copied (a tensor's bytes are never touched)."""
    counted: Counter[str] = Counter()

    def text(f: Any) -> str:
        return bytes(buf[f.start : f.end]).decode("utf-8", "replace")

    def graph(g: Any, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise TensorCutError("the model nests deeper than a graph may")
        for x in _walk(buf, g.start, g.end):
            if x.wire != _LEN:
                continue
            if x.number == _GRAPH_INITIALIZER:
                counted.update(
                    text(t)
                    for t in _walk(buf, x.start, x.end)
                    if t.number == _T_NAME and t.wire == _LEN
                )
            elif x.number == _GRAPH_NODE:
                constant = _constant(buf, x.start, x.end)
                if constant is not None:
                    counted[constant[0]] += 1
                    continue
                for n in _walk(buf, x.start, x.end):
                    if n.number == _N_ATTRIBUTE and n.wire == _LEN:
                        for a in _walk(buf, n.start, n.end):
                            if a.wire == _LEN and a.number in _A_GRAPHS:
                                graph(a, depth + 1)

    for f in _walk(buf, 0, len(buf)):
        if f.number == _MODEL_GRAPH and f.wire == _LEN:
            graph(f, 0)
    return counted


def split(buf: Any, files: frozenset[str] = frozenset()) -> Split:
    """Cut the serialized model ``buf`` into its skeleton and its large tensors (see
    the module doc); ``files``: the external data files whose tensors are cut too.

    Raises:
        TensorCutError: not a protobuf message with a graph.
    """
    pieces: list[Piece] = []
    names = _tensor_names(buf)

    def cut(f: Any, alias: str | None) -> list[Part] | None:
        tensor = _read_tensor(buf, f.start, f.end, alias)
        if tensor is not None and tensor.raw is not None:
            a, b = tensor.raw
            piece = Piece(tensor.name, tensor.dtype, tensor.dims, a, b - a)
        elif files and (external := _read_external(buf, f.start, f.end, alias, files)):
            tensor, file, offset, length = external
            piece = Piece(tensor.name, tensor.dtype, tensor.dims, offset, length, file)
        else:
            return None
        if names[tensor.name] != 1:
            return None  # a name two tensors share: a device could not tell them apart
        pieces.append(piece)
        body = _fields_of(buf, tensor.before) + _fields_of(buf, tensor.after)
        return _wrap(f.number, [body + _suffix(piece.length)])

    parts = _model(buf, cut)
    return Split(b"".join(p for p in parts if isinstance(p, bytes)), tuple(pieces))


Place = Callable[[int, Piece], tuple[str, int] | None]
"""Where the ``index``-th cut tensor of a skeleton goes back: an external data file and
the offset in it, or None for its bytes in the file itself."""


def joined(skeleton: bytes, where: Place | None = None) -> Joined:
    """How ``skeleton`` and its tensors make the whole file (see :class:`Joined`);
    ``where`` puts tensors back as external data (None: every one in the file).

    Raises:
        TensorCutError: not a skeleton :func:`split` makes.
    """
    pieces: list[Piece] = []
    index: dict[int, int] = {}

    def put_back(f: Any, alias: str | None) -> list[Part] | None:
        cut = _cut_tensor(skeleton, f.start, f.end, alias)
        if cut is None:
            return None
        tensor, length = cut
        piece = Piece(tensor.name, tensor.dtype, tensor.dims, 0, length)
        place = where(len(pieces), piece) if where is not None else None
        if place is not None:
            location, offset = place
            pieces.append(Piece(piece.name, piece.dtype, piece.dims, offset, length, location))
            body = _fields_of(skeleton, tensor.before) + _fields_of(skeleton, tensor.after)
            return _wrap(f.number, [body + _suffix(length, location, offset)])
        index[id(piece)] = len(pieces)
        pieces.append(piece)
        head = _fields_of(skeleton, tensor.before) + _len_field(_T_RAW, length)
        return _wrap(f.number, [head, piece, _fields_of(skeleton, tensor.after)])

    segments: list[bytes | int] = []
    pos = 0
    for part in _model(skeleton, put_back):
        if isinstance(part, Piece):
            at = index[id(part)]
            pieces[at] = Piece(part.name, part.dtype, part.dims, pos, part.length)
            segments.append(at)
            pos += part.length
        elif part:
            segments.append(part)
            pos += len(part)
    return Joined(tuple(segments), tuple(pieces), pos)


def join(layout: Joined, read: Callable[[int, Piece], Any]) -> Iterator[Any]:
    """The whole file's bytes, in order: skeleton runs and each piece's bytes as
    ``read(index, piece)`` gives them (a memoryview over a mapped tensor works)."""
    for segment in layout.segments:
        if isinstance(segment, int):
            yield read(segment, layout.pieces[segment])
        else:
            yield segment


def relocate(skeleton: bytes, where: Callable[[int, Piece], tuple[str, int]]) -> bytes:
    """``skeleton`` with each cut tensor pointing at where its bytes really lie:
    ``where(index, piece)`` gives the external data location (a file name) and the
    offset in it.  For a session that reads its weights itself (a private, optimized
    one: ONNX Runtime's optimizers read a ``Constant``'s tensor from the graph, not
    from the values a caller gives).

    Raises:
        TensorCutError: not a skeleton :func:`split` makes.
    """
    layout = joined(skeleton, where)
    return b"".join(s for s in layout.segments if isinstance(s, bytes))


def data_files(pieces: tuple[Piece, ...]) -> dict[str, tuple[int, ...]]:
    """The pieces in each external data file, by index in offset order.

    Raises:
        TensorCutError: two pieces of a file overlap.
    """
    found: dict[str, list[int]] = {}
    for i, piece in enumerate(pieces):
        if piece.file is not None:
            found.setdefault(piece.file, []).append(i)
    ordered = {}
    for file, indices in sorted(found.items()):
        indices.sort(key=lambda i: pieces[i].offset)
        end = 0
        for i in indices:
            if pieces[i].offset < end:
                raise TensorCutError(f"tensor {pieces[i].name!r} overlaps another in {file!r}")
            end = pieces[i].offset + pieces[i].length
        ordered[file] = tuple(indices)
    return ordered


def join_data(pieces: tuple[Piece, ...], order: tuple[int, ...], read: Callable[[int, Piece], Any]
              ) -> Iterator[Any]:  # fmt: skip
    """An external data file's bytes, in order: the pieces ``order`` names (one entry
    of :func:`data_files`) as ``read(index, piece)`` gives them, zeros between them."""
    pos = 0
    for i in order:
        piece = pieces[i]
        while pos < piece.offset:
            gap = min(piece.offset - pos, 1 << 20)
            yield bytes(gap)
            pos += gap
        yield read(i, piece)
        pos = piece.offset + piece.length


# Where TensorProtos lie, by message: (field, message) pairs to descend into.
_GRAPH_TENSORS: Final = {_GRAPH_INITIALIZER: "tensor", _GRAPH_NODE: "node", 15: "sparse"}
_NODE_FIELDS: Final = {_N_ATTRIBUTE: "attribute"}
# AttributeProto: t 5, g 6, tensors 10, graphs 11, sparse_tensor 22, sparse_tensors 23
_ATTRIBUTE_FIELDS: Final = {_A_TENSOR: "tensor", 6: "graph", 10: "tensor", 11: "graph",
                            22: "sparse", 23: "sparse"}  # fmt: skip
_SPARSE_FIELDS: Final = {1: "tensor", 2: "tensor"}
# FunctionProto: node 7, attribute_proto 11 (default attribute values)
_FUNCTION_FIELDS: Final = {7: "node", 11: "attribute"}
# TrainingInfoProto: initialization 1, algorithm 2
_TRAINING_FIELDS: Final = {1: "graph", 2: "graph"}
# ModelProto: graph 7, training_info 20, functions 25
_MODEL_FIELDS: Final = {_MODEL_GRAPH: "graph", 20: "training", 25: "function"}
_MAX_DEPTH: Final = 64
_MESSAGES: Final = {
    "model": _MODEL_FIELDS, "graph": _GRAPH_TENSORS, "node": _NODE_FIELDS,
    "attribute": _ATTRIBUTE_FIELDS, "sparse": _SPARSE_FIELDS, "function": _FUNCTION_FIELDS,
    "training": _TRAINING_FIELDS,
}  # fmt: skip


def external_locations(buf: Any) -> set[str]:
    """Every external data ``location`` any tensor of the model names: initializers,
    ``Constant`` and other attribute tensors, sparse tensors, subgraphs, functions.  A
    skeleton names only :data:`STORE_LOCATION`; anything else would have ONNX Runtime
    read a file the device never verified for it.

    Raises:
        TensorCutError: not a message this can walk, or nested too deep.
    """
    found: set[str] = set()

    def visit(kind: str, start: int, end: int, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise TensorCutError("the model nests deeper than a graph may")
        for f in _walk(buf, start, end):
            if f.wire != _LEN:
                continue
            if kind != "tensor":
                inner = _MESSAGES[kind].get(f.number)
                if inner is not None:
                    visit(inner, f.start, f.end, depth + 1)
            elif f.number == _T_EXTERNAL:
                entry = {e.number: bytes(buf[e.start : e.end]) for e in _walk(buf, f.start, f.end)}
                if entry.get(_E_KEY) == b"location":
                    found.add(entry.get(_E_VALUE, b"").decode("utf-8", "replace"))

    visit("model", 0, len(buf), 0)
    return found
