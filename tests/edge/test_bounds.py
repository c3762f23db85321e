"""Serving with bounds (issue 23, point 5): the review's attacks on the inference port
replayed against a real uvicorn server on 127.0.0.1 (the daemon's bounded protocol,
``edge_sync.serve.listeners``) over real ONNX Runtime sessions.

Each test fails without its bound: a gzip bomb inflated on the event loop stalls the
health check; requests are charged before they allocate (413 over one's cap, 503 with
``Retry-After`` over the budget in flight, or for want of a slot); the CNN's batch is
refused before any run; a large header is cut at the cap (431), a slow one timed out
(408); ONNX Runtime gives a burst's memory back.  The descriptor cap and the management
listener are checked on a real daemon in ``test_bounds_daemon.py``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from benchmarks._attack_payloads import bytes_bomb, cnn_batch, header_line, json_bomb
from edge_sync.engine.base import LoadRequest
from edge_sync.engine.host import InProcessHost
from edge_sync.serve.app import create_app
from edge_sync.serve.body import json_cost
from edge_sync.serve.codec import ModelCaps, ServeLimits
from edge_sync.serve.listeners import ConnectionLimits, server
from tests.edge.test_conformance import identity_model, serve_file

pytestmark = pytest.mark.integration


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text(encoding="ascii").split()[1]) * 4096


class _Peak:
    """The resident set's peak while the block runs, sampled every 5 ms."""

    def __init__(self) -> None:
        self.base = self.peak = _rss()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    @property
    def grew(self) -> int:
        return self.peak - self.base


@contextlib.contextmanager
def bounded_server(app: Any, **limits: Any) -> Iterator[str]:
    """``app`` on 127.0.0.1 under the daemon's bounded uvicorn server; its base URL."""
    srv = server(app, "127.0.0.1", 0, ConnectionLimits(**{"max_connections": 64, **limits}))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive(), "the server did not start"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    port = srv.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> InProcessHost:
    """mlp 1.1.0, the CNN and a BYTES identity, served."""
    folder = tmp_path_factory.mktemp("bounds")
    host = InProcessHost(prepack="on")
    for name, data in {
        "id_bytes": identity_model("BYTES"),
        "id_fp32": identity_model("FP32"),
    }.items():
        (folder / f"{name}.onnx").write_bytes(data)
        serve_file(host, name, "1", folder / f"{name}.onnx")
    serve_file(host, "mlp", "1.1.0", example_models / "mlp/1.1.0.onnx")
    serve_file(host, "cnn", "1.0.0", example_models / "cnn/1.0.0.onnx")
    return host


MODELS = ["mlp", "cnn", "id_bytes", "id_fp32"]


def _app(host: InProcessHost, **limits: Any) -> Any:
    return create_app(host, MODELS, dict, "t", limits=ServeLimits(**limits))


@pytest.fixture(scope="module")
def base(host: InProcessHost) -> Iterator[str]:
    """The server with the default limits."""
    with bounded_server(_app(host)) as url:
        yield url


def _warm(base: str) -> None:
    x = {"name": "input", "shape": [2, 16], "datatype": "FP32", "data": [0.5] * 32}
    for _ in range(5):  # the mlp's runs are measured quick: it is answered inline
        assert httpx.post(f"{base}/v2/models/mlp/infer", json={"inputs": [x]}).status_code == 200


def _health_worst(base: str, stop: threading.Event, worst: list[float]) -> None:
    with httpx.Client(base_url=base, timeout=60) as client:
        while not stop.is_set():
            start = time.perf_counter()
            assert client.get("/v2/health/live").status_code == 200
            worst[0] = max(worst[0], time.perf_counter() - start)
            time.sleep(0.005)


def _concurrently(base: str, n: int, path: str, body: bytes, headers: dict[str, str]) -> list[int]:
    codes: list[int] = []

    def one() -> None:
        codes.append(httpx.post(f"{base}{path}", content=body, headers=headers, timeout=120)
                     .status_code)  # fmt: skip

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


def test_gzip_bombs_never_stall_the_health_check(base: str) -> None:
    """Three 60 KiB gzip requests inflating to 61 MiB of JSON, to a model answered on
    the event loop: refused (413: parsing would cost more than a request may hold),
    inflated in worker threads, while the health check keeps answering (on main: up
    to 4.5 s, and +2 GiB of memory)."""
    _warm(base)
    bomb = json_bomb()
    assert len(bomb) < 64 << 10
    stop, worst = threading.Event(), [0.0]
    poller = threading.Thread(target=_health_worst, args=(base, stop, worst))
    with _Peak() as peak:
        poller.start()
        time.sleep(0.1)
        codes = _concurrently(base, 4, "/v2/models/mlp/infer", bomb, {"Content-Encoding": "gzip"})
        stop.set()
        poller.join()
    assert codes == [413] * 4
    assert worst[0] < 1.0, f"the health check waited {worst[0]:.2f} s"
    assert peak.grew < 400 << 20, f"+{peak.grew >> 20} MiB"
    for _ in range(2):  # again: what the first ones freed is reused, then given back
        assert (
            _concurrently(base, 4, "/v2/models/mlp/infer", bomb, {"Content-Encoding": "gzip"})
            == [413] * 4
        )
    time.sleep(0.5)  # the last answer's account is settled after it was sent
    held = _rss() - peak.base
    assert held < 48 << 20, f"+{held >> 20} MiB held after the bombs"


def test_a_bytes_tensor_of_empty_strings_is_charged_its_objects(base: str) -> None:
    """63 KiB of gzip holding 16.8 M empty strings: refused before one is made (on
    main: +1.3 GiB and 13.5 s of server time)."""
    body, headers = bytes_bomb()
    start = time.perf_counter()
    with _Peak() as peak:
        response = httpx.post(f"{base}/v2/models/id_bytes/infer", content=body, headers=headers,
                              timeout=60)  # fmt: skip
    assert response.status_code == 413, response.text
    assert "max_request" in response.json()["error"]
    assert time.perf_counter() - start < 5
    assert peak.grew < 48 << 20, f"+{peak.grew >> 20} MiB"  # refused before it inflated


def test_the_cnn_batch_is_capped_before_it_runs(base: str) -> None:
    """A small request asking the CNN for batch 21,399 (on main: a 1.9 GiB peak, 1.75
    GiB still held 10 s later): 413 from the shapes, nothing run."""
    body, headers = cnn_batch()
    with _Peak() as peak:
        response = httpx.post(f"{base}/v2/models/cnn/infer", content=body, headers=headers,
                              timeout=60)  # fmt: skip
    assert response.status_code == 413
    assert response.json() == {"error": "input 'image': batch of 21399, over this model's 64"}
    assert peak.grew < 48 << 20, f"+{peak.grew >> 20} MiB"  # refused before it inflated
    small, headers = cnn_batch(64)
    assert (
        httpx.post(f"{base}/v2/models/cnn/infer", content=small, headers=headers).status_code == 200
    )


def test_output_values_are_capped_from_the_shapes(host: InProcessHost) -> None:
    app = _app(host, models={"id_fp32": ModelCaps(max_output_elements=100)})
    with bounded_server(app) as url:
        x = {"name": "x", "shape": [2, 60], "datatype": "FP32", "data": [1.0] * 120}
        response = httpx.post(f"{url}/v2/models/id_fp32/infer", json={"inputs": [x]})
        assert response.status_code == 413
        assert response.json() == {
            "error": "the outputs would hold 120 values, over this model's 100"
        }
        x = {"name": "x", "shape": [2, 50], "datatype": "FP32", "data": [1.0] * 100}
        assert httpx.post(f"{url}/v2/models/id_fp32/infer", json={"inputs": [x]}).status_code == 200


def _open(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _reply(sock: socket.socket) -> bytes:
    reply = b""
    with contextlib.suppress(ConnectionError, TimeoutError):
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def test_the_budget_in_flight_answers_503_with_retry_after(host: InProcessHost) -> None:
    """A body is charged as it arrives: while one client holds 6 MiB of an 8 MiB
    budget (it sent them and stalls), another request of 4 MiB is refused, health
    answers, and what the first held is given back when it leaves."""
    app = _app(host, inflight_bytes=8 << 20, max_request_bytes=8 << 20)
    with bounded_server(app) as url, _open(url) as holder:
        holder.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                       b"Content-Length: %d\r\n\r\n" % (7 << 20) + b" " * (6 << 20))  # fmt: skip
        deadline = time.monotonic() + 30
        while True:  # once the server has read the holder's head, and charged it
            response = httpx.post(f"{url}/v2/models/mlp/infer", content=b" " * (4 << 20))
            if response.status_code == 503 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert response.json()["error"].startswith("the server holds as many requests")
        assert httpx.get(f"{url}/v2/health/live").status_code == 200
        holder.close()
        x = {"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}
        while True:  # the holder's charge is given back when its request ends
            code = httpx.post(f"{url}/v2/models/mlp/infer", json={"inputs": [x]}).status_code
            if code != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert code == 200
        assert _api(app).budget.used == 0


def _api(app: Any) -> Any:
    """The server's serving core (its budget and slots, shared by every protocol)."""
    return getattr(app.routes[0], "endpoint").__self__.core  # noqa: B009 - a bound method's owner


def test_a_body_that_stalls_is_closed_and_gives_its_bytes_back(host: InProcessHost) -> None:
    app = _app(host)
    with bounded_server(app, body_timeout_s=0.5) as url, _open(url) as sock:
        sock.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: %d\r\n\r\n" % (1 << 20) + b" " * (512 << 10))  # fmt: skip
        start = time.perf_counter()
        assert _reply(sock).startswith(b"HTTP/1.1 408 ")
        assert time.perf_counter() - start < 10
        deadline = time.monotonic() + 30
        while _api(app).budget.used:  # the request's task ends after the connection
            assert time.monotonic() < deadline, _api(app).budget.used
            time.sleep(0.01)


class _Blocking:
    """An engine (the production interface) whose runs wait for ``go``."""

    model, version, sha256 = "slow", "1", "0" * 64
    request = LoadRequest("slow", "1", Path("slow.onnx"), "0" * 64)
    run_s = 1.0
    loaded = True
    intra_op_threads = 1

    def __init__(self) -> None:
        self.inputs = [("x", "tensor(float)", [1])]
        self.outputs = [("y", "tensor(float)", [1])]
        self.providers: list[str] = []  # no ONNX Runtime: its runs are timed by the wall clock
        self.go = threading.Event()
        self.started = threading.Semaphore(0)

    def run(self, inputs: Any, outputs: Any = None) -> dict[str, Any]:
        self.started.release()
        assert self.go.wait(60)
        return {"y": np.asarray(inputs["x"])}

    def close(self) -> None:
        pass


class _OneEngineHost(InProcessHost):
    def __init__(self, engine: Any) -> None:
        super().__init__()
        self.engine = engine

    @contextlib.contextmanager
    def lease(self, model: str, version: str | None = None) -> Iterator[Any]:
        yield self.engine

    def current(self, model: str) -> Any:
        return self.engine


def test_the_concurrency_limit_answers_503_while_health_answers() -> None:
    engine = _Blocking()
    app = create_app(_OneEngineHost(engine), ["slow"], dict, "t",
                     limits=ServeLimits(max_concurrent=1, max_queued=1, queue_timeout_s=30))  # fmt: skip
    doc = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    with bounded_server(app) as url:
        results: list[int] = []

        def infer() -> None:
            results.append(
                httpx.post(f"{url}/v2/models/slow/infer", json=doc, timeout=60).status_code
            )

        first = threading.Thread(target=infer)
        first.start()
        assert engine.started.acquire(timeout=30)  # running: the one slot is taken
        queued = threading.Thread(target=infer)
        queued.start()
        slots = _api(app).slots
        deadline = time.monotonic() + 30
        while slots.waiting < 1:  # the second waits for the slot
            assert time.monotonic() < deadline
            time.sleep(0.01)
        third = httpx.post(f"{url}/v2/models/slow/infer", json=doc)
        assert third.status_code == 503
        assert third.headers["retry-after"] == "1"
        start = time.perf_counter()
        assert httpx.get(f"{url}/v2/health/live").status_code == 200
        assert time.perf_counter() - start < 1
        engine.go.set()
        first.join()
        queued.join()
        assert results == [200, 200]


def test_a_64_mib_header_line_is_431_at_the_cap(base: str) -> None:
    """On main, read whole and answered 200 after 4 s of CPU."""
    with _open(base) as sock, _Peak() as peak:
        start = time.perf_counter()
        data = header_line()
        with contextlib.suppress(ConnectionError):
            sock.sendall(data)
        reply = _reply(sock)
    assert reply.startswith(b"HTTP/1.1 431 "), reply[:80]
    assert time.perf_counter() - start < 5
    assert peak.grew < 100 << 20
    # a head over the cap that arrives in one read, headers complete
    with _open(base) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n"
                     + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 1000) for i in range(80)) + b"\r\n")  # fmt: skip
        assert _reply(sock).startswith(b"HTTP/1.1 431 ")


def test_slow_headers_and_idle_connections_are_closed(host: InProcessHost) -> None:
    with bounded_server(_app(host), header_timeout_s=0.5, keepalive_timeout_s=0.5) as url:
        with _open(url) as sock:  # a request's head sent slowly
            start = time.perf_counter()
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
            assert _reply(sock).startswith(b"HTTP/1.1 408 ")
            assert time.perf_counter() - start < 5
        with _open(url) as sock:  # a new connection that says nothing
            assert _reply(sock).startswith(b"HTTP/1.1 408 ")
        with _open(url) as sock:  # idle after an answer: the keep-alive timeout
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _reply(sock).startswith(b"HTTP/1.1 200 ")


def test_idle_connections_give_way_at_the_connection_cap(host: InProcessHost) -> None:
    """Over the cap, the longest idle connection is closed for the new one: idle
    connections hold no slot a client needs."""
    with bounded_server(_app(host), max_connections=10) as url:
        idle = [_open(url) for _ in range(30)]
        try:
            time.sleep(0.3)
            assert httpx.get(f"{url}/v2/health/live", timeout=10).status_code == 200
            closed = 0
            for sock in idle:
                sock.settimeout(0.01)
                with contextlib.suppress(TimeoutError):
                    closed += sock.recv(1) == b""
            assert closed >= 20
        finally:
            for sock in idle:
                sock.close()


def test_onnx_runtime_gives_a_burst_back(host: InProcessHost) -> None:
    """A burst of large CNN requests (within caps raised for it): the resident set is
    back within 1.25x of steady soon after (the arena kept the peak for good)."""
    app = _app(host, model=ModelCaps(max_batch=4096))
    body, headers = cnn_batch(3000)
    with bounded_server(app) as url:
        small, small_headers = cnn_batch(1)
        for _ in range(3):
            httpx.post(f"{url}/v2/models/cnn/infer", content=small, headers=small_headers)
        steady = _rss()
        with _Peak() as peak:
            codes = _concurrently(url, 3, "/v2/models/cnn/infer", body, headers)
        assert codes == [200] * 3
        assert peak.grew > 100 << 20  # it was a burst
        deadline = time.monotonic() + 10
        while _rss() > 1.25 * steady and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _rss() <= 1.25 * steady, f"{_rss() >> 20} MiB held, {steady >> 20} steady"


@pytest.mark.parametrize(
    "text",
    [
        b"[" + b",".join([b"0"] * 50_000) + b"]",
        b"[" + b",".join([b"1e1"] * 50_000) + b"]",
        b"[" + b",".join([b"[]"] * 50_000) + b"]",
        b"[" + b",".join([b"{}"] * 50_000) + b"]",
        b"[" + b",".join([b'{"a":0}'] * 50_000) + b"]",
        b"[" + b",".join([b'""'] * 50_000) + b"]",
        b"[" + b",".join([b'"\\ud83d\\ude00"'] * 50_000) + b"]",
        b"{" + b",".join(b'"k%d":0' % i for i in range(50_000)) + b"}",
        b'["' + b"a" * 200_000 + "\U0001f600".encode() + b'"]',
        b'["' + "\U0001f600".encode() * 50_000 + b'"]',
        b"[" + b",".join([b"9" * 40] * 50_000) + b"]",
    ],
    ids=[
        "zeros",
        "floats",
        "lists",
        "dicts",
        "members",
        "strings",
        "escapes",
        "keys",
        "ascii-then-wide",
        "wide",
        "big-ints",
    ],
)
def test_json_cost_bounds_what_parsing_allocates(text: bytes) -> None:
    tracemalloc.start()
    try:
        parsed = json.loads(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del parsed
    assert json_cost(text) >= peak
