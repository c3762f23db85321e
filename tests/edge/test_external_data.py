"""A device following a model stored with ONNX external data: every data file fetched
as a signed target and verified before use, a fine-tune fetched as the tensors it
changed (or, when they cannot be had, as a delta per data file), weights memory-mapped,
resumed after a restart, and the whole files written again by ``edge export``."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from modelreg.cli.main import cli
from modelreg.examples import build_model, run_onnxruntime
from signing.target_names import object_path
from signing.tuf_roles import TARGETS_DIR
from signing.version_doc import TensorManifest, VersionDoc
from tests.edge.conftest import EdgeRig

pytestmark = pytest.mark.integration


@pytest.fixture
def rig(tmp_path: Path, cli: Any, external_models: Path, example_models: Path) -> EdgeRig:
    root = tmp_path / "fleet"
    assert cli("init", str(root), cwd=tmp_path).code == 0
    rig = EdgeRig(root, tmp_path, cli, external_models)
    rig.run("model", "add", "mlp", "--channel-order", "canary,production")
    # no device target: the device runs the ONNX artifact itself (with its data files)
    rig.run("version", "add", "mlp", "1.0.0", "--artifact",
            str(external_models / "1.0.0/model.onnx"),
            "--golden-inputs", str(example_models / "mlp/1.0.0.inputs.npz"))  # fmt: skip
    rig.promote("1.0.0")
    return rig


def _answer(rig: EdgeRig, version: str) -> None:
    """The serving engine computes what the self-contained example model computes."""
    engine = rig.hosts["device"].current("mlp")
    assert engine.version == version
    x = {"input": np.random.default_rng(0).standard_normal((3, 16), dtype=np.float32)}
    expected = run_onnxruntime(build_model("mlp", version).SerializeToString(), x)
    np.testing.assert_allclose(engine.run(x)["probs"], expected["probs"], rtol=1e-6)


def _data(rig: EdgeRig, version: str) -> Path:
    return rig.root / f"models/mlp/{version}.onnx.data"


def _manifest(rig: EdgeRig, version: str) -> TensorManifest:
    (doc,) = (rig.remote / "targets/versions/mlp").glob(f"*.{version}.json")
    manifest = VersionDoc.from_bytes(doc.read_bytes()).tensors
    assert manifest is not None
    return manifest


def test_external_data_full_then_a_fine_tune_by_its_tensors(rig: EdgeRig, tmp_path: Path) -> None:
    first = rig.sync().updates["mlp"]
    assert (first.result, first.version, first.method) == ("installed", "1.0.0", "full"), first
    data = _data(rig, "1.0.0")
    assert first.bytes_fetched >= data.stat().st_size
    serving = rig.state().models["mlp"].serving
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    assert serving.external == {"1.0.0.onnx.data": digest}
    blobs = rig.tmp / "device/state/blobs/sha256"
    assert (blobs / digest).read_bytes() == data.read_bytes()
    _answer(rig, "1.0.0")
    # the shared-weight session maps the data file: its weights are this engine's own
    weights = rig.hosts["device"].current("mlp").weights
    assert weights is not None
    assert weights.own_bytes >= data.stat().st_size * 0.9
    # every tensor of the data file is signed, with where it lies in it
    manifest = _manifest(rig, "1.0.0")
    assert {t.file for t in manifest.tensors} == {"1.0.0.onnx.data"}
    raw = data.read_bytes()
    for t in manifest.tensors:
        assert t.offset is not None
        assert hashlib.sha256(raw[t.offset : t.offset + t.length]).hexdigest() == t.sha256

    rig.release_version("1.1.0", "1.0.0", artifact=rig.models / "1.1.0/model.onnx")
    second = rig.sync().updates["mlp"]
    assert (second.result, second.version, second.method) == ("installed", "1.1.0", "delta")
    kept = {t.sha256 for t in manifest.tensors}
    new = _manifest(rig, "1.1.0")
    changed = [t for t in new.tensors if t.sha256 not in kept]
    assert 0 < len(changed) < len(new.tensors)
    fetched = sum(t.length for t in changed) + new.graph.length
    assert fetched <= second.bytes_fetched < fetched + 64 * 1024  # and the metadata
    assert "layout" in second.stages_ms
    assert "apply_delta" not in second.stages_ms
    _answer(rig, "1.1.0")
    # unchanged tensors are mapped from 1.0.0's data file, shared with its engine
    weights = rig.hosts["device"].current("mlp").weights
    assert weights is not None
    assert weights.shared_bytes > 0
    model = rig.state().models["mlp"]
    assert (model.serving.version, model.previous.version) == ("1.1.0", "1.0.0")
    new_data = hashlib.sha256(_data(rig, "1.1.0").read_bytes()).hexdigest()
    assert model.serving.external == {"1.1.0.onnx.data": new_data}
    assert not (blobs / new_data).exists()  # the data file was never made on the device
    assert model.serving.graph == new.graph.sha256

    # the whole files come back from the tensors, each checked against its signed digest
    out = tmp_path / "export/model.onnx"
    result = CliRunner().invoke(
        cli, ["edge", "export", "mlp", "--config", str(rig.config()), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    released = rig.root / "models/mlp/1.1.0.onnx"
    assert out.read_bytes() == released.read_bytes()
    assert (out.parent / "1.1.0.onnx.data").read_bytes() == _data(rig, "1.1.0").read_bytes()


def test_a_tampered_data_file_on_the_remote_is_refused_and_nothing_is_served(
    rig: EdgeRig,
) -> None:
    digest = hashlib.sha256(_data(rig, "1.0.0").read_bytes()).hexdigest()
    (stored,) = (rig.remote / "targets/models/mlp/1.0.0.data").glob(f"{digest}.*")
    raw = bytearray(stored.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    stored.chmod(0o644)
    stored.write_bytes(bytes(raw))
    update = rig.sync().updates["mlp"]
    assert update.result == "failed", update
    assert "1.0.0.onnx.data" in update.reason
    assert rig.state().models["mlp"].serving is None
    assert rig.hosts["device"].current("mlp") is None
    assert not (rig.tmp / "device/state/blobs/sha256" / digest).exists()


def test_a_restarted_device_serves_its_external_data_model_without_the_network(
    rig: EdgeRig,
) -> None:
    from edge_sync.engine.host import InProcessHost

    assert rig.sync().updates["mlp"].result == "installed"
    rig.hosts["device"] = InProcessHost()  # a new process: nothing loaded
    with rig.updater(artifacts={"url": str(rig.tmp / "nowhere")}) as updater:
        assert updater.resume() == {}
    _answer(rig, "1.0.0")


def test_corrupt_objects_then_a_corrupt_data_delta_fall_back_to_the_full_file(
    rig: EdgeRig,
) -> None:
    assert rig.sync().updates["mlp"].method == "full"
    rig.release_version("1.1.0", "1.0.0", artifact=rig.models / "1.1.0/model.onnx")
    old = {t.sha256 for t in _manifest(rig, "1.0.0").tensors}
    for t in _manifest(rig, "1.1.0").tensors:
        if t.sha256 not in old:  # every tensor the device lacks comes wrong
            _spoil(rig.remote / TARGETS_DIR / object_path(t.sha256))
    (delta,) = (rig.remote / "targets/deltas/mlp/1.1.0.from-1.0.0.data").glob("*.delta")
    _spoil(delta)
    update = rig.sync().updates["mlp"]
    assert (update.result, update.version, update.method) == ("installed", "1.1.0", "full")
    assert update.bytes_fetched >= _data(rig, "1.1.0").stat().st_size
    _answer(rig, "1.1.0")
    assert rig.state().models["mlp"].serving.graph is not None  # laid out over the files


def _spoil(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[min(200, len(raw) - 1)] ^= 0xFF
    path.chmod(0o644)
    path.write_bytes(bytes(raw))


def test_a_manifest_that_misplaces_a_tensor_in_its_data_file_is_rejected(rig: EdgeRig) -> None:
    """Signed with the stolen online keys: a description whose tensor lies elsewhere in
    the data file than the verified ``.onnx`` says.  The whole files verify; the cut
    proves the manifest does not describe them."""
    from tests.edge.test_tensor_attacks import _forge_description

    def shift(doc: dict[str, Any]) -> None:
        doc["tensors"]["tensors"][-1]["offset"] += 4

    _forge_description(rig, "1.0.0", shift)
    update = rig.sync().updates["mlp"]
    assert (update.result, update.version) == ("rejected", "1.0.0"), update
    assert update.reason is not None
    assert update.reason.endswith("the signed tensor manifest does not describe the artifact")
    assert rig.state().models["mlp"].serving is None
    assert rig.hosts["device"].current("mlp") is None
