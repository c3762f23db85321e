"""TUF release metadata: the repository side, the device side, and every TUF attack.

Each attack test drives the real ``DeviceTrust`` against a repository the test controls
(``tests/trust_sim.py``) and asserts the one typed error the device raises.  The
attacker controls git and the artifact remote (it rewrites files); where an attack
needs signatures, the test says whose keys were stolen.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Key, Metadata, Root

from edge_sync.sync.trust import DeviceTrust, TrustLimits, foreign_root
from signing.errors import (
    DigestMismatchError,
    ExpiredError,
    FileSetError,
    ForeignRootError,
    HistoryError,
    KeyMaterialError,
    RollbackError,
    SignatureError,
    StaleKeyError,
    TargetMismatchError,
    TrustFetchError,
    VerificationError,
)
from signing.tuf_facts import (
    CHANNELS_PATH,
    ChannelsDoc,
    TargetFacts,
    check_channels_successor,
    next_channels,
)
from signing.tuf_repo import TrustRepo
from signing.tuf_roles import ONLINE_ROLES, Expiry, target_file
from tests.conftest import REPO_ROOT
from tests.trust_sim import RepoSim, load_signed, new_signer

MLP = "models/mlp/1.0.0.onnx"


@pytest.fixture
def sim(tmp_path: Path) -> RepoSim:
    """A repository with mlp 1.0.0 released to production."""
    sim = RepoSim.create(tmp_path)
    sim.release("mlp", "1.0.0", channels={"production": ("1.0.0", None)})
    return sim


def now() -> datetime:
    return datetime.now(UTC)


# --- happy paths --------------------------------------------------------------------------


def test_device_refreshes_and_fetches_verified_files(sim: RepoSim, tmp_path: Path) -> None:
    device = sim.device()
    device.refresh()
    assert sim.tracker is not None
    # root v2 probed (absent: v1 is newest), then the consistent snapshot chain
    assert sim.tracker.reset() == [
        "2.root.json",
        "timestamp.json",
        "1.snapshot.json",
        "1.targets.json",
    ]

    doc = device.channels()
    assert doc.models["mlp"]["production"].version == "1.0.0"
    assert doc.sequence == doc.models["mlp"]["production"].sequence == 1

    info = device.target_info(MLP)
    assert info.facts == TargetFacts(kind="artifact", model="mlp", version="1.0.0", ci_run="run-1")
    path = device.fetch(MLP, tmp_path / "art", model="mlp", version="1.0.0", kind="artifact")
    assert path.read_bytes() == sim.released[MLP]
    assert path.name == f"{info.sha256}.1.0.0.onnx"
    bundle = device.fetch(f"{MLP}.sig.json", tmp_path / "art", kind="bundle")
    assert bundle.read_bytes().startswith(b'{"bundle"')
    assert [n.split(".", 1)[1] for n in sim.tracker.reset()] == [
        "channels.json",
        "1.0.0.onnx",
        "1.0.0.onnx.sig.json",
    ]

    # a verified copy already in place is not fetched again; nothing half-written remains
    assert device.fetch(MLP, tmp_path / "art") == path
    assert sim.tracker.reset() == []
    assert sorted(p.name for p in (tmp_path / "art").iterdir()) == sorted([path.name, bundle.name])
    trusted = device.trusted()
    assert {role: s.version for role, s in trusted.items()} == {
        "root": 1,
        "targets": 1,
        "snapshot": 1,
        "timestamp": 1,
    }


def test_publish_is_idempotent(sim: RepoSim) -> None:
    before = {p.name: p.read_bytes() for p in sim.metadata_dir.iterdir()}
    result = sim.repo.publish(sim.signers)
    assert not result.changed
    assert result.versions == {}
    assert sim.repo.write_targets_to(sim.remote) == []
    # the same release staged again (a re-run of CI) changes nothing either
    sim.release("mlp", "1.0.0", channels={"production": ("1.0.0", None)})
    reloaded = TrustRepo.load(sim.metadata_dir)
    assert not reloaded.publish(sim.signers).changed
    assert {p.name: p.read_bytes() for p in sim.metadata_dir.iterdir()} == before


def test_second_release_bumps_each_online_role_once(sim: RepoSim) -> None:
    device = sim.device()
    device.refresh()
    sim.release("mlp", "1.1.0", channels={"production": ("1.0.0", None), "canary": ("1.1.0", 10)})
    assert [sim.repo.version(r) for r in ("root", "targets", "snapshot", "timestamp")] == [
        1,
        2,
        2,
        2,
    ]
    device = sim.device()
    device.refresh()
    doc = device.channels()
    assert doc.sequence == 2
    assert doc.models["mlp"]["production"].sequence == 1  # unchanged assignment
    assert doc.models["mlp"]["canary"].model_dump() == {
        "version": "1.1.0",
        "percent": 10.0,
        "sequence": 2,
    }


def test_released_files_are_immutable(sim: RepoSim) -> None:
    facts = TargetFacts(kind="artifact", model="mlp", version="1.0.0")
    with pytest.raises(ValueError, match="immutable"):
        sim.repo.add_target(MLP, b"other bytes", facts)
    with pytest.raises(ValueError, match="set_channels"):
        sim.repo.add_target(CHANNELS_PATH, b"{}", facts)
    with pytest.raises(ValueError, match="clean"):
        sim.repo.add_target("../escape.onnx", b"x", facts)


def test_refresh_timestamp_resigns_only_what_would_expire(sim: RepoSim) -> None:
    result = sim.repo.refresh_timestamp(sim.signers["timestamp"])
    assert result.versions == {"timestamp": 2}
    device = sim.device()
    device.refresh()
    assert device.trusted()["timestamp"].version == 2

    # six and a half days later the snapshot (7 days) would expire before a new timestamp
    later = now() + timedelta(days=6, hours=12)
    with pytest.raises(KeyMaterialError, match="snapshot"):
        sim.repo.refresh_timestamp(sim.signers["timestamp"], now=later)
    result = sim.repo.refresh_timestamp(
        sim.signers["timestamp"], snapshot_signer=sim.signers["snapshot"], now=later
    )
    assert result.versions == {"snapshot": 2, "timestamp": 3}


def test_publish_renews_roles_past_half_their_validity(sim: RepoSim) -> None:
    result = sim.repo.publish(sim.signers, now=now() + timedelta(hours=13))
    assert result.versions == {"timestamp": 2}
    result = sim.repo.publish(sim.signers, now=now() + timedelta(days=4))
    assert result.versions == {"snapshot": 2, "timestamp": 3}


def test_signing_with_a_key_of_another_role_is_refused(sim: RepoSim) -> None:
    wrong = {**sim.signers, "targets": sim.signers["snapshot"]}
    sim.repo.add_target(
        "models/mlp/2.0.0.onnx", b"2", TargetFacts(kind="artifact", model="mlp", version="2.0.0")
    )
    with pytest.raises(KeyMaterialError, match="not a targets key"):
        sim.repo.publish(wrong)
    with pytest.raises(KeyMaterialError, match="no targets key"):
        sim.repo.publish({"snapshot": sim.signers["snapshot"]})


def test_load_refuses_metadata_edited_in_git(sim: RepoSim) -> None:
    signed = sim.read_metadata("1.targets.json")
    targets = json.loads(signed)
    targets["signed"]["targets"]["evil.onnx"] = {"length": 1, "hashes": {"sha256": "0" * 64}}
    sim.write_metadata("1.targets.json", json.dumps(targets).encode())
    with pytest.raises(DigestMismatchError, match=r"1\.targets\.json"):
        TrustRepo.load(sim.metadata_dir)
    sim.write_metadata("1.targets.json", signed)
    ts = json.loads(sim.read_metadata("timestamp.json"))
    ts["signed"]["expires"] = "2100-01-01T00:00:00Z"
    sim.write_metadata("timestamp.json", json.dumps(ts).encode())
    with pytest.raises(SignatureError, match=r"timestamp\.json"):
        TrustRepo.load(sim.metadata_dir)


def test_channel_sequences_only_grow(sim: RepoSim) -> None:
    previous = sim.channels_doc()
    assert previous is not None
    same = next_channels(previous, {"mlp": {"production": ("1.0.0", None)}})
    assert same is previous
    back = ChannelsDoc.model_validate({"sequence": 0, "models": {}})
    with pytest.raises(RollbackError):
        sim.repo.set_channels(back)
    moved = next_channels(previous, {"mlp": {"production": ("1.1.0", None)}})
    stale = moved.model_copy(
        update={
            "models": {
                "mlp": {
                    "production": moved.models["mlp"]["production"].model_copy(
                        update={"sequence": 1}
                    )
                }
            }
        }
    )
    with pytest.raises(RollbackError, match="production"):
        check_channels_successor(previous, stale)
    sim.repo.set_channels(moved, previous)


# --- arbitrary artifact -------------------------------------------------------------------


def test_arbitrary_artifact_is_refused(sim: RepoSim, tmp_path: Path) -> None:
    stored = sim.target_file(MLP)
    stored.write_bytes(b"X" * len(sim.released[MLP]))  # same length, other bytes
    device = sim.device()
    with pytest.raises(DigestMismatchError, match=MLP):
        device.fetch(MLP, tmp_path / "art")
    assert not (tmp_path / "art").exists() or not any((tmp_path / "art").iterdir())


def test_unsigned_target_is_refused(sim: RepoSim, tmp_path: Path) -> None:
    with pytest.raises(FileSetError, match="not a signed target"):
        sim.device().fetch("models/mlp/6.6.6.onnx", tmp_path)


# --- rollback -----------------------------------------------------------------------------


def test_rollback_of_timestamp_is_refused(sim: RepoSim) -> None:
    old = {p.name: p.read_bytes() for p in sim.metadata_dir.iterdir()}
    sim.release("mlp", "1.1.0")
    sim.device().refresh()
    # the attacker serves the old checkout (a git reset): every file validly signed
    for name, data in old.items():
        sim.write_metadata(name, data)
    with pytest.raises(RollbackError, match="timestamp version 1 must be >= 2"):
        sim.device().refresh()


def test_rollback_of_snapshot_is_refused(sim: RepoSim) -> None:
    sim.release("mlp", "1.1.0")
    sim.device().refresh()
    # stolen timestamp key: a new timestamp that points at the old snapshot
    sim.forge(
        "timestamp", 3, [sim.signers["timestamp"]], listed=sim.read_metadata("1.snapshot.json")
    )
    with pytest.raises(RollbackError, match="snapshot version must be >= 2"):
        sim.device().refresh()


def test_rollback_of_targets_is_refused(sim: RepoSim) -> None:
    sim.release("mlp", "1.1.0")
    sim.device().refresh()
    # stolen snapshot + timestamp keys: a new snapshot that lists the old targets
    snapshot = sim.forge(
        "snapshot", 3, [sim.signers["snapshot"]], listed=sim.read_metadata("1.targets.json")
    )
    sim.forge("timestamp", 3, [sim.signers["timestamp"]], listed=snapshot)
    with pytest.raises(RollbackError, match=r"targets\.json"):
        sim.device().refresh()


def test_rollback_of_root_is_refused(sim: RepoSim) -> None:
    sim.repo.rotate_root(
        sim.root_signers, [s.public_key for s in sim.root_signers], sim.root_signers, 1
    )
    device = sim.device()
    device.refresh()
    assert device.trusted()["root"].version == 2
    # the old root, validly signed by the same keys, served as the next version
    sim.write_metadata("3.root.json", sim.read_metadata("1.root.json"))
    with pytest.raises(RollbackError, match="Expected root version 3"):
        sim.device().refresh()


# --- indefinite freeze --------------------------------------------------------------------


def test_expired_timestamp_is_refused(tmp_path: Path) -> None:
    sim = RepoSim.create(tmp_path)
    sim.release("mlp", "1.0.0", now=now() - timedelta(days=2))  # timestamp: 1 day
    with pytest.raises(ExpiredError, match=r"timestamp\.json is expired"):
        sim.device().refresh()


def test_expired_snapshot_is_refused(tmp_path: Path) -> None:
    sim = RepoSim.create(tmp_path)
    sim.release("mlp", "1.0.0", now=now() - timedelta(days=8))  # snapshot: 7 days
    sim.repo.refresh_timestamp(sim.signers["timestamp"], now=now() - timedelta(days=8))
    sim.forge(
        "timestamp", 9, [sim.signers["timestamp"]], listed=sim.read_metadata("1.snapshot.json")
    )
    with pytest.raises(ExpiredError, match=r"snapshot\.json is expired"):
        sim.device().refresh()


def test_expired_root_is_refused(tmp_path: Path) -> None:
    sim = RepoSim.create(
        tmp_path, expiry=Expiry(root=timedelta(days=1)), now=now() - timedelta(days=2)
    )
    sim.release("mlp", "1.0.0")
    with pytest.raises(ExpiredError, match=r"root\.json is expired"):
        sim.device().refresh()


# --- endless data -------------------------------------------------------------------------


def test_target_longer_than_signed_is_refused(sim: RepoSim, tmp_path: Path) -> None:
    stored = sim.target_file(MLP)
    stored.write_bytes(sim.released[MLP] + b"and more")
    with pytest.raises(DigestMismatchError, match=r"longer than the \d+ bytes signed"):
        sim.device().fetch(MLP, tmp_path)


def test_endless_target_stream_stops_at_the_signed_length(sim: RepoSim, tmp_path: Path) -> None:
    device = sim.device()
    assert sim.tracker is not None
    sim.tracker.endless.add(sim.target_file(MLP).name)
    with pytest.raises(DigestMismatchError, match=r"longer than the \d+ bytes signed"):
        device.fetch(MLP, tmp_path)
    assert sim.tracker.bytes_served < 200_000  # stopped after the first oversized chunk


def test_oversized_timestamp_is_refused(sim: RepoSim) -> None:
    ts = sim.read_metadata("timestamp.json")
    sim.write_metadata("timestamp.json", ts + b" " * 20_000)  # nothing signed caps it
    with pytest.raises(DigestMismatchError, match="16384"):
        sim.device().refresh()


def test_snapshot_longer_than_listed_is_refused(sim: RepoSim) -> None:
    snapshot = sim.read_metadata("1.snapshot.json")
    sim.write_metadata("1.snapshot.json", snapshot + b" " * 10)
    with pytest.raises(DigestMismatchError):
        sim.device().refresh()


def test_channels_document_over_the_cap_is_refused(sim: RepoSim) -> None:
    with pytest.raises(VerificationError, match="over the 10 allowed"):
        sim.device(limits=TrustLimits(channels_max_length=10)).channels()


# --- mix-and-match ------------------------------------------------------------------------


def test_old_snapshot_with_new_timestamp_is_refused(sim: RepoSim) -> None:
    sim.release("mlp", "1.1.0")
    # the attacker serves the old (validly signed) snapshot under the new one's name
    sim.write_metadata("2.snapshot.json", sim.read_metadata("1.snapshot.json"))
    with pytest.raises(DigestMismatchError):
        sim.device().refresh()


def test_old_targets_with_new_snapshot_is_refused(sim: RepoSim) -> None:
    sim.release("mlp", "1.1.0")
    sim.write_metadata("2.targets.json", sim.read_metadata("1.targets.json"))
    with pytest.raises(DigestMismatchError):
        sim.device().refresh()


# --- wrong target -------------------------------------------------------------------------


def test_signed_target_of_another_model_is_refused(tmp_path: Path) -> None:
    sim = RepoSim.create(tmp_path)
    # validly signed, but its facts say it is cnn 2.0.0 (a mix-up or a malicious path)
    sim.release("mlp", "1.0.0", facts={"model": "cnn", "version": "2.0.0"})
    device = sim.device()
    with pytest.raises(TargetMismatchError, match="signed as model 'cnn', expected 'mlp'"):
        device.fetch(MLP, tmp_path / "art", model="mlp", version="1.0.0")
    with pytest.raises(TargetMismatchError, match="signed as kind 'bundle'"):
        device.fetch(f"{MLP}.sig.json", tmp_path / "art", kind="artifact")
    with pytest.raises(TargetMismatchError, match="signed as kind 'artifact'"):
        device.fetch(MLP, tmp_path / "art", kind="bundle")


def test_other_signed_target_served_in_place_is_refused(sim: RepoSim, tmp_path: Path) -> None:
    sim.release("mlp", "1.1.0")
    # the remote serves the (validly signed) 1.1.0 bytes where 1.0.0 was asked for
    sim.target_file(MLP).write_bytes(sim.target_file("models/mlp/1.1.0.onnx").read_bytes())
    with pytest.raises(DigestMismatchError):
        sim.device().fetch(MLP, tmp_path, model="mlp", version="1.0.0")


# --- key compromise: threshold, rotation, revocation --------------------------------------


def test_root_below_threshold_is_refused(tmp_path: Path) -> None:
    sim = RepoSim.create(tmp_path, root_keys=2, root_threshold=2)
    sim.release("mlp", "1.0.0")
    sim.device().refresh()
    # one stolen root key: a root v2 that hands the timestamp role to the attacker
    attacker = new_signer()
    root = load_signed(sim.read_metadata("1.root.json"))
    assert isinstance(root, Root)
    root.version = 2
    root.add_key(attacker.public_key, "timestamp")
    sim.forge_root(root, [sim.root_signers[0]])
    with pytest.raises(SignatureError, match="root was signed by 1/2 keys"):
        sim.device().refresh()


def test_provisioning_an_under_signed_root_is_refused(tmp_path: Path) -> None:
    sim = RepoSim.create(tmp_path, root_keys=2, root_threshold=2)
    md = Metadata.from_bytes(sim.read_metadata("1.root.json"))
    md.signatures.popitem()
    with pytest.raises(SignatureError):
        DeviceTrust.provision(tmp_path / "dev", md.to_bytes())
    with pytest.raises(KeyMaterialError, match="no trust root"):
        DeviceTrust(tmp_path / "dev", sim.checkout, sim.remote)


def test_repository_refuses_rotation_below_the_old_threshold(tmp_path: Path) -> None:
    sim = RepoSim.create(tmp_path, root_keys=2, root_threshold=2)
    new = new_signer()
    with pytest.raises(KeyMaterialError, match="1/2 of the previous root keys"):
        sim.repo.rotate_root(sim.root_signers[:1], [new.public_key], [new], 1)


def test_metadata_signed_by_an_unknown_key_is_refused(sim: RepoSim) -> None:
    sim.forge("timestamp", 2, [new_signer()], listed=sim.read_metadata("1.snapshot.json"))
    with pytest.raises(SignatureError, match="timestamp was signed by 0/1 keys"):
        sim.device().refresh()


def test_root_rotation_chain_is_followed(sim: RepoSim, tmp_path: Path) -> None:
    device = sim.device()
    device.refresh()
    for _ in range(2):  # root 1 -> 2 -> 3, each with a new root key
        new = new_signer()
        sim.repo.rotate_root(sim.root_signers, [new.public_key], [new], 1)
        sim.root_signers = [new]
    sim.release("mlp", "1.1.0")
    device = sim.device()
    device.refresh()
    assert sim.tracker is not None
    assert sim.tracker.fetched[:3] == ["2.root.json", "3.root.json", "4.root.json"]
    assert device.trusted()["root"].version == 3
    assert device.fetch("models/mlp/1.1.0.onnx", tmp_path / "art").is_file()


def test_revoked_online_key_is_refused(sim: RepoSim) -> None:
    old = sim.signers["timestamp"]
    new = new_signer()
    result = sim.repo.revoke_key(
        "timestamp",
        old.public_key.keyid,
        sim.root_signers,
        replacement=new.public_key,
        signers={"timestamp": new},
    )
    assert result.versions == {"root": 2, "timestamp": 2}
    sim.signers["timestamp"] = new
    sim.device().refresh()
    # the thief of the revoked key signs a newer timestamp
    sim.forge("timestamp", 99, [old], listed=sim.read_metadata("1.snapshot.json"))
    with pytest.raises(SignatureError, match="timestamp was signed by 0/1 keys"):
        sim.device().refresh()


def test_revoked_root_key_is_refused(tmp_path: Path) -> None:
    sim = RepoSim.create(tmp_path, root_keys=2, root_threshold=1)
    sim.release("mlp", "1.0.0")
    stolen, kept = sim.root_signers
    result = sim.repo.revoke_key("root", stolen.public_key.keyid, [kept])
    assert result.versions == {"root": 2}
    sim.device().refresh()
    root = load_signed(sim.read_metadata("2.root.json"))
    assert isinstance(root, Root)
    root.version = 3
    root.add_key(stolen.public_key, "root")
    sim.forge_root(root, [stolen])
    with pytest.raises(SignatureError, match="root was signed by 0/1 keys"):
        sim.device().refresh()


def test_revoking_below_threshold_is_refused(sim: RepoSim) -> None:
    key = sim.signers["snapshot"].public_key
    with pytest.raises(ValueError, match="0 key"):
        sim.repo.revoke_key("snapshot", key.keyid, sim.root_signers)
    with pytest.raises(ValueError, match="not a targets key"):
        sim.repo.revoke_key("targets", key.keyid, sim.root_signers)


def test_fast_forward_attack_recovery(sim: RepoSim) -> None:
    sim.device().refresh()
    # stolen snapshot + timestamp keys: versions pushed far ahead
    stolen = {role: sim.signers[role] for role in ("snapshot", "timestamp")}
    snapshot = sim.forge("snapshot", 1000, [stolen["snapshot"]], listed_version=1000)
    sim.forge("timestamp", 1000, [stolen["timestamp"]], listed=snapshot)
    with pytest.raises(TrustFetchError, match=r"1000\.targets\.json"):
        sim.device().refresh()
    device = sim.device()
    assert device.trusted()["timestamp"].version == 1000  # the device took the bait

    sim.release("mlp", "1.1.0")  # the repository's own versions are far lower
    with pytest.raises(RollbackError):
        sim.device().refresh()

    fresh = {role: new_signer() for role in stolen}
    sim.repo.revoke_key(
        "timestamp",
        stolen["timestamp"].public_key.keyid,
        sim.root_signers,
        replacement=fresh["timestamp"].public_key,
        signers={"timestamp": fresh["timestamp"]},
    )
    # a new timestamp key alone is not enough: the trusted snapshot still lists targets v1000
    with pytest.raises(RollbackError, match=r"targets\.json"):
        sim.device().refresh()
    sim.repo.revoke_key(
        "snapshot",
        stolen["snapshot"].public_key.keyid,
        sim.root_signers,
        replacement=fresh["snapshot"].public_key,
        signers=fresh,
    )
    device = sim.device()
    device.refresh()
    assert {role: s.version for role, s in device.trusted().items()} == {
        "root": 3,
        "timestamp": 4,
        "snapshot": 3,
        "targets": 2,
    }
    assert device.channels().models["mlp"]["production"].version == "1.0.0"


# --- transport and provisioning ------------------------------------------------------------


def test_metadata_symlinked_outside_the_checkout_is_refused(sim: RepoSim, tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_bytes(sim.read_metadata("timestamp.json"))
    (sim.metadata_dir / "timestamp.json").unlink()
    (sim.metadata_dir / "timestamp.json").symlink_to(secret)
    with pytest.raises(TrustFetchError, match="outside the served folders"):
        sim.device().refresh()


def test_nothing_published_yet_is_a_fetch_error(tmp_path: Path) -> None:
    sim = RepoSim.create(tmp_path)
    with pytest.raises(TrustFetchError, match="not found"):
        sim.device().refresh()


def test_provisioning_is_idempotent_and_guarded(sim: RepoSim, tmp_path: Path) -> None:
    root = sim.read_metadata("1.root.json")
    DeviceTrust.provision(tmp_path / "dev", root)
    DeviceTrust.provision(tmp_path / "dev", root)
    other = RepoSim.create(tmp_path / "other").read_metadata("1.root.json")
    with pytest.raises(ValueError, match="another root"):
        DeviceTrust.provision(tmp_path / "dev", other)
    DeviceTrust.provision(tmp_path / "dev", other, replace=True)
    with pytest.raises(VerificationError):
        DeviceTrust.provision(tmp_path / "dev2", b"not json")


def test_remote_urls(sim: RepoSim, tmp_path: Path) -> None:
    DeviceTrust.provision(sim.state, sim.read_metadata("1.root.json"))
    device = DeviceTrust(sim.state, sim.checkout, sim.remote.as_uri())
    assert device.fetch(MLP, tmp_path / "a").read_bytes() == sim.released[MLP]
    with pytest.raises(ValueError, match=r"s3://"):
        DeviceTrust(sim.state, sim.checkout, "ftp://example.invalid/remote")


def test_edge_trust_imports_no_ci_tooling() -> None:
    code = (
        "import sys, edge_sync.sync.trust; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'mlflow', 'dvc', 'pipelines'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_root_holds_public_keys_only(sim: RepoSim) -> None:
    """No private key material reaches git."""
    root = json.loads(sim.read_metadata("1.root.json"))
    for key in root["signed"]["keys"].values():
        assert "private" not in key["keyval"]
        assert Key.from_dict("x", dict(key)).keytype == "ecdsa"


def test_remote_over_http_on_loopback(sim: RepoSim, tmp_path: Path) -> None:
    handler = functools.partial(_QuietHandler, directory=str(sim.remote))
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        try:
            DeviceTrust.provision(sim.state, sim.read_metadata("1.root.json"))
            url = f"http://127.0.0.1:{server.server_address[1]}/"
            device = DeviceTrust(sim.state, sim.checkout, url)
            assert device.fetch(MLP, tmp_path / "a").read_bytes() == sim.released[MLP]
            sim.target_file(MLP).write_bytes(b"X" * len(sim.released[MLP]))
            with pytest.raises(DigestMismatchError):
                device.fetch(MLP, tmp_path / "b")
            with pytest.raises(TrustFetchError, match="404"):
                DeviceTrust(sim.state, sim.checkout, url + "missing/").fetch(MLP, tmp_path / "c")
        finally:
            server.shutdown()
            thread.join()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


# --- CI side: only the newest root's keys count; released history is never reset --------


def rotate_online_keys(sim: RepoSim) -> dict[str, CryptoSigner]:
    """Replace the three online keys (three root versions); returns the replaced signers."""
    old = dict(sim.signers)
    for role in ONLINE_ROLES:
        new = new_signer()
        sim.signers[role] = new
        sim.repo.revoke_key(
            role,
            old[role].public_key.keyid,
            sim.root_signers,
            replacement=new.public_key,
            signers=sim.signers,
        )
    return old


def test_ci_never_loads_or_resigns_metadata_of_replaced_keys(sim: RepoSim) -> None:
    old = rotate_online_keys(sim)
    assert sim.repo.version("root") == 4
    versions = {role: sim.repo.version(role) for role in ONLINE_ROLES}
    committed = {p.name: p.read_bytes() for p in sim.metadata_dir.iterdir()}
    # whoever kept the replaced keys signs a release that swaps the artifact
    forged = dict(sim.repo.targets)
    evil = TargetFacts(kind="artifact", model="mlp", version="1.0.0", ci_run="run-1")
    forged[MLP] = target_file(MLP, b"forged weights", evil)
    targets = sim.forge_targets(versions["targets"] + 1, [old["targets"]], forged)
    snapshot = sim.forge("snapshot", versions["snapshot"] + 1, [old["snapshot"]], listed=targets)
    sim.forge("timestamp", versions["timestamp"] + 1, [old["timestamp"]], listed=snapshot)

    with pytest.raises(StaleKeyError) as caught:
        TrustRepo.load(sim.metadata_dir)
    message = str(caught.value)
    assert message.startswith(f"{sim.metadata_dir / 'timestamp.json'}: ")
    assert "timestamp keys of root v3 that root v4 no longer trusts" in message
    assert "restore the metadata folder from the last good commit" in message
    # each role is judged on its own: old keys on the snapshot or targets alone are refused
    sim.forge("timestamp", versions["timestamp"] + 1, [sim.signers["timestamp"]], listed=snapshot)
    with pytest.raises(StaleKeyError, match=r"snapshot\.json: signed by snapshot keys of root v2"):
        TrustRepo.load(sim.metadata_dir)
    snapshot = sim.forge(
        "snapshot", versions["snapshot"] + 1, [sim.signers["snapshot"]], listed=targets
    )
    sim.forge("timestamp", versions["timestamp"] + 1, [sim.signers["timestamp"]], listed=snapshot)
    with pytest.raises(StaleKeyError, match=r"targets\.json: signed by targets keys of root v1"):
        TrustRepo.load(sim.metadata_dir)
    # a key no root ever trusted is a plain signature failure naming the newest root
    targets = sim.forge_targets(versions["targets"] + 1, [new_signer()], forged)
    snapshot = sim.forge(
        "snapshot", versions["snapshot"] + 1, [sim.signers["snapshot"]], listed=targets
    )
    sim.forge("timestamp", versions["timestamp"] + 1, [sim.signers["timestamp"]], listed=snapshot)
    with pytest.raises(SignatureError, match="not signed by the targets keys of root v4") as plain:
        TrustRepo.load(sim.metadata_dir)
    assert not isinstance(plain.value, StaleKeyError)
    # the recovery the message names: back to the last good commit
    for path in sim.metadata_dir.iterdir():
        if path.name not in committed:
            path.unlink()
    for name, data in committed.items():
        (sim.metadata_dir / name).write_bytes(data)
    assert TrustRepo.load(sim.metadata_dir).published(MLP) == sim.repo.published(MLP)


def test_an_interrupted_rotation_is_refused_not_trusted_under_the_old_key(
    sim: RepoSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    from registry.atomic import write_atomic as real_write

    committed = {p.name: p.read_bytes() for p in sim.metadata_dir.iterdir()}

    def crash_at(name: str) -> None:
        def write(path: Path, data: bytes, mode: int | None = None) -> None:
            if path.name == name:
                raise KeyboardInterrupt  # the runner is killed
            real_write(path, data, mode)

        monkeypatch.setattr("signing.tuf_repo.write_atomic", write)

    def rotate_targets() -> list[str]:
        new = new_signer()
        result = TrustRepo.load(sim.metadata_dir).revoke_key(
            "targets",
            sim.signers["targets"].public_key.keyid,
            sim.root_signers,
            replacement=new.public_key,
            signers={**sim.signers, "targets": new},
        )
        sim.signers["targets"] = new
        return [p.name for p in result.written]

    def restore() -> None:  # what the operator does: back to the last commit
        for path in sim.metadata_dir.iterdir():
            if path.name not in committed:
                path.unlink()
        for name, data in committed.items():
            (sim.metadata_dir / name).write_bytes(data)

    crash_at("timestamp.json")  # after the new root, before the timestamp
    with pytest.raises(KeyboardInterrupt):
        rotate_targets()
    assert (sim.metadata_dir / "2.root.json").exists()
    with pytest.raises(StaleKeyError, match=r"1\.targets\.json: .*root v1 that root v2"):
        TrustRepo.load(sim.metadata_dir)
    restore()
    crash_at("2.root.json")  # after the versioned files, before the root
    with pytest.raises(KeyboardInterrupt):
        rotate_targets()
    with pytest.raises(RollbackError, match=r"2\.snapshot\.json is above snapshot version 1"):
        TrustRepo.load(sim.metadata_dir)
    restore()
    monkeypatch.undo()
    signers_before = dict(sim.signers)
    assert rotate_targets() == [
        "2.targets.json",
        "2.snapshot.json",
        "2.root.json",
        "timestamp.json",
    ]
    assert sim.signers["targets"] != signers_before["targets"]
    device = sim.device()
    device.refresh()
    assert device.trusted()["root"].version == 2


def test_versioned_metadata_without_a_timestamp_is_refused(sim: RepoSim) -> None:
    (sim.metadata_dir / "timestamp.json").unlink()
    with pytest.raises(FileSetError, match=r"timestamp\.json is missing .*\(1\.snapshot\.json"):
        TrustRepo.load(sim.metadata_dir)
    (sim.metadata_dir / "1.snapshot.json").unlink()
    with pytest.raises(FileSetError, match=r"\(1\.targets\.json\)"):
        TrustRepo.load(sim.metadata_dir)


def test_a_rewound_timestamp_is_refused(sim: RepoSim) -> None:
    first = sim.read_metadata("timestamp.json")
    sim.release("mlp", "1.1.0")
    second = sim.read_metadata("timestamp.json")
    sim.write_metadata("timestamp.json", first)  # validly signed, current keys
    with pytest.raises(RollbackError, match=r"2\.snapshot\.json is above snapshot version 1"):
        TrustRepo.load(sim.metadata_dir)
    # a snapshot rewound under a new timestamp (stolen timestamp key) leaves targets above
    sim.forge(
        "timestamp", 3, [sim.signers["timestamp"]], listed=sim.read_metadata("1.snapshot.json")
    )
    (sim.metadata_dir / "2.snapshot.json").unlink()
    with pytest.raises(RollbackError, match=r"2\.targets\.json is above targets version 1"):
        TrustRepo.load(sim.metadata_dir)
    sim.write_metadata("timestamp.json", second)
    with pytest.raises(FileSetError, match=r"2\.snapshot\.json"):
        TrustRepo.load(sim.metadata_dir)


def test_a_release_never_replaces_a_versioned_file(sim: RepoSim) -> None:
    repo = TrustRepo.load(sim.metadata_dir)
    sim.write_metadata("2.targets.json", b"planted after the load")  # a race, or a bug
    before = {p.name: p.read_bytes() for p in sim.metadata_dir.iterdir()}
    repo.add_target(
        "models/mlp/2.0.0.onnx", b"2", TargetFacts(kind="artifact", model="mlp", version="2.0.0")
    )
    with pytest.raises(
        HistoryError, match=r"2\.targets\.json: already exists and would be replaced"
    ):
        repo.publish(sim.signers)
    assert {p.name: p.read_bytes() for p in sim.metadata_dir.iterdir()} == before
    (sim.metadata_dir / "2.targets.json").unlink()
    sim.write_metadata("2.root.json", b"planted")
    with pytest.raises(HistoryError, match=r"2\.root\.json: already exists"):
        repo.rotate_root(sim.root_signers, [sim.root_signers[0].public_key], sim.root_signers, 1)


def snapshot_of(sim: RepoSim, folder: Path) -> TrustRepo:
    """The repository's metadata as it is now, loaded from a copy (a base branch's state)."""
    shutil.copytree(sim.metadata_dir, folder)
    return TrustRepo.load(folder)


def test_a_later_state_follows_its_past(sim: RepoSim, tmp_path: Path) -> None:
    empty = TrustRepo.load(RepoSim.create(tmp_path / "new").metadata_dir)
    base = snapshot_of(sim, tmp_path / "base")
    base.check_follows(base)
    sim.release("mlp", "1.1.0", channels={"production": ("1.1.0", None)})
    sim.repo.rotate_root(sim.root_signers, [sim.root_signers[0].public_key], sim.root_signers, 1)
    sim.repo.check_follows(base)
    with pytest.raises(
        RollbackError, match=r"^2\.root\.json: root version 1 is below the base's 2$"
    ):
        base.check_follows(sim.repo)
    # every online file deleted (no versioned file left to betray it): load alone
    # cannot tell, the comparison with the released state does
    wiped = tmp_path / "wiped"
    shutil.copytree(sim.metadata_dir, wiped)
    for path in wiped.iterdir():
        if not path.name.endswith(".root.json"):
            path.unlink()
    unpublished = TrustRepo.load(wiped)
    with pytest.raises(RollbackError, match=r"^targets: version 0 is below the base's 2$"):
        unpublished.check_follows(sim.repo)
    with pytest.raises(
        HistoryError, match=r"^1\.root\.json: differs from the base's root version 1"
    ):
        empty.check_follows(base)


def test_a_rewound_role_version_is_refused(sim: RepoSim, tmp_path: Path) -> None:
    base = sim.fork(tmp_path / "base")
    base.release("mlp", "1.1.0")
    sim.repo.refresh_timestamp(sim.signers["timestamp"])
    sim.repo.refresh_timestamp(sim.signers["timestamp"])  # timestamp 3, targets still 1
    with pytest.raises(RollbackError, match=r"^targets: version 1 is below the base's 2$"):
        sim.repo.check_follows(base.repo)


def test_a_forked_history_is_refused(sim: RepoSim, tmp_path: Path) -> None:
    ours = sim.fork(tmp_path / "ours")
    ours.release("mlp", "1.1.0")
    sim.release("mlp", "1.1.0", b"other weights")  # same version numbers, other content
    with pytest.raises(
        HistoryError, match=r"^targets: version 2 differs from the base's version 2"
    ):
        sim.repo.check_follows(ours.repo)
    new = new_signer()
    ours.repo.rotate_root(ours.root_signers, [new.public_key], [new], 1)
    other = new_signer()
    sim.repo.rotate_root(sim.root_signers, [other.public_key], [other], 1)
    with pytest.raises(
        HistoryError, match=r"^2\.root\.json: differs from the base's root version 2"
    ):
        sim.repo.check_follows(ours.repo)


def test_a_released_target_dropped_or_swapped_is_refused(sim: RepoSim, tmp_path: Path) -> None:
    base = sim.fork(tmp_path / "base")
    base.release("mlp", "1.1.0")
    dropped = sim.fork(tmp_path / "dropped")
    dropped.release("mlp", "1.2.0")
    dropped.release("mlp", "1.3.0")  # ahead of the base, without its 1.1.0
    with pytest.raises(
        HistoryError,
        match=r"^models/mlp/1\.1\.0\.onnx: released in targets version 2 of the base, "
        r"missing from version 3$",
    ):
        dropped.repo.check_follows(base.repo)
    swapped = sim.fork(tmp_path / "swapped")
    swapped.release("mlp", "1.1.0", b"swapped weights")
    swapped.release("mlp", "1.2.0")
    with pytest.raises(
        HistoryError,
        match=r"^models/mlp/1\.1\.0\.onnx: differs from the file released in targets version 2 "
        r"of the base \(targets version 3\)",
    ):
        swapped.repo.check_follows(base.repo)
    kept = sim.fork(tmp_path / "kept")
    kept.release("mlp", "1.1.0")
    kept.release("mlp", "1.2.0")
    kept.repo.check_follows(base.repo)


def test_channels_may_change_but_not_go_back(sim: RepoSim, tmp_path: Path) -> None:
    base = sim.fork(tmp_path / "base")
    base.release("mlp", "1.1.0", channels={"production": ("1.1.0", None)})  # sequence 2
    moved = sim.fork(tmp_path / "moved")
    moved.release("mlp", "1.1.0", channels={"production": ("1.1.0", None)})
    moved.release("mlp", "1.2.0", channels={"production": ("1.2.0", None)})  # sequence 3
    moved.repo.check_follows(base.repo)
    stale = sim.fork(tmp_path / "stale")
    stale.release("mlp", "1.1.0")
    stale.release("mlp", "1.2.0")  # targets 3, channels still at sequence 1
    with pytest.raises(
        RollbackError,
        match=r"^channels\.json: sequence 1 \(targets version 3\) does not follow the base's 2 "
        r"\(targets version 2\)$",
    ):
        stale.repo.check_follows(base.repo)


def test_a_role_below_its_floor_is_refused(sim: RepoSim) -> None:
    floor = {"root": 1, "targets": 1, "snapshot": 1, "timestamp": 1}
    sim.repo.check_floor(floor)
    sim.repo.check_floor({})
    with pytest.raises(RollbackError, match=r"^timestamp: version 1 is below 2, a version that"):
        sim.repo.check_floor({**floor, "timestamp": 2})
    with pytest.raises(RollbackError, match=r"^root: version 1 is below 3"):
        sim.repo.check_floor({"root": 3})
    with pytest.raises(ValueError, match="unknown role 'mirror'"):
        sim.repo.check_floor({"mirror": 1})
    with pytest.raises(ValueError, match="negative"):
        sim.repo.check_floor({"targets": -1})
    # at its floor, the next release writes floor + 1
    sim.release("mlp", "1.1.0")
    assert sim.repo.version("targets") == floor["targets"] + 1
    sim.repo.check_floor({**floor, "targets": 2})


def test_a_signed_digest_that_is_not_hex_names_no_file(sim: RepoSim, tmp_path: Path) -> None:
    """The digest names files on the device: a signer (a bug, a stolen targets key) that
    signs ``/../../escaped`` as one must not make the device write outside its folders."""
    from datetime import UTC, datetime, timedelta

    from tuf.api.metadata import Metadata, TargetFile, Targets

    targets = Metadata[Targets].from_bytes(sim.read_metadata("1.targets.json")).signed
    files = dict(targets.targets)
    evil = "/../../escaped"
    info = files[MLP]
    files[MLP] = TargetFile(info.length, {"sha256": evil}, MLP, info.unrecognized_fields)
    expires = datetime.now(UTC) + timedelta(days=1)
    tdata = sim.forge_targets(2, [sim.signers["targets"]], files, expires=expires)
    sdata = sim.forge("snapshot", 2, [sim.signers["snapshot"]], listed=tdata, expires=expires)
    sim.forge("timestamp", 2, [sim.signers["timestamp"]], listed=sdata, expires=expires)
    with pytest.raises(VerificationError, match="is not a hex digest"):
        sim.device().fetch(MLP, tmp_path / "work", partial_dir=tmp_path / "partial")
    assert not list(tmp_path.rglob("*escaped*"))
    assert not list(sim.state.rglob("*escaped*"))


@pytest.mark.parametrize("rotated", [False, True], ids=["root v1", "root rotated"])
def test_a_device_provisioned_with_another_repositorys_root_is_told_so(
    sim: RepoSim, tmp_path: Path, rotated: bool
) -> None:
    """Issue 27 point 15: a device whose anchor is another repository's first root is
    refused as before (nothing of the repository is trusted), with the reason named
    instead of ``timestamp was signed by 0/1 keys``."""
    other = RepoSim.create(tmp_path / "other")
    other.release("mlp", "1.0.0")
    if rotated:  # the repository's metadata then starts with its own 2.root.json
        new = new_signer()
        other.repo.rotate_root(other.root_signers, [new.public_key], [new], 1)
    DeviceTrust.provision(sim.state, sim.read_metadata("1.root.json"))
    device = DeviceTrust(sim.state, other.checkout, other.remote)
    with pytest.raises(ForeignRootError) as refused:
        device.refresh()
    assert isinstance(refused.value, SignatureError)  # what every handler already catches
    ours = sim.root_signers[0].public_key.keyid[:12]
    theirs = other.root_signers[0].public_key.keyid[:12]
    assert str(refused.value) == (
        f"trust metadata: the repository's first root (1.root.json, root key {theirs}) is "
        f"not the root this device was provisioned with (root key {ours}): the device holds "
        "another repository's trust root; set trust.root in edge.yaml to this repository's "
        f"trust/metadata/1.root.json and remove {sim.state / 'trust'} so that the device "
        "trusts it instead"
    )
    assert not (sim.state / "trust/metadata/timestamp.json").exists()


def test_foreign_root_is_decided_by_the_root_keys_alone(sim: RepoSim) -> None:
    anchor = load_signed(sim.read_metadata("1.root.json"))
    assert isinstance(anchor, Root)
    assert foreign_root(anchor, anchor, Path("/state/trust")) is None
    # the same repository with a root key added: its own failure stands
    shared = load_signed(sim.read_metadata("1.root.json"))
    assert isinstance(shared, Root)
    shared.add_key(new_signer().public_key, "root")
    assert foreign_root(anchor, shared, Path("/state/trust")) is None
    stranger = load_signed(RepoSim.create(sim.base / "x").read_metadata("1.root.json"))
    assert isinstance(stranger, Root)
    reason = foreign_root(anchor, stranger, Path("/state/trust"))
    assert reason is not None
    assert reason.startswith("the repository's first root (1.root.json, root key ")
