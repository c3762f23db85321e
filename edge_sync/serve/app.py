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
on the event loop; others are decoded, run and encoded in a worker thread, within
``edge_sync.serve.admission``'s concurrency limit and budget of decoded bytes in flight (503
with ``Retry-After`` over them), so the loop keeps answering health and metadata while
large requests are read or a model computes.  With ``management=False`` (the daemon's
``serve.management_listen``), ``/status`` and ``/metrics`` are left to
:func:`create_management_app`.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from edge_sync.engine.base import DATATYPES
from edge_sync.engine.heap import keep_heap_small, trim_heap
from edge_sync.serve.admission import Budget, Slots, Ticket
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
from edge_sync.serve.metrics import CONTENT_TYPE, Metrics

if TYPE_CHECKING:
    from edge_sync.engine.base import Engine, EngineHost, TensorDecl
    from edge_sync.serve.recorder import Recorder

__all__ = ["MAX_BODY_BYTES", "ServeLimits", "create_app", "create_management_app"]

INLINE_RUN_S: Final = 0.0005
"""An engine whose typical run takes at most this long runs on the event loop (with a
body of at most :data:`INLINE_BODY_BYTES`); a slower one in a worker thread, so the loop
keeps answering while it computes."""
INLINE_BODY_BYTES: Final = 64 << 10
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
        remote_sync: accept ``POST /v2/repository/sync`` from any client, not only
            from this machine.
        limits: the caps on inference requests, one and all together.
        management: serve ``/status`` and ``/metrics`` too (False: they are on a
            listener of their own, :func:`create_management_app`).
    """
    api = _Api(host, models, status, version, metrics or Metrics(), request_sync)
    api.recorder = recorder
    api.remote_sync = remote_sync
    if limits is not None:
        api.bound(limits)
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
    return Starlette(routes=routes, exception_handlers=handlers)


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
        self.remote_sync = False
        self.bound(ServeLimits())

    def bound(self, limits: ServeLimits) -> None:
        """Serve within ``limits`` (before the first request)."""
        self.limits = limits
        self.budget = Budget(limits.inflight_bytes)
        self.slots = Slots(limits.max_concurrent, limits.max_queued, limits.queue_timeout_s)
        keep_heap_small()  # what a burst allocated is given back, not kept

    @contextlib.contextmanager
    def engine_for(self, request: Request) -> Iterator[Engine]:
        """The engine for the request's model (and version, when named), held until the
        request is done: a swap never releases it under a request.

        Raises:
            RefusedError: unknown model (404), not loaded yet (503), no such version
                loaded (404).
        """
        name = request.path_params["model"]
        if name not in self.models:
            raise RefusedError(404, f"unknown model {name!r}")
        wanted = request.path_params.get("version")
        try:
            lease = self.host.lease(name, wanted)
            engine = lease.__enter__()
        except LookupError:
            if wanted is None or self.host.current(name) is None:
                raise RefusedError(503, f"model {name!r} is not loaded yet") from None
            raise RefusedError(404, f"model {name!r} has no loaded version {wanted!r}") from None
        try:
            yield engine
        finally:
            lease.__exit__(None, None, None)

    async def live(self, _: Request) -> Response:
        return json_response({"live": True})

    async def ready(self, _: Request) -> Response:
        ok = all(self.host.current(m) is not None for m in self.models)
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
        name = request.path_params["model"]
        work = _Work()
        response = await self._infer(request, work)
        version = response.headers.get("x-model-version", "")
        outcome = "ok" if response.status_code == 200 else f"http_{response.status_code}"
        seconds = time.perf_counter() - start
        if name in self.models:  # unknown names are not label values
            self.metrics.request(name, version, outcome, seconds)
            code = response.status_code
            if self.recorder is not None and version and (code == 200 or code >= 500):
                # the gate compares the engine's run by request size, never the time a
                # client took to send its body (edge_sync.decide.health)
                self.recorder.record(name, version, error=code >= 500,
                                     seconds=work.run_s if work.run_s is not None else seconds,
                                     units=work.units)  # fmt: skip
        return response

    async def _infer(self, request: Request, work: _Work) -> Response:
        ticket = self.budget.ticket(self.limits.max_request_bytes)
        headers = _headers(request)
        try:
            body = await _read_body(request, self.limits.max_body_bytes, ticket.charge, headers)
            with self.engine_for(request) as engine:  # held until it answered
                plain = headers.get("content-encoding", "identity") in ("identity", "")
                if len(body) <= INLINE_BODY_BYTES and plain and _quick(engine):
                    response = self._answer(body, headers, engine, ticket, work)
                else:
                    await self.slots.acquire()
                    try:
                        response = await run_in_threadpool(
                            self._answer, body, headers, engine, ticket, work
                        )
                    finally:
                        self.slots.release()
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

    def _answer(
        self,
        body: bytes | bytearray,
        headers: Mapping[str, str],
        engine: Engine,
        ticket: Ticket,
        work: _Work,
    ) -> Response:
        """Read the request, run it on ``engine``, write the answer (or the refusal)."""
        try:
            parsed = read_request(body, headers, engine, self.limits, ticket.charge)
            del body  # the arrays are what the run needs
            work.units = sum(int(a.size) for a in parsed.inputs.values())
            clock = _run_clock(engine)
            ran = clock()
            try:
                results = engine.run(parsed.inputs, parsed.wanted)
            except Exception as e:  # noqa: BLE001 - ORT raises many types for bad inputs
                first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
                # ONNX Runtime's InvalidArgument: the input's fault; else the engine's,
                # unless every other loaded version fails on it too
                theirs = type(e).__name__ == "InvalidArgument" or self._fails_everywhere(
                    engine, parsed.inputs, parsed.wanted
                )
                raise RefusedError(
                    400 if theirs else 500, f"inference failed: {first}", engine.version
                ) from None
            work.run_s = clock() - ran
            parsed.inputs.clear()
            return answer(engine, parsed, results)
        except RefusedError as e:
            return error_response(e.status, str(e), e.version, e.retry_after)

    def _fails_everywhere(self, engine: Engine, inputs: Any, wanted: list[str] | None) -> bool:
        """Whether every other loaded version of ``engine``'s model fails on the request
        too (False when none is loaded).

        A run can fail on valid-looking inputs (symbolic sizes that do not broadcast:
        ONNX Runtime's ``Fail``); counted as the version's server error, any client
        told of a swap by ``x-model-version`` could fail its health gate.  During the
        gate the previous version is still loaded: a request it fails on as well says
        nothing about the new one.  A request that fails costs a run per version.
        """
        compared = 0
        for version in self.host.versions(engine.model):
            if version == engine.version:
                continue
            try:
                with self.host.lease(engine.model, version) as other:
                    compared += 1
                    other.run(inputs, wanted)
            except LookupError:
                continue  # released meanwhile: nothing compared
            except Exception:  # noqa: BLE001, S112 - any failure: it fails there too
                continue
            return False  # another version answers it: this one's fault
        return compared > 0

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
        index = []
        for name in self.models:
            versions = self.host.versions(name) if self.host.current(name) else []
            index += [{"name": name, "version": v, "state": "READY", "reason": ""}
                      for v in versions]  # fmt: skip
            if not versions and not ready:
                index.append({"name": name, "version": "", "state": "UNAVAILABLE",
                              "reason": "not installed yet"})  # fmt: skip
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
    found = {}
    for name, value in request.scope["headers"]:
        key = _READ_HEADERS.get(name.lower())
        if key is not None:
            found[key] = value.decode("latin-1").strip().lower()
    return found


@dataclass
class _Work:
    """What one inference request cost, for the health gate: its decoded input
    elements (the size no encoding, compression or padding of the body changes) and the
    engine's run (no upload, queue or encoding time a client could stretch; see
    :func:`_run_clock`)."""

    units: int | None = None
    run_s: float | None = None


def _run_clock(engine: Engine) -> Callable[[], float]:
    """How an engine's run is timed for the health gate: the CPU time of this thread
    when ONNX Runtime computes on it alone (the CPU provider with one intra-op thread,
    the default), which a flood of other requests competing for the CPU does not
    stretch; else the wall clock (a GPU, or a pool of threads)."""
    on_this_thread = engine.providers == ["CPUExecutionProvider"] and engine.intra_op_threads == 1
    return time.thread_time if on_this_thread else time.perf_counter


def _quick(engine: Engine) -> bool:
    """Whether ``engine`` answers fast enough to run on the event loop (handing a
    request to a worker thread costs more than a small model's run: measured with
    ``benchmarks/serving.py``, 396 against 282 us of server CPU per request)."""
    run_s = engine.run_s
    return run_s is not None and run_s <= INLINE_RUN_S and engine.loaded


def _specs(specs: Sequence[TensorDecl]) -> list[dict[str, Any]]:
    """(name, ORT type, shape) as the protocol's tensor metadata."""
    return [{"name": n, "datatype": DATATYPES.get(t, t), "shape": dims(s)} for n, t, s in specs]


# --- reading a request ---------------------------------------------------------------


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
    if declared.isascii() and declared.isdigit() and int(declared) > cap:
        raise RefusedError(413, f"request body over {cap} bytes")
    body = bytearray()
    async for chunk in request.stream():
        if charge is not None:
            charge(len(chunk))
        body += chunk
        if len(body) > cap:
            raise RefusedError(413, f"request body over {cap} bytes")
    return body
