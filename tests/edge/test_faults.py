"""Faults a device meets (issue 9, point 8): the remote down, serving garbage or endless
data, the repository unreachable, a full disk, a corrupted state file or blob.  In each
the device keeps serving what it served, says why, and recovers once the fault is gone."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.edge.conftest import EdgeRig

pytestmark = pytest.mark.integration


def _installed(rig: EdgeRig) -> None:
    assert rig.sync().updates["mlp"].version == "1.0.0"
    rig.release_version("1.1.0", "1.0.0")


def _serving(rig: EdgeRig) -> str:
    return str(rig.state().models["mlp"].serving.version)


def _artifact_on_remote(rig: EdgeRig, version: str) -> Path:
    (path,) = (rig.remote / "targets/models/mlp").glob(f"*.{version}.onnx")
    return path


def _no_leftovers(rig: EdgeRig) -> None:
    tmp = rig.tmp / "device/state/tmp"
    assert not [p for p in tmp.rglob("*") if p.is_file()], list(tmp.rglob("*"))


def test_the_artifact_remote_down(rig: EdgeRig) -> None:
    _installed(rig)
    away = rig.remote.with_name("away")
    rig.remote.rename(away)
    report = rig.sync()
    assert report.result == "failed"
    # the signed channels document is the first target a sync reads
    assert (report.reason or "").startswith("trust metadata: channels.json"), report.reason
    assert _serving(rig) == "1.0.0"
    assert rig.hosts["device"].current("mlp").version == "1.0.0"
    away.rename(rig.remote)
    assert rig.sync().updates["mlp"].version == "1.1.0"


def test_the_repository_unreachable(rig: EdgeRig) -> None:
    _installed(rig)
    report = rig.sync(repository={"url": str(rig.tmp / "nowhere.git"), "branch": "main"})
    assert report.result == "failed"
    assert (report.reason or "").startswith("repository: git ls-remote")
    assert report.failure == "repository"
    state = rig.state()
    assert state.sync.result == "failed"
    assert state.models["mlp"].serving.version == "1.0.0"


@pytest.mark.parametrize("fault", ["garbage", "endless"])
def test_the_remote_serving_wrong_bytes(rig: EdgeRig, fault: str) -> None:
    _installed(rig)
    for delta in (rig.remote / "targets/deltas").rglob("*.delta"):
        delta.unlink()  # no way around the full file
    artifact = _artifact_on_remote(rig, "1.1.0")
    good = artifact.read_bytes()
    if fault == "garbage":
        artifact.write_bytes(os.urandom(len(good)))
    else:
        artifact.write_bytes(good + b"\0" * (8 << 20))  # longer than signed
    report = rig.sync()
    update = report.updates["mlp"]
    assert (report.result, update.result) == ("failed", "failed")
    assert "models/mlp/1.1.0.onnx" in (update.reason or "")
    assert update.bytes_fetched < len(good) + (1 << 20)  # the endless file was cut off
    assert _serving(rig) == "1.0.0"
    _no_leftovers(rig)
    blobs = {p.name for p in (rig.tmp / "device/state/blobs/sha256").iterdir()}
    assert blobs == {rig.state().models["mlp"].serving.sha256}
    artifact.write_bytes(good)
    assert rig.sync().updates["mlp"].version == "1.1.0"


def test_a_corrupted_state_file_starts_afresh_from_verified_blobs(rig: EdgeRig) -> None:
    rig.sync()
    state_file = rig.tmp / "device/state/state.json"
    state_file.write_text('{"models": {"mlp": "not what you think"')
    report = rig.sync()
    update = report.updates["mlp"]
    assert (update.result, update.version, update.method) == ("installed", "1.0.0", "cached")
    assert (rig.tmp / "device/state/state.json.corrupt").is_file()
    assert _serving(rig) == "1.0.0"


def test_a_corrupted_blob_is_never_served_and_is_fetched_again(rig: EdgeRig) -> None:
    rig.sync()
    sha = rig.state().models["mlp"].serving.sha256
    blob = rig.tmp / "device/state/blobs/sha256" / sha
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[100] ^= 0x01
    blob.write_bytes(bytes(data))
    from edge_sync.engine.host import InProcessHost

    rig.hosts["device"] = InProcessHost()  # a restart: nothing in memory
    with rig.updater() as updater:
        problems = updater.resume()
        assert problems == {"mlp": "blob of 1.0.0 is missing or corrupt"}
        assert not blob.exists()
        assert updater.host.current("mlp") is None
    report = rig.sync()
    update = report.updates["mlp"]
    assert (update.result, update.version, update.method) == ("installed", "1.0.0", "full")


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if mounted.returncode:  # not root, no CAP_SYS_ADMIN: a machine fact, like a missing GPU
        pytest.skip(
            "a full disk needs a small tmpfs, and mounting one needs root or CAP_SYS_ADMIN, "
            f"which this test runner lacks ({mounted.stderr.strip()[:120]})"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_disk_fails_the_update_and_keeps_serving(rig: EdgeRig) -> None:
    with _tmpfs(rig.tmp / "small", "2m") as small:
        state = small / "state"
        _installed(rig)
        shutil.copytree(rig.tmp / "device/state", state)
        overrides = {"state_dir": str(state)}
        filler = small / "filler"
        with contextlib.suppress(OSError), filler.open("wb") as fh:
            while True:
                fh.write(b"\0" * 4096)
                fh.flush()
        report = rig.sync(**overrides)
        assert report.result == "failed"
        # wherever the disk ran out (the git fetch, a download, the state file): said
        said = report.updates["mlp"].reason if "mlp" in report.updates else report.reason
        assert said, report
        from edge_sync.state.store import StateDir

        kept = StateDir(state).load().models["mlp"].serving
        assert kept is not None
        assert kept.version == "1.0.0"
        assert not [p for p in (state / "tmp").rglob("*") if p.is_file()]
        filler.unlink()
        assert rig.sync(**overrides).updates["mlp"].version == "1.1.0"


def test_metrics_count_failed_syncs_by_what_failed_and_time_the_last_good_one(
    rig: EdgeRig,
) -> None:
    from edge_sync.serve.metrics import Metrics
    from edge_sync.sync.trust import trust_expiries

    metrics = Metrics()
    metrics.watch_trust(lambda: trust_expiries(rig.tmp / "device/state"))
    good = rig.sync()
    metrics.sync(good.result == "failed", good.failure, at=1000.0)
    bad = rig.sync(repository={"url": str(rig.tmp / "nowhere.git"), "branch": "main"})
    metrics.sync(bad.result == "failed", bad.failure)
    metrics.sync(bad.result == "failed", bad.failure)
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.text().decode().splitlines()
        if line and not line.startswith("#")
    }
    assert samples['modelreg_sync_failures_total{reason="repository"}'] == 2.0
    assert samples["modelreg_last_successful_sync_timestamp_seconds"] == 1000.0  # kept
    import time

    timestamp = samples['modelreg_trust_expiry_timestamp_seconds{role="timestamp"}']
    assert time.time() < timestamp < samples['modelreg_trust_expiry_timestamp_seconds{role="root"}']
    assert {k for k in samples if k.startswith("modelreg_trust_expiry")} == {
        f'modelreg_trust_expiry_timestamp_seconds{{role="{r}"}}'
        for r in ("root", "timestamp", "snapshot", "targets")
    }
