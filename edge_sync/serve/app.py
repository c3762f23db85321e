"""Open Inference Protocol v2 (REST) on the device: health, metadata, inference with
the binary tensor data extension, Triton's model configuration and repository index,
and ``/status`` (docs/reference/daemon.md).

Requests are answered from the engine each model serves now (:meth:`EngineHost.current`);
a request holds the engine it started on, so a swap never breaks one in flight; every
response names the version that computed it.  Requests are counted at ``/metrics``
(``edge_sync.serve.metrics``).

An inference request is untrusted input, read and checked by ``edge_sync.serve.codec``
before any engine runs; every refusal is ``{"error": "..."}`` with 400 (the request's
fault), 404 (no such model or loaded version), 413 (over a cap), 415 (an unknown content
coding) or 503 (not loaded yet); an engine that fails on a valid request is 500 (ONNX
Runtime's InvalidArgument is the request's fault: 400, as is a failure every other
loaded version makes too: the health gate does not count it against a new version).

Runs on Starlette (ASGI) under uvicorn (with uvloop and httptools; the connection
bounds are ``edge_sync.serve.listeners``). A request to a model whose runs are short
(:data:`INLINE_RUN_S`) with a small body sent as it is (no content coding) is answered
on the event loop (by :meth:`RestApp.answer_now` from the listener's protocol when its
body came with its head); others are decoded, run and encoded in a worker thread, within
``edge_sync.serve.admission``'s concurrency limit and budget of decoded bytes in flight (503
with ``Retry-After`` over them), so the loop keeps answering health and metadata while
large requests are read or a model computes.  With ``management=False`` (the daemon's
``serve.management_listen``), ``/status`` and ``/metrics`` are left to
:func:`create_management_app`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from edge_sync.engine.base import DATATYPES
from edge_sync.engine.heap import trim_heap
from edge_sync.serve.admission import Ticket
from edge_sync.serve.body import HEADER_LENGTH, Charge
from edge_sync.serve.codec import (
    MAX_BODY_BYTES,
    RefusedError,
    ServeLimits,
    answer,
    dims,
    error_response,
    json_response,
    read_request,
)
from edge_sync.serve.core import Inference, Work, quick
from edge_sync.serve.metrics import CONTENT_TYPE, Metrics

if TYPE_CHECKING:
    from edge_sync.engine.base import Engine, EngineHost, TensorDecl
    from edge_sync.serve.recorder import Recorder

__all__ = [
    "MAX_BODY_BYTES",
    "RestApp",
    "ServeLimits",
    "create_app",
    "create_management_app",
    "create_rest_app",
]

INLINE_BODY_BYTES: Final = 64 << 10
ANSWER_KEY: Final = "modelreg.answer"
"""In an ASGI scope: the answer :meth:`RestApp.answer_now` computed, for the ASGI call
to send (one too large to write at once)."""
SETTLE_AFTER_BYTES: Final = 1 << 20
"""A request that held more is given back only once its answer is sent (a background
task); a smaller one at once (its answer is small)."""
SEND_CHUNK: Final = 256 << 10
"""A large answer is handed to the connection this much at a time, each piece once
the client took the one before (written whole, a client that reads nothing kept it
all in the connection's buffer, outside the budget)."""


def create_app(
    host: EngineHost,
    models: list[str],
    status: Callable[[], Mapping[str, Any]],
    version: str,
    *,
    metrics: Metrics | None = None,
    request_sync: Callable[[], None] | None = None,
    recorder: Recorder | None = None,
    remote_sync: bool = False,
    limits: ServeLimits | None = None,
    management: bool = True,
) -> RestApp:
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
        remote_sync: accept ``POST /v2/repository/sync`` from any client, not only
            from this machine.
        limits: the caps on inference requests, one and all together.
        management: serve ``/status`` and ``/metrics`` too (False: they are on a
            listener of their own, :func:`create_management_app`).
    """
    core = Inference(host, models, metrics or Metrics(), recorder, limits)
    return create_rest_app(core, status, version, request_sync=request_sync,
                           remote_sync=remote_sync, management=management)  # fmt: skip


def create_rest_app(
    core: Inference,
    status: Callable[[], Mapping[str, Any]],
    version: str,
    *,
    request_sync: Callable[[], None] | None = None,
    remote_sync: bool = False,
    management: bool = True,
) -> RestApp:
    """The OIP v2 application over ``core`` (which a gRPC server may share: one budget,
    one set of run slots, one recorder); see :func:`create_app` for the rest."""
    api = _Api(core, status, version, request_sync)
    api.remote_sync = remote_sync
    routes = [  # inference first: routes are matched in order, on every request
        Route("/v2/models/{model}/infer", api.infer, methods=["POST"]),
        Route("/v2/models/{model}/versions/{version}/infer", api.infer, methods=["POST"]),
        Route("/v2/health/live", api.live),
        Route("/v2/health/ready", api.ready),
        Route("/v2", api.server),
        Route("/v2/models/{model}", api.metadata),
        Route("/v2/models/{model}/versions/{version}", api.metadata),
        Route("/v2/models/{model}/ready", api.model_ready),
        Route("/v2/models/{model}/versions/{version}/ready", api.model_ready),
        Route("/v2/models/{model}/config", api.model_config),
        Route("/v2/models/{model}/versions/{version}/config", api.model_config),
        Route("/v2/repository/index", api.repository_index, methods=["POST"]),
        Route("/v2/repository/sync", api.repository_sync, methods=["POST"]),
    ]
    if management:
        routes += _management_routes(api.status, api.metrics)
    handlers = {HTTPException: _http_error, Exception: _server_error}
    return RestApp(api, Starlette(routes=routes, exception_handlers=handlers))


class RestApp:
    """The REST application: inference requests answered straight from the ASGI call
    (the hot path: no router, middleware or exception handlers between the server and
    :meth:`_Api.infer`, which answers every failure itself), every other request by
    Starlette."""

    def __init__(self, api: _Api, app: Starlette) -> None:
        self.api, self.app, self.core = api, app, api.core

    @property
    def routes(self) -> list[Any]:
        """Starlette's routes (inference first)."""
        return self.app.routes

    def answer_now(
        self, path: str, raw_headers: Sequence[tuple[bytes, bytes]], body: bytes | bytearray
    ) -> Response | None:
        """The answer to an inference request whose whole body was read, computed at
        once on the event loop, with no ASGI call (the listener writes it:
        ``edge_sync.serve.http_bounds``); None when the request is not one that may be
        answered so (another route, a content coding, a large body, a model whose runs
        are not quick or whose requests wait for a batch), before anything is held.
        Answers, refusals and what is counted are those of the ASGI route."""
        params = _infer_params(path)
        if params is None or len(body) > INLINE_BODY_BYTES:
            return None
        headers = _read_headers(raw_headers)
        if headers.get("content-encoding", "identity") not in ("identity", ""):
            return None
        core, name = self.core, params["model"]
        if core.batched(name):
            return None
        start = time.perf_counter()
        work = Work()
        ticket = core.budget.ticket(core.limits.max_request_bytes)
        try:
            try:
                _check_length(headers, len(body), core.limits.max_body_bytes)
                ticket.charge(len(body))
                with core.engine(name, params.get("version")) as engine:
                    if not quick(engine):
                        ticket.release()
                        return None
                    response = self.api._answer(body, headers, engine, ticket, work)
            except RefusedError as e:
                response = error_response(e.status, str(e), e.version, e.retry_after)
        except Exception:
            ticket.release()
            raise
        version = response.headers.get("x-model-version", "")
        core.settle(name, version, response.status_code, time.perf_counter() - start, work, "rest")
        if ticket.held > SETTLE_AFTER_BYTES:
            return _Paced(response, BackgroundTask(_settle, ticket))
        if ticket.release():
            asyncio.get_running_loop().run_in_executor(None, trim_heap)
        return response

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        ready = scope.get(ANSWER_KEY)
        if ready is not None:  # computed by answer_now, sent here (a large answer)
            await ready(scope, receive, send)
            return
        if scope["type"] == "http" and scope["method"] == "POST":
            params = _infer_params(scope["path"])
            if params is not None:
                scope["path_params"] = params
                request = Request(scope, receive)
                try:
                    response = await self.api.infer(request)
                except Exception as e:
                    # as Starlette's error middleware does: one JSON line, then raised
                    # for the server's log
                    await (await _server_error(request, e))(scope, receive, send)
                    raise
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _infer_params(path: str) -> dict[str, str] | None:
    """The path parameters of ``/v2/models/{model}[/versions/{version}]/infer``; None
    for any other path."""
    if not (path.startswith("/v2/models/") and path.endswith("/infer")):
        return None
    parts = path[len("/v2/models/") : -len("/infer")].split("/")
    if len(parts) == 1 and parts[0]:
        return {"model": parts[0]}
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return {"model": parts[0], "version": parts[2]}
    return None


def create_management_app(status: Callable[[], Mapping[str, Any]], metrics: Metrics) -> Starlette:
    """``/status`` and ``/metrics`` alone, for a listener of their own (as Triton keeps
    its metrics on a port apart from inference)."""
    handlers = {HTTPException: _http_error, Exception: _server_error}
    return Starlette(routes=_management_routes(status, metrics), exception_handlers=handlers)


def _management_routes(status: Callable[[], Mapping[str, Any]], metrics: Metrics) -> list[Route]:
    async def status_route(_: Request) -> Response:
        return json_response(await run_in_threadpool(status))

    async def metrics_route(_: Request) -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE)

    return [Route("/status", status_route), Route("/metrics", metrics_route)]


async def _http_error(_: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route, a wrong method) as protocol errors."""
    assert isinstance(exc, HTTPException)  # noqa: S101 - registered for HTTPException only
    response = error_response(exc.status_code, exc.detail)
    response.headers.update(exc.headers or {})
    return response


async def _server_error(_: Request, exc: Exception) -> Response:
    """A bug answers one JSON line too (the traceback goes to the server's log)."""
    return error_response(500, f"internal error: {type(exc).__name__}")


class _Api:
    """The route handlers, over one serving core."""

    def __init__(
        self,
        core: Inference,
        status: Callable[[], Mapping[str, Any]],
        version: str,
        request_sync: Callable[[], None] | None,
    ) -> None:
        self.core, self.host, self.models = core, core.host, core.models
        self.status, self.version, self.request_sync = status, version, request_sync
        self.metrics = core.metrics
        self.remote_sync = False

    def engine_for(self, request: Request) -> contextlib.AbstractContextManager[Engine]:
        """The engine for the request's model (and version, when named), held until the
        request is done (:meth:`Inference.engine`)."""
        return self.core.engine(request.path_params["model"], request.path_params.get("version"))

    async def live(self, _: Request) -> Response:
        return json_response({"live": True})

    async def ready(self, _: Request) -> Response:
        ok = self.core.ready()
        return json_response({"ready": ok}, 200 if ok else 503)

    async def server(self, _: Request) -> Response:
        return json_response(
            {"name": "modelreg", "version": self.version, "extensions": ["binary_tensor_data"]}
        )

    def look_up(self, request: Request) -> Engine | Response:
        """The engine the request names, for its description only (its lease ends at
        once), or the error answer when there is none."""
        try:
            with self.engine_for(request) as engine:
                return engine
        except RefusedError as e:
            return error_response(e.status, str(e))

    async def metadata(self, request: Request) -> Response:
        engine = self.look_up(request)
        if isinstance(engine, Response):
            return engine
        return json_response(
            {
                "name": engine.model,
                "versions": self.host.versions(engine.model) or [engine.version],
                "platform": "onnxruntime_onnx",
                "inputs": _specs(engine.inputs),
                "outputs": _specs(engine.outputs),
            }
        )

    async def model_ready(self, request: Request) -> Response:
        found = self.look_up(request)
        if isinstance(found, Response):
            return found
        return json_response({"name": request.path_params["model"], "ready": True})

    async def model_config(self, request: Request) -> Response:
        """The model's configuration as Triton's clients read it."""
        engine = self.look_up(request)
        if isinstance(engine, Response):
            return engine

        def tensors(specs: Sequence[TensorDecl]) -> list[dict[str, Any]]:
            return [
                {"name": s["name"], "dims": s["shape"],
                 "data_type": "TYPE_" + s["datatype"].replace("BYTES", "STRING")}
                for s in _specs(specs)
            ]  # fmt: skip

        return json_response(
            {
                "name": engine.model,
                "platform": "onnxruntime_onnx",
                "backend": "onnxruntime",
                "max_batch_size": 0,
                "input": tensors(engine.inputs),
                "output": tensors(engine.outputs),
            }
        )

    async def infer(self, request: Request) -> Response:
        start = time.perf_counter()
        work = Work()
        response = await self._infer(request, work)
        version = response.headers.get("x-model-version", "")
        seconds = time.perf_counter() - start
        name = request.path_params["model"]
        self.core.settle(name, version, response.status_code, seconds, work, "rest")
        return response

    async def _infer(self, request: Request, work: Work) -> Response:
        core = self.core
        ticket = core.budget.ticket(core.limits.max_request_bytes)
        headers = _headers(request)
        try:
            body = await _read_body(request, core.limits.max_body_bytes, ticket.charge, headers)
            with self.engine_for(request) as engine:  # held until it answered
                plain = headers.get("content-encoding", "identity") in ("identity", "")
                small = len(body) <= INLINE_BODY_BYTES and plain
                if small and core.batched(engine.model):
                    # read and answered here, the run waiting for its batch (no thread)
                    response = await self._batched(body, headers, engine, ticket, work)
                elif small and quick(engine):
                    response = self._answer(body, headers, engine, ticket, work)
                else:
                    await core.slots.acquire()
                    try:
                        response = await run_in_threadpool(
                            self._answer, body, headers, engine, ticket, work
                        )
                    finally:
                        core.slots.release()
        except RefusedError as e:
            response = error_response(e.status, str(e), e.version, e.retry_after)
        except ClientDisconnect:  # mid-body (or closed for a stalled body): no one reads it
            response = error_response(400, "the client left before its request was read")
        except BaseException:  # the client left, a bug, a cancellation: nothing is held
            if ticket.release():
                trim_heap()
            raise
        if ticket.held > SETTLE_AFTER_BYTES:  # given back once its answer is sent
            response = _Paced(response, BackgroundTask(_settle, ticket))
        elif ticket.release():  # a small answer: as good as sent
            await run_in_threadpool(trim_heap)
        return response

    async def _batched(
        self,
        body: bytes | bytearray,
        headers: Mapping[str, str],
        engine: Engine,
        ticket: Ticket,
        work: Work,
    ) -> Response:
        """:meth:`_answer` for a small request to a batched model: read and answered on
        the event loop, its run awaited from its batch; one that cannot join a batch
        runs in a worker thread, within the run slots as any other request."""
        core = self.core
        try:
            parsed = read_request(body, headers, engine, core.limits, ticket.charge)
            del body
            inputs, wanted = parsed.inputs, parsed.wanted
            queued = core.submit(engine, inputs, wanted, work)
            if queued is not None:
                results = await core.collect(engine, inputs, wanted, queued, work)
            else:
                await core.slots.acquire()
                try:
                    results = await run_in_threadpool(core.run, engine, inputs, wanted, work)
                finally:
                    core.slots.release()
            inputs.clear()
            return answer(engine, parsed, results)
        except RefusedError as e:
            return error_response(e.status, str(e), e.version, e.retry_after)

    def _answer(
        self,
        body: bytes | bytearray,
        headers: Mapping[str, str],
        engine: Engine,
        ticket: Ticket,
        work: Work,
    ) -> Response:
        """Read the request, run it on ``engine``, write the answer (or the refusal)."""
        try:
            parsed = read_request(body, headers, engine, self.core.limits, ticket.charge)
            del body  # the arrays are what the run needs
            results = self.core.run(engine, parsed.inputs, parsed.wanted, work)
            parsed.inputs.clear()
            return answer(engine, parsed, results)
        except RefusedError as e:
            return error_response(e.status, str(e), e.version, e.retry_after)

    async def repository_index(self, request: Request) -> Response:
        """Every subscribed model's loaded versions and whether it is served (Triton's
        repository index; ``{"ready": true}`` lists only what answers requests)."""
        try:
            body = await _read_body(request, 4096)
            doc = json.loads(body) if body.strip() else {}
        except RefusedError as e:
            return error_response(e.status, str(e))
        except (ValueError, RecursionError):
            return error_response(400, "a repository index request is a JSON object")
        ready = doc.get("ready", False) if isinstance(doc, dict) else None
        if not isinstance(ready, bool):
            return error_response(400, 'a repository index request is {"ready": true|false}')
        index = [{"name": n, "version": v, "state": state, "reason": why}
                 for n, v, state, why in self.core.index(ready)]  # fmt: skip
        return json_response(index)

    async def repository_sync(self, request: Request) -> Response:
        """Sync now (what SIGHUP does); only from this machine unless ``remote_sync``."""
        client = request.client.host if request.client else ""
        if not self.remote_sync and client not in ("127.0.0.1", "::1"):
            return error_response(
                403,
                "a sync is asked for from this machine only (serve.remote_sync: true "
                "allows any client)",
            )
        if self.request_sync is None:
            return error_response(503, "this server runs no update loop")
        self.request_sync()
        return json_response({"sync": "requested"})


class _Paced(Response):
    """``sent``'s answer handed to the connection :data:`SEND_CHUNK` bytes at a time:
    uvicorn waits for a client's reads before it takes the next piece, so the request
    stays charged until its answer is (nearly) all sent, and a client that reads
    nothing is cut by the listener's write timeout (``edge_sync.serve.http_bounds``)."""

    def __init__(self, sent: Response, background: BackgroundTask) -> None:
        super().__init__(sent.body, sent.status_code, background=background)
        self.raw_headers = sent.raw_headers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})  # fmt: skip
        body = memoryview(self.body)
        for at in range(0, len(body), SEND_CHUNK):
            piece = bytes(body[at : at + SEND_CHUNK])
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        body.release()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if self.background is not None:
            await self.background()


async def _settle(ticket: Ticket) -> None:
    """Give back what a request held; after a burst of large ones, the freed heap too
    (in a worker thread: trimming takes milliseconds)."""
    if ticket.release():
        await run_in_threadpool(trim_heap)


_READ_HEADERS: Final = {
    b"content-length": "content-length",
    b"content-encoding": "content-encoding",
    HEADER_LENGTH.encode(): HEADER_LENGTH,
}


def _headers(request: Request) -> dict[str, str]:
    """The headers an inference request is read by, in one pass over the scope's (a
    body with a content coding is never inflated on the event loop: its size is not
    known until it is)."""
    return _read_headers(request.scope["headers"])


def _read_headers(raw: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    found = {}
    for name, value in raw:
        key = _READ_HEADERS.get(name.lower())
        if key is not None:
            found[key] = value.decode("latin-1").strip().lower()
    return found


def _specs(specs: Sequence[TensorDecl]) -> list[dict[str, Any]]:
    """(name, ORT type, shape) as the protocol's tensor metadata."""
    return [{"name": n, "datatype": DATATYPES.get(t, t), "shape": dims(s)} for n, t, s in specs]


# --- reading a request ---------------------------------------------------------------


def _check_length(headers: Mapping[str, str], read: int, cap: int) -> None:
    """Refuse a body over ``cap`` bytes, declared or ``read``.

    Raises:
        RefusedError: 413.
    """
    declared = headers.get("content-length", "")
    if read > cap or (declared.isascii() and declared.isdigit() and int(declared) > cap):
        raise RefusedError(413, f"request body over {cap} bytes")


async def _read_body(
    request: Request,
    cap: int,
    charge: Charge | None = None,
    headers: Mapping[str, str] | None = None,
) -> bytearray:
    """The request's body as sent, within ``cap`` bytes (a larger declared length is
    refused unread), charged to ``charge`` as it comes: a client that declares much and
    sends little holds only what it sent (and the listener closes a body that pauses).

    Raises:
        RefusedError: larger (413); and what ``charge`` raises.
    """
    declared = (headers if headers is not None else request.headers).get("content-length", "")
    _check_length({"content-length": declared}, 0, cap)
    body = bytearray()
    async for chunk in request.stream():
        if charge is not None:
            charge(len(chunk))
        body += chunk
        if len(body) > cap:
            raise RefusedError(413, f"request body over {cap} bytes")
    return body
