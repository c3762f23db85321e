"""One tensor's values decoded straight into an array (``edge_sync.serve.codec`` reads
the request around them), and what decoding them allocates (charged before)."""

from __future__ import annotations

from typing import Any, Final

from edge_sync.engine.base import NUMPY_DTYPES
from edge_sync.serve.answer import BYTES_ELEMENT_COST

__all__ = ["array_cost", "from_binary", "from_json"]

_ITEM_BYTES: Final = {
    "BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "UINT32": 4,
    "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8,
}  # fmt: skip


def array_cost(datatype: str, count: int, size: int) -> int:
    """What decoding ``count`` values of ``datatype`` from ``size`` bytes of data
    allocates: the array (with numpy's byte-order copy), or for BYTES every element's
    objects and up to four bytes a byte of text (a wide Python string)."""
    if datatype == "BYTES":
        return count * BYTES_ELEMENT_COST + 4 * size
    return 2 * count * _ITEM_BYTES[datatype]


_JSON_KINDS: Final[dict[str, tuple[set[type], str]]] = {
    "BOOL": ({bool}, "true or false"),
    "BYTES": ({str}, "strings"),
    **{t: ({int}, "integers") for t in ("UINT8", "UINT16", "UINT32", "UINT64",
                                         "INT8", "INT16", "INT32", "INT64")},
    **{t: ({int, float}, "numbers") for t in ("FP16", "FP32", "FP64")},
}  # fmt: skip
"""The JSON values each datatype takes (Python's type after ``json.loads``)."""


def from_json(data: object, datatype: str, shape: list[int], count: int) -> Any:
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


def from_binary(raw: memoryview | bytes, datatype: str, count: int) -> Any:
    """One tensor's values from its binary data (little-endian; BOOL one byte 0 or 1;
    BYTES as 4-byte length-prefixed elements, UTF-8 text: ONNX Runtime's strings).

    Raises:
        ValueError: the bytes do not hold ``count`` values of ``datatype``.
    """
    import numpy as np

    if datatype == "BYTES":
        items = np.empty(count, dtype=object)  # filled in place: no list beside it
        pos, end = 0, len(raw)
        for i in range(count):
            if pos + 4 > end:
                raise ValueError("a BYTES element's length is cut")
            n = int.from_bytes(raw[pos : pos + 4], "little")
            if pos + 4 + n > end:
                raise ValueError("a BYTES element runs past its data")
            try:
                items[i] = str(raw[pos + 4 : pos + 4 + n], "utf-8")
            except UnicodeDecodeError:
                raise ValueError("a BYTES element is not UTF-8 text") from None
            pos += 4 + n
        if pos != end:
            raise ValueError(f"{len(raw)} bytes of BYTES data for {count} elements")
        return items
    if datatype == "BOOL":
        flags = np.frombuffer(raw, dtype=np.uint8)
        if flags.size != count or (flags > 1).any():
            raise ValueError(f"BOOL data must be {count} bytes of 0 or 1")
        return flags.astype(bool)
    dtype = np.dtype(NUMPY_DTYPES[datatype]).newbyteorder("<")
    if len(raw) != count * dtype.itemsize:
        raise ValueError(f"{len(raw)} bytes for {count} values of {datatype}")
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))
