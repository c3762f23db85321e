"""The trust attacks, replayed through the updater a daemon runs (issue 9, point 8):
whoever holds (or stole) online keys and controls the git host and the artifact remote.
Each time the device keeps what it serves and says why; the running-daemon replays of
rollback, forged signatures and swapped files are in ``test_daemon.py``.

Every attack runs twice: against a device that follows the git repository, and one
that follows the metadata mirrored to the artifact remote (``source: artifacts``,
issue 14), where the attacker writes the mirror instead of the branch."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata, TargetFile, Timestamp

from signing.keys import load_private_key, public_key_of
from signing.target_names import artifact_path
from signing.tuf_facts import TargetFacts
from signing.tuf_repo import TrustRepo
from signing.tuf_roles import (
    ONLINE_ROLES,
    TARGETS_DIR,
    build_timestamp,
    meta_file,
    stored_name,
    target_file,
    to_bytes,
)
from tests.edge.conftest import SOURCES, EdgeRig
from tests.trust_sim import online_signers, sign_online

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("rig", SOURCES, indirect=True)]

ARTIFACT = artifact_path("mlp", "1.1.0")


def _signers(rig: EdgeRig, pattern: str = "{role}.key") -> dict[str, CryptoSigner]:
    return online_signers(rig.root / ".modelreg/keys", pattern)


def _release(
    rig: EdgeRig, signers: Mapping[str, CryptoSigner], files: dict[str, TargetFile]
) -> None:
    """Sign a release of ``files`` with ``signers`` and push it to the git host (or the
    remote's mirror)."""
    sign_online(rig.root / "trust/metadata", signers, files)
    rig.push("an attacker's release")


def _installed_11(rig: EdgeRig) -> dict[str, TargetFile]:
    assert rig.sync().updates["mlp"].version == "1.0.0"
    rig.release_version("1.1.0", "1.0.0")
    assert rig.sync().updates["mlp"].version == "1.1.0"
    return dict(TrustRepo.load(rig.root / "trust/metadata").targets)


def test_stolen_online_keys_cannot_give_a_device_another_models_file(rig: EdgeRig) -> None:
    """Validly signed, but the facts signed with the file name another model: the
    right signature on the wrong file is still the wrong file."""
    files = _installed_11(rig)
    rig.release_version("2.0.0", "1.1.0")
    files = dict(TrustRepo.load(rig.root / "trust/metadata").targets)
    path = artifact_path("mlp", "2.0.0")
    facts = TargetFacts.from_custom(files[path].custom)
    data = (rig.root / "models/mlp/1.0.0.onnx").read_bytes()
    files[path] = target_file(path, data, facts.model_copy(update={"model": "cnn"}))
    (rig.remote / TARGETS_DIR / stored_name(files[path])).parent.mkdir(parents=True, exist_ok=True)
    (rig.remote / TARGETS_DIR / stored_name(files[path])).write_bytes(data)
    _release(rig, _signers(rig), files)
    report = rig.sync()
    update = report.updates["mlp"]
    assert update.result == "failed"
    assert report.failure == "model"
    assert "signed as model 'cnn', expected 'mlp'" in (update.reason or "")
    assert rig.state().models["mlp"].serving.version == "1.1.0"


def test_a_new_timestamp_over_an_old_snapshot_is_refused(rig: EdgeRig) -> None:
    """Mix and match: a stolen timestamp key lists the snapshot of an older release."""
    _installed_11(rig)
    signers = _signers(rig)
    folder = rig.root / "trust/metadata"
    trust = TrustRepo.load(folder)
    old = (folder / "1.snapshot.json").read_bytes()
    timestamp: Metadata[Timestamp] = Metadata(
        build_timestamp(
            trust.version("timestamp") + 1, datetime.now(UTC) + timedelta(days=1), meta_file(1, old)
        )
    )
    timestamp.sign(signers["timestamp"])
    (folder / "timestamp.json").write_bytes(to_bytes(timestamp))
    rig.push("rewind the snapshot")
    report = rig.sync()
    assert report.result == "failed"
    assert report.failure == "trust"  # counted by it at /metrics
    assert "snapshot" in (report.reason or "")
    assert rig.state().models["mlp"].serving.version == "1.1.0"


def test_keys_rotated_away_sign_nothing_a_device_accepts(rig: EdgeRig) -> None:
    """After ``keys rotate``, whoever kept the old online keys signs a release that
    swaps the artifact; the device, on the new root, refuses it."""
    files = _installed_11(rig)
    for role in ONLINE_ROLES:
        rig.run("keys", "rotate", "--role", role)
    rig.push("rotate the online keys")
    assert rig.sync().result == "current"  # the new root chain is followed
    facts = TargetFacts.from_custom(files[ARTIFACT].custom)
    forged = b"weights that were never reviewed"
    files[ARTIFACT] = target_file(ARTIFACT, forged, facts)
    (rig.remote / TARGETS_DIR / stored_name(files[ARTIFACT])).write_bytes(forged)
    _release(rig, _signers(rig, "{role}.*.key.old"), files)
    report = rig.sync()
    assert report.result == "failed"
    assert "signed by 0/1 keys" in (report.reason or ""), report.reason
    assert rig.state().models["mlp"].serving.version == "1.1.0"


def test_a_root_signed_by_a_rotated_away_root_key_is_refused(rig: EdgeRig) -> None:
    """After the root key is rotated, whoever kept the old one signs a next root that
    trusts their own online keys; the device, following the chain, refuses it."""
    from tuf.api.metadata import Root

    _installed_11(rig)
    rig.run("keys", "rotate", "--role", "root")
    rig.push("rotate the root key")
    assert rig.sync().result == "current"  # the device follows the new root
    folder = rig.root / "trust/metadata"
    newest = max(folder.glob("*.root.json"), key=lambda p: int(p.name.split(".")[0]))
    root = Metadata[Root].from_bytes(newest.read_bytes()).signed
    (old_path,) = (rig.root / ".modelreg/keys").glob("root*.key.old")
    old = load_private_key(old_path)
    root.version += 1
    forged: Metadata[Root] = Metadata(root)
    forged.sign(CryptoSigner(old, public_key_of(old)))
    (folder / f"{root.version}.root.json").write_bytes(to_bytes(forged))
    rig.push("a root from the old key")
    report = rig.sync()
    assert report.result == "failed"
    assert "root was signed by 0/1 keys" in (report.reason or ""), report.reason
    assert rig.state().models["mlp"].serving.version == "1.1.0"
