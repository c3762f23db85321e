"""Open Inference Protocol v2 (REST) on the device: health, metadata, JSON inference,
and ``/status`` (SPEC section 7).

A first step of the serving issue: requests are answered from the engine each model
serves now (:meth:`EngineHost.current`); a request holds the engine it started on, so a
swap never breaks one in flight; every response names the version that computed it.
Requests are counted at ``/metrics`` (``edge_sync.metrics``).  The binary tensor data
extension and the memory budget come next.

Runs on Starlette (ASGI) under uvicorn; inference runs in a worker thread, so the event
loop keeps answering while a model computes.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge_sync.engine import DATATYPES, NUMPY_DTYPES
from edge_sync.metrics import CONTENT_TYPE, Metrics

if TYPE_CHECKING:
    from edge_sync.engine import EngineHost
    from edge_sync.health import Recorder

__all__ = ["MAX_BODY_BYTES", "create_app"]

MAX_BODY_BYTES: Final = 64 << 20
"""Largest request body accepted (larger ones get 413)."""
HEADER_LENGTH: Final = "inference-header-content-length"
"""Where the JSON header of a binary-data request or response ends."""
MAX_ELEMENTS: Final = 1 << 24
"""Most values one input tensor may hold."""


class _RefusedError(Exception):
    """A request the server answers with ``{"error": ...}`` and ``status``."""

    def __init__(self, status: int, message: str, version: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.version = version
        """The version whose engine refused it ("" when none was reached)."""


def _error(status: int, message: str, version: str = "") -> JSONResponse:
    headers = {"x-model-version": version} if version else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _dims(shape: list[Any]) -> list[int]:
    """Symbolic dimensions as -1, as Triton shows them."""
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


def create_app(
    host: EngineHost,
    models: list[str],
    status: Callable[[], Mapping[str, Any]],
    version: str,
    *,
    metrics: Metrics | None = None,
    request_sync: Callable[[], None] | None = None,
    recorder: Recorder | None = None,
) -> Starlette:
    """The OIP v2 application serving ``models`` from ``host``.

    Args:
        host: where each model's serving engine is.
        models: the subscribed model names.
        status: the ``edge status --json`` document, made on demand.
        version: this server's version (``/v2``).
        metrics: where requests are counted (``/metrics``); a fresh one by default.
        request_sync: asks the daemon to sync now (``POST /v2/repository/sync``, from
            loopback only).
        recorder: where each answer's outcome and latency go for the health gate.
    """
    api = _Api(host, models, status, version, metrics or Metrics(), request_sync)
    api.recorder = recorder
    routes = [
        Route("/v2/health/live", api.live),
        Route("/v2/health/ready", api.ready),
        Route("/v2", api.server),
        Route("/v2/models/{model}", api.metadata),
        Route("/v2/models/{model}/versions/{version}", api.metadata),
        Route("/v2/models/{model}/ready", api.model_ready),
        Route("/v2/models/{model}/versions/{version}/ready", api.model_ready),
        Route("/v2/models/{model}/config", api.model_config),
        Route("/v2/models/{model}/versions/{version}/config", api.model_config),
        Route("/v2/models/{model}/infer", api.infer, methods=["POST"]),
        Route("/v2/models/{model}/versions/{version}/infer", api.infer, methods=["POST"]),
        Route("/v2/repository/index", api.repository_index, methods=["POST"]),
        Route("/v2/repository/sync", api.repository_sync, methods=["POST"]),
        Route("/status", api.status_route),
        Route("/metrics", api.metrics_route),
    ]
    return Starlette(routes=routes)


class _Api:
    """The route handlers, over one host and its subscribed models."""

    def __init__(  # noqa: PLR0917 - built once, by create_app
        self,
        host: EngineHost,
        models: list[str],
        status: Callable[[], Mapping[str, Any]],
        version: str,
        metrics: Metrics,
        request_sync: Callable[[], None] | None,
    ) -> None:
        self.host, self.models, self.status, self.version = host, models, status, version
        self.metrics, self.request_sync = metrics, request_sync
        self.recorder: Recorder | None = None

    @contextlib.contextmanager
    def engine_for(self, request: Request) -> Iterator[Any]:
        """The engine for the request's model (and version, when named), held until the
        request is done: a swap never releases it under a request.

        Raises:
            _RefusedError: unknown model (404), not loaded yet (503), no such version
                loaded (404).
        """
        name = request.path_params["model"]
        if name not in self.models:
            raise _RefusedError(404, f"unknown model {name!r}")
        wanted = request.path_params.get("version")
        try:
            lease = self.host.lease(name, wanted)
            engine = lease.__enter__()
        except LookupError:
            if wanted is None or self.host.current(name) is None:
                raise _RefusedError(503, f"model {name!r} is not loaded yet") from None
            raise _RefusedError(404, f"model {name!r} has no loaded version {wanted!r}") from None
        try:
            yield engine
        finally:
            lease.__exit__(None, None, None)

    async def live(self, _: Request) -> JSONResponse:
        return JSONResponse({"live": True})

    async def ready(self, _: Request) -> JSONResponse:
        ok = all(self.host.current(m) is not None for m in self.models)
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    async def server(self, _: Request) -> JSONResponse:
        return JSONResponse(
            {"name": "modelreg", "version": self.version, "extensions": ["binary_tensor_data"]}
        )

    async def metadata(self, request: Request) -> JSONResponse:
        try:
            with self.engine_for(request) as engine:
                pass
        except _RefusedError as e:
            return _error(e.status, str(e))
        return JSONResponse(
            {
                "name": engine.model,
                "versions": self.host.versions(engine.model) or [engine.version],
                "platform": "onnxruntime_onnx",
                "inputs": _specs(getattr(engine, "inputs", [])),
                "outputs": _specs(getattr(engine, "outputs", [])),
            }
        )

    async def model_ready(self, request: Request) -> JSONResponse:
        try:
            with self.engine_for(request):
                pass
        except _RefusedError as e:
            return _error(e.status, str(e))
        return JSONResponse({"name": request.path_params["model"], "ready": True})

    async def model_config(self, request: Request) -> JSONResponse:
        """The model's configuration as Triton's clients read it."""
        try:
            with self.engine_for(request) as engine:
                pass
        except _RefusedError as e:
            return _error(e.status, str(e))

        def tensors(specs: list[Any]) -> list[dict[str, Any]]:
            return [
                {"name": s["name"], "dims": s["shape"],
                 "data_type": "TYPE_" + s["datatype"].replace("BYTES", "STRING")}
                for s in _specs(specs)
            ]  # fmt: skip

        return JSONResponse(
            {
                "name": engine.model,
                "platform": "onnxruntime_onnx",
                "backend": "onnxruntime",
                "max_batch_size": 0,
                "input": tensors(getattr(engine, "inputs", [])),
                "output": tensors(getattr(engine, "outputs", [])),
            }
        )

    async def infer(self, request: Request) -> Response:
        start = time.perf_counter()
        name = request.path_params["model"]
        response = await self._infer(request)
        version = response.headers.get("x-model-version", "")
        outcome = "ok" if response.status_code == 200 else f"http_{response.status_code}"
        seconds = time.perf_counter() - start
        if name in self.models:  # unknown names are not label values
            self.metrics.request(name, version, outcome, seconds)
            code = response.status_code
            if self.recorder is not None and version and (code == 200 or code >= 500):
                self.recorder.record(name, version, error=code >= 500, seconds=seconds)
        return response

    async def _infer(self, request: Request) -> Response:
        try:
            doc, binary = await _read_body(request)
            with self.engine_for(request) as engine:  # held until it answered
                parsed = _parse_request(doc, engine, binary)
                try:
                    results = await run_in_threadpool(engine.run, parsed.inputs, parsed.wanted)
                except Exception as e:  # noqa: BLE001 - ORT raises many types for bad inputs
                    first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
                    # ONNX Runtime's InvalidArgument: the input's fault; else the engine's
                    code = 400 if type(e).__name__ == "InvalidArgument" else 500
                    message = f"inference failed: {first}"
                    raise _RefusedError(code, message, engine.version) from None
        except _RefusedError as e:
            return _error(e.status, str(e), e.version)
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
            return JSONResponse(answer, headers=headers)
        header = json.dumps(answer, separators=(",", ":")).encode()
        headers[HEADER_LENGTH] = str(len(header))
        return Response(header + bytes(tail), media_type="application/octet-stream",
                        headers=headers)  # fmt: skip

    async def repository_index(self, _: Request) -> JSONResponse:
        """Every subscribed model and whether it is served (Triton's repository index)."""
        index = []
        for name in self.models:
            engine = self.host.current(name)
            index.append(
                {"name": name, "version": engine.version, "state": "READY", "reason": ""}
                if engine is not None
                else {"name": name, "version": "", "state": "UNAVAILABLE",
                      "reason": "not installed yet"}
            )  # fmt: skip
        return JSONResponse(index)

    async def repository_sync(self, request: Request) -> JSONResponse:
        """Sync now (what SIGHUP does); only from this machine."""
        client = request.client.host if request.client else ""
        if client not in ("127.0.0.1", "::1"):
            return _error(403, "a sync is asked for from this machine only")
        if self.request_sync is None:
            return _error(503, "this server runs no update loop")
        self.request_sync()
        return JSONResponse({"sync": "requested"})

    async def status_route(self, _: Request) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(self.status))

    async def metrics_route(self, _: Request) -> Response:
        return Response(self.metrics.text(), media_type=CONTENT_TYPE)


def _specs(specs: list[Any]) -> list[dict[str, Any]]:
    """(name, ORT type, shape) as the protocol's tensor metadata."""
    return [{"name": n, "datatype": DATATYPES.get(t, t), "shape": _dims(s)} for n, t, s in specs]


async def _read_body(request: Request) -> tuple[object, bytes]:
    """The request's JSON document and the binary tensor data after it, read within
    :data:`MAX_BODY_BYTES` (the binary data extension: ``Inference-Header-Content-Length``
    says where the JSON ends).

    Raises:
        _RefusedError: too large (413), not JSON or a bad header length (400).
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _RefusedError(413, f"request body over {MAX_BODY_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _RefusedError(413, f"request body over {MAX_BODY_BYTES} bytes")
    split = request.headers.get(HEADER_LENGTH)
    if split is not None and (not split.isdigit() or int(split) > len(body)):
        raise _RefusedError(400, f"{HEADER_LENGTH}: {split[:20]!r} is not a length in the body")
    cut = int(split) if split is not None else len(body)
    try:
        return json.loads(body[:cut]), bytes(body[cut:])
    except (ValueError, RecursionError):
        raise _RefusedError(400, "the request's JSON header is not JSON") from None


@dataclass
class _Parsed:
    """An inference request, read: inputs as arrays, outputs asked for (None: all),
    which of them go back as binary data, and the request's id."""

    inputs: dict[str, Any]
    wanted: list[str] | None
    binary_outputs: set[str]
    request_id: Any


def _parse_request(doc: object, engine: Any, binary: bytes = b"") -> _Parsed:
    """Read an inference request (JSON tensors, or binary ones after the header).

    Raises:
        _RefusedError: not an inference request, or a tensor whose data does not fit.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise _RefusedError(400, "an inference request needs an 'inputs' list")
    declared = {n: t for n, t, _ in getattr(engine, "inputs", [])}
    arrays: dict[str, Any] = {}
    offset = 0
    for item in doc["inputs"]:
        if not isinstance(item, dict):
            raise _RefusedError(400, "each input is an object with name, shape, datatype, data")
        name, array, offset = _input(item, declared, binary, offset)
        arrays[name] = array
    missing = sorted(set(declared) - set(arrays))
    if missing:
        raise _RefusedError(400, f"missing input(s) {missing}")
    if offset != len(binary):
        raise _RefusedError(400, f"{len(binary) - offset} bytes of binary data no input names")
    wanted, binary_out = _outputs(doc, [n for n, _, _ in getattr(engine, "outputs", [])])
    return _Parsed(arrays, wanted, binary_out, doc.get("id"))


def _input(
    item: Mapping[str, Any], declared: Mapping[str, str], binary: bytes, offset: int
) -> tuple[str, Any, int]:
    """One input tensor: its name, its array, and where the next binary data starts.

    Raises:
        _RefusedError: unknown, a bad shape or datatype, or data that does not fit.
    """
    import numpy as np

    name, shape, datatype = item.get("name"), item.get("shape"), item.get("datatype")
    if not isinstance(name, str) or name not in declared:
        raise _RefusedError(400, f"unknown input {name!r} (the model takes {sorted(declared)})")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise _RefusedError(400, f"input {name!r}: shape must be a list of sizes")
    count = int(np.prod(shape)) if shape else 1
    if count > MAX_ELEMENTS:
        raise _RefusedError(413, f"input {name!r}: {count} values, over {MAX_ELEMENTS}")
    expected = DATATYPES.get(declared[name], "")
    if datatype != expected:
        raise _RefusedError(
            400, f"input {name!r}: datatype {datatype!r}, the model takes {expected}"
        )
    size = _binary_size(item)
    if size is not None and offset + size > len(binary):
        raise _RefusedError(400, f"input {name!r}: binary data past the body's end")
    try:
        if size is None:
            data = np.asarray(item.get("data"), dtype=NUMPY_DTYPES[expected])
        else:
            data = _from_binary(binary[offset : offset + size], expected, count)
            offset += size
    except (TypeError, ValueError, OverflowError):
        raise _RefusedError(400, f"input {name!r}: data is not {datatype}") from None
    if data.size != count:
        raise _RefusedError(400, f"input {name!r}: {data.size} values for shape {shape}")
    return name, data.reshape(shape), offset


def _outputs(doc: Mapping[str, Any], known: list[str]) -> tuple[list[str] | None, set[str]]:
    """The outputs asked for (None: all) and which go back as binary data.

    Raises:
        _RefusedError: an unknown output.
    """
    params = doc.get("parameters")
    all_binary = isinstance(params, dict) and bool(params.get("binary_data_output"))
    binary_out = set(known) if all_binary else set()
    outputs = doc.get("outputs")
    if not isinstance(outputs, list):
        return None, binary_out
    wanted = [str(o.get("name")) for o in outputs if isinstance(o, dict)]
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise _RefusedError(400, f"unknown output(s) {unknown}")
    for o in outputs:
        p = o.get("parameters") if isinstance(o, dict) else None
        if isinstance(p, dict) and "binary_data" in p:
            if p["binary_data"]:
                binary_out.add(str(o["name"]))
            else:
                binary_out.discard(str(o["name"]))
    return wanted, binary_out


def _binary_size(item: Mapping[str, Any]) -> int | None:
    params = item.get("parameters")
    size = params.get("binary_data_size") if isinstance(params, dict) else None
    if size is None:
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise _RefusedError(400, f"input {item.get('name')!r}: binary_data_size is not a size")
    return size


def _from_binary(raw: bytes, datatype: str, count: int) -> Any:
    """One tensor's values from its binary data (little-endian; BYTES as 4-byte
    length-prefixed elements).

    Raises:
        ValueError: the bytes do not hold ``count`` values of ``datatype``.
    """
    import numpy as np

    if datatype == "BYTES":
        items, pos = [], 0
        while pos < len(raw):
            if pos + 4 > len(raw):
                raise ValueError("a BYTES element's length is cut")
            n = int.from_bytes(raw[pos : pos + 4], "little")
            items.append(raw[pos + 4 : pos + 4 + n])
            pos += 4 + n
        if pos != len(raw) or len(items) != count:
            raise ValueError("BYTES elements do not match the shape")
        return np.array(items, dtype=object)
    dtype = np.dtype(NUMPY_DTYPES[datatype]).newbyteorder("<")
    if len(raw) != count * dtype.itemsize:
        raise ValueError(f"{len(raw)} bytes for {count} values of {datatype}")
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))


def _to_binary(array: Any) -> bytes:
    import numpy as np

    if array.dtype.kind in "OUS":
        out = bytearray()
        for item in array.reshape(-1):
            data = item if isinstance(item, bytes) else str(item).encode()
            out += len(data).to_bytes(4, "little") + data
        return bytes(out)
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()


def _tensor_json(name: str, value: Any, binary: bytearray | None = None) -> dict[str, Any]:
    """One output as the protocol writes it; with ``binary``, its data is appended there
    and the JSON gives only its size."""
    import numpy as np

    array = np.asarray(value)
    kind = {"b": "BOOL", "O": "BYTES", "U": "BYTES", "S": "BYTES"}.get(array.dtype.kind)
    datatype = kind or {v: k for k, v in NUMPY_DTYPES.items()}.get(str(array.dtype), "FP32")
    tensor: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": datatype}
    if binary is not None:
        data = _to_binary(array)
        binary += data
        tensor["parameters"] = {"binary_data_size": len(data)}
        return tensor
    decoded = array.astype(str) if kind == "BYTES" else array
    tensor["data"] = decoded.reshape(-1).tolist()
    return tensor
