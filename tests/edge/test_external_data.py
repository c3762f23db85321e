"""A device following a model stored with ONNX external data: every data file fetched
as a signed target and verified before use, a fine-tune fetched as a delta per data
file, the files laid out side by side, weights memory-mapped, resumed after a restart."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelreg.examples import build_model, run_onnxruntime
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


def test_external_data_full_then_a_fine_tune_by_delta(rig: EdgeRig) -> None:
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

    rig.release_version("1.1.0", "1.0.0", artifact=rig.models / "1.1.0/model.onnx")
    second = rig.sync().updates["mlp"]
    assert (second.result, second.version, second.method) == ("installed", "1.1.0", "delta")
    assert second.bytes_fetched < _data(rig, "1.1.0").stat().st_size / 2
    assert "apply_delta" in second.stages_ms
    _answer(rig, "1.1.0")
    # unchanged tensors of the data file are shared with the engine 1.1.0 replaced
    weights = rig.hosts["device"].current("mlp").weights
    assert weights is not None
    assert weights.shared_bytes > 0
    model = rig.state().models["mlp"]
    assert (model.serving.version, model.previous.version) == ("1.1.0", "1.0.0")
    assert set(model.serving.external) == {"1.1.0.onnx.data"}


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


def test_a_corrupt_data_delta_falls_back_to_the_full_file(rig: EdgeRig) -> None:
    assert rig.sync().updates["mlp"].method == "full"
    rig.release_version("1.1.0", "1.0.0", artifact=rig.models / "1.1.0/model.onnx")
    (delta,) = (rig.remote / "targets/deltas/mlp/1.1.0.from-1.0.0.data").glob("*.delta")
    raw = bytearray(delta.read_bytes())
    raw[200] ^= 0xFF
    delta.chmod(0o644)
    delta.write_bytes(bytes(raw))
    update = rig.sync().updates["mlp"]
    assert (update.result, update.version, update.method) == ("installed", "1.1.0", "full")
    assert update.bytes_fetched >= _data(rig, "1.1.0").stat().st_size
    _answer(rig, "1.1.0")
