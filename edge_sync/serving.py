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

import json
import time
from collections.abc import Callable, Mapping
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

__all__ = ["MAX_BODY_BYTES", "create_app"]

MAX_BODY_BYTES: Final = 64 << 20
"""Largest request body accepted (larger ones get 413)."""
MAX_ELEMENTS: Final = 1 << 24
"""Most values one input tensor may hold."""


class _RefusedError(Exception):
    """A request the server answers with ``{"error": ...}`` and ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


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
    """
    api = _Api(host, models, status, version, metrics or Metrics(), request_sync)
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

    def engine_for(self, request: Request) -> Any:
        """The engine serving the request's model (and version, when named).

        Raises:
            _RefusedError: unknown model (404), not loaded yet (503), no such version (404).
        """
        name = request.path_params["model"]
        if name not in self.models:
            raise _RefusedError(404, f"unknown model {name!r}")
        engine = self.host.current(name)
        if engine is None:
            raise _RefusedError(503, f"model {name!r} is not loaded yet")
        wanted = request.path_params.get("version")
        if wanted is not None and wanted != engine.version:
            raise _RefusedError(404, f"model {name!r} has no loaded version {wanted!r}")
        return engine

    async def live(self, _: Request) -> JSONResponse:
        return JSONResponse({"live": True})

    async def ready(self, _: Request) -> JSONResponse:
        ok = all(self.host.current(m) is not None for m in self.models)
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    async def server(self, _: Request) -> JSONResponse:
        return JSONResponse({"name": "modelreg", "version": self.version, "extensions": []})

    async def metadata(self, request: Request) -> JSONResponse:
        try:
            engine = self.engine_for(request)
        except _RefusedError as e:
            return _error(e.status, str(e))
        return JSONResponse(
            {
                "name": engine.model,
                "versions": [engine.version],
                "platform": "onnxruntime_onnx",
                "inputs": _specs(getattr(engine, "inputs", [])),
                "outputs": _specs(getattr(engine, "outputs", [])),
            }
        )

    async def model_ready(self, request: Request) -> JSONResponse:
        try:
            self.engine_for(request)
        except _RefusedError as e:
            return _error(e.status, str(e))
        return JSONResponse({"name": request.path_params["model"], "ready": True})

    async def model_config(self, request: Request) -> JSONResponse:
        """The model's configuration as Triton's clients read it."""
        try:
            engine = self.engine_for(request)
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

    async def infer(self, request: Request) -> JSONResponse:
        start = time.perf_counter()
        name = request.path_params["model"]
        response = await self._infer(request)
        version = response.headers.get("x-model-version", "")
        outcome = "ok" if response.status_code == 200 else f"http_{response.status_code}"
        if name in self.models:  # unknown names are not label values
            self.metrics.request(name, version, outcome, time.perf_counter() - start)
        return response

    async def _infer(self, request: Request) -> JSONResponse:
        try:
            engine = self.engine_for(request)  # held until the answer: a swap cannot break it
            inputs, wanted, request_id = _parse_request(await _json_body(request), engine)
            try:
                results = await run_in_threadpool(engine.run, inputs, wanted)
            except Exception as e:  # noqa: BLE001 - ORT raises many types for bad inputs
                first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
                raise _RefusedError(400, f"inference failed: {first}") from None
        except _RefusedError as e:
            return _error(e.status, str(e))
        answer: dict[str, Any] = {
            "model_name": engine.model,
            "model_version": engine.version,
            "outputs": [_tensor_json(name, value) for name, value in results.items()],
        }
        if request_id is not None:
            answer["id"] = request_id
        return JSONResponse(answer, headers={"x-model-version": engine.version})

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


async def _json_body(request: Request) -> object:
    """The request's JSON body, read within :data:`MAX_BODY_BYTES`.

    Raises:
        _RefusedError: too large (413) or not JSON (400).
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _RefusedError(413, f"request body over {MAX_BODY_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _RefusedError(413, f"request body over {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise _RefusedError(400, "the request body is not JSON") from None


def _parse_request(doc: object, engine: Any) -> tuple[dict[str, Any], list[str] | None, Any]:
    """Inputs as arrays, the outputs asked for, and the request id.

    Raises:
        _RefusedError: not an inference request, or a tensor whose data does not fit.
    """
    import numpy as np

    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise _RefusedError(400, "an inference request needs an 'inputs' list")
    declared = {n: t for n, t, _ in getattr(engine, "inputs", [])}
    arrays: dict[str, Any] = {}
    for item in doc["inputs"]:
        if not isinstance(item, dict):
            raise _RefusedError(400, "each input is an object with name, shape, datatype, data")
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
        try:
            data = np.asarray(item.get("data"), dtype=NUMPY_DTYPES[expected])
        except (TypeError, ValueError, OverflowError):
            raise _RefusedError(400, f"input {name!r}: data is not {datatype}") from None
        if data.size != count:
            raise _RefusedError(400, f"input {name!r}: {data.size} values for shape {shape}")
        arrays[name] = data.reshape(shape)
    missing = sorted(set(declared) - set(arrays))
    if missing:
        raise _RefusedError(400, f"missing input(s) {missing}")
    outputs = doc.get("outputs")
    wanted: list[str] | None = None
    if isinstance(outputs, list):
        wanted = [str(o.get("name")) for o in outputs if isinstance(o, dict)]
        known = {n for n, _, _ in getattr(engine, "outputs", [])}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise _RefusedError(400, f"unknown output(s) {unknown}")
    return arrays, wanted, doc.get("id")


def _tensor_json(name: str, value: Any) -> dict[str, Any]:
    import numpy as np

    array = np.asarray(value)
    kind = {"b": "BOOL", "O": "BYTES", "U": "BYTES", "S": "BYTES"}.get(array.dtype.kind)
    datatype = kind or {v: k for k, v in NUMPY_DTYPES.items()}.get(str(array.dtype), "FP32")
    data = array.astype(str) if kind == "BYTES" else array
    return {
        "name": name,
        "shape": list(array.shape),
        "datatype": datatype,
        "data": data.reshape(-1).tolist(),
    }
