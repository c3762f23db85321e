"""Attacks on the bounded inference port found in review (issue 23, point 5), each
replayed against a real uvicorn server on 127.0.0.1 (the daemon's bounded protocol)
over real ONNX Runtime sessions; ``test_bounds.py`` holds the review's first ones."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from edge_sync.engine.host import InProcessHost
from tests.edge.test_bounds import _api, _app, bounded_server, host

__all__ = ["host"]  # the fixture, shared with test_bounds

pytestmark = pytest.mark.integration


def _stalled_reader(url: str) -> socket.socket:
    """A connection whose client reads (almost) nothing: a small receive buffer."""
    address, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect((address, int(port)))
    return sock


def test_an_answer_the_client_does_not_read_stays_charged_and_is_cut(
    host: InProcessHost,
) -> None:
    """A 40 KiB gzip request whose answer is 16 MB, from a client that never reads it:
    the answer was written to the connection's buffer whole and its charge given back
    at once, so that each such connection held 16 MB outside the budget, for as long as
    the client stayed (keep-alive's close waits for the buffer to drain).  Now the
    answer is sent in pieces, charged until the last is taken, and a connection that
    takes nothing for ``body_timeout`` is cut (what it held is freed)."""
    app = _app(host)
    values = np.zeros((16, 250_000), np.float32)
    head = json.dumps({
        "inputs": [{"name": "x", "shape": [16, 250_000], "datatype": "FP32",
                    "parameters": {"binary_data_size": values.nbytes}}],
        "parameters": {"binary_data_output": True},
    }).encode()  # fmt: skip
    body = gzip.compress(head + values.tobytes(), 6)
    assert len(body) < 64 << 10
    with bounded_server(app, body_timeout_s=2.0) as url, _stalled_reader(url) as sock:
        sock.sendall(
            b"POST /v2/models/id_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
            b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
            % (len(head), len(body))
            + body
        )
        start = sock.recv(12)  # the answer has begun
        assert start == b"HTTP/1.1 200", start
        assert _api(app).budget.used > 0  # held while the answer is not taken
        deadline = time.monotonic() + 30
        while _api(app).budget.used:  # given back once the stalled client is cut
            assert time.monotonic() < deadline, _api(app).budget.used
            time.sleep(0.05)
        received = len(start)
        with contextlib.suppress(ConnectionError):
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
    assert received < values.nbytes  # cut: the rest was not kept for it


def test_bodies_trickled_at_the_connection_cap_give_way(host: InProcessHost) -> None:
    """Connections at the cap that each sent a head and a little of their body, then a
    byte now and then (within ``body_timeout``): nothing was idle, so every new client
    was answered 503 for as long as the trickle went on (4096 such sockets held a
    daemon's inference port).  Now a new connection takes the place of the one whose
    request stalled longest, when it stalled over a second."""
    app = _app(host)
    with bounded_server(app, max_connections=4, body_timeout_s=60.0) as url:
        address, port = url.removeprefix("http://").split(":")
        tricklers = [socket.create_connection((address, int(port)), timeout=30) for _ in range(4)]
        try:
            for sock in tricklers:
                sock.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Length: 1000\r\n\r\n" + b" " * 10)  # fmt: skip
            deadline = time.monotonic() + 30
            while _api(app).budget.used == 0:  # the server reads their bodies
                assert time.monotonic() < deadline
                time.sleep(0.01)
            time.sleep(1.5)  # they stall past the second a request may stall and give way
            with socket.create_connection((address, int(port)), timeout=30) as client:
                client.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                assert client.recv(12) == b"HTTP/1.1 200"
            cut = 0
            for sock in tricklers:
                sock.settimeout(1)  # the cut one answers at once
                with contextlib.suppress(TimeoutError, ConnectionError):
                    cut += sock.recv(12) == b"HTTP/1.1 408"
            assert cut == 1
        finally:
            for sock in tricklers:
                sock.close()


def test_pipelined_requests_in_one_read_are_bounded(host: InProcessHost) -> None:
    """256 KiB of pipelined 31-byte requests on each of 20 connections whose clients do
    not read: every request of a read was parsed and queued at once (+276 MiB for 5 MiB
    sent, 55 times what was sent, outside every cap).  Now a connection that pipelines
    more than ``MAX_PIPELINED`` requests behind the one being answered is cut; a few
    pipelined requests are still answered in order."""
    from tests.edge.test_bounds import _Peak

    request = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    errors = _Errors()
    logging.getLogger("uvicorn.error").addHandler(errors)
    with contextlib.ExitStack() as stack, bounded_server(_app(host)) as url:
        stack.callback(logging.getLogger("uvicorn.error").removeHandler, errors)
        address, port = url.removeprefix("http://").split(":")
        with socket.create_connection((address, int(port)), timeout=30) as sock:
            sock.sendall(request * 3)
            replies = b""
            while replies.count(b"HTTP/1.1 200") < 3:
                chunk = sock.recv(65536)
                assert chunk, replies
                replies += chunk
        socks = []
        try:
            with _Peak() as peak:
                for _ in range(20):
                    sock = _stalled_reader(url)
                    socks.append(sock)
                    with contextlib.suppress(ConnectionError):
                        sock.sendall(request * ((256 << 10) // len(request)))
                for sock in socks:  # each is cut (what it sent was not all queued)
                    with contextlib.suppress(ConnectionError):
                        while sock.recv(65536):
                            pass
        finally:
            for sock in socks:
                sock.close()
    assert peak.grew < 64 << 20, f"+{peak.grew >> 20} MiB"
    assert errors.seen == []  # the request being answered was told its client left


class _Errors(logging.Handler):
    """The server's error records (uvicorn's loggers do not reach pytest's)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


@pytest.mark.parametrize("shape", [[0, 2**62], [0, 10**30]])
def test_an_empty_tensor_of_impossible_shape_is_the_requests_fault(
    host: InProcessHost, shape: list[int]
) -> None:
    """Zero values in a shape numpy cannot make (every cap counts the values: zero):
    answered 500 with a traceback in the log for each request, a log any client could
    fill.  Now 400, as any other data that does not fit its shape."""
    import httpx

    errors = _Errors()
    logging.getLogger("uvicorn.error").addHandler(errors)
    try:
        with bounded_server(_app(host)) as url:
            doc = {"inputs": [{"name": "x", "shape": shape, "datatype": "FP32", "data": []}]}
            response = httpx.post(f"{url}/v2/models/id_fp32/infer", json=doc, timeout=60)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(errors)
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith("input 'x': data is not FP32")
    assert errors.seen == []


def test_a_header_length_in_other_digits_is_the_requests_fault(host: InProcessHost) -> None:
    """``Inference-Header-Content-Length: ²`` (a digit to ``str.isdigit``, not to
    ``int``) on a gzip body: a 500 with a traceback in the log; now 400."""
    errors = _Errors()
    logging.getLogger("uvicorn.error").addHandler(errors)
    try:
        with bounded_server(_app(host)) as url, _stalled_reader(url) as sock:
            body = gzip.compress(b'{"inputs": []}')
            sock.sendall(
                b"POST /v2/models/id_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
                b"Inference-Header-Content-Length: \xb2\r\nContent-Length: %d\r\n\r\n"
                % len(body)
                + body
            )
            reply = sock.recv(65536)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(errors)
    assert reply.startswith(b"HTTP/1.1 400 "), reply
    assert errors.seen == []


def _pair_model(node: str) -> bytes:
    """``a`` [n] and ``b`` [m] -> ``c``: ``Add`` (fails when n and m do not broadcast)
    or ``Identity`` of ``a`` (never fails)."""
    from onnx import TensorProto, helper

    from tests.edge.test_conformance import _model

    inputs = ["a", "b"] if node == "Add" else ["a"]
    return _model(
        [helper.make_node(node, inputs, ["c"])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["m"])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, ["k"])],
    )  # fmt: skip


def test_a_request_every_version_fails_on_is_not_held_against_the_new_one(
    tmp_path: Path,
) -> None:
    """Inputs of symbolic sizes that do not broadcast make ONNX Runtime fail (``Fail``,
    not ``InvalidArgument``): answered 500 and counted as the new version's server
    error by its health gate, so that any client, told of the swap by
    ``x-model-version``, could fail the gate (more than 5% errors) and get a good
    version rejected for good.  Now a failure the previous version (still loaded
    during the gate) makes too is the request's (400, not counted); one only the new
    version makes is still its error."""
    import httpx

    from edge_sync.serve.app import create_app
    from edge_sync.serve.recorder import Recorder
    from tests.edge.test_conformance import serve_file

    host = InProcessHost(prepack="off")
    for version, node in (("1", "Add"), ("2", "Add"), ("3", "Identity"), ("4", "Add")):
        (tmp_path / f"{version}.onnx").write_bytes(_pair_model(node))
    serve_file(host, "pair", "1", tmp_path / "1.onnx")
    serve_file(host, "pair", "2", tmp_path / "2.onnx")  # 1 still loaded: the gate's time
    recorder = Recorder()
    app = create_app(host, ["pair"], dict, "t", recorder=recorder)
    doc = {"inputs": [{"name": "a", "shape": [2], "datatype": "FP32", "data": [1, 2]},
                      {"name": "b", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}  # fmt: skip
    with bounded_server(app) as url:
        response = httpx.post(f"{url}/v2/models/pair/infer", json=doc, timeout=60)
        assert response.status_code == 400, response.text
        assert response.headers["x-model-version"] == "2"
        assert recorder.window("pair", "2", 0, time.monotonic() + 1).errors == 0
        serve_file(host, "pair", "3", tmp_path / "3.onnx")  # answers it
        serve_file(host, "pair", "4", tmp_path / "4.onnx")  # fails where 3 answered
        response = httpx.post(f"{url}/v2/models/pair/infer", json=doc, timeout=60)
        assert response.status_code == 500, response.text
        assert recorder.window("pair", "4", 0, time.monotonic() + 1).errors == 1


def test_a_pipelined_body_that_stalls_is_closed_too(host: InProcessHost) -> None:
    """A request pipelined in the same packet as the one before it had no timer: its
    head ended after the first request's timer was disarmed, so its body could stop
    for good and hold what it sent of the budget.  Now it is timed out as any body."""
    app = _app(host)
    with bounded_server(app, body_timeout_s=0.5) as url:
        address, port = url.removeprefix("http://").split(":")
        with socket.create_connection((address, int(port)), timeout=30) as sock:
            sock.sendall(
                b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
                b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: %d\r\n\r\n" % (1 << 20) + b" " * (256 << 10)
            )
            reply = b""
            with contextlib.suppress(ConnectionError, TimeoutError):
                while chunk := sock.recv(65536):
                    reply += chunk
        assert reply.startswith(b"HTTP/1.1 200 "), reply[:80]
        assert b"HTTP/1.1 408 " in reply, reply
        deadline = time.monotonic() + 30
        while _api(app).budget.used:
            assert time.monotonic() < deadline, _api(app).budget.used
            time.sleep(0.01)
