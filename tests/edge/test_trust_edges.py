"""Trust and transport edges (issue 23, point 7), each attack replayed through the
updater a daemon runs, or against a running daemon: a timestamp key that freezes a
device, S3 and HTTP endpoints that trickle, a stop during a transfer, a git host that
fills the disk, a link planted in a folder remote, a clock that ran ahead, redirects
to another origin, and a state dir made under umask 022."""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from tuf.api.metadata import Metadata, Timestamp

from edge_sync.sync.limits import TrustLimits
from signing.tuf_repo import TrustRepo
from signing.tuf_roles import build_timestamp, meta_file, to_bytes
from tests.conftest import git
from tests.edge.conftest import SOURCES, EdgeRig
from tests.http_sim import TrickleServer
from tests.trust_sim import online_signers

pytestmark = pytest.mark.integration

GITLESS = {"source": "artifacts", "poll_interval": "1s"}


def _status(rig: EdgeRig, **overrides: Any) -> dict[str, Any]:
    from edge_sync.config import load_edge_config
    from edge_sync.daemon import status_document

    return status_document(load_edge_config(rig.config(**overrides)))


def _later(monkeypatch: pytest.MonkeyPatch, days: float) -> None:
    """Move every clock the device reads (python-tuf's, the updater's, the status's)."""
    import tuf.ngclient._internal.trusted_metadata_set as tms

    from edge_sync import clock

    class Later(_dt.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return _dt.datetime.now(tz) + _dt.timedelta(days=days)

    monkeypatch.setattr(tms, "datetime", types.SimpleNamespace(
        datetime=Later, timezone=_dt.timezone, timedelta=_dt.timedelta))  # fmt: skip
    monkeypatch.setattr(clock, "now", lambda: Later.now(_dt.UTC))


# --- 1. every role's expiry --------------------------------------------------------------


@pytest.mark.parametrize("rig", SOURCES, indirect=True)
def test_a_timestamp_key_alone_cannot_freeze_a_device_past_the_snapshot_s_bound(
    rig: EdgeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timestamp key's holder signs a timestamp valid for a year over the current
    snapshot (7 days) and freezes the branch.  Eight days on, the idle poll used to
    look only at the timestamp's expiry and say "current", stale false."""
    assert rig.sync().updates["mlp"].version == "1.0.0"
    folder = rig.root / "trust/metadata"
    trust = TrustRepo.load(folder)
    snapshot = trust.version("snapshot")
    listed = meta_file(snapshot, (folder / f"{snapshot}.snapshot.json").read_bytes())
    expires = _dt.datetime.now(_dt.UTC) + _dt.timedelta(days=365)
    timestamp: Metadata[Timestamp] = Metadata(
        build_timestamp(trust.version("timestamp") + 1, expires, listed)
    )
    timestamp.sign(online_signers(rig.root / ".modelreg/keys")["timestamp"])
    (folder / "timestamp.json").write_bytes(to_bytes(timestamp))
    rig.push("a timestamp for a year")
    assert rig.sync().result == "current"  # a valid timestamp: taken
    assert _status(rig)["trust"]["stale"] is False

    _later(monkeypatch, days=8)  # the snapshot's 7 days are over; the branch is frozen
    report = rig.sync()
    assert report.result == "failed"
    assert "snapshot.json is expired" in (report.reason or ""), report.reason
    status = _status(rig)
    assert status["trust"]["stale"] is True
    assert status["trust"]["expired"] == ["snapshot"]
    assert status["sync"]["result"] == "failed"
    assert rig.state().models["mlp"].serving.version == "1.0.0"  # still served
    shown = rig.cli("edge", "status", "--config", str(rig.config()), cwd=rig.tmp)
    assert "trust: stale, snapshot expired" in shown.out + shown.err, shown


# --- 2. S3 and HTTP transfers: the same bounds, a prompt stop --------------------------


def _bucket(rig: EdgeRig) -> Path:
    """A folder laid out as the S3 endpoint serves it: ``/fleet/modelreg/...``."""
    root = rig.tmp / "s3root"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(rig.remote, root / "fleet/modelreg")
    return root


_FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",  # the endpoint checks no signature
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _s3_env(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    for key, value in _FAKE_AWS.items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize("scheme", ["s3", "http"])
def test_a_trickling_endpoint_fails_the_sync_at_the_same_bound(
    rig: EdgeRig, monkeypatch: pytest.MonkeyPatch, scheme: str
) -> None:
    """One byte every 2 s of the model: botocore's per-read timeout never fired, so an
    S3 sync hung for hours and recorded nothing.  Both transports are now cut when
    the rate is judged (the grace period) and the sync records the failure."""
    from tests.http_sim import Trickle

    root = _bucket(rig)
    with TrickleServer(root.resolve()) as server:
        server.slow[".onnx"] = Trickle(interval_s=2.0, give_up_s=60.0)
        _s3_env(monkeypatch, server.url("").rstrip("/"))
        url = "s3://fleet/modelreg" if scheme == "s3" else server.url("fleet/modelreg")
        rig.updater_options["limits"] = TrustLimits(rate_grace_s=2.0, min_bytes_per_s=1024)
        start = time.monotonic()
        report = rig.sync(artifacts={"url": url})
        elapsed = time.monotonic() - start
    update = report.updates["mlp"]
    assert (report.result, update.result) == ("failed", "failed")
    assert "slower than 1024 bytes/s" in (update.reason or ""), update.reason
    print(f"{scheme}: the sync failed after {elapsed:.2f} s: {update.reason}")
    assert elapsed < 20, elapsed  # the trickle would take ~2 days; cut after 2 s
    assert any(path.endswith(".onnx") for path in server.requests)


class _Bursts:
    """An artifact remote on 127.0.0.1 that sends the files named ``*suffix`` in
    bursts of ``burst`` bytes every 5 s (within every limit for a model's 12 kB), and
    notes when the device hangs up."""

    def __init__(self, root: Path, suffix: str = ".onnx", burst: int = 12_000) -> None:
        self.root = root.resolve()
        self.started = threading.Event()
        self.closed: float | None = None
        bursts = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = (bursts.root / self.path.split("?", 1)[0].lstrip("/")).resolve()
                if not path.is_relative_to(bursts.root) or not path.is_file():
                    self.send_error(404)
                    return
                body = path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                slow = path.name.endswith(suffix)
                step = burst if slow else len(body) or 1
                for i in range(0, len(body), step):
                    try:
                        self.wfile.write(body[i : i + step])
                        self.wfile.flush()
                    except OSError:
                        return
                    if slow:
                        bursts.started.set()
                        if self._hung_up(5.0):
                            bursts.closed = time.monotonic()
                            return

            def _hung_up(self, wait_s: float) -> bool:
                conn: socket.socket = self.connection
                poller = select.poll()  # not select(): any descriptor number works
                poller.register(conn, select.POLLIN)
                if not poller.poll(wait_s * 1000):
                    return False
                try:
                    return conn.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    return True

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{path}"

    @contextlib.contextmanager
    def running(self) -> Iterator[_Bursts]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()


@pytest.mark.parametrize("scheme", ["s3", "http", "mirror"])
def test_sigterm_stops_a_transfer_within_a_second(rig: EdgeRig, scheme: str) -> None:
    """A running daemon downloading from a remote that pauses 5 s between bursts (a
    model over S3 or HTTP, or the mirror's ``timestamp.json`` an HTTP poll reads): the
    connection is closed within 1 s of SIGTERM (it waited for the next burst over
    HTTP, and for a whole MiB over S3), the daemon exits 0, and the stop is recorded
    as no failure."""
    rig.sync()
    rig.release_version("1.1.0", "1.0.0")
    for delta in (rig.remote / "targets/deltas").rglob("*.delta"):
        delta.unlink()
    poll = scheme == "mirror"
    bursts = _Bursts(_bucket(rig), "timestamp.json", 100) if poll else _Bursts(_bucket(rig))
    with bursts.running() as remote:
        env = {**os.environ}
        if scheme == "s3":
            env.update(_FAKE_AWS, AWS_ENDPOINT_URL_S3=remote.url().rstrip("/"))
        url = "s3://fleet/modelreg" if scheme == "s3" else remote.url("fleet/modelreg")
        config = rig.config(artifacts={"url": url}, **({"repository": GITLESS} if poll else {}))
        proc = subprocess.Popen(
            [sys.executable, "-m", "modelreg", "edge", "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        try:
            assert remote.started.wait(90), "the daemon never started the download"
            time.sleep(0.5)  # inside the 5 s pause
            stopped = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(30)
            deadline = time.monotonic() + 10
            while remote.closed is None and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            proc.kill()
            proc.wait()
    assert rc == 0
    assert remote.closed is not None, "the device never hung up"
    print(f"{scheme}: the connection closed {remote.closed - stopped:.3f} s after SIGTERM")
    assert remote.closed - stopped < 1.0, remote.closed - stopped
    assert "stopping" not in (rig.state().sync.reason or "")


# --- 3. the git checkout's object store ----------------------------------------------


def _bytes_under(folder: Path) -> int:
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file())


def test_a_git_host_cannot_fill_the_disk_with_blobs_beside_the_metadata(rig: EdgeRig) -> None:
    """Every commit carries a new 4 MiB blob outside trust/metadata, and the host
    ignores the blob filter (as git does unless ``uploadpack.allowFilter``): the
    store held every commit's blobs (12 MiB more after three).  Now it holds one
    commit, and a commit over the cap fails the sync and gives the disk back."""
    rig.updater_options["limits"] = TrustLimits(git_store_max_bytes=10 << 20)
    assert rig.sync().updates["mlp"].version == "1.0.0"
    store = rig.tmp / "device/state/checkout/.git"
    before = _bytes_under(store)
    for i in range(3):
        (rig.root / "recordings.bin").write_bytes(os.urandom(4 << 20))
        git(rig.root, "add", "-f", "recordings.bin")
        git(rig.root, "commit", "-qm", f"recordings {i}")
        assert rig.sync().result == "current"
    after = _bytes_under(store)
    print(f".git: {before} bytes after the first sync, {after} after three 4 MiB commits")
    assert after < before + (5 << 20), (before, after)  # one 4 MiB blob, not three

    (rig.root / "recordings.bin").write_bytes(os.urandom(12 << 20))
    git(rig.root, "add", "-f", "recordings.bin")
    git(rig.root, "commit", "-qm", "recordings, bigger")
    report = rig.sync()
    assert report.result == "failed"
    assert "over the 10485760 a device keeps (TrustLimits.git_store_max_bytes)" in (
        report.reason or ""
    ), report.reason
    assert not store.exists()  # removed: the disk is given back
    assert rig.state().models["mlp"].serving.version == "1.0.0"


# --- 4. the folder probe follows no link ----------------------------------------------


@pytest.mark.parametrize("planted", ["timestamp.json", "metadata"])
def test_a_link_planted_in_a_folder_remote_is_not_followed(rig: EdgeRig, planted: str) -> None:
    """A link on the remote (the timestamp, or the whole metadata folder) to a file
    the daemon may read: the probe read it and published its SHA-256 as
    ``sync.commit``.  Now the poll fails, saying why, and nothing of it is shown."""
    over_folder = {"repository": GITLESS}
    assert rig.sync(**over_folder).updates["mlp"].version == "1.0.0"
    secret = rig.tmp / "secret"
    (secret / "metadata").mkdir(parents=True)
    (secret / "metadata/timestamp.json").write_bytes(b"root:$6$hash-of-a-password:19000::::::\n")
    digest = hashlib.sha256((secret / "metadata/timestamp.json").read_bytes()).hexdigest()
    if planted == "metadata":
        shutil.rmtree(rig.mirror)
        rig.mirror.symlink_to(secret / "metadata")
    else:
        (rig.mirror / "timestamp.json").unlink()
        (rig.mirror / "timestamp.json").symlink_to(secret / "metadata/timestamp.json")
    report = rig.sync(**over_folder)
    assert report.result == "failed"
    assert "a symbolic link on the remote" in (report.reason or ""), report.reason
    status = _status(rig, repository=GITLESS)
    assert digest not in repr(status)
    assert digest not in (rig.tmp / "device/state/state.json").read_text()
    assert rig.state().models["mlp"].serving.version == "1.0.0"


# --- 5. the newest sync record -------------------------------------------------------


def test_a_clock_that_ran_ahead_does_not_hide_later_failures(
    rig: EdgeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle poll noted while the clock said 2031; the clock is set right, and the
    next sync fails.  Compared as text, the 2031 "current" won: the failure was hidden
    from ``edge status`` and the fleet."""
    from edge_sync import clock

    assert rig.sync().updates["mlp"].version == "1.0.0"
    with monkeypatch.context() as ahead:
        ahead.setattr(clock, "now", lambda: _dt.datetime(2031, 1, 1, tzinfo=_dt.UTC))
        assert rig.sync().result == "current"  # idle: noted in sync.json
    assert _status(rig)["sync"]["last_checked"].startswith("2031")
    report = rig.sync(repository={"url": str(rig.tmp / "gone"), "branch": "main"})
    assert report.result == "failed"
    sync = _status(rig)["sync"]
    assert (sync["result"], sync["last_checked"][:4]) == ("failed", str(_dt.datetime.now().year))
    assert "repository" in sync["reason"]


# --- 6. redirects --------------------------------------------------------------------


@pytest.mark.parametrize("what", ["targets", "metadata", "timestamp"])
def test_a_redirect_to_another_origin_is_refused(rig: EdgeRig, what: str) -> None:
    """The remote sends the device elsewhere (another port here: another host or
    scheme alike) for a model, a metadata file, or the timestamp the poll reads."""
    rig.release_version("1.1.0", "1.0.0")
    remote = rig.remote.resolve()
    with TrickleServer(remote) as server, TrickleServer(remote) as elsewhere:
        if what == "targets":
            moved = [p for p in remote.rglob("*.onnx") if "1.1.0" in p.name]
        elif what == "metadata":
            moved = [p for p in (remote / "metadata").iterdir() if p.name != "timestamp.json"]
        else:
            moved = [remote / "metadata/timestamp.json"]
        for path in moved:
            name = path.relative_to(remote).as_posix()
            server.redirects[f"/{name}"] = elsewhere.url(name)
        report = rig.sync(repository=GITLESS, artifacts={"url": server.url()})
        assert report.result == "failed"
        reason = report.reason or ""
        if what == "targets":
            reason = report.updates["mlp"].reason or ""
        assert "refused a redirect (302)" in reason, reason
        assert f"to another origin, {elsewhere.url().rstrip('/')}: " in reason
        assert elsewhere.requests == []


# --- 7. the state dir's permissions and lock ----------------------------------------


def _mode(path: Path) -> int:
    return path.lstat().st_mode & 0o777


def test_the_state_dir_is_private_whatever_the_umask(rig: EdgeRig) -> None:
    """A daemon run by hand under umask 022 made its lock, state and blobs
    world-readable, and anyone could hold a shared lock on ``lock``, which stopped
    the daemon's restart."""
    shared = Path(tempfile.mkdtemp(prefix="modelreg-state-"))
    shared.chmod(0o755)  # a place other users can reach (as /var/lib is)
    state_dir = shared / "state"
    old = os.umask(0o022)
    try:
        assert rig.sync(state_dir=str(state_dir)).updates["mlp"].version == "1.0.0"
        assert rig.sync(state_dir=str(state_dir)).result == "current"  # idle: sync.json
        assert _mode(state_dir) == 0o700
        for name in ("lock", "state.json", "sync.json"):
            assert _mode(state_dir / name) == 0o600, name
        blobs = list((state_dir / "blobs/sha256").iterdir())
        assert blobs
        assert all(_mode(b) == 0o400 for b in blobs)
        if os.geteuid() == 0:  # root can be another user for a moment
            _another_user_cannot_hold_the_lock(rig, state_dir)
        # a state dir made loose by an older daemon is narrowed when next locked
        state_dir.chmod(0o755)
        (state_dir / "lock").chmod(0o644)
        rig.sync(state_dir=str(state_dir))
        assert (_mode(state_dir), _mode(state_dir / "lock")) == (0o700, 0o600)
    finally:
        os.umask(old)
        shutil.rmtree(shared, ignore_errors=True)


def _another_user_cannot_hold_the_lock(rig: EdgeRig, state_dir: Path) -> None:
    """``nobody`` takes a shared lock on ``lock`` and keeps it (util-linux ``flock``);
    the daemon's restart must still lock the state dir."""
    flock = shutil.which("flock")
    assert flock is not None, "util-linux flock is needed to replay the attack"
    holder = subprocess.Popen(
        [flock, "--shared", "--nonblock", str(state_dir / "lock"), "sh", "-c", "echo held; cat"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        user=65534,  # nobody
        group=65534,
        extra_groups=[],
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == ""  # refused: it could not even open the file
        assert rig.sync(state_dir=str(state_dir)).result == "current"  # the restart locks
    finally:
        holder.kill()
        holder.communicate()
