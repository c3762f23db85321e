"""``modelreg edge run`` as a process, following a repository served by ``git daemon``
on 127.0.0.1: it installs, syncs at once on SIGHUP, refuses a second daemon on its state
dir, reports while running, stops cleanly on SIGTERM, serves its last version with the
network gone, and keeps its version (saying why) under every attack a git host or an
artifact remote can make."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from benchmarks._util import git_daemon
from tests.conftest import git
from tests.edge.conftest import EdgeRig

pytestmark = pytest.mark.integration


@contextmanager
def _hosted(rig: EdgeRig) -> Iterator[tuple[str, Path]]:
    """The fleet repository pushed to a bare one served by git daemon; (url, bare)."""
    served = rig.tmp / "served"
    served.mkdir()
    git(served, "clone", "-q", "--bare", str(rig.root), "fleet.git")
    with git_daemon(served) as base:
        yield f"{base}/fleet.git", served / "fleet.git"


def _publish(rig: EdgeRig, bare: Path) -> None:
    git(rig.root, "push", "-q", "--force", str(bare), "main:main")


def _status(config: Path) -> dict[str, Any]:
    from edge_sync.config import load_edge_config
    from edge_sync.daemon import status_document

    return status_document(load_edge_config(config))


def _wait(
    config: Path, done: Callable[[dict[str, Any]], bool], timeout: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status = _status(config)
        if done(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; last status: {json.dumps(status, indent=1)}")
        time.sleep(0.1)


def _start(config: Path) -> subprocess.Popen[str]:
    """``modelreg edge run`` in the background; its output goes to ``<config>.log``."""
    with config.with_suffix(".log").open("a") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "modelreg", "edge", "run", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def _serving(status: dict[str, Any]) -> str | None:
    serving = status["models"]["mlp"]["serving"]
    return None if serving is None else str(serving["version"])


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, proc.args


def test_the_daemon_follows_a_git_host_and_survives_what_it_does(rig: EdgeRig) -> None:
    with _hosted(rig) as (url, bare):
        # a long poll: everything after the first sync happens because of SIGHUP
        config = rig.config(repository={"url": url, "branch": "main", "poll_interval": "1h"})
        before = _status(config)
        assert before["daemon"]["running"] is False
        assert _serving(before) is None
        proc = _start(config)
        try:
            status = _wait(config, lambda s: _serving(s) == "1.0.0")
            assert status["daemon"]["running"] is True
            assert status["daemon"]["pid"] == proc.pid
            assert status["models"]["mlp"]["last_update"]["method"] == "full"
            assert status["trust"]["timestamp_version"] >= 1
            # a second daemon on the same state dir is refused, in one line
            second = subprocess.run(
                [sys.executable, "-m", "modelreg", "edge", "run", "--config", str(config)],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert second.returncode == 1
            assert "another modelreg edge daemon (pid" in second.stderr
            assert len(second.stderr.strip().splitlines()) == 1

            rig.release_version("1.1.0", "1.0.0")
            _publish(rig, bare)
            proc.send_signal(signal.SIGHUP)
            status = _wait(config, lambda s: _serving(s) == "1.1.0")
            assert status["models"]["mlp"]["last_update"]["method"] == "delta"
            released = git(bare, "rev-parse", "main").strip()

            # the git host rolls the branch back to an older, validly signed commit
            old = git(bare, "rev-parse", "main~2").strip()
            git(bare, "update-ref", "refs/heads/main", old)
            proc.send_signal(signal.SIGHUP)
            status = _wait(config, lambda s: s["sync"]["commit"] == old)
            assert status["sync"]["result"] == "failed"
            assert "timestamp" in status["sync"]["reason"]
            assert _serving(status) == "1.1.0"

            # the git host serves metadata edited by hand (no valid signature)
            git(bare, "update-ref", "refs/heads/main", released)
            forged = _forge_commit(rig, bare)
            proc.send_signal(signal.SIGHUP)
            status = _wait(config, lambda s: s["sync"]["commit"] == forged)
            assert status["sync"]["result"] == "failed"
            assert status["sync"]["reason"] == "trust metadata: timestamp was signed by 0/1 keys"
            assert _serving(status) == "1.1.0"
            git(bare, "update-ref", "refs/heads/main", released)

            # the artifact remote serves another signed file in place of the new one
            rig.release_version("2.0.0", "1.1.0")
            _publish(rig, bare)
            targets = rig.remote / "targets"
            (new,) = targets.rglob("*.2.0.0.onnx")
            (delta,) = targets.rglob("*.2.0.0.from-1.1.0.delta")
            (old_file,) = targets.rglob("*.1.0.0.onnx")
            saved = {p: p.read_bytes() for p in (new, delta)}
            new.write_bytes(old_file.read_bytes())
            delta.write_bytes(old_file.read_bytes()[: len(saved[delta])])
            proc.send_signal(signal.SIGHUP)
            status = _wait(config, lambda s: (s["models"]["mlp"]["last_update"] or {}).get(
                "version") == "2.0.0")  # fmt: skip
            update = status["models"]["mlp"]["last_update"]
            assert update["result"] == "failed"
            assert "models/mlp/2.0.0.onnx" in update["reason"]
            assert _serving(status) == "1.1.0"
            for path, data in saved.items():
                path.write_bytes(data)
            proc.send_signal(signal.SIGHUP)
            status = _wait(config, lambda s: _serving(s) == "2.0.0")
            assert status["models"]["mlp"]["previous"]["version"] == "1.1.0"
        finally:
            _stop(proc)
        assert _status(config)["daemon"]["running"] is False

    # the network is gone: a restart serves the last committed version (jitter 0: the
    # first poll at once, though the device has something to serve)
    offline = rig.config(
        repository={"url": str(rig.tmp / "gone.git"), "poll_interval": "1h", "jitter": 0}
    )
    proc = _start(offline)
    try:
        status = _wait(
            offline,
            lambda s: s["daemon"]["running"] and "repository" in (s["sync"]["reason"] or ""),
        )
        assert status["sync"]["result"] == "failed"
        assert _serving(status) == "2.0.0"
    finally:
        _stop(proc)


def _forge_commit(rig: EdgeRig, bare: Path) -> str:
    """A commit whose timestamp was edited by hand: a newer version pointing at a
    snapshot the attacker wrote, with the signature left as it was."""
    work = rig.tmp / "forger"
    if not work.exists():
        git(rig.tmp, "clone", "-q", str(bare), str(work))
    git(work, "fetch", "-q", "origin")
    git(work, "checkout", "-q", "-B", "main", "origin/main")
    timestamp = work / "trust/metadata/timestamp.json"
    doc = json.loads(timestamp.read_text())
    doc["signed"]["version"] += 1
    doc["signed"]["meta"]["snapshot.json"]["version"] += 1
    timestamp.write_text(json.dumps(doc))
    git(work, "-c", "user.name=m", "-c", "user.email=m@m.invalid", "commit", "-qam", "faster")
    git(work, "push", "-q", "origin", "main")
    return git(bare, "rev-parse", "main").strip()


def test_edge_status_before_any_run_and_a_bad_config(rig: EdgeRig) -> None:
    config = rig.config()
    r = rig.cli("edge", "status", "--config", str(config), "--json", cwd=rig.tmp)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["daemon"]["running"] is False
    assert doc["models"]["mlp"]["serving"] is None
    bad = config.with_name("bad.yaml")
    bad.write_text(config.read_text().replace('"poll_interval": "1s"', '"poll_interval": "soon"'))
    r = rig.cli("edge", "run", "--config", str(bad), cwd=rig.tmp)
    assert r.code == 1
    (line,) = r.err.strip().splitlines()
    assert line.startswith(f"{bad}:")
    assert "repository.poll_interval: expected a duration" in line


def test_a_restarted_device_that_serves_spreads_its_first_poll(rig: EdgeRig) -> None:
    """A fleet that restarts together (a power cut) must not poll together: a device
    with something to serve waits a random part of its poll interval first; SIGHUP
    still syncs at once."""
    rig.sync()  # 1.0.0 installed: what the restarted daemon serves at once
    before = _status(rig.config())["sync"]["last_checked"]
    config = rig.config(repository={"url": str(rig.root), "poll_interval": "24h"})
    address = rig.tmp / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(address))
        sock.settimeout(120)
        with config.with_suffix(".log").open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "modelreg", "edge", "run", "--config", str(config)],
                stdout=log, stderr=subprocess.STDOUT, text=True,
                env={**os.environ, "NOTIFY_SOCKET": str(address)},
            )  # fmt: skip
        try:
            assert sock.recv(4096).decode().startswith("READY=1\n")
            assert _serving(_status(config)) == "1.0.0"
            # the loop runs now: before, its first sync came at once (a second or so)
            sock.settimeout(5)
            with pytest.raises(TimeoutError):
                sock.recv(4096)
            assert _status(config)["sync"]["last_checked"] == before
            proc.send_signal(signal.SIGHUP)
            sock.settimeout(120)
            assert sock.recv(4096).decode() == "STATUS=last sync: current"
            assert _status(config)["sync"]["last_checked"] != before
        finally:
            _stop(proc)
