"""The load generator of the demo and the serving benchmark (``modelreg.loadgen``)
against a tiny HTTP/1.1 server on loopback: it keeps the asked number of requests in
flight, records each answer's latency, status and ``model_version``, counts failures by
reason, and runs the same way in its own process."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from modelreg.loadgen import LoadError, LoadResult, run_load, run_load_subprocess


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.requests = self.in_flight = self.most_in_flight = 0
        self.connections: set[tuple[str, int]] = set()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True  # headers and body go out in two writes
    server: _Server

    def log_message(self, *_: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.requests += 1
            n = self.server.requests
            self.server.in_flight += 1
            self.server.most_in_flight = max(self.server.most_in_flight, self.server.in_flight)
            self.server.connections.add(self.client_address)
        try:
            time.sleep(0.005)
            self._answer(n, json.loads(body))
        finally:
            with self.server.lock:
                self.server.in_flight -= 1

    def _answer(self, n: int, request: Mapping[str, Any]) -> None:
        version = "1.1.0" if n % 2 else "1.0.0"
        answer = {"model_name": "m", "model_version": version, "echo": request["x"]}
        status = 200
        if self.path == "/flaky" and n % 3 == 0:
            status, answer = 503, {"error": "busy"}
        if self.path == "/drop" and n % 4 == 0:
            self.close_connection = True
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{")
            return
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if self.path == "/chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (data[:7], data[7:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=10)


BODY = json.dumps({"x": 7}).encode()


def check(doc: Mapping[str, Any]) -> str | None:
    """Answers from 1.1.0 are wrong (imported by the generator's own process)."""
    return "1.1.0 is not wanted" if doc["model_version"] == "1.1.0" else None


def test_it_keeps_the_asked_requests_in_flight_for_a_duration(server: _Server) -> None:
    before = time.time()
    result = run_load(f"{server.base}/ok", BODY, concurrency=8, duration_s=0.5)
    assert server.most_in_flight == 8
    assert len(server.connections) == 8  # one keep-alive connection each
    assert result.concurrency == 8
    assert result.requests == server.requests > 50
    assert 0.5 <= result.elapsed_s < 5
    assert result.failures == {}
    assert result.failed == 0
    assert set(result.statuses) == {200}
    assert result.version_counts() == {
        "1.0.0": result.versions.count("1.0.0"),
        "1.1.0": result.versions.count("1.1.0"),
    }
    assert all(lat >= 0.005 for lat in result.latencies_s)
    assert list(result.finished_s) == sorted(result.finished_s)
    assert before < result.started_unix_s < before + 5
    assert result.throughput_rps == pytest.approx(result.requests / result.elapsed_s)
    assert 0.005 <= result.percentile(50) <= result.percentile(99) <= max(result.latencies_s)
    summary = result.summary()
    assert summary["requests"] == result.requests
    assert summary["p99_ms"] >= summary["p50_ms"] >= 5


def test_a_count_sends_exactly_that_many(server: _Server) -> None:
    result = run_load(f"{server.base}/chunked", BODY, concurrency=4, count=37)
    assert result.requests == server.requests == 37
    assert result.failures == {}
    assert set(result.versions) == {"1.0.0", "1.1.0"}  # the chunked bodies were read


def test_failures_are_counted_by_reason_never_raised(server: _Server) -> None:
    result = run_load(f"{server.base}/flaky", BODY, concurrency=3, count=30, check=check)
    assert result.requests == 30
    assert result.statuses.count(503) == 10
    failures = result.failures
    assert failures["HTTP 503: busy"] == 10
    assert failures["check: 1.1.0 is not wanted"] == sum(
        v == "1.1.0" and s == 200 for v, s in zip(result.versions, result.statuses, strict=True)
    )
    assert result.failed == sum(failures.values())
    assert result.version_counts() == {"1.0.0": 30 - result.failed}
    assert result.throughput_rps == pytest.approx((30 - result.failed) / result.elapsed_s)


def test_a_broken_connection_fails_that_request_and_the_next_one_reconnects(
    server: _Server,
) -> None:
    result = run_load(f"{server.base}/drop", BODY, concurrency=2, count=40, timeout_s=5)
    assert result.requests == 40
    dropped = [s for s in result.statuses if s == 0]
    assert len(dropped) == 10
    assert set(result.failures) == {"no response: IncompleteReadError"}
    assert len(server.connections) > 2  # reconnected after each drop


def test_a_check_that_raises_fails_the_answer(server: _Server) -> None:
    def broken(doc: Mapping[str, Any]) -> str | None:
        raise KeyError("outputs")

    result = run_load(f"{server.base}/ok", BODY, concurrency=1, count=3, check=broken)
    assert result.failures == {"check: the check raised KeyError: 'outputs'": 3}


def test_warm_up_requests_are_not_recorded(server: _Server) -> None:
    result = run_load(f"{server.base}/ok", BODY, concurrency=2, count=10, warmup_s=0.2)
    assert result.requests == 10
    assert server.requests > 20  # the warm-up ran too


def test_in_its_own_process_with_a_named_check_and_pinned(server: _Server) -> None:
    result = run_load_subprocess(
        f"{server.base}/ok", BODY, concurrency=4, count=20,
        check="tests.unit.test_loadgen:check", cpus={min(os.sched_getaffinity(0))},
    )  # fmt: skip
    assert result.requests == server.requests == 20
    assert result.failures == {"check: 1.1.0 is not wanted": 10}
    assert result.client_cpu_s > 0
    assert LoadResult.from_json(result.to_json()) == result


def test_misuse_and_no_server_are_errors(server: _Server) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        run_load(f"{server.base}/ok", BODY, concurrency=1)
    with pytest.raises(ValueError, match="exactly one"):
        run_load(f"{server.base}/ok", BODY, concurrency=1, duration_s=1, count=1)
    with pytest.raises(ValueError, match="concurrency"):
        run_load(f"{server.base}/ok", BODY, concurrency=0, count=1)
    with pytest.raises(LoadError, match="http://"):
        run_load("https://127.0.0.1/ok", BODY, concurrency=1, count=1)
    port = server.server_address[1]
    server.shutdown()
    server.server_close()
    with pytest.raises(LoadError, match="cannot connect"):
        run_load(f"http://127.0.0.1:{port}/ok", BODY, concurrency=1, count=1)
    with pytest.raises(LoadError, match="cannot connect"):
        run_load_subprocess(f"http://127.0.0.1:{port}/ok", BODY, concurrency=1, count=1)


def test_percentiles_are_nearest_rank() -> None:
    result = LoadResult(
        concurrency=1, elapsed_s=1.0, latencies_s=tuple(i / 100 for i in range(100, 0, -1)),
        statuses=(200,) * 100, versions=("1",) * 100, errors=(None,) * 100,
        finished_s=tuple(range(100)),
    )  # fmt: skip
    assert result.percentile(50) == 0.5
    assert result.percentile(99) == 0.99
    assert result.percentile(100) == 1.0
    assert result.percentile(0) == 0.01
    assert result.throughput_rps == 100
