"""Walk the protobuf wire format of a serialized ONNX model: the one walker of the project.

:func:`fields` lists a message's fields with where each one starts and ends (the device
rebuilds a model's graph from them: ``edge_sync.engine.weights``); :func:`initializers` finds
the initializer tensors for the delta codec (:mod:`registry.delta`), reading only:
``ModelProto.graph`` (7) -> ``GraphProto.initializer`` (5) -> ``TensorProto`` ``dims`` (1),
``data_type`` (2), ``name`` (8) and ``raw_data`` (9).  Everything else is skipped by its
wire type, so the walk costs one pass over the field headers and never copies tensor data.

Importing ``onnx`` would do the same job with a full parse, but it copies every tensor into
Python objects and is a heavy dependency the core library avoids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, NamedTuple

_VARINT: Final = 0
_FIXED64: Final = 1
_LEN: Final = 2
_FIXED32: Final = 5
_MAX_VARINT_BYTES: Final = 10

_MODEL_GRAPH: Final = 7
_GRAPH_INITIALIZER: Final = 5
_TENSOR_DIMS: Final = 1
_TENSOR_DATA_TYPE: Final = 2
_TENSOR_NAME: Final = 8
_TENSOR_RAW_DATA: Final = 9

# Bytes per element of each TensorProto.DataType whose raw_data holds fixed-size values:
# the width of the byte planes the delta splits XOR patches into.  Sub-byte and 8-bit types
# (and anything unknown) get 1: no split.
_ELEMENT_SIZE: Final[dict[int, int]] = {
    1: 4,  # FLOAT
    4: 2,  # UINT16
    5: 2,  # INT16
    6: 4,  # INT32
    7: 8,  # INT64
    10: 2,  # FLOAT16
    11: 8,  # DOUBLE
    12: 4,  # UINT32
    13: 8,  # UINT64
    14: 4,  # COMPLEX64: pairs of float32
    15: 8,  # COMPLEX128: pairs of float64
    16: 2,  # BFLOAT16
}


class WireFormatError(Exception):
    """The bytes are not a well-formed protobuf message of the expected shape."""


@dataclass(frozen=True, slots=True)
class InitializerSpan:
    """One initializer tensor as the wire walk finds it: its name, type and shape, and
    where its bytes lie (its inline ``raw_data`` in the model file, or for
    :class:`ExternalSpan` a span of an external data file).

    Attributes:
        name: the tensor's name (raw bytes, compared as such).
        data_type: ``TensorProto.DataType`` value.
        dims: the shape, as the varints were written.
        offset: where the raw_data payload starts in the file.
        length: length of the raw_data payload in bytes.
    """

    name: bytes
    data_type: int
    dims: tuple[int, ...]
    offset: int
    length: int

    @property
    def element_size(self) -> int:
        """Width of one value in bytes (1 when unknown or when it does not divide the data)."""
        size = _ELEMENT_SIZE.get(self.data_type, 1)
        return size if self.length % size == 0 else 1

    @property
    def key(self) -> tuple[bytes, int, tuple[int, ...]]:
        """What must agree for two tensors to be XOR-patched: name, dtype and shape."""
        return (self.name, self.data_type, self.dims)


def varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``buf[pos]`` and where the next field starts.

    Raises:
        WireFormatError: truncated, or longer than ten bytes.
    """
    value = 0
    shift = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= end:
            raise WireFormatError(f"truncated varint at offset {pos}")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos + i + 1
        shift += 7
    raise WireFormatError(f"varint longer than {_MAX_VARINT_BYTES} bytes at offset {pos}")


class Field(NamedTuple):
    """One field of a message.

    Attributes:
        number, wire: its field number and wire type.
        key_at: where its key starts (the field is ``buf[key_at:end]``).
        value: the varint of a varint field (0 for other wire types).
        start: where a length-delimited field's payload starts (the payload is
            ``buf[start:end]``); ``end`` for other wire types.
        end: where the field ends.
    """

    number: int
    wire: int
    key_at: int
    value: int
    start: int
    end: int


def fields(buf: Any, start: int, end: int) -> list[Field]:
    """Every field of the message in ``buf[start:end]`` (``buf``: bytes, a memoryview or
    a memory map).

    Raises:
        WireFormatError: a field is truncated, uses a group or an unknown wire type.
    """
    out: list[Field] = []
    pos = start
    while pos < end:
        key_at = pos
        tag, pos = varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise WireFormatError(f"field number 0 at offset {pos}")
        if wire == _VARINT:
            value, pos = varint(buf, pos, end)
            out.append(Field(number, wire, key_at, value, pos, pos))
        elif wire == _LEN:
            length, pos = varint(buf, pos, end)
            if length > end - pos:
                raise WireFormatError(f"field {number} runs past its message at offset {pos}")
            out.append(Field(number, wire, key_at, 0, pos, pos + length))
            pos += length
        elif wire in (_FIXED64, _FIXED32):
            pos += 8 if wire == _FIXED64 else 4
            if pos > end:
                raise WireFormatError(f"truncated fixed-width field {number}")
            out.append(Field(number, wire, key_at, 0, pos, pos))
        else:  # groups (3, 4) are not used by ONNX; 6 and 7 are invalid
            raise WireFormatError(f"unsupported wire type {wire} at offset {pos}")
    return out


def encode_varint(value: int) -> bytes:
    """``value`` (non-negative) as a protobuf varint."""
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def _dims(buf: Any, wire: int, value: int, pos: int, stop: int) -> list[int]:
    """The dimensions in one ``dims`` field: one varint, or a packed run of them."""
    if wire == _VARINT:
        return [value]
    dims: list[int] = []
    while wire == _LEN and pos < stop:
        dim, pos = varint(buf, pos, stop)
        dims.append(dim)
    return dims


def _tensor(buf: Any, start: int, end: int) -> InitializerSpan | None:
    name = b""
    data_type = 0
    dims: list[int] = []
    raw: tuple[int, int] | None = None
    for number, wire, _key_at, value, pos, stop in fields(buf, start, end):
        if number == _TENSOR_DIMS:
            dims.extend(_dims(buf, wire, value, pos, stop))
        elif number == _TENSOR_DATA_TYPE and wire == _VARINT:
            data_type = value
        elif number == _TENSOR_NAME and wire == _LEN:
            name = bytes(buf[pos:stop])
        elif number == _TENSOR_RAW_DATA and wire == _LEN:
            if raw is not None:
                return None  # two raw_data fields: the parser would merge; not worth matching
            raw = (pos, stop - pos)
    if raw is None:
        return None
    return InitializerSpan(name, data_type, tuple(dims), raw[0], raw[1])


def initializers(data: memoryview) -> list[InitializerSpan]:
    """The inline initializers of a serialized ``ModelProto``, in file order.

    Tensors without ``raw_data`` (typed repeated fields, external data) are left out:
    the encoder treats their bytes like any other framing.

    Raises:
        WireFormatError: ``data`` is not a well-formed protobuf message.
    """
    tensors: list[InitializerSpan] = []
    for number, wire, _key_at, _value, pos, stop in fields(data, 0, len(data)):
        if number != _MODEL_GRAPH:
            continue
        if wire != _LEN:
            raise WireFormatError("ModelProto.graph is not length-delimited")
        for g_number, g_wire, _g_key, _g_value, g_pos, g_stop in fields(data, pos, stop):
            if g_number != _GRAPH_INITIALIZER:
                continue
            if g_wire != _LEN:
                raise WireFormatError("GraphProto.initializer is not length-delimited")
            tensor = _tensor(data, g_pos, g_stop)
            if tensor is not None:
                tensors.append(tensor)
    return tensors


_TENSOR_EXTERNAL_DATA: Final = 13
_TENSOR_DATA_LOCATION: Final = 14
_ENTRY_KEY: Final = 1
_ENTRY_VALUE: Final = 2
_EXTERNAL: Final = 1


@dataclass(frozen=True, slots=True)
class ExternalSpan:
    """One top-level initializer stored as ONNX external data.

    Attributes:
        tensor: its name, dtype, shape and the span (``offset``, ``length``) of its bytes
            in ``location``.
        location: the data file's name, as the graph writes it (unchecked: see
            ``registry.schema.file_name_problem``).
    """

    tensor: InitializerSpan
    location: str


def _entry(buf: Any, start: int, end: int) -> tuple[bytes, bytes]:
    """(key, value) of a ``StringStringEntryProto``."""
    key = val = b""
    for number, wire, _key_at, _value, pos, stop in fields(buf, start, end):
        if number == _ENTRY_KEY and wire == _LEN:
            key = bytes(buf[pos:stop])
        elif number == _ENTRY_VALUE and wire == _LEN:
            val = bytes(buf[pos:stop])
    return key, val


def _external(buf: Any, start: int, end: int) -> ExternalSpan | None:
    name = b""
    data_type = 0
    dims: list[int] = []
    external = False
    entries: dict[bytes, bytes] = {}
    for number, wire, _key_at, value, pos, stop in fields(buf, start, end):
        if number == _TENSOR_DIMS:
            dims.extend(_dims(buf, wire, value, pos, stop))
        elif number == _TENSOR_DATA_TYPE and wire == _VARINT:
            data_type = value
        elif number == _TENSOR_NAME and wire == _LEN:
            name = bytes(buf[pos:stop])
        elif number == _TENSOR_DATA_LOCATION and wire == _VARINT:
            external = value == _EXTERNAL
        elif number == _TENSOR_EXTERNAL_DATA and wire == _LEN:
            key, val = _entry(buf, pos, stop)
            if key in entries:
                raise WireFormatError(f"external data key {key!r} repeated")
            entries[key] = val
    if not external:
        return None
    return _span(name, data_type, tuple(dims), entries)


def _span(
    name: bytes, data_type: int, dims: tuple[int, ...], entries: dict[bytes, bytes]
) -> ExternalSpan:
    """The span an external tensor's entries describe.

    Raises:
        WireFormatError: a value is not text or not a non-negative number.
    """
    try:
        location = entries.get(b"location", b"").decode()
        offset = int(entries.get(b"offset", b"0").decode() or "0")
        length_text = entries.get(b"length")
    except (UnicodeDecodeError, ValueError):
        raise WireFormatError(f"external data of {name!r} is not readable") from None
    size = _ELEMENT_SIZE.get(data_type, 1)
    count = 1
    for d in dims:
        count *= d
    try:
        length = int(length_text.decode()) if length_text is not None else count * size
    except (UnicodeDecodeError, ValueError):
        raise WireFormatError(f"external data length of {name!r} is not a number") from None
    if offset < 0 or length < 0:
        raise WireFormatError(f"external data span of {name!r} is negative")
    return ExternalSpan(InitializerSpan(name, data_type, dims, offset, length), location)


def external_initializers(data: Any) -> list[ExternalSpan]:
    """The top-level initializers of a serialized ``ModelProto`` stored as external data,
    in graph order (``data``: bytes, a memoryview or a memory map of the ``.onnx``).

    Only the graph's own initializers are read (the only place ``pipelines.onnx``
    lets external data be); spans are not checked against any file here.

    Raises:
        WireFormatError: not a well-formed protobuf message, or an external data entry
            that does not parse.
    """
    spans: list[ExternalSpan] = []
    for number, wire, _key_at, _value, pos, stop in fields(data, 0, len(data)):
        if number != _MODEL_GRAPH or wire != _LEN:
            continue
        for g_number, g_wire, _g_key, _g_value, g_pos, g_stop in fields(data, pos, stop):
            if g_number == _GRAPH_INITIALIZER and g_wire == _LEN:
                span = _external(data, g_pos, g_stop)
                if span is not None:
                    spans.append(span)
    return spans
