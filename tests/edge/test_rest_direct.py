"""Inference answered straight from the listener (issue 26, point 3): a small inference
request whose body came in the read of its head is answered by ``RestApp.answer_now``
from the bounded protocol (``edge_sync.serve.http_bounds``), with no ASGI call; every
other request still takes its ASGI call.  Real uvicorn on 127.0.0.1, real ONNX Runtime.

Each test would fail if the direct path broke HTTP: answers differ from the ASGI
route's, pipelined answers out of order, HTTP/1.0 left open, a large answer cut, a
request not counted, or the path silently unused.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from edge_sync.engine.host import InProcessHost
from edge_sync.serve.body import HEADER_LENGTH
from tests.edge.test_bounds import _api, _app, _warm, bounded_server, host

pytestmark = pytest.mark.integration

__all__ = ["host"]  # the module fixture, shared with test_bounds

_X = {"name": "input", "shape": [2, 16], "datatype": "FP32", "data": [0.25] * 32}
_BODY = json.dumps({"inputs": [_X], "id": "r1"}).encode()


def _request(body: bytes, path: str = "/v2/models/mlp/infer", version: bytes = b"1.1") -> bytes:
    return (
        b"POST " + path.encode() + b" HTTP/" + version + b"\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )


def _responses(sock: socket.socket, count: int) -> Iterator[tuple[bytes, dict[str, str], bytes]]:
    """``count`` responses read off ``sock``: (status line, headers, body)."""
    buf = b""
    for _ in range(count):
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, f"the connection closed before a response: {buf[:200]!r}"
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        status, *lines = head.split(b"\r\n")
        headers = {}
        for line in lines:
            name, value = line.decode("latin-1").split(":", 1)
            headers[name.strip().lower()] = value.strip()
        length = int(headers["content-length"])
        while len(buf) < length:
            chunk = sock.recv(1 << 20)
            assert chunk, "the connection closed inside a body"
            buf += chunk
        yield status, headers, buf[:length]
        buf = buf[length:]


def _connect(url: str) -> socket.socket:
    address, port = url.removeprefix("http://").split(":")
    return socket.create_connection((address, int(port)), timeout=30)


def _no_asgi_infer(app: Any) -> list[str]:
    """Make the ASGI inference route record each call (and refuse it with 500)."""
    calls: list[str] = []

    async def infer(request: Any) -> Any:
        calls.append(request.url.path)
        raise RuntimeError("the ASGI route ran")

    app.api.infer = infer
    return calls


def test_a_small_request_is_answered_as_the_asgi_route_answers_it(host: InProcessHost) -> None:
    """The same request, its body in a later read (the ASGI route) and in the read of
    its head (answered at once): the same status, headers and body; the ASGI route is
    not called for the second, and both are counted at /metrics."""
    app = _app(host)
    with bounded_server(app) as url:
        _warm(url)
        with _connect(url) as sock:  # the body after the head: the ASGI call reads it
            request = _request(_BODY)
            head, body = request.split(b"\r\n\r\n", 1)
            sock.sendall(head + b"\r\n\r\n")
            time.sleep(0.2)
            sock.sendall(body)
            [(status_a, headers_a, body_a)] = _responses(sock, 1)
        calls = _no_asgi_infer(app)
        before = _api(app).metrics.requests.labels("mlp", "1.1.0", "ok", "rest")._value.get()
        with _connect(url) as sock:
            sock.sendall(_request(_BODY))
            [(status_b, headers_b, body_b)] = _responses(sock, 1)
        after = _api(app).metrics.requests.labels("mlp", "1.1.0", "ok", "rest")._value.get()
    assert calls == []
    assert status_a == status_b == b"HTTP/1.1 200 OK"
    headers_a.pop("date"), headers_b.pop("date")
    assert headers_a == headers_b
    assert headers_b["x-model-version"] == "1.1.0"
    assert body_a == body_b
    doc = json.loads(body_b)
    assert (doc["id"], doc["model_version"]) == ("r1", "1.1.0")
    assert after == before + 1


def test_refusals_answered_at_once_match_the_asgi_route(host: InProcessHost) -> None:
    """An unknown model, an unknown version and a malformed request: the same refusal
    whichever path answered it."""
    app = _app(host)
    cases = [
        _request(_BODY, "/v2/models/nope/infer"),
        _request(_BODY, "/v2/models/mlp/versions/9.9.9/infer"),
        _request(b'{"inputs": [{"name": "input"}]}'),
        _request(b"not json"),
    ]
    with bounded_server(app) as url:
        _warm(url)
        via_asgi = []
        for request in cases:
            with _connect(url) as sock:
                head, body = request.split(b"\r\n\r\n", 1)
                sock.sendall(head + b"\r\n\r\n")
                time.sleep(0.1)
                sock.sendall(body)
                via_asgi += [(s, b) for s, _, b in _responses(sock, 1)]
        calls = _no_asgi_infer(app)
        with _connect(url) as sock:
            sock.sendall(b"".join(cases))
            at_once = [(s, b) for s, _, b in _responses(sock, len(cases))]
    assert calls == []
    assert at_once == via_asgi
    assert [s.split()[1] for s, _ in at_once] == [b"404", b"404", b"400", b"400"]


def test_pipelined_requests_are_answered_in_order(host: InProcessHost) -> None:
    """Inference requests pipelined in one read with a health check between: each
    answered, in the order sent, each naming its own request id."""
    app = _app(host)
    with bounded_server(app) as url:
        _warm(url)
        calls = _no_asgi_infer(app)
        bodies = [json.dumps({"inputs": [_X], "id": f"p{i}"}).encode() for i in range(4)]
        with _connect(url) as sock:
            sock.sendall(
                _request(bodies[0]) + _request(bodies[1])
                + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
                + _request(bodies[2]) + _request(bodies[3])
            )  # fmt: skip
            answers = list(_responses(sock, 5))
    assert calls == []
    assert [json.loads(b).get("id", "live") for _, _, b in answers] == [
        "p0", "p1", "live", "p2", "p3"
    ]  # fmt: skip


def test_an_http_1_0_request_is_answered_and_closed(host: InProcessHost) -> None:
    """HTTP/1.0 without keep-alive: the answer says ``connection: close`` and the
    connection is closed after it."""
    app = _app(host)
    with bounded_server(app) as url:
        _warm(url)
        calls = _no_asgi_infer(app)
        with _connect(url) as sock:
            sock.sendall(_request(_BODY, version=b"1.0"))
            [(status, headers, _)] = _responses(sock, 1)
            assert sock.recv(1) == b""  # closed by the server
    assert calls == []
    assert status.startswith(b"HTTP/1.1 200")
    assert headers["connection"] == "close"


def test_a_large_answer_computed_at_once_is_sent_whole(host: InProcessHost) -> None:
    """An answer over what is written at once (14,000 floats sent as 56 KB of binary
    data, answered as ~300 KB of JSON) is sent by the ASGI call in pieces, the run not
    repeated: whole, and equal to the input (an identity model)."""
    app = _app(host)
    values = np.random.default_rng(3).random((1, 14000), dtype=np.float32)
    header = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 14000], "datatype": "FP32",
                     "parameters": {"binary_data_size": values.nbytes}}]}
    ).encode()  # fmt: skip
    request = _request(header + values.tobytes(), "/v2/models/id_fp32/infer").replace(
        b"Host: x\r\n", b"Host: x\r\n%s: %d\r\n" % (HEADER_LENGTH.encode(), len(header))
    )
    with bounded_server(app) as url:
        _warm(url)
        for _ in range(5):  # the identity's runs measured quick
            with _connect(url) as sock:
                sock.sendall(request)
                list(_responses(sock, 1))
        calls = _no_asgi_infer(app)
        with _connect(url) as sock:
            sock.sendall(request)
            [(status, _, answer)] = _responses(sock, 1)
    assert calls == []
    assert status.startswith(b"HTTP/1.1 200")
    assert len(answer) > 256 << 10
    assert json.loads(answer)["outputs"][0]["data"] == values.ravel().tolist()


def test_an_answer_that_gives_its_budget_back_after_sending_is_not_written_at_once(
    host: InProcessHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that held more than ``SETTLE_AFTER_BYTES`` gives its bytes back once
    its answer is sent (a background task): written at once, its task never ran and the
    budget leaked.  Here every request is such a request (the threshold at 0)."""
    import edge_sync.serve.app as app_module

    monkeypatch.setattr(app_module, "SETTLE_AFTER_BYTES", 0)
    app = _app(host)
    with bounded_server(app) as url:
        _warm(url)
        calls = _no_asgi_infer(app)
        with _connect(url) as sock:
            sock.sendall(_request(_BODY))
            [(status, _, _)] = _responses(sock, 1)
        deadline = time.monotonic() + 10
        while _api(app).budget.used:
            assert time.monotonic() < deadline, _api(app).budget.used
            time.sleep(0.01)
    assert calls == []
    assert status.startswith(b"HTTP/1.1 200")
