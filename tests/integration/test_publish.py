"""`modelreg publish` on a real git + DVC repository, verified by a real device client."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from edge_sync.sync.trust import DeviceTrust
from registry.delta import decode
from signing.errors import TargetMismatchError
from signing.oms import verify_model
from tests.conftest import git

pytestmark = pytest.mark.integration


@pytest.fixture
def released(tmp_path: Path, cli, example_models: Path) -> Path:
    root = tmp_path / "fleet"
    assert cli("init", str(root), cwd=tmp_path).code == 0
    assert cli("model", "add", "mlp", "--channel-order", "canary,production", cwd=root).code == 0
    for version in ("1.0.0", "1.1.0"):
        r = cli("version", "add", "mlp", version, "--artifact",
                str(example_models / f"mlp/{version}.onnx"), "--target", "cpu=onnxruntime",
                cwd=root)  # fmt: skip
        assert r.code == 0, r.err
    assert cli("promote", "mlp", "1.0.0", "-c", "canary", cwd=root).code == 0
    assert cli("promote", "mlp", "1.0.0", "-c", "production", cwd=root).code == 0
    assert cli("promote", "mlp", "1.1.0", "-c", "canary", "--percent", "10", cwd=root).code == 0
    git(root, "add", "-A")
    git(root, "commit", "-qm", "mlp 1.0.0 and 1.1.0")
    r = cli("publish", "--json", cwd=root)
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert report["pushed"] == 2
    assert sorted(report["added"]) == [
        "bundles/mlp/1.0.0.sigstore.json",
        "bundles/mlp/1.1.0.sigstore.json",
        "channels.json",
        "deltas/mlp/1.1.0.from-1.0.0.delta",
        "models/mlp/1.0.0.onnx",
        "models/mlp/1.1.0.onnx",
        "provenance/mlp/1.0.0.intoto.json",
        "provenance/mlp/1.1.0.intoto.json",
        "versions/mlp/1.0.0.json",
        "versions/mlp/1.1.0.json",
    ]
    return root


def device(root: Path, tmp_path: Path, name: str = "device") -> DeviceTrust:
    state = tmp_path / name
    if not state.exists():
        DeviceTrust.provision(state, (root / "trust/metadata/1.root.json").read_bytes())
    return DeviceTrust(state, root, root / ".modelreg/remote/modelreg")


def test_device_gets_verified_artifacts_bundles_and_channels(
    released: Path, tmp_path: Path, example_models: Path
) -> None:
    trust = device(released, tmp_path)
    trust.refresh()
    channels = trust.channels().models["mlp"]
    assert channels["production"].version == "1.0.0"
    assert channels["canary"].version == "1.1.0"
    assert channels["canary"].percent == 10
    head = git(released, "rev-parse", "HEAD").strip()
    info = trust.target_info("models/mlp/1.1.0.onnx")
    assert info.facts.model == "mlp"
    assert info.facts.version == "1.1.0"
    assert info.facts.parent == "1.0.0"
    assert info.facts.git_commit == head
    assert info.facts.targets == ["cpu"]
    model = trust.fetch("models/mlp/1.1.0.onnx", tmp_path / "got", model="mlp", version="1.1.0",
                        kind="artifact")  # fmt: skip
    assert model.read_bytes() == (example_models / "mlp/1.1.0.onnx").read_bytes()
    bundle = trust.fetch("bundles/mlp/1.1.0.sigstore.json", tmp_path / "got", kind="bundle")
    verified = verify_model(model, bundle, released / ".modelreg/keys/targets.pub")
    assert verified.facts is not None
    assert verified.facts.git_commit == head
    with pytest.raises(TargetMismatchError):
        trust.fetch("models/mlp/1.0.0.onnx", tmp_path / "got", model="mlp", version="1.1.0")
    # a device holding 1.0.0 rebuilds 1.1.0 from the signed delta, byte for byte
    delta_info = trust.target_info("deltas/mlp/1.1.0.from-1.0.0.delta")
    assert delta_info.facts.base == "1.0.0"
    base = trust.fetch("models/mlp/1.0.0.onnx", tmp_path / "got", model="mlp", version="1.0.0")
    assert delta_info.facts.base_sha256 == hashlib.sha256(base.read_bytes()).hexdigest()
    delta = trust.fetch("deltas/mlp/1.1.0.from-1.0.0.delta", tmp_path / "got", kind="delta")
    assert delta.stat().st_size < model.stat().st_size / 3
    rebuilt = decode(base, delta, expected_sha256=info.sha256)
    assert rebuilt == model.read_bytes()


def test_publish_is_idempotent_and_follows_promotions(released: Path, cli, tmp_path: Path) -> None:
    before = {p.name: p.read_bytes() for p in (released / "trust/metadata").iterdir()}
    again = cli("publish", "--json", cwd=released)
    assert again.code == 0, again.err
    assert json.loads(again.out)["added"] == []
    assert json.loads(again.out)["metadata"] == []
    assert {p.name: p.read_bytes() for p in (released / "trust/metadata").iterdir()} == before
    trust = device(released, tmp_path)
    trust.refresh()
    first = trust.channels()
    assert cli("promote", "mlp", "1.1.0", "-c", "production", cwd=released).code == 0
    r = cli("publish", "--json", cwd=released)
    assert r.code == 0, r.err
    assert json.loads(r.out)["added"] == ["channels.json"]
    trust.refresh()
    second = trust.channels()
    assert second.sequence > first.sequence
    assert second.models["mlp"]["production"].version == "1.1.0"
    assert second.models["mlp"]["production"].sequence > first.models["mlp"]["production"].sequence
    assert second.models["mlp"]["canary"].sequence == first.models["mlp"]["canary"].sequence


def test_publish_refuses_invalid_manifests_and_missing_keys(
    released: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = released / "manifests/mlp/model.yaml"
    good = model.read_text()
    model.write_text(good.replace("production: 1.0.0", "production: 9.9.9"))
    r = cli("publish", cwd=released)
    assert r.code == 1
    assert "points at version 9.9.9, which is not declared" in r.err
    model.write_text(good)
    assert cli("promote", "mlp", "1.1.0", "-c", "production", cwd=released).code == 0
    (released / ".modelreg/keys/timestamp.key").rename(released / "timestamp.key.away")
    r = cli("publish", cwd=released)
    assert r.code == 1
    assert "no timestamp key: set $MODELREG_TIMESTAMP_KEY" in r.err
    monkeypatch.setenv("MODELREG_TIMESTAMP_KEY", str(released / "timestamp.key.away"))
    assert cli("publish", cwd=released).code == 0


def test_status_shows_signed_and_published(released: Path, cli, example_models: Path) -> None:
    rows = json.loads(cli("status", "--json", cwd=released).out)["versions"]
    assert [(r["version"], r["signed"], r["published"]) for r in rows] == [
        ("1.0.0", True, True),
        ("1.1.0", True, True),
    ]
    r = cli("version", "add", "mlp", "2.0.0", "--artifact", str(example_models / "mlp/2.0.0.onnx"),
            cwd=released)  # fmt: skip
    assert r.code == 0, r.err
    table = cli("status", cwd=released).out.splitlines()
    assert table[3].split()[:2] == ["mlp", "2.0.0"]
    assert table[3].split()[-2:] == ["no", "no"]
    assert table[1].split()[-2:] == ["yes", "yes"]


def test_an_interrupted_publish_resumes(
    tmp_path: Path, cli, example_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipelines.publish import _stage as publish_module
    from signing.tuf_repo import TrustRepo

    root = tmp_path / "fleet"
    assert cli("init", str(root), cwd=tmp_path).code == 0
    assert cli("model", "add", "mlp", cwd=root).code == 0
    assert cli("version", "add", "mlp", "1.0.0", "--artifact",
               str(example_models / "mlp/1.0.0.onnx"), cwd=root).code == 0  # fmt: skip
    git(root, "add", "-A")
    git(root, "commit", "-qm", "mlp 1.0.0")
    before = sorted(p.name for p in (root / "trust/metadata").iterdir())

    def crash(self: TrustRepo, *args: object, **kwargs: object) -> object:
        raise KeyboardInterrupt  # the runner is killed after the targets were copied

    monkeypatch.setattr(TrustRepo, "publish", crash)
    with pytest.raises(KeyboardInterrupt):
        publish_module.publish(root)
    assert sorted(p.name for p in (root / "trust/metadata").iterdir()) == before
    assert any((root / ".modelreg/remote/modelreg/targets").rglob("*.1.0.0.onnx"))
    monkeypatch.undo()
    r = cli("publish", "--json", cwd=root)
    assert r.code == 0, r.err
    assert "models/mlp/1.0.0.onnx" in json.loads(r.out)["added"]
    trust = device(root, tmp_path)
    trust.refresh()
    got = trust.fetch("models/mlp/1.0.0.onnx", tmp_path / "got", model="mlp", version="1.0.0")
    assert got.read_bytes() == (example_models / "mlp/1.0.0.onnx").read_bytes()


def test_a_released_version_cannot_be_swapped(released: Path, cli, example_models: Path) -> None:
    artifact = released / "models/mlp/1.0.0.onnx"
    artifact.write_bytes((example_models / "mlp/2.0.0.onnx").read_bytes())
    from pipelines.dvc import add

    add(released, artifact)
    git(released, "commit", "-qam", "swap the released 1.0.0")
    # validate says what ci pr says (issue 27, bug 8: it said "valid")
    checked = cli("validate", cwd=released)
    assert checked.code == 1
    assert checked.err.startswith("manifests/mlp/versions/1.0.0.yaml:")
    assert "version 1.0.0 is released and its artifact models/mlp/1.0.0.onnx has changed" in (
        checked.err
    )
    r = cli("publish", cwd=released)
    assert r.code == 1
    assert (
        "spec.artifact: version 1.0.0 is released and its artifact models/mlp/1.0.0.onnx has changed since"
        in r.err
    )
    pr = cli("ci", "pr", "--base", "HEAD~1", cwd=released)
    assert pr.code == 1
    assert "versions are immutable: declare a new version" in pr.err
    bad = cli("ci", "pr", "--base", "no-such-ref", cwd=released)
    assert bad.code == 2
    assert "git ref 'no-such-ref' does not name a commit" in bad.err


def test_a_model_deleted_while_devices_serve_it_is_not_released(
    released: Path, cli, tmp_path: Path
) -> None:
    """A merged change that deletes a served model (its policy, branch and all) on the
    promotion branch itself: nothing is signed, and devices keep what they serve."""
    shutil.rmtree(released / "manifests/mlp")
    git(released, "commit", "-qam", "drop mlp")
    metadata = {p.name: p.read_bytes() for p in (released / "trust/metadata").iterdir()}
    r = cli("publish", cwd=released)
    assert r.code == 1
    assert r.err.strip() == (
        "manifests/mlp/model.yaml: 'mlp' is deleted but its channels are released: devices "
        "serve it; restore it, release it with no channels, and deprecate its versions"
    )
    assert {p.name: p.read_bytes() for p in (released / "trust/metadata").iterdir()} == metadata
    trust = device(released, tmp_path)
    trust.refresh()
    assert trust.channels().models["mlp"]["production"].version == "1.0.0"


def test_channel_changes_are_released_from_the_promotion_branch_only(
    released: Path, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    git(released, "checkout", "-qb", "experiment")
    assert cli("promote", "mlp", "1.1.0", "-c", "production", cwd=released).code == 0
    git(released, "commit", "-qam", "1.1.0 to production, on a side branch")
    metadata = {p.name: p.read_bytes() for p in (released / "trust/metadata").iterdir()}
    r = cli("publish", cwd=released)
    assert r.code == 1
    line = r.err.strip()
    assert line.startswith("manifests/mlp/model.yaml:")
    assert line.endswith(
        "spec.channels: channel changes of 'mlp' are released from branch 'main' only, "
        "not from branch 'experiment'"
    )
    # in CI the ref decides, and a detached checkout is no branch at all
    monkeypatch.setenv("GITHUB_REF", "refs/pull/3/merge")
    assert (
        "not from a detached HEAD or a ref that is not a branch" in cli("publish", cwd=released).err
    )
    assert {p.name: p.read_bytes() for p in (released / "trust/metadata").iterdir()} == metadata
    trust = device(released, tmp_path)
    trust.refresh()
    assert trust.channels().models["mlp"]["production"].version == "1.0.0"
    # released from main (as CI names it), the promotion goes out
    monkeypatch.setenv("GITHUB_REF", "refs/heads/main")
    r = cli("publish", "--json", cwd=released)
    assert r.code == 0, r.err
    assert json.loads(r.out)["added"] == ["channels.json"]
