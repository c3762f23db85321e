"""The Open Inference Protocol v2's answer to an inference request (``edge_sync.serve.codec``
reads the request): JSON, with the binary outputs' data after it, charged to the
request's account before it is encoded."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson
from starlette.responses import Response

from edge_sync.engine.base import NUMPY_DTYPES
from edge_sync.errors import RefusedError
from edge_sync.serve.body import HEADER_LENGTH

if TYPE_CHECKING:
    from edge_sync.engine.base import Engine
    from edge_sync.serve.codec import Parsed

__all__ = [
    "BYTES_ELEMENT_COST",
    "SERVED_DIGEST",
    "answer",
    "json_response",
    "outputs",
    "raw_tensor",
]

BYTES_ELEMENT_COST: Final = 64 + 48
"""Bytes one BYTES element may cost beyond its text: a Python string (its object and
its slot in the array) and ONNX Runtime's own string."""
_JSON_MEDIA: Final = "application/json"


SERVED_DIGEST: Final = "model_sha256"
"""The response parameter naming the SHA-256 of the signed artifact that answered."""


def _dumps(doc: object, finite: bool) -> bytes:
    """``doc`` as compact JSON: by orjson when every float in it is finite (ten times
    faster), else as :func:`json_response` writes NaN and infinities."""
    if finite:
        return orjson.dumps(doc)
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def json_response(
    doc: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    # NaN and infinities are written as NaN / Infinity, as Triton writes them (a model
    # may compute them; JSON has no other way to say so and Starlette refuses them).
    body = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    return Response(body, status_code=status, headers=headers, media_type=_JSON_MEDIA)


def answer(engine: Engine, parsed: Parsed, results: Mapping[str, Any]) -> Response:
    """The inference response: JSON, with the binary outputs' data after it; the
    outputs and their encoding charged to the request first.

    Raises:
        RefusedError: the outputs hold more values than the model's cap (413), or
            what the request's account raises.
    """
    arrays = outputs(engine, parsed, results)
    tail = bytearray()
    answer: dict[str, Any] = {
        "model_name": engine.model,
        "model_version": engine.version,
        "outputs": [
            _tensor_json(name, value, tail if name in parsed.binary_outputs else None)
            for name, value in arrays.items()
        ],
    }
    if parsed.request_id is not None:
        answer["id"] = parsed.request_id
    headers = {"x-model-version": engine.version}
    digest = engine.request.served_sha256
    if digest is not None:
        # the signed artifact whose engine computed this answer (issue 28): a client
        # can tie any prediction to a signed, approved release
        answer["parameters"] = {SERVED_DIGEST: digest}
        headers["x-model-sha256"] = digest
    # a sum is finite only when every value is (an overflow just takes the slow path)
    finite = all(
        n in parsed.binary_outputs or a.dtype.kind != "f" or math.isfinite(a.sum())
        for n, a in arrays.items()
    )
    header = _dumps(answer, finite)
    if not tail:
        return Response(header, headers=headers, media_type=_JSON_MEDIA)
    headers[HEADER_LENGTH] = str(len(header))
    return Response(header + bytes(tail), media_type="application/octet-stream",
                    headers=headers)  # fmt: skip


def outputs(
    engine: Engine, parsed: Parsed, results: Mapping[str, Any], *, binary: bool = False
) -> dict[str, Any]:
    """The run's outputs as arrays, within the model's cap of output values and
    charged to the request (as they will be encoded: ``binary`` all of them, else as
    the request asked).

    Raises:
        RefusedError: over the cap (413), or what the request's account raises.
    """
    import numpy as np

    arrays = {name: np.asarray(value) for name, value in results.items()}
    values = sum(a.size for a in arrays.values())
    if values > parsed.max_output_elements:
        raise RefusedError(
            413,
            f"the outputs hold {values} values, over this model's {parsed.max_output_elements}",
            engine.version,
        )
    parsed.charge(
        sum(_answer_cost(a, binary or n in parsed.binary_outputs) for n, a in arrays.items())
    )
    return arrays


def raw_tensor(name: str, value: Any) -> tuple[str, list[int], bytes]:
    """One output's datatype, shape and raw little-endian bytes (BYTES: each element a
    4-byte length and its bytes), as the binary data extension and gRPC carry it.

    Raises:
        TypeError: an array of a type the protocol has no name for (a server bug).
    """
    data = bytearray()
    tensor = _tensor_json(name, value, data)
    return tensor["datatype"], tensor["shape"], bytes(data)


def _answer_cost(array: Any, binary: bool) -> int:
    """What an output holds and costs encoded: binary data copied three times (the tail,
    the body, the response), or JSON values as Python objects and text."""
    if array.dtype.kind in "OUS":
        text = sum(len(v) if isinstance(v, (str, bytes)) else 64 for v in array.reshape(-1))
        return int(array.size) * 2 * BYTES_ELEMENT_COST + 12 * text
    nbytes, size = int(array.nbytes), int(array.size)
    return nbytes * 4 if binary else nbytes + size * 96


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
