"""Serving with bounds on a real daemon process (issue 23, point 5): idle connections
never take the descriptors the update loop needs, and ``serve.management_listen`` moves
``/status`` and ``/metrics`` off the inference port."""

from __future__ import annotations

import contextlib
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.edge.conftest import EdgeRig
from tests.edge.test_serving import _wait_listen

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def _daemon(config: Path, nofile: int | None = None) -> Iterator[str]:
    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    log = config.with_suffix(".log")
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "modelreg", "edge", "run", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, preexec_fn=limit,  # noqa: PLW1509 - rlimit only
        )  # fmt: skip
    try:
        yield _wait_listen(config)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()


def _infer(base: str) -> httpx.Response:
    x = {"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}
    return httpx.post(f"{base}/v2/models/mlp/infer", json={"inputs": [x]}, timeout=30)


def test_idle_connections_never_take_the_update_loops_descriptors(rig: EdgeRig) -> None:
    """The review's attack: 300 idle connections to a daemon limited to 256
    descriptors refused new inference and failed the next sync (``Errno 24 ...
    state.json``).  Now the connections are capped below the limit, less a reserve,
    and the longest idle one gives way to a new one."""
    config = rig.config(repository={"url": str(rig.root), "poll_interval": "1h"})
    with _daemon(config, nofile=256) as base:
        host, port = base.removeprefix("http://").split(":")
        idle: list[socket.socket] = []
        try:
            idle.extend(socket.create_connection((host, int(port)), timeout=30) for _ in range(300))
            time.sleep(0.5)  # all accepted (or refused) by now
            assert _infer(base).status_code == 200
            before = httpx.get(f"{base}/status", timeout=30).json()["sync"]
            answer = httpx.post(f"{base}/v2/repository/sync", timeout=30)
            assert answer.json() == {"sync": "requested"}
            deadline = time.monotonic() + 60
            while (sync := httpx.get(f"{base}/status", timeout=30).json()["sync"]) == before:
                assert time.monotonic() < deadline, "no sync followed the request"
                time.sleep(0.1)
            assert sync["result"] in ("current", "updated", "ok"), sync
        finally:
            for sock in idle:
                sock.close()
    assert "Errno 24" not in config.with_suffix(".log").read_text()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_management_listen_moves_status_and_metrics_off_the_inference_port(
    rig: EdgeRig,
) -> None:
    port = _free_port()
    serve: dict[str, Any] = {"listen": "127.0.0.1:0", "management_listen": f"127.0.0.1:{port}"}
    config = rig.config(repository={"url": str(rig.root), "poll_interval": "1h"}, serve=serve)
    with _daemon(config) as base:
        management = f"http://127.0.0.1:{port}"
        status = httpx.get(f"{management}/status", timeout=30)
        assert status.status_code == 200
        assert status.json()["models"]["mlp"]["serving"]["version"] == "1.0.0"
        assert _infer(base).status_code == 200
        metrics = httpx.get(f"{management}/metrics", timeout=30)
        assert (
            'modelreg_requests_total{model="mlp",outcome="ok",protocol="rest",version="1.0.0"} 1'
            in metrics.text
        )
        for path in ("/status", "/metrics"):
            gone = httpx.get(f"{base}{path}", timeout=30)
            assert gone.status_code == 404
            assert gone.json() == {"error": "Not Found"}
        assert httpx.get(f"{management}/v2/health/live", timeout=30).status_code == 404


@pytest.mark.parametrize(
    ("serve", "said"),
    [
        ({"limits": {"inflight": "64MiB", "max_request": "128MiB"}},
         "max_request must not exceed inflight"),
        ({"limits": {"models": {"nope": {"max_batch": 8}}}},
         "serve.limits.models names ['nope'], not subscribed"),
        ({"limits": {"max_header": "12"}}, "serve.limits.max_header"),
        ({"management_listen": "nowhere"}, "serve.management_listen: expected host:port"),
    ],
)  # fmt: skip
def test_bad_serve_bounds_are_one_line_and_exit_1(rig: EdgeRig, serve: Any, said: str) -> None:
    config = rig.config(serve={"listen": "127.0.0.1:0", **serve})
    r = rig.cli("edge", "run", "--config", str(config), cwd=rig.tmp)
    assert r.code == 1
    (line,) = r.err.strip().splitlines()
    assert line.startswith(f"{config}:")
    assert said in line, line


def test_serve_bounds_are_read_with_sizes_and_durations(rig: EdgeRig) -> None:
    from edge_sync.config import load_edge_config

    limits = {"inflight": "1GiB", "max_request": "300MiB", "header_timeout": "2s",
              "model": {"max_batch": 16}, "models": {"mlp": {"max_batch": 4}}}  # fmt: skip
    config = load_edge_config(rig.config(serve={"listen": "127.0.0.1:0", "limits": limits}))
    bounds = config.serve.limits
    assert (bounds.inflight, bounds.max_request, bounds.header_timeout) == (1 << 30, 300 << 20, 2.0)
    assert (bounds.model.max_batch, bounds.models["mlp"].max_batch) == (16, 4)
