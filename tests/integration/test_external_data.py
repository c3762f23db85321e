"""A model stored with ONNX external data (every model over 2 GB is) through the whole
flow: ``version add``, build, diff, ``ci release`` (OMS bundle, TUF targets, deltas),
and a device that fetches, verifies and serves it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelreg.cli.build_cmd import build as build_command
from tests.conftest import git

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _build_registered() -> None:
    from modelreg.cli.main import cli as group

    if "build" not in group.commands:
        group.add_command(build_command)


def _add(cli: Any, repo: Path, external_models: Path, version: str, *extra: str) -> None:
    r = cli("version", "add", "mlp", version, "--artifact",
            str(external_models / version / "model.onnx"), *extra, cwd=repo)  # fmt: skip
    assert r.code == 0, r.err


@pytest.fixture
def repo(tmp_path: Path, cli: Any, external_models: Path, example_models: Path) -> Path:
    root = tmp_path / "models-repo"
    assert cli("init", str(root), cwd=tmp_path).code == 0
    assert cli("model", "add", "mlp", cwd=root).code == 0
    _add(cli, root, external_models, "1.0.0",
         "--golden-inputs", str(example_models / "mlp/1.0.0.inputs.npz"))  # fmt: skip
    _add(cli, root, external_models, "1.1.0")
    git(root, "commit", "-qm", "mlp 1.0.0 and 1.1.0, external data")
    return root


def test_version_add_copies_renames_and_tracks_every_file(repo: Path) -> None:
    import onnx

    folder = repo / "models/mlp"
    for version in ("1.0.0", "1.1.0"):
        manifest = yaml.safe_load((repo / f"manifests/mlp/versions/{version}.yaml").read_text())
        assert manifest["spec"]["artifact"] == {
            "path": f"models/mlp/{version}.onnx",
            "format": "onnx",
            "external_data": [f"{version}.onnx.data"],
        }
        for name in (f"{version}.onnx", f"{version}.onnx.data"):
            assert (folder / f"{name}.dvc").is_file()
            tracked = git(repo, "ls-files", f"models/mlp/{name}.dvc").strip()
            assert tracked == f"models/mlp/{name}.dvc"
        graph = onnx.load(str(folder / f"{version}.onnx"), load_external_data=False)
        locations = {
            e.value for t in graph.graph.initializer for e in t.external_data if e.key == "location"
        }
        assert locations == {f"{version}.onnx.data"}


def test_build_verifies_and_runs_a_model_with_external_data(repo: Path, cli: Any) -> None:
    r = cli("build", cwd=repo)
    assert r.code == 0, r.err
    record = json.loads((repo / ".modelreg/build/mlp/1.0.0/build.json").read_text())
    assert record["ok"], record
    assert "goldens" in record["checks_passed"]
    data = repo / "models/mlp/1.0.0.onnx.data"
    [entry] = record["external_data"]
    assert entry["file"] == "1.0.0.onnx.data"
    assert entry["size"] == data.stat().st_size
    import hashlib

    assert entry["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()


def test_build_refuses_an_external_data_list_that_differs_from_the_graph(
    repo: Path, cli: Any
) -> None:
    path = repo / "manifests/mlp/versions/1.1.0.yaml"
    # A manifest that hides the data file from review (and from signing) is refused.
    text = path.read_text()
    kept = [
        x
        for x in text.splitlines(keepends=True)
        if "external_data" not in x and x.strip() != "- 1.1.0.onnx.data"
    ]
    path.write_text("".join(kept))
    r = cli("build", "mlp", "1.1.0", cwd=repo)
    assert r.code == 1
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r.err
    assert lines[0].startswith("manifests/mlp/versions/1.1.0.yaml:"), lines[0]
    assert lines[0].endswith(
        "spec.artifact: the graph stores tensors in '1.1.0.onnx.data' but "
        "spec.artifact.external_data lists none; list exactly the files the graph names"
    ), lines[0]


def test_build_refuses_a_tampered_external_data_file(repo: Path, cli: Any) -> None:
    data = repo / "models/mlp/1.1.0.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    r = cli("build", "mlp", "1.1.0", cwd=repo)
    assert r.code == 1
    assert "models/mlp/1.1.0.onnx.data: md5" in r.err
    assert "does not match models/mlp/1.1.0.onnx.data.dvc" in r.err


def test_diff_compares_external_tensors_as_it_does_inline_ones(
    repo: Path, cli: Any, example_models: Path, external_models: Path
) -> None:
    from pipelines.diff import diff_models

    inline = diff_models(example_models / "mlp/1.0.0.onnx", example_models / "mlp/1.1.0.onnx")
    split = diff_models(external_models / "1.0.0/model.onnx", external_models / "1.1.0/model.onnx")
    assert split.weights == inline.weights
    assert split.weights.changed  # the fine-tune changed some tensors
    assert split.new.parameters == inline.new.parameters
    r = cli("diff", "mlp", "1.0.0", "1.1.0", "--json", cwd=repo)
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert report["weights"]["changed"], report["weights"]


@pytest.fixture
def released(repo: Path, cli: Any) -> Path:
    assert cli("promote", "mlp", "1.0.0", "-c", "production", cwd=repo).code == 0
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "promote")
    r = cli("publish", "--json", cwd=repo)
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert report["pushed"] == 4  # two graphs and two data files
    assert sorted(report["added"]) == [
        "bundles/mlp/1.0.0.sigstore.json",
        "bundles/mlp/1.1.0.sigstore.json",
        "channels.json",
        "deltas/mlp/1.1.0.from-1.0.0.data/1.1.0.onnx.data.delta",
        "deltas/mlp/1.1.0.from-1.0.0.delta",
        "goldens/mlp/1.0.0/default.inputs.npz",
        "goldens/mlp/1.0.0/default.outputs.npz",
        "models/mlp/1.0.0.data/1.0.0.onnx.data",
        "models/mlp/1.0.0.onnx",
        "models/mlp/1.1.0.data/1.1.0.onnx.data",
        "models/mlp/1.1.0.onnx",
        "provenance/mlp/1.0.0.intoto.json",
        "provenance/mlp/1.1.0.intoto.json",
        "versions/mlp/1.0.0.json",
        "versions/mlp/1.1.0.json",
    ]
    return repo


def _device(root: Path, tmp_path: Path) -> Any:
    from edge_sync.sync.trust import DeviceTrust

    state = tmp_path / "device"
    DeviceTrust.provision(state, (root / "trust/metadata/1.root.json").read_bytes())
    trust = DeviceTrust(state, root, root / ".modelreg/remote/modelreg")
    trust.refresh()
    return trust


def test_publish_signs_every_file_and_a_tensor_aware_delta_per_data_file(
    released: Path, tmp_path: Path, cli: Any
) -> None:
    import hashlib

    from registry.delta import decode
    from signing.oms import verify_model
    from signing.version_doc import VersionDoc

    trust = _device(released, tmp_path)
    got = tmp_path / "got"
    doc = VersionDoc.from_bytes(
        trust.fetch("versions/mlp/1.1.0.json", got, kind="version").read_bytes()
    )
    assert doc.external_data == {"1.1.0.onnx.data": "models/mlp/1.1.0.data/1.1.0.onnx.data"}
    info = trust.target_info("models/mlp/1.1.0.data/1.1.0.onnx.data")
    assert info.facts.kind == "external_data"
    assert info.facts.file == "1.1.0.onnx.data"
    # the device's files, side by side under the names the graph uses
    model = tmp_path / "model"
    model.mkdir()
    for target, name in (("models/mlp/1.1.0.onnx", "1.1.0.onnx"),
                         ("models/mlp/1.1.0.data/1.1.0.onnx.data", "1.1.0.onnx.data")):  # fmt: skip
        (model / name).write_bytes(trust.fetch(target, got).read_bytes())
    for name in ("1.1.0.onnx", "1.1.0.onnx.data"):
        assert (model / name).read_bytes() == (released / "models/mlp" / name).read_bytes()
    bundle = trust.fetch("bundles/mlp/1.1.0.sigstore.json", got, kind="bundle")
    verified = verify_model(model, bundle, released / ".modelreg/keys/targets.pub")
    assert sorted(verified.files) == ["1.1.0.onnx", "1.1.0.onnx.data"]
    # a device holding 1.0.0's data file rebuilds 1.1.0's from the signed delta
    delta_target = "deltas/mlp/1.1.0.from-1.0.0.data/1.1.0.onnx.data.delta"
    delta_info = trust.target_info(delta_target)
    assert delta_info.facts.base == "1.0.0"
    assert delta_info.facts.file == "1.1.0.onnx.data"
    base = released / "models/mlp/1.0.0.onnx.data"
    assert delta_info.facts.base_sha256 == hashlib.sha256(base.read_bytes()).hexdigest()
    delta = trust.fetch(delta_target, got, kind="delta")
    new = (model / "1.1.0.onnx.data").read_bytes()
    assert decode(base, delta, expected_sha256=hashlib.sha256(new).hexdigest()) == new
    assert delta.stat().st_size < len(new) / 2
    # publishing again signs nothing new
    r = cli("publish", "--json", cwd=released)
    assert r.code == 0, r.err
    assert json.loads(r.out)["added"] == []


def test_our_external_data_bundle_verifies_with_model_signing(
    released: Path, tmp_path: Path
) -> None:
    import shutil

    from tests.integration.test_oms_interop import their_verify

    folder = tmp_path / "mlp-1.1.0"
    folder.mkdir()
    for name in ("1.1.0.onnx", "1.1.0.onnx.data"):
        shutil.copy(released / "models/mlp" / name, folder / name)
    bundle = released / ".modelreg/release/bundles/mlp/1.1.0.sigstore.json"
    proc = their_verify(folder, bundle, released / ".modelreg/keys/targets.pub")
    assert proc.returncode == 0, proc.stderr
    # a changed data file fails their verification too
    data = folder / "1.1.0.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 1
    data.write_bytes(bytes(raw))
    assert their_verify(folder, bundle, released / ".modelreg/keys/targets.pub").returncode != 0


def test_register_logs_external_data_that_mlflow_loads_back(
    repo: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnx import numpy_helper

    from modelreg.examples import build_model
    from tests.integration.test_register import quiet_mlflow  # type: ignore[attr-defined]

    assert cli("promote", "mlp", "1.0.0", "-c", "production", cwd=repo).code == 0
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "promote")
    r = cli("register", "--json", cwd=repo)
    assert r.code == 0, r.err
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{repo / '.modelreg/mlflow.db'}")
    with quiet_mlflow() as mlflow:
        import mlflow.onnx

        loaded = mlflow.onnx.load_model("models:/mlp@production")
    expected = {
        t.name: numpy_helper.to_array(t) for t in build_model("mlp", "1.0.0").graph.initializer
    }
    got = {t.name: numpy_helper.to_array(t) for t in loaded.graph.initializer}
    assert got.keys() == expected.keys()
    for name, array in expected.items():
        assert (got[name] == array).all(), name


def test_verify_an_onnx_with_its_external_data_beside_it(released: Path, cli: Any) -> None:
    bundle = released / ".modelreg/release/bundles/mlp/1.1.0.sigstore.json"
    key = released / ".modelreg/keys/targets.pub"
    onnx_file = released / "models/mlp/1.1.0.onnx"
    r = cli("verify", str(onnx_file), "--bundle", str(bundle), "--public-key", str(key),
            "--json", cwd=released)  # fmt: skip
    assert r.code == 0, r.err
    assert sorted(json.loads(r.out)["files"]) == ["1.1.0.onnx", "1.1.0.onnx.data"]
    data = released / "models/mlp/1.1.0.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 1
    data.chmod(0o644)
    data.write_bytes(bytes(raw))
    r = cli("verify", str(onnx_file), "--bundle", str(bundle), "--public-key", str(key),
            cwd=released)  # fmt: skip
    assert r.code == 1
    assert len(r.err.strip().splitlines()) == 1, r.err
    assert "1.1.0.onnx.data" in r.err
