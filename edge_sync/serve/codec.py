"""The Open Inference Protocol v2's request and answer encoding (``edge_sync.serve.app``
serves it).

An inference request is untrusted input, read in checked steps before any engine runs,
each allocation charged first to the request's account (``edge_sync.serve.admission``:
413 over :attr:`ServeLimits.max_request_bytes`, 503 over the server's budget):

1. the body, within :attr:`ServeLimits.max_body_bytes` (413), inflated from gzip or
   deflate as ``tritonclient``'s request compression sends it, within the same cap
   (``edge_sync.serve.body``);
2. the JSON header (up to ``Inference-Header-Content-Length``; the rest is binary
   tensor data), its nesting depth measured on the bytes and its worst-case cost
   charged before it is parsed (400);
3. each input: a known name, the model's datatype, a shape of the model's rank and
   fixed sizes, within the model's caps (:class:`ModelCaps`: values, batch; 413), and
   data that holds exactly that shape, decoded straight into an array: JSON values of
   the datatype's kind (flat, or nested as the shape is), or its binary data
   (little-endian; BOOL one byte 0 or 1; BYTES 4-byte length-prefixed elements,
   charged their objects);
4. the outputs asked for, and which go back as binary data; their values, where the
   shapes tell them, within the model's cap (413 before the run; after it otherwise).

Every refusal is a :class:`RefusedError` with the status it answers: 400 (the request's
fault), 413 (over a cap), 415 (an unknown content coding) or 503 (the server is full).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from starlette.responses import Response

from edge_sync.engine.base import DATATYPES
from edge_sync.errors import RefusedError
from edge_sync.serve.answer import answer, json_response
from edge_sync.serve.body import HEADER_LENGTH, TEXT_COST, Charge, Inflating, split
from edge_sync.serve.tensors import array_cost, from_binary, from_json

if TYPE_CHECKING:
    from edge_sync.config import ModelLimits, ServeLimitsConfig
    from edge_sync.engine.base import Engine

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


@dataclass(frozen=True)
class ModelCaps:
    """Caps on one request to a model, from the shapes (413 over them).

    Attributes:
        max_batch: the first dimension of an input whose first dimension the model
            leaves open.
        max_input_elements: values in one input tensor.
        max_output_elements: values of all the outputs of one run.
    """

    max_batch: int = 64
    max_input_elements: int = MAX_ELEMENTS
    max_output_elements: int = MAX_ELEMENTS


@dataclass(frozen=True)
class ServeLimits:
    """Caps on inference requests (untrusted input), one and all together.

    Attributes:
        max_body_bytes: the body, as sent and after any content coding is undone.
        max_json_depth: nesting of the JSON header (400 over it).
        max_request_bytes: what one request may cost decoded (413 over it).
        inflight_bytes: what every request in flight may cost together (503 over it).
        max_concurrent: requests decoded or run at once in worker threads.
        max_queued: requests waiting for one of those (503 over it).
        queue_timeout_s: how long one waits at most (503 after it).
        model: each model's caps, unless ``models`` names it.
        models: the caps of the models named.
    """

    max_body_bytes: int = MAX_BODY_BYTES
    max_json_depth: int = MAX_JSON_DEPTH
    max_request_bytes: int = 256 << 20
    inflight_bytes: int = 512 << 20
    max_concurrent: int = 8
    max_queued: int = 256
    queue_timeout_s: float = 5.0
    model: ModelCaps = ModelCaps()
    models: Mapping[str, ModelCaps] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: ServeLimitsConfig) -> ServeLimits:
        """The limits ``serve.limits`` sets."""

        def caps(m: ModelLimits) -> ModelCaps:
            return ModelCaps(m.max_batch, m.max_input_elements, m.max_output_elements)

        return cls(
            max_body_bytes=config.max_body,
            max_request_bytes=config.max_request,
            inflight_bytes=config.inflight,
            max_concurrent=config.max_concurrent,
            max_queued=config.max_queued,
            queue_timeout_s=config.queue_timeout,
            model=caps(config.model),
            models={name: caps(m) for name, m in config.models.items()},
        )

    def caps(self, model: str) -> ModelCaps:
        """``model``'s caps."""
        return self.models.get(model, self.model)


def error_response(
    status: int, message: str, version: str = "", retry_after: int | None = None
) -> Response:
    headers = {"x-model-version": version} if version else {}
    if retry_after is not None:
        headers["retry-after"] = str(retry_after)
    return json_response({"error": message}, status, headers or None)


def dims(shape: list[Any]) -> list[int]:
    """Symbolic dimensions as -1, as Triton shows them."""
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


# --- reading a request ---------------------------------------------------------------


def read_request(
    body: bytes | bytearray,
    headers: Mapping[str, str],
    engine: Engine,
    limits: ServeLimits,
    charge: Charge | None = None,
) -> Parsed:
    """An inference request's body (as sent, with its headers), read for ``engine``,
    each allocation charged to ``charge`` first (None: nothing is counted).

    Raises:
        RefusedError: see the module docstring.
    """
    charge = charge or _no_charge
    cap, length = limits.max_body_bytes, headers.get(HEADER_LENGTH)
    if length is None:  # all JSON: what the request could not afford to parse
        cap = min(cap, limits.max_request_bytes // TEXT_COST)
    stream = Inflating(body, headers.get("content-encoding", ""), cap, charge)
    reading = _Reading(limits.caps(engine.model), charge)
    if length is not None and length.isascii() and length.isdigit() and not stream.done:
        # the JSON header first: inputs over a cap are refused before the rest inflates
        head, view = split(stream.until(int(length)), length, limits.max_json_depth, charge)
        view.release()  # the inflated bytes grow on
        precharge(head, engine, limits, charge)
        data = stream.finish()
        if len(data) < int(length):
            raise RefusedError(400, f"{HEADER_LENGTH}: {length[:20]!r} is not a length in the body")
        doc, binary = head, memoryview(data)[int(length) :]
        reading = _Reading(reading.caps, charge, precharged=True)
    else:
        doc, binary = split(stream.finish(), length, limits.max_json_depth, charge)
    return _parse_request(doc, engine, binary, reading)


def parse_request(
    doc: Mapping[str, Any],
    engine: Engine,
    binary: memoryview | bytes,
    limits: ServeLimits,
    charge: Charge | None = None,
) -> Parsed:
    """An inference request already in the protocol's JSON form (``doc``; binary data
    in ``binary``, in input order), read for ``engine`` as :func:`read_request` reads a
    body's (the gRPC server's requests: ``edge_sync.serve.grpc_server``).

    Raises:
        RefusedError: see the module docstring.
    """
    return _parse_request(
        doc, engine, binary, _Reading(limits.caps(engine.model), charge or _no_charge)
    )


def _no_charge(_: int) -> None:
    return None


@dataclass(frozen=True)
class _Reading:
    """What reading one request's tensors checks against and charges to."""

    caps: ModelCaps
    charge: Charge
    precharged: bool = False
    """The inputs were charged already (:func:`precharge`)."""


@dataclass
class Parsed:
    """An inference request, read: inputs as arrays, outputs asked for (None: all),
    which of them go back as binary data, and the request's id."""

    inputs: dict[str, Any]
    wanted: list[str] | None
    binary_outputs: set[str]
    request_id: str | None
    max_output_elements: int = MAX_ELEMENTS
    charge: Charge = field(default=_no_charge, repr=False)
    """The request's account: the answer is charged to it too."""


def _parse_request(
    doc: object, engine: Engine, binary: memoryview | bytes, reading: _Reading
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
    declared = {n: (DATATYPES.get(t, t), s) for n, t, s in engine.inputs}
    arrays: dict[str, Any] = {}
    offset = 0
    for item in doc["inputs"]:
        if not isinstance(item, dict):
            raise RefusedError(400, "each input is an object with name, shape, datatype, data")
        name, array, offset = _input(item, declared, binary, offset, reading)
        if name in arrays:
            raise RefusedError(400, f"input {name!r} is given twice")
        arrays[name] = array
    missing = sorted(set(declared) - set(arrays))
    if missing:
        raise RefusedError(400, f"missing input(s) {missing}")
    if offset != len(binary):
        raise RefusedError(400, f"{len(binary) - offset} bytes of binary data no input names")
    wanted, binary_out = _outputs(doc, [n for n, _, _ in engine.outputs])
    cap = reading.caps.max_output_elements
    _check_outputs(engine, arrays, wanted, cap)
    return Parsed(arrays, wanted, binary_out, request_id, cap, reading.charge)


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _spec(
    item: Mapping[str, Any], declared: Mapping[str, tuple[str, list[Any]]], caps: ModelCaps
) -> tuple[str, list[int], int, str, int | None]:
    """One input tensor's description, checked: its name, shape, values, datatype and
    binary data size (None: its data is JSON).

    Raises:
        RefusedError: unknown, a bad shape or datatype, over a cap (413), or neither
            or both of data and binary data.
    """
    name, shape, datatype = item.get("name"), item.get("shape"), item.get("datatype")
    if not isinstance(name, str) or name not in declared:
        raise RefusedError(400, f"unknown input {name!r} (the model takes {sorted(declared)})")
    if not isinstance(shape, list) or not all(_is_size(d) for d in shape) or len(shape) > 32:
        raise RefusedError(400, f"input {name!r}: shape must be a list of sizes")
    count = math.prod(shape)  # exact: numpy's product wraps around at 2**63
    expected, model_shape = declared[name]
    _check_caps(name, shape, count, model_shape, caps)
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
    return name, shape, count, expected, size


def _cost(count: int, datatype: str, size: int | None) -> int:
    """What decoding an input allocates (JSON data: plus a nesting's copy)."""
    return array_cost(datatype, count, 0) + 8 * count if size is None else (
        array_cost(datatype, count, size)
    )  # fmt: skip


def precharge(doc: object, engine: Engine, limits: ServeLimits, charge: Charge) -> None:
    """Check the inputs a request's JSON header describes against the model's caps,
    and charge what decoding them will allocate, before its binary data is inflated
    (then :func:`read_request` charges them no more).

    Raises:
        RefusedError: see :func:`read_request`.
    """
    items = doc.get("inputs") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        return  # refused when it is read
    declared = {n: (DATATYPES.get(t, t), s) for n, t, s in engine.inputs}
    caps = limits.caps(engine.model)
    for item in items:
        if isinstance(item, dict):
            _, _, count, datatype, size = _spec(item, declared, caps)
            charge(_cost(count, datatype, size))


def _input(
    item: Mapping[str, Any],
    declared: Mapping[str, tuple[str, list[Any]]],
    binary: memoryview | bytes,
    offset: int,
    reading: _Reading,
) -> tuple[str, Any, int]:
    """One input tensor: its name, its array, and where the next binary data starts.

    Raises:
        RefusedError: unknown, a bad shape or datatype, or data that does not fit.
    """
    name, shape, count, expected, size = _spec(item, declared, reading.caps)
    if size is not None and offset + size > len(binary):
        raise RefusedError(400, f"input {name!r}: binary data past the body's end")
    if not reading.precharged:
        reading.charge(_cost(count, expected, size))
    try:
        if size is None:
            data = from_json(item["data"], expected, shape, count)
        else:
            data = from_binary(binary[offset : offset + size], expected, count)
            offset += size
        # in the try: zero values in a shape numpy cannot make (every cap passed) are
        # the request's fault, not a 500 with a traceback in the log
        data = data.reshape(shape)
    except (TypeError, ValueError, OverflowError, ArithmeticError) as e:
        raise RefusedError(400, f"input {name!r}: data is not {expected} ({e})") from None
    return name, data, offset


def _check_caps(
    name: str, shape: list[int], count: int, model_shape: list[Any], caps: ModelCaps
) -> None:
    """An input within the model's caps: its values, and its batch (the first
    dimension, where the model leaves it open).

    Raises:
        RefusedError: over one (413).
    """
    if count > caps.max_input_elements:
        raise RefusedError(413, f"input {name!r}: {count} values, over {caps.max_input_elements}")
    if shape and model_shape and not _fixed(model_shape[0]) and shape[0] > caps.max_batch:
        raise RefusedError(
            413, f"input {name!r}: batch of {shape[0]}, over this model's {caps.max_batch}"
        )


def _fixed(dim: object) -> bool:
    return isinstance(dim, int) and dim >= 0


def _check_outputs(
    engine: Engine, arrays: Mapping[str, Any], wanted: list[str] | None, cap: int
) -> None:
    """Refuse a run whose outputs would hold over ``cap`` values, where the model's
    output shapes tell it from the inputs' (fixed sizes, or dimensions named like an
    input's); outputs of other shapes are counted after the run (:func:`answer`).

    Raises:
        RefusedError: over the cap (413).
    """
    named: dict[str, int] = {}
    for name, _, shape in engine.inputs:
        array = arrays.get(name)
        if array is not None and len(shape) == array.ndim:
            named.update(
                {d: n for d, n in zip(shape, array.shape, strict=True) if isinstance(d, str)}
            )
    total = 0
    for name, _, shape in engine.outputs:
        if not shape or (wanted is not None and name not in wanted):
            continue
        count = 1
        for dim in shape:
            size = dim if _fixed(dim) else named.get(dim)
            if size is None:
                break  # not known before the run
            count *= size
        else:
            total += count
    if total > cap:
        raise RefusedError(413, f"the outputs would hold {total} values, over this model's {cap}")


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
