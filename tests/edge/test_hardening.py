"""What a hostile review of the daemon found, each kept as a regression test: a git host
sending bytes that are not UTF-8, a forged golden case name, a failed commit, a resume
that could not build, a rotten cached blob, a frozen branch with expired metadata, a
metadata folder of gigabytes, a corrupt state file, SIGTERM in a slow download, SIGHUP
storms, a checkout damaged by a power cut, and idle polls that rewrite the state."""

from __future__ import annotations

import datetime as _dt
import errno
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from edge_sync.engine.base import LoadRequest
from edge_sync.engine.host import InProcessHost
from edge_sync.errors import EngineError
from tests.conftest import git
from tests.edge.conftest import SOURCES, EdgeRig

pytestmark = pytest.mark.integration


def _blob(rig: EdgeRig, sha: str) -> Path:
    return rig.tmp / "device/state/blobs/sha256" / sha


# --- daemon crashes -----------------------------------------------------------------


def test_git_host_sending_non_utf8_is_a_failed_sync_not_a_crash(rig: EdgeRig) -> None:
    from tests.edge._evil_git import serve

    rig.sync()
    srv, url = serve()
    try:
        report = rig.sync(repository={"url": url, "branch": "main"})
    finally:
        srv.close()
    assert report.result == "failed"


def test_backoff_survives_a_long_outage() -> None:
    from edge_sync.decide.schedule import backoff_delay

    # ~1025 failures in a row = ~10.7 days offline at max_backoff 15m
    assert backoff_delay(1025, 60.0, 900.0) == 900.0


def test_a_forged_golden_case_name_is_rejected_not_a_crash(
    rig: EdgeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipelines.publish._description as pd
    from signing.version_doc import VersionDoc

    rig.sync()

    def forged(**kw: Any) -> Any:  # a signer (bug or stolen key) names a case badly
        doc = VersionDoc(**kw)
        cases = [c.model_copy(update={"name": "../../x"}) for c in doc.goldens]
        return doc.model_copy(update={"goldens": cases})

    monkeypatch.setattr(pd, "VersionDoc", forged)
    rig.run(
        "version",
        "add",
        "mlp",
        "1.1.0",
        "--artifact",
        str(rig.models / "mlp/1.1.0.onnx"),
        "--parent",
        "1.0.0",
        "--golden-inputs",
        str(rig.models / "mlp/1.1.0.inputs.npz"),
    )
    rig.promote("1.1.0")
    report = rig.sync()  # a UsageError (a ValueError) from the signed name
    assert report.updates["mlp"].result == "rejected"


# --- swap / commit / resume consistency --------------------------------------------


def test_a_failed_commit_keeps_serving_the_committed_version(rig: EdgeRig) -> None:
    rig.sync()
    rig.release_version("1.1.0", "1.0.0")
    with rig.updater() as up:

        def full_disk(_state: Any) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch_commit = up.state
        setattr(monkeypatch_commit, "commit", full_disk)  # noqa: B010 - a full disk
        report = up.sync()
        assert report.result == "failed"
        committed = up.state.load().models["mlp"].serving
        engine = up.host.current("mlp")
        # docs/reference/daemon.md: failure at any stage keeps serving the current version
        assert engine.version == committed.version == "1.0.0"
        assert _blob(rig, engine.sha256).exists()


class _FailsOnce(InProcessHost):
    def __init__(self) -> None:
        super().__init__()
        self.fail = 2  # serving, then last_known_good (the same version)

    def build(self, request: LoadRequest) -> Any:
        if self.fail:
            self.fail -= 1
            raise EngineError("std::bad_alloc (memory pressure at boot)")
        return super().build(request)


def test_a_resume_that_could_not_build_is_retried_by_sync(rig: EdgeRig) -> None:
    rig.sync()
    rig.hosts["device"] = _FailsOnce()
    with rig.updater() as up:
        assert "std::bad_alloc" in up.resume()["mlp"]  # the first build fails
        up.sync()
        serving = up.state.load().models["mlp"].serving
        engine = up.host.current("mlp")
        assert engine is not None
        assert serving is not None
        assert engine.sha256 == serving.sha256  # the next sync built it again


def test_a_rotten_blob_is_never_served_from_the_cache(rig: EdgeRig) -> None:
    import onnx

    rig.sync()
    rig.release_version("1.1.0", "1.0.0")  # no goldens
    rig.sync()
    rig.release_version("2.0.0", "1.1.0")
    rig.sync()
    model = rig.state().models["mlp"]
    assert (model.serving.version, model.previous.version) == ("2.0.0", "1.1.0")
    blob = _blob(rig, model.previous.sha256)
    data = bytearray(blob.read_bytes())
    raw = max((t.raw_data for t in onnx.load_from_string(bytes(data)).graph.initializer), key=len)
    at = bytes(data).find(raw) + len(raw) // 2
    data[at] ^= 0x01  # one bit of one weight rots on the device's flash
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    rig.promote("1.1.0")  # operator rolls back to the held 1.1.0
    update = rig.sync().updates["mlp"]
    assert (update.result, update.version, update.method) == ("installed", "1.1.0", "full")
    serving = rig.state().models["mlp"].serving
    from edge_sync.state.store import StateDir

    assert StateDir(rig.tmp / "device/state").blobs.verify(serving.sha256)


# --- trust freshness -----------------------------------------------------------------


@pytest.mark.parametrize("rig", SOURCES, indirect=True)
def test_an_idle_poll_notices_expired_metadata(
    rig: EdgeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tuf.ngclient._internal.trusted_metadata_set as tms

    rig.sync()

    class Later(_dt.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return _dt.datetime.now(tz) + _dt.timedelta(days=400)

    monkeypatch.setattr(
        tms,
        "datetime",
        types.SimpleNamespace(datetime=Later, timezone=_dt.timezone, timedelta=_dt.timedelta),
    )
    from edge_sync import clock

    monkeypatch.setattr(clock, "now", lambda: Later.now(_dt.UTC))
    # the git host freezes the branch (or the remote its mirror: "not modified" for
    # ever); every signed role has long expired
    report = rig.sync()
    assert report.result == "failed"
    assert "expired" in (report.reason or ""), report.reason


# --- git host resource exhaustion -------------------------------------------------


def test_a_huge_file_in_trust_metadata_does_not_fill_the_disk(rig: EdgeRig) -> None:
    rig.sync()
    pad = rig.root / "trust/metadata/padding.json"
    with pad.open("wb") as fh:
        fh.truncate(300 << 20)  # 300 MiB of zeros: a pack of ~300 KiB
    git(rig.root, "add", "-f", str(pad))
    git(rig.root, "commit", "-qm", "padding")
    report = rig.sync()
    assert report.result == "failed"
    assert "over the 100000 files or 268435456 bytes a device accepts" in (report.reason or "")
    checkout = rig.tmp / "device/state/checkout"
    written = sum(p.stat().st_size for p in checkout.rglob("*") if p.is_file())
    assert written < 32 << 20  # the device reads < 10 MB of metadata, by its own caps
    assert rig.state().models["mlp"].serving.version == "1.0.0"


# --- config / status contract --------------------------------------------------------


def test_an_s3_artifact_remote_is_usable(rig: EdgeRig) -> None:
    rig.sync()
    rig.release_version("1.1.0", "1.0.0")
    report = rig.sync(artifacts={"url": "s3://fleet-bucket/modelreg"})
    assert "use a path, file://" not in (report.reason or "")


def test_status_sync_result_is_one_spec_allows(rig: EdgeRig) -> None:
    from edge_sync.config import load_edge_config
    from edge_sync.daemon import status_document

    rig.sync()
    doc = status_document(load_edge_config(rig.config()))
    assert doc["sync"]["result"] in ("current", "failed"), doc["sync"]


def test_a_corrupt_state_file_keeps_its_high_water_marks_and_serves_offline(
    rig: EdgeRig,
) -> None:
    rig.sync()
    (rig.tmp / "device/state/state.json").write_text("{")
    rig.hosts["device"] = InProcessHost()  # a restart
    with rig.updater(repository={"url": str(rig.tmp / "gone.git"), "branch": "main"}) as up:
        up.resume()
        up.sync()
        state = up.state.load()
        assert state.channels is not None
        assert up.host.current("mlp") is not None


# --- SIGTERM while a sync runs ---------------------------------------------------------


def test_sigterm_during_a_slow_download_stops_promptly(rig: EdgeRig) -> None:
    import signal
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    rig.sync()
    rig.release_version("1.1.0", "1.0.0")
    for delta in (rig.remote / "targets/deltas").rglob("*.delta"):
        delta.unlink()
    root = rig.remote.resolve()
    started = threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = (root / self.path.lstrip("/")).resolve()
            if not path.is_relative_to(root) or not path.is_file():
                self.send_error(404)
                return
            body = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            slow = self.path.endswith(".1.1.0.onnx")
            if slow:
                started.set()
            for i in range(0, len(body), 700):  # 1.4 kB/s: above the 1 kB/s floor
                try:
                    self.wfile.write(body[i : i + 700])
                    self.wfile.flush()
                except OSError:
                    return
                if slow:
                    time.sleep(0.5)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = rig.config(artifacts={"url": f"http://127.0.0.1:{server.server_address[1]}"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "modelreg", "edge", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert started.wait(60), "the daemon never started the download"
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(10)
        except subprocess.TimeoutExpired:
            rc = None
        assert rc == 0  # docs/reference/daemon.md: SIGTERM drains, exits 0 (TimeoutStopSec=60)
    finally:
        proc.kill()
        proc.wait()
        server.shutdown()


# --- power cut inside git's own files -----------------------------------------------


@pytest.mark.parametrize("victim", ["pack", "head"])
def test_a_checkout_damaged_by_a_power_cut_heals(rig: EdgeRig, victim: str) -> None:
    rig.sync()
    gitdir = rig.tmp / "device/state/checkout/.git"
    if victim == "pack":
        for f in list((gitdir / "objects/pack").glob("*.pack")) + [
            p for p in (gitdir / "objects").rglob("*") if p.is_file() and "pack" not in p.parts
        ]:
            f.chmod(0o644)
            f.write_bytes(b"")  # data never reached the disk (git does not fsync objects)
    else:
        (gitdir / "HEAD").write_bytes(b"")
    rig.release_version("1.1.0", "1.0.0")
    reports = [rig.sync() for _ in range(3)]
    assert reports[-1].result != "failed"


def test_an_idle_poll_does_not_rewrite_the_state_file(rig: EdgeRig) -> None:
    rig.sync()
    rig.sync()
    state_file = rig.tmp / "device/state/state.json"
    before = state_file.stat().st_ino
    assert rig.sync().result == "current"
    # every idle poll = temp file + fsync + rename + dir fsync (1440/day at 60 s on flash)
    assert state_file.stat().st_ino == before


_STORM_CHILD = """
import sys, tempfile, threading, time, os
import edge_sync.daemon as d
from edge_sync.config import EdgeConfig
from edge_sync.sync.updater import SyncOutcome
turns = [0]
class Quick:
    settled = {}
    gates = {}
    def __init__(self, *a, **k): pass
    def resume(self, **k):
        print("ready", flush=True)
        return {}
    def sync(self):
        turns[0] += 1
        return SyncOutcome("current")
    def next_gate_s(self):
        return None
    def check_gates(self):
        return {}
d.Updater = Quick
d.provision = lambda c, s: None
tmp = tempfile.mkdtemp()
cfg = EdgeConfig.model_validate({"apiVersion": "modelreg/v1", "kind": "EdgeConfig",
    "device": {"id": "d1"}, "repository": {"url": tmp, "poll_interval": "1ms", "jitter": 0},
    "trust": {"root": tmp + "/r.json"}, "artifacts": {"url": tmp}, "state_dir": tmp + "/s",
    "serve": {"listen": "127.0.0.1:0"}})
def watch():
    last = -1
    while True:
        time.sleep(0.5)
        if turns[0] == last:
            os._exit(3)  # the loop stopped turning: deadlocked
        last = turns[0]
threading.Thread(target=watch, daemon=True).start()
sys.exit(d.Daemon(cfg).run())
"""


def test_a_storm_of_sighup_never_deadlocks_the_loop() -> None:
    """Signal handlers only set flags (a lock taken there can deadlock the main thread,
    which held the same lock when the signal came)."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-c", _STORM_CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 5
        while proc.poll() is None and time.monotonic() < deadline:
            proc.send_signal(signal.SIGHUP)
            time.sleep(0.002)
        assert proc.poll() is None, f"exited {proc.returncode} during the storm"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_what_a_remote_says_reaches_status_as_plain_text_without_secrets(rig: EdgeRig) -> None:
    """Reasons quote remotes and URLs: a URL's password never reaches state.json, ``edge
    status`` or ``/status``, and a git host's escape sequences reach no terminal."""
    import json
    import socket

    from edge_sync.config import load_edge_config
    from edge_sync.daemon import status_document
    from tests.edge._evil_git import serve

    rig.sync()
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    secret = "s3cret-password-42"  # noqa: S105 - planted to be found
    url = f"http://deploy:{secret}@127.0.0.1:{port}/fleet.git"
    report = rig.sync(repository={"url": url, "branch": "main"})
    assert report.result == "failed"
    assert secret not in (report.reason or "")
    assert "http://***@127.0.0.1" in (report.reason or "")
    assert secret not in (rig.tmp / "device/state/state.json").read_text()
    config = load_edge_config(rig.config(repository={"url": url, "branch": "main"}))
    assert secret not in json.dumps(status_document(config))

    srv, evil = serve(b"ERR \x1b]0;owned\x07\x1b[2J\x1b[31mred\r\nno such repo\n")
    try:
        report = rig.sync(repository={"url": evil, "branch": "main"})
    finally:
        srv.close()
    said = report.reason or ""
    assert report.result == "failed"
    assert "no such repo" in said or "red" in said
    assert all(ch.isprintable() for ch in said), repr(said)
    assert "\x1b" not in (rig.state().sync.reason or "")
