"""The Open Inference Protocol v2's request and answer encoding (``edge_sync.serving``
serves it).

An inference request is untrusted input, read in checked steps before any engine runs:

1. the body, within :attr:`ServeLimits.max_body_bytes` (413), inflated from gzip or
   deflate as ``tritonclient``'s request compression sends it, within the same cap;
2. the JSON header (up to ``Inference-Header-Content-Length``; the rest is binary
   tensor data), its nesting depth measured on the bytes before it is parsed (400);
3. each input: a known name, the model's datatype, a shape of the model's rank and
   fixed sizes, at most :attr:`ServeLimits.max_elements` values (413), and data that
   holds exactly that shape: JSON values of the datatype's kind (flat, or nested as
   the shape is), or its binary data (little-endian; BOOL one byte 0 or 1; BYTES
   4-byte length-prefixed elements);
4. the outputs asked for, and which go back as binary data.

Every refusal is a :class:`RefusedError` with the status it answers: 400 (the request's
fault), 413 (over a cap) or 415 (an unknown content coding).
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from starlette.responses import Response

from edge_sync.engine import DATATYPES, NUMPY_DTYPES

__all__ = [
    "HEADER_LENGTH", "MAX_BODY_BYTES", "MAX_ELEMENTS", "MAX_JSON_DEPTH", "Parsed",
    "RefusedError", "ServeLimits", "answer", "dims", "error_response", "json_response",
    "read_request",
]  # fmt: skip

MAX_BODY_BYTES: Final = 64 << 20
"""Largest request body accepted, inflated (larger ones get 413)."""
MAX_ELEMENTS: Final = 1 << 24
"""Most values one input tensor may hold."""
MAX_JSON_DEPTH: Final = 40
"""Deepest JSON nesting accepted: a request is 3 levels deep before a tensor's nested
data, and numpy arrays have at most 64 dimensions."""
HEADER_LENGTH: Final = "inference-header-content-length"
"""Where the JSON header of a binary-data request or response ends."""
_JSON_MEDIA: Final = "application/json"


@dataclass(frozen=True)
class ServeLimits:
    """Caps on one inference request (untrusted input).

    Attributes:
        max_body_bytes: the body, after any content coding is undone (413 over it).
        max_elements: values in one input tensor, as its shape declares (413 over it).
        max_json_depth: nesting of the JSON header (400 over it).
    """

    max_body_bytes: int = MAX_BODY_BYTES
    max_elements: int = MAX_ELEMENTS
    max_json_depth: int = MAX_JSON_DEPTH


class RefusedError(Exception):
    """A request the server answers with ``{"error": ...}`` and ``status``."""

    def __init__(self, status: int, message: str, version: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.version = version
        """The version whose engine refused it ("" when none was reached)."""


def json_response(
    doc: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    # NaN and infinities are written as NaN / Infinity, as Triton writes them (a model
    # may compute them; JSON has no other way to say so and Starlette refuses them).
    body = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    return Response(body, status_code=status, headers=headers, media_type=_JSON_MEDIA)


def error_response(status: int, message: str, version: str = "") -> Response:
    headers = {"x-model-version": version} if version else None
    return json_response({"error": message}, status, headers)


def dims(shape: list[Any]) -> list[int]:
    """Symbolic dimensions as -1, as Triton shows them."""
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


# --- reading a request ---------------------------------------------------------------


def read_request(
    body: bytes, headers: Mapping[str, str], engine: Any, limits: ServeLimits
) -> Parsed:
    """An inference request's body (as sent, with its headers), read for ``engine``.

    Raises:
        RefusedError: see the module docstring.
    """
    body = _inflate(body, headers.get("content-encoding", ""), limits.max_body_bytes)
    doc, binary = _split(body, headers.get(HEADER_LENGTH), limits.max_json_depth)
    return _parse_request(doc, engine, binary, limits)


def _inflate(body: bytes, coding: str, cap: int) -> bytes:
    """The body with its content coding undone (gzip, deflate: what ``tritonclient``
    sends), within ``cap`` bytes: a small bomb never inflates past it.

    Raises:
        RefusedError: an unknown coding (415), too large inflated (413), or not a
            whole stream of its coding (400).
    """
    coding = coding.strip().lower()
    if coding in ("", "identity"):
        return body
    if coding not in ("gzip", "x-gzip", "deflate"):
        raise RefusedError(415, f"content encoding {coding[:40]!r} is not supported")
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib, by their header
    try:
        data = inflater.decompress(body, cap + 1)
    except zlib.error:
        raise RefusedError(400, f"the body is not {coding} data") from None
    if len(data) > cap:
        raise RefusedError(413, f"request body over {cap} bytes inflated")
    if not inflater.eof or inflater.unused_data:
        raise RefusedError(400, f"the body is not one whole {coding} stream")
    return data


_STRING: Final = re.compile(rb'"[^"\\]*(?:\\[\s\S][^"\\]*)*(?:"|\\?\Z)')
"""A JSON string, or an unterminated one up to the end (so that every match attempt
succeeds and a scan is linear)."""
_NOT_BRACKETS: Final = bytes(set(range(256)) - set(b"[]{}"))


def _depth(header: bytes, limit: int) -> int:
    """How deep the JSON text ``header`` nests (exact for any prefix the JSON parser
    accepts), without parsing it; 0 when it cannot exceed ``limit``."""
    import numpy as np

    if header.count(b"[") + header.count(b"{") <= limit:
        return 0  # depth never exceeds the number of opened brackets
    brackets = _STRING.sub(b"", header).translate(None, _NOT_BRACKETS)
    # '[' and '{' have bit 1 set, ']' and '}' do not: +1 for an opening, -1 for a close
    steps = (np.frombuffer(brackets, dtype=np.uint8) & 2).astype(np.int32) - 1
    return int(np.cumsum(steps, dtype=np.int32).max()) if steps.size else 0


def _split(body: bytes, header_length: str | None, max_depth: int) -> tuple[object, memoryview]:
    """The JSON header and the binary tensor data after it.

    Raises:
        RefusedError: a bad ``Inference-Header-Content-Length``, a header that nests
            too deep or is not JSON (400).
    """
    cut = len(body)
    if header_length is not None:
        value = header_length.strip()
        if not (value.isascii() and value.isdigit()) or int(value) > len(body):
            raise RefusedError(
                400, f"{HEADER_LENGTH}: {header_length[:20]!r} is not a length in the body"
            )
        cut = int(value)
    header = body[:cut]
    if _depth(header, max_depth) > max_depth:
        raise RefusedError(400, f"the request's JSON nests deeper than {max_depth} levels")
    try:
        doc = json.loads(header)
    except (ValueError, RecursionError):
        raise RefusedError(400, "the request's JSON header is not JSON") from None
    return doc, memoryview(body)[cut:]


@dataclass
class Parsed:
    """An inference request, read: inputs as arrays, outputs asked for (None: all),
    which of them go back as binary data, and the request's id."""

    inputs: dict[str, Any]
    wanted: list[str] | None
    binary_outputs: set[str]
    request_id: str | None


def _parse_request(
    doc: object, engine: Any, binary: memoryview | bytes, limits: ServeLimits
) -> Parsed:
    """Read an inference request (JSON tensors, or binary ones after the header).

    Raises:
        RefusedError: not an inference request, or a tensor whose data does not fit.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise RefusedError(400, "an inference request needs an 'inputs' list")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise RefusedError(400, "the request's 'id' must be a string")
    declared = {n: (DATATYPES.get(t, t), s) for n, t, s in getattr(engine, "inputs", [])}
    arrays: dict[str, Any] = {}
    offset = 0
    for item in doc["inputs"]:
        if not isinstance(item, dict):
            raise RefusedError(400, "each input is an object with name, shape, datatype, data")
        name, array, offset = _input(item, declared, binary, offset, limits)
        if name in arrays:
            raise RefusedError(400, f"input {name!r} is given twice")
        arrays[name] = array
    missing = sorted(set(declared) - set(arrays))
    if missing:
        raise RefusedError(400, f"missing input(s) {missing}")
    if offset != len(binary):
        raise RefusedError(400, f"{len(binary) - offset} bytes of binary data no input names")
    wanted, binary_out = _outputs(doc, [n for n, _, _ in getattr(engine, "outputs", [])])
    return Parsed(arrays, wanted, binary_out, request_id)


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _input(
    item: Mapping[str, Any],
    declared: Mapping[str, tuple[str, list[Any]]],
    binary: memoryview | bytes,
    offset: int,
    limits: ServeLimits,
) -> tuple[str, Any, int]:
    """One input tensor: its name, its array, and where the next binary data starts.

    Raises:
        RefusedError: unknown, a bad shape or datatype, or data that does not fit.
    """
    name, shape, datatype = item.get("name"), item.get("shape"), item.get("datatype")
    if not isinstance(name, str) or name not in declared:
        raise RefusedError(400, f"unknown input {name!r} (the model takes {sorted(declared)})")
    if not isinstance(shape, list) or not all(_is_size(d) for d in shape) or len(shape) > 32:
        raise RefusedError(400, f"input {name!r}: shape must be a list of sizes")
    count = math.prod(shape)  # exact: numpy's product wraps around at 2**63
    if count > limits.max_elements:
        raise RefusedError(413, f"input {name!r}: {count} values, over {limits.max_elements}")
    expected, model_shape = declared[name]
    if datatype != expected:
        raise RefusedError(
            400, f"input {name!r}: datatype {datatype!r}, the model takes {expected}"
        )
    _check_shape(name, shape, model_shape)
    params = item.get("parameters", {})
    if not isinstance(params, dict):
        raise RefusedError(400, f"input {name!r}: parameters must be an object")
    if "shared_memory_region" in params:
        raise RefusedError(400, "the shared memory extension is not supported")
    size = params.get("binary_data_size")
    if size is not None and not _is_size(size):
        raise RefusedError(400, f"input {name!r}: binary_data_size is not a size")
    if (size is None) == ("data" not in item):
        raise RefusedError(400, f"input {name!r}: give data or binary_data_size, one of them")
    if size is not None and offset + size > len(binary):
        raise RefusedError(400, f"input {name!r}: binary data past the body's end")
    try:
        if size is None:
            data = _from_json(item["data"], expected, shape, count)
        else:
            data = _from_binary(binary[offset : offset + size], expected, count)
            offset += size
    except (TypeError, ValueError, OverflowError, ArithmeticError) as e:
        raise RefusedError(400, f"input {name!r}: data is not {expected} ({e})") from None
    return name, data.reshape(shape), offset


def _check_shape(name: str, shape: list[int], model_shape: list[Any]) -> None:
    """A shape of the model's rank, with its fixed sizes (an empty model shape is
    ONNX Runtime's for a scalar and for an unknown shape alike: the engine decides).

    Raises:
        RefusedError: it does not fit (400).
    """
    if not model_shape:
        return
    fits = len(shape) == len(model_shape) and all(
        not isinstance(m, int) or m < 0 or m == d for d, m in zip(shape, model_shape, strict=True)
    )
    if not fits:
        raise RefusedError(
            400, f"input {name!r}: shape {shape} does not fit the model's {dims(model_shape)}"
        )


_JSON_KINDS: Final[dict[str, tuple[set[type], str]]] = {
    "BOOL": ({bool}, "true or false"),
    "BYTES": ({str}, "strings"),
    **{t: ({int}, "integers") for t in ("UINT8", "UINT16", "UINT32", "UINT64",
                                         "INT8", "INT16", "INT32", "INT64")},
    **{t: ({int, float}, "numbers") for t in ("FP16", "FP32", "FP64")},
}  # fmt: skip
"""The JSON values each datatype takes (Python's type after ``json.loads``)."""


def _from_json(data: object, datatype: str, shape: list[int], count: int) -> Any:
    """One tensor's values from JSON: a flat list of ``count`` values, or nested lists
    of exactly ``shape`` (a bare value for a scalar).

    Raises:
        ValueError: the data does not hold ``shape`` values of ``datatype``.
        OverflowError: a value out of the datatype's range.
    """
    import numpy as np

    if isinstance(data, list) and not any(isinstance(v, list) for v in data[:1]):
        flat: Any = data  # the common case: a flat list, checked without a copy
        if len(data) != count:
            raise ValueError(f"{len(data)} values for shape {shape}")
    else:
        try:
            flat = np.array(data, dtype=object)
        except ValueError:  # numpy 2 refuses some ragged nestings, keeps others as lists
            flat = None
        if flat is None or any(isinstance(v, list) for v in flat.flat):
            raise ValueError("nested lists of uneven lengths")
        if list(flat.shape) != shape and not (flat.ndim == 1 and flat.size == count):
            raise ValueError(f"nested data of shape {list(flat.shape)} for shape {shape}")
        flat = flat.reshape(-1)
    kinds, said = _JSON_KINDS[datatype]
    found = set(map(type, flat))
    if not found <= kinds:
        odd = sorted(t.__name__.replace("NoneType", "null") for t in found - kinds)
        raise ValueError(f"{datatype} data holds {', '.join(odd)} values, not only {said}")
    if datatype == "BYTES":
        # JSON can spell a lone surrogate ("\ud800"), which ONNX Runtime cannot encode:
        # refused here, it is the request's fault (there, it would be a 500)
        try:
            "".join(flat).encode()
        except UnicodeEncodeError:
            raise ValueError("a BYTES element is not UTF-8 text") from None
        return np.array(flat, dtype=object)
    with np.errstate(over="raise", invalid="raise"):
        try:
            return np.array(flat, dtype=NUMPY_DTYPES[datatype])
        except FloatingPointError:
            raise OverflowError(f"a value out of the range of {datatype}") from None


def _from_binary(raw: memoryview | bytes, datatype: str, count: int) -> Any:
    """One tensor's values from its binary data (little-endian; BOOL one byte 0 or 1;
    BYTES as 4-byte length-prefixed elements, UTF-8 text: ONNX Runtime's strings).

    Raises:
        ValueError: the bytes do not hold ``count`` values of ``datatype``.
    """
    import numpy as np

    if datatype == "BYTES":
        items: list[str] = []
        pos, end = 0, len(raw)
        while pos < end and len(items) < count:
            if pos + 4 > end:
                raise ValueError("a BYTES element's length is cut")
            n = int.from_bytes(raw[pos : pos + 4], "little")
            if pos + 4 + n > end:
                raise ValueError("a BYTES element runs past its data")
            try:
                items.append(str(raw[pos + 4 : pos + 4 + n], "utf-8"))
            except UnicodeDecodeError:
                raise ValueError("a BYTES element is not UTF-8 text") from None
            pos += 4 + n
        if pos != end or len(items) != count:
            raise ValueError(f"{len(raw)} bytes of BYTES data for {count} elements")
        return np.array(items, dtype=object).reshape(-1)
    if datatype == "BOOL":
        flags = np.frombuffer(raw, dtype=np.uint8)
        if flags.size != count or (flags > 1).any():
            raise ValueError(f"BOOL data must be {count} bytes of 0 or 1")
        return flags.astype(bool)
    dtype = np.dtype(NUMPY_DTYPES[datatype]).newbyteorder("<")
    if len(raw) != count * dtype.itemsize:
        raise ValueError(f"{len(raw)} bytes for {count} values of {datatype}")
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))


def _outputs(doc: Mapping[str, Any], known: list[str]) -> tuple[list[str] | None, set[str]]:
    """The outputs asked for (None: all) and which go back as binary data.

    Raises:
        RefusedError: an unknown or repeated output, a parameter of the wrong type, or
            one of an extension this server lacks.
    """
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise RefusedError(400, "the request's parameters must be an object")
    all_binary = params.get("binary_data_output", False)
    if not isinstance(all_binary, bool):
        raise RefusedError(400, "binary_data_output must be true or false")
    binary_out = set(known) if all_binary else set()
    outputs = doc.get("outputs")
    if outputs is None:
        return None, binary_out
    if not isinstance(outputs, list) or not all(
        isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs
    ):
        raise RefusedError(400, "'outputs' is a list of objects with a name")
    wanted = [o["name"] for o in outputs]
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise RefusedError(400, f"unknown output(s) {unknown} (the model has {known})")
    if len(set(wanted)) != len(wanted):
        raise RefusedError(400, "an output is asked for twice")
    for o in outputs:
        p = o.get("parameters", {})
        if not isinstance(p, dict):
            raise RefusedError(400, f"output {o['name']!r}: parameters must be an object")
        if "classification" in p or "shared_memory_region" in p:
            raise RefusedError(400, "the classification and shared memory extensions are "
                                     "not supported")  # fmt: skip
        flag = p.get("binary_data", o["name"] in binary_out)
        if not isinstance(flag, bool):
            raise RefusedError(400, f"output {o['name']!r}: binary_data must be true or false")
        (binary_out.add if flag else binary_out.discard)(o["name"])
    return wanted, binary_out


# --- writing the answer --------------------------------------------------------------


def answer(engine: Any, parsed: Parsed, results: Mapping[str, Any]) -> Response:
    """The inference response: JSON, with the binary outputs' data after it."""
    tail = bytearray()
    answer: dict[str, Any] = {
        "model_name": engine.model,
        "model_version": engine.version,
        "outputs": [
            _tensor_json(name, value, tail if name in parsed.binary_outputs else None)
            for name, value in results.items()
        ],
    }
    if parsed.request_id is not None:
        answer["id"] = parsed.request_id
    headers = {"x-model-version": engine.version}
    if not tail:
        return json_response(answer, headers=headers)
    header = json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode()
    headers[HEADER_LENGTH] = str(len(header))
    return Response(header + bytes(tail), media_type="application/octet-stream",
                    headers=headers)  # fmt: skip


_DATATYPE_OF: Final = {v: k for k, v in NUMPY_DTYPES.items() if k != "BYTES"}


def _tensor_json(name: str, value: Any, binary: bytearray | None = None) -> dict[str, Any]:
    """One output as the protocol writes it; with ``binary``, its data is appended there
    and the JSON gives only its size.

    Raises:
        TypeError: an array of a type the protocol has no name for (a server bug).
    """
    import numpy as np

    array = np.asarray(value)
    if array.dtype.kind in "OUS":
        datatype = "BYTES"
        items = [v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1)]
    else:
        datatype = _DATATYPE_OF.get(array.dtype.name, "")
        if not datatype:
            raise TypeError(f"output {name!r}: no protocol datatype for {array.dtype}")
    tensor: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": datatype}
    if binary is not None:
        start = len(binary)
        if datatype == "BYTES":
            for data in items:
                binary += len(data).to_bytes(4, "little") + data
        else:
            binary += np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
        tensor["parameters"] = {"binary_data_size": len(binary) - start}
    elif datatype == "BYTES":
        tensor["data"] = [v.decode("utf-8", "replace") for v in items]
    else:
        tensor["data"] = array.reshape(-1).tolist()
    return tensor
