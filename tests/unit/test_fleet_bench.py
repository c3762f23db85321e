"""The fleet benchmark's parts that decide its figures: the artifact server's answers and
counters (conditional requests, ranges, paced downloads), the cost solve, the download
peak and the herd model on the daemon's own waits."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks._fleet_servers import read_control
from benchmarks._fleet_sim import RunParams, RunRecord, Snapshot
from benchmarks.fleet import _costs, herd_model, peak
from benchmarks.fleet import _installs as installs


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    root = tmp_path / "root"
    (root / "modelreg/targets/models/mlp").mkdir(parents=True)
    (root / "modelreg/metadata").mkdir(parents=True)
    (root / "modelreg/targets/models/mlp/1.onnx").write_bytes(bytes(range(256)) * 8)
    (root / "modelreg/metadata/timestamp.json").write_text('{"signed": {}}')
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks._fleet_servers", "http", str(root),
         "--rate", "8192", "--ready", str(ready)],
        start_new_session=True,
    )  # fmt: skip
    try:
        while not ready.exists():
            assert proc.poll() is None
            time.sleep(0.02)
        info = json.loads(ready.read_text())
        yield {**info, "url": f"http://127.0.0.1:{info['port']}/modelreg"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _get(url: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - loopback http
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_the_artifact_server_answers_conditionally_and_counts(server: dict[str, Any]) -> None:
    timestamp = f"{server['url']}/metadata/timestamp.json"
    status, headers, body = _get(timestamp)
    assert (status, body) == (200, b'{"signed": {}}')
    assert _get(timestamp, **{"If-None-Match": headers["ETag"]})[0] == 304
    assert _get(timestamp, **{"If-Modified-Since": headers["Last-Modified"]})[0] == 304
    assert _get(f"{server['url']}/metadata/nothing.json")[0] == 404
    stats = read_control(server["control"])
    assert stats["requests"] == 4
    assert stats["status_304"] == 2
    assert stats["status_404"] == 1
    assert stats["bytes_in"] > 0
    assert stats["bytes_out"] > len(b'{"signed": {}}')
    assert stats["downloads"] == []  # metadata is no download


def test_a_model_download_is_paced_ranged_and_recorded(server: dict[str, Any]) -> None:
    url = f"{server['url']}/targets/models/mlp/1.onnx"
    start = time.monotonic()
    status, _, body = _get(url)
    took = time.monotonic() - start
    assert (status, len(body)) == (200, 2048)
    assert took >= 0.2  # 2048 bytes at 8192 bytes/s
    status, headers, body = _get(url, Range="bytes=2000-")
    assert (status, body) == (206, (bytes(range(256)) * 8)[2000:])
    assert headers["Content-Range"] == "bytes 2000-2047/2048"
    # The server records a download once its last byte is written, which may be after
    # this client has read that byte: wait for the record (a few ms at most).
    deadline = time.monotonic() + 5
    while len(downloads := read_control(server["control"])["downloads"]) < 2:
        assert time.monotonic() < deadline, downloads
        time.sleep(0.01)
    assert len(downloads) == 2
    (begin, end), (range_begin, range_end) = sorted(downloads)
    assert end - begin >= 0.19  # the paced whole file, recorded from start to end
    assert range_end >= range_begin  # 48 bytes go in one write: it may take no time at all


def test_peak_counts_intervals_open_at_once() -> None:
    intervals = [(0.0, 2.0), (1.0, 3.0), (1.5, 1.7), (2.5, 4.0), (10.0, 11.0)]
    assert peak(intervals, -1, 20) == 3
    assert peak(intervals, 5, 20) == 1  # only those that start in the window
    assert peak([], 0, 1) == 0


def test_the_herd_model_uses_the_daemons_waits() -> None:
    # jitter 0: daemons started together poll together forever, and download together
    assert herd_model(500, 60, 0.0, release_s=200, download_s=1) == 500
    spread = herd_model(500, 60, 0.2, release_s=200, download_s=1)
    assert spread < 0.2 * 500
    assert spread == herd_model(500, 60, 0.2, release_s=200, download_s=1)  # seeded


def _snapshot(t: float, requests: float, cpu_s: float) -> Snapshot:
    return Snapshot(t, {"requests": requests, "bytes_in": 0, "bytes_out": 10 * requests},
                    {}, cpu_s, 0.0)  # fmt: skip


def test_costs_are_solved_from_the_idle_and_release_windows() -> None:
    """10 devices; an idle poll costs 1 request, a refresh 4, an update 9; in the canary
    window 2 devices update and 8 refresh, in production 8 update and 2 refresh, and each
    window also holds 5 idle polls."""
    n, idle, refresh, update = 10, 1, 4, 9
    events: list[dict[str, Any]] = []
    clock = 0.0

    def polls(count: int, kind: str) -> None:
        nonlocal clock
        for _ in range(count):
            clock += 0.01
            u = {"mlp": ["installed", "1.1.0", "delta", 1]} if kind == "update" else {}
            events.append({"t": clock, "d": "x", "r": "current", "u": u, "why": None})

    polls(20, "idle")
    up_to_canary = clock
    polls(2, "update")
    polls(8, "refresh")
    polls(5, "idle")
    canary_end = clock
    polls(8, "update")
    polls(2, "refresh")
    polls(5, "idle")
    totals = [0.0, 20 * idle, 20 * idle + 2 * update + 8 * refresh + 5 * idle]
    totals.append(totals[-1] + 8 * update + 2 * refresh + 5 * idle)
    record = RunRecord(RunParams(n, 60, 0.2, "artifacts"), [f"d{i}" for i in range(n)])
    for name, t, total in zip(
        ("up", "canary", "canary_end", "end"),
        (0.0, up_to_canary, canary_end, clock + 1),
        totals,
        strict=True,
    ):
        record.marks[name] = _snapshot(t, total, total / 1000)  # fmt: skip
    record.events = events
    costs = _costs(record)
    assert costs["idle_poll"]["requests"] == pytest.approx(idle)
    assert costs["refresh"]["requests"] == pytest.approx(refresh)
    assert costs["update"]["requests"] == pytest.approx(update)
    assert costs["update"]["cpu_ms"] == pytest.approx(update)
    assert costs["update"]["bytes"] == pytest.approx(10 * update)
    assert costs["counts"] == {"idle_polls": 20, "canary_installs": 2, "production_installs": 8}
    assert len(installs(events)) == 10
