"""Trust commands end to end: init's trust root, rotation, revocation, refresh, sign/verify.

A device (``edge_sync.sync.trust.DeviceTrust``) provisioned with the first root follows
every change the commands make, reading metadata from the repository checkout.
"""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest

from edge_sync.sync.trust import DeviceTrust
from tests.conftest import git

pytestmark = pytest.mark.integration


@pytest.fixture
def repo(tmp_path: Path, cli) -> Path:
    root = tmp_path / "fleet"
    result = cli("init", str(root), cwd=tmp_path)
    assert result.code == 0, result.err
    return root


def device(repo: Path, tmp_path: Path) -> DeviceTrust:
    state = tmp_path / "device-state"
    if not (state / "trust").exists():
        DeviceTrust.provision(state, (repo / "trust/metadata/1.root.json").read_bytes())
    return DeviceTrust(state, repo, repo / ".modelreg/remote")


def test_init_creates_a_signed_trust_root(repo: Path) -> None:
    root = json.loads((repo / "trust/metadata/1.root.json").read_text())
    assert root["signed"]["_type"] == "root"
    assert root["signed"]["consistent_snapshot"] is True
    assert set(root["signed"]["roles"]) == {"root", "targets", "snapshot", "timestamp"}
    keys = repo / ".modelreg/keys"
    for role in ("root", "targets", "snapshot", "timestamp"):
        assert stat.S_IMODE((keys / f"{role}.key").stat().st_mode) == 0o600
    assert git(repo, "check-ignore", ".modelreg/keys/root.key").strip()
    assert "trust/metadata/1.root.json" in git(repo, "diff", "--cached", "--name-only")


def test_refresh_and_rotations_are_followed_by_a_device(repo: Path, cli, tmp_path: Path) -> None:
    assert cli("freshness", "refresh", cwd=repo).code == 0
    trust = device(repo, tmp_path)
    trust.refresh()
    assert trust.trusted()["timestamp"].version == 1
    first = cli("freshness", "refresh", "--json", cwd=repo)
    assert json.loads(first.out)["versions"] == {"timestamp": 2}
    trust.refresh()
    assert trust.trusted()["timestamp"].version == 2

    old_ts = json.loads((repo / "trust/metadata/1.root.json").read_text())["signed"]["roles"][
        "timestamp"
    ]["keyids"][0]
    rotated = cli("keys", "rotate", "--role", "timestamp", "--json", cwd=repo)
    assert rotated.code == 0, rotated.err
    new_ts = json.loads(rotated.out)["keyid"]
    assert new_ts != old_ts
    assert (repo / f".modelreg/keys/timestamp.{old_ts[:16]}.key.old").exists()
    root_rot = cli("keys", "rotate", "--role", "root", "--json", cwd=repo)
    assert root_rot.code == 0, root_rot.err
    assert json.loads(root_rot.out)["root_version"] == 3
    trust.refresh()
    state = trust.trusted()
    assert state["root"].version == 3
    # a fresh device provisioned with root 1 walks the chain 1 -> 2 -> 3
    other = tmp_path / "second-device"
    DeviceTrust.provision(other, (repo / "trust/metadata/1.root.json").read_bytes())
    second = DeviceTrust(other, repo, repo / ".modelreg/remote")
    second.refresh()
    assert second.trusted()["root"].version == 3


def test_revoking_the_only_key_of_a_role_is_refused(repo: Path, cli) -> None:
    assert cli("freshness", "refresh", cwd=repo).code == 0
    root = json.loads((repo / "trust/metadata/1.root.json").read_text())
    keyid = root["signed"]["roles"]["snapshot"]["keyids"][0]
    before = sorted(p.name for p in (repo / "trust/metadata").iterdir())
    r = cli("keys", "revoke", "--role", "snapshot", "--keyid", keyid, cwd=repo)
    assert r.code == 2  # asking for something impossible is misuse, not bad data
    assert r.err == "modelreg: error: snapshot would have 0 key(s) for threshold 1\n"
    assert sorted(p.name for p in (repo / "trust/metadata").iterdir()) == before
    unknown = cli("keys", "revoke", "--role", "snapshot", "--keyid", "ab" * 32, cwd=repo)
    assert unknown.code == 2
    assert "Traceback" not in unknown.err
    assert len(unknown.err.strip().splitlines()) == 1


def test_revoke_with_replacement(
    repo: Path, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cli("freshness", "refresh", cwd=repo).code == 0
    trust = device(repo, tmp_path)
    trust.refresh()
    gen = cli(
        "keys", "generate", "--role", "targets", "--out", str(tmp_path / "new"), "--json", cwd=repo
    )
    new = json.loads(gen.out)
    root = json.loads((repo / "trust/metadata/1.root.json").read_text())
    old = root["signed"]["roles"]["targets"]["keyids"][0]
    # CI style: the replacement's private key arrives as a PEM in the environment
    monkeypatch.setenv("MODELREG_TARGETS_KEY", Path(new["private"]).read_text())
    r = cli(
        "keys",
        "revoke",
        "--role",
        "targets",
        "--keyid",
        old,
        "--replacement",
        new["public"],
        cwd=repo,
    )
    assert r.code == 0, r.err
    trust.refresh()
    assert trust.trusted()["root"].version == 2


def test_sign_and_verify_commands(repo: Path, cli, tmp_path: Path, example_models: Path) -> None:
    model = tmp_path / "model.onnx"
    model.write_bytes((example_models / "mlp/1.0.0.onnx").read_bytes())
    bundle = tmp_path / "model.sigstore.json"
    signed = cli("sign", str(model), "--bundle", str(bundle), "--model", "mlp", "--version", "1.0.0",
                 "--git-commit", "abc123", "--ci-run", "42", "--json", cwd=repo)  # fmt: skip
    assert signed.code == 0, signed.err
    public = repo / ".modelreg/keys/targets.pub"
    report = json.loads(signed.out)
    assert report["bundle_sha256"] == hashlib.sha256(bundle.read_bytes()).hexdigest()
    assert report["key_hint"] == hashlib.sha256(public.read_bytes()).hexdigest()
    assert (report["facts"]["model"], report["facts"]["ci_run"]) == ("mlp", "42")
    # without --git-commit the facts name the work tree's HEAD (and ci_run "local")
    git(repo, "commit", "-qm", "init")
    head = git(repo, "rev-parse", "HEAD").strip()
    r = cli("sign", str(model), "--bundle", str(tmp_path / "b2.json"), "--model", "mlp",
            "--version", "1.0.0", "--json", cwd=repo)  # fmt: skip
    assert r.code == 0, r.err
    assert json.loads(r.out)["facts"]["git_commit"] == head
    assert json.loads(r.out)["facts"]["ci_run"] == "local"
    bad = cli("sign", str(model), "--bundle", str(tmp_path / "b3.json"), "--model", "mlp",
                  "--version", "1.0.0", "--parent", "", "--git-commit", "abc", cwd=repo)  # fmt: skip
    assert bad.code == 2
    assert "parent must be a non-empty string" in bad.err
    ok = cli(
        "verify",
        str(model),
        "--bundle",
        str(bundle),
        "--public-key",
        str(public),
        "--json",
        cwd=repo,
    )
    assert ok.code == 0, ok.err
    report = json.loads(ok.out)
    file_sha256 = hashlib.sha256(model.read_bytes()).hexdigest()
    assert report["sha256"] == file_sha256
    assert report["facts"]["model"] == "mlp"
    text = cli("verify", str(model), "--bundle", str(bundle), "--public-key", str(public), cwd=repo)
    assert text.out.splitlines()[0] == f"verified {model}: sha256 {file_sha256}"
    assert report["facts"]["git_commit"] == "abc123"
    wrong = cli("verify", str(model), "--bundle", str(bundle), "--public-key",
                str(repo / ".modelreg/keys/snapshot.pub"), cwd=repo)  # fmt: skip
    assert wrong.code == 1
    data = bytearray(model.read_bytes())
    data[100] ^= 0x01
    model.write_bytes(bytes(data))
    tampered = cli(
        "verify", str(model), "--bundle", str(bundle), "--public-key", str(public), cwd=repo
    )
    assert tampered.code == 1
    assert tampered.err == (
        f"modelreg: {model}: content differs from its signed digest (sha256 "
        f"{hashlib.sha256(bytes(data)).hexdigest()}, signed {file_sha256})\n"
    )
    for result in (wrong, tampered):
        assert "Traceback" not in result.err
