"""One verdict per version (issue 23, point 2): CI's build and devices tuned every way
(``serve.prepack`` on, off, and auto with different measured gains) accept or reject
the same version, even one whose goldens are borderline between session setups.

The borderline model has the example mlp's signature and a Conv + BatchNormalization
inside: ONNX Runtime folds the two into one Conv when it optimizes the graph (the
prepacked setup) and not in the shared-weight setup, so the two answer ~1e-9 apart.
Goldens recorded by ONNX Runtime's default session, at ``rtol: 0, atol: 0``, pass in
one setup and fail in the other: before, a device's verdict depended on the setup it
happened to run (a timing measurement, with ``auto``).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_sync.engine.base import LoadRequest
from edge_sync.engine.host import PREPACK_GAIN, InProcessHost
from edge_sync.engine.ort import OrtEngine
from registry.sessions import PREPACKED, SHARED, SessionSetup, session_setups
from tests.edge.conftest import EdgeRig

pytestmark = pytest.mark.integration

DEVICES: dict[str, dict[str, Any]] = {
    "on": {"prepack": "on"},
    "off": {"prepack": "off"},
    # the same settings, two measurements either side of PREPACK_GAIN
    "auto-fast": {"prepack": "auto", "gain": 1.28},
    "auto-slow": {"prepack": "auto", "gain": 1.23},
}
"""The differently-tuned devices, and the setup each serves a version in."""
SERVED_IN = {"on": PREPACKED, "off": SHARED, "auto-fast": PREPACKED, "auto-slow": SHARED}


def borderline(seed: int) -> onnx.ModelProto:
    """``input [batch, 16] -> probs [batch, 4]`` through Conv + BatchNormalization of
    odd sizes (3 channels, 3x3), with weights small enough that answers are ~1e-2."""
    rng = np.random.default_rng(seed)

    def init(name: str, array: Any) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(array, np.float32), name)

    channels = 3
    inits = [
        numpy_helper.from_array(np.array([-1, 1, 4, 4], np.int64), "image_shape"),
        numpy_helper.from_array(np.array([-1, channels * 16], np.int64), "flat_shape"),
        init("w", rng.standard_normal((channels, 1, 3, 3)) * 0.05),
        init("b", rng.standard_normal(channels) * 1e-3),
        init("gamma", 1 + rng.standard_normal(channels) * 0.1),
        init("beta", rng.standard_normal(channels) * 1e-3),
        init("mean", rng.standard_normal(channels) * 1e-3),
        init("var", 1 + np.abs(rng.standard_normal(channels)) * 0.1),
        init("head", rng.standard_normal((channels * 16, 4)) * 0.05),
    ]
    nodes = [
        helper.make_node("Reshape", ["input", "image_shape"], ["image"]),
        helper.make_node("Conv", ["image", "w", "b"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["conv", "gamma", "beta", "mean", "var"], ["norm"]),
        helper.make_node("Reshape", ["norm", "flat_shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "head"], ["probs"]),
    ]
    graph = helper.make_graph(
        nodes,
        "borderline",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _setup_outputs(path: Path, x: Any) -> dict[str, Any]:
    """The model's answer in each setup a CPU device may run it in."""
    import onnxruntime as ort

    found: dict[str, Any] = {}
    for setup in session_setups(None):
        options = ort.SessionOptions()
        setup.configure(options)
        session = ort.InferenceSession(str(path), options, providers=list(setup.providers))
        found[setup.name] = session.run(["probs"], {"input": x})[0]
    return found


def _device(rig: EdgeRig, name: str) -> None:
    """Device ``name``'s host, tuned as :data:`DEVICES` says (an ``auto`` device's
    measurement kept in its state dir, as the daemon keeps it)."""
    tuning = DEVICES[name]
    decisions = rig.tmp / name / "tuning.json"
    decisions.parent.mkdir(parents=True, exist_ok=True)
    if "gain" in tuning:
        gain = float(tuning["gain"])
        decisions.write_text(json.dumps({"mlp": {
            "prepack": gain > PREPACK_GAIN, "shared_ms": gain, "prepacked_ms": 1.0}}))  # fmt: skip
    rig.hosts[name] = InProcessHost(prepack=str(tuning["prepack"]), decisions=decisions)


def _add(rig: EdgeRig, version: str, model: onnx.ModelProto, *, exact: bool) -> None:
    """Add mlp ``version`` with goldens recorded by ONNX Runtime's default session
    (``exact``: at rtol 0, atol 0)."""
    path = rig.tmp / f"borderline-{version}.onnx"
    path.write_bytes(model.SerializeToString())
    rig.run("version", "add", "mlp", version, "--artifact", str(path), "--parent", "1.0.0",
            "--golden-inputs", str(rig.models / "mlp/1.1.0.inputs.npz"))  # fmt: skip
    if exact:
        manifest = rig.root / f"manifests/mlp/versions/{version}.yaml"
        text = manifest.read_text()
        assert "  goldens:\n" in text
        manifest.write_text(text.replace("  goldens:\n", "  goldens:\n    rtol: 0\n    atol: 0\n"))


def test_ci_and_every_tuned_device_give_a_borderline_version_the_same_verdict(
    rig: EdgeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the model really is borderline: its setups answer ~1e-9 apart
    x = np.load(rig.models / "mlp/1.1.0.inputs.npz")["input"]
    probe = rig.tmp / "probe.onnx"
    probe.write_bytes(borderline(1).SerializeToString())
    answers = _setup_outputs(probe, x)
    gap = float(np.abs(answers[SHARED] - answers[PREPACKED]).max())
    assert 1e-10 < gap < 1e-7, gap
    assert float(np.abs(answers[SHARED]).max()) < 0.1
    # and the device's engines compute bit for bit what CI's sessions of each setup do
    request = LoadRequest("mlp", "probe", probe, hashlib.sha256(probe.read_bytes()).hexdigest())
    for share, setup in ((True, SHARED), (False, PREPACKED)):
        engine = OrtEngine(request, share=share)
        assert engine.setup.name == setup
        assert np.array_equal(engine.run({"input": x})["probs"], answers[setup]), setup

    for name in DEVICES:
        _device(rig, name)
        assert rig.sync(name).updates["mlp"].result == "installed"  # 1.0.0: no borderline

    # CI's build: out of tolerance in the shared setup, named with the largest error
    _add(rig, "1.1.0", borderline(1), exact=True)
    built = rig.cli("build", "mlp", "1.1.0", cwd=rig.root)
    assert built.code == 1
    match = re.search(
        r"spec\.goldens\.cases\[0\]\.outputs: case 'default' output 'probs' in session "
        r"setup shared: max abs error ([0-9.e+-]+) exceeds tolerance \(rtol=0, atol=0\)",
        built.err,
    )
    assert match is not None, built.err
    assert float(match.group(1)) == pytest.approx(gap, rel=1e-6)
    record = json.loads(
        (rig.root / ".modelreg/build/mlp/1.1.0/build.json").read_text()
    )["goldens"][0]  # fmt: skip
    assert record["setups"]["prepacked"]["probs"] == 0.0  # the setup the goldens came from
    assert record["setups"]["shared"]["probs"] == pytest.approx(gap, rel=1e-6)

    # released anyway by a CI that checks one setup (ONNX Runtime's defaults, as the
    # build did before): every device, whatever setup it serves in, rejects it alike
    monkeypatch.setattr(
        "pipelines.build._stage.golden_setups",
        lambda _targets, _available: [SessionSetup(PREPACKED)],
    )
    rig.promote("1.1.0")
    monkeypatch.undo()
    reasons = {}
    for name in DEVICES:
        update = rig.sync(name).updates["mlp"]
        assert update.result == "rejected", (name, update)
        # one serving in the prepacked setup swapped 1.1.0 in and back: its own goldens
        # passed, the shared setup's failed right after the swap
        assert ("confirm" in update.stages_ms) == (SERVED_IN[name] == PREPACKED), name
        reasons[name] = update.reason
        assert rig.hosts[name].current("mlp").version == "1.0.0"
    assert len(set(reasons.values())) == 1, reasons  # the same words on every device
    reason = reasons["on"]
    assert reason is not None
    assert reason.startswith("golden case 'default', output 'probs' in the shared session: ")
    assert f"max abs error {gap:.3g}, rtol 0, atol 0" in reason

    # a version within its tolerances: CI and every device accept it, each device
    # serving it in the setup its own tuning picked
    _add(rig, "1.2.0", borderline(2), exact=False)
    assert rig.cli("build", "mlp", "1.2.0", cwd=rig.root).code == 0
    rig.promote("1.2.0")
    for name in DEVICES:
        assert rig.sync(name).updates["mlp"].result == "installed", name
        serving = rig.hosts[name].current("mlp")
        assert isinstance(serving, OrtEngine)
        assert serving.version == "1.2.0"
        assert serving.setup.name == SERVED_IN[name], name


def test_a_replacing_version_serves_before_its_other_setups_are_checked(rig: EdgeRig) -> None:
    """A device serving 1.0.0 in the prepacked setup installs 1.2.0: it serves once its
    own setup's goldens pass, and the shared setup is checked right after the swap
    (``confirm``), the state saying so meanwhile.  A daemon killed during that check
    serves 1.0.0 again at its restart and loads 1.2.0 anew, blaming no version."""
    from edge_sync.state.store import StateDir

    _device(rig, "on")
    assert rig.sync("on").updates["mlp"].result == "installed"
    _add(rig, "1.2.0", borderline(2), exact=False)
    rig.promote("1.2.0")
    host, killed = rig.hosts["on"], rig.tmp / "killed-while-confirming"
    seen: list[tuple[str, str]] = []

    def observer(stage: str, edge: str) -> None:
        seen.append((stage, edge))
        if (stage, edge) == ("confirm", "start"):
            assert host.current("mlp").version == "1.2.0"  # serving already
            model = StateDir(rig.tmp / "on/state").load().models["mlp"]
            assert model.serving is not None
            assert model.serving.version == "1.2.0"
            assert model.gate is not None
            assert not model.gate.confirmed
            assert model.gate.restore_serving is not None
            assert model.gate.restore_serving.version == "1.0.0"
            shutil.copytree(rig.tmp / "on/state", killed, symlinks=True)  # as a kill leaves it

    rig.updater_options = {"observer": observer}
    update = rig.sync("on").updates["mlp"]
    rig.updater_options = {}
    assert update.result == "installed", update
    assert seen.index(("commit", "end")) < seen.index(("confirm", "start"))
    assert "confirm" in update.stages_ms
    model = rig.state("on").models["mlp"]
    assert model.last_known_good == model.serving
    assert model.serving is not None
    assert model.serving.version == "1.2.0"
    assert model.gate is None  # no health gate here: confirmed is known good

    # the kill during the check, replayed on a copy of the state it left
    rig.config("again")
    shutil.copytree(killed, rig.tmp / "again/state", symlinks=True)
    rig.hosts["again"] = InProcessHost(prepack="on")
    with rig.updater("again") as up:
        assert up.resume(unclean=True) == {}
        restarted = rig.state("again").models["mlp"]
        assert rig.hosts["again"].current("mlp").version == "1.0.0"
        assert restarted.serving is not None
        assert restarted.serving.version == "1.0.0"
        assert restarted.gate is None
        assert restarted.attempt is not None
        assert restarted.attempt.version == "1.2.0"
        assert restarted.attempt.unclean_stops == 1
        again = up.sync().updates["mlp"]
    assert again.result == "installed", again
    model = rig.state("again").models["mlp"]
    assert model.serving is not None
    assert model.serving.version == "1.2.0"
    assert (model.attempt, model.gate, model.rejected) == (None, None, [])
    assert rig.hosts["again"].current("mlp").version == "1.2.0"


def test_a_confirm_that_breaks_off_blames_no_version(
    rig: EdgeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check in the other setup that fails for no fault of the version (the disk, a
    blob gone) swaps the version back unjudged: what it replaced serves, as the state
    says, nothing is rejected, and the next sync installs it."""
    _device(rig, "on")
    assert rig.sync("on").updates["mlp"].result == "installed"
    _add(rig, "1.2.0", borderline(2), exact=False)
    rig.promote("1.2.0")

    def broken(*_args: object) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr("edge_sync.sync.install.confirm_setups", broken)
    update = rig.sync("on").updates["mlp"]
    assert update.result == "failed", update
    assert update.reason is not None
    assert "No space left on device" in update.reason
    assert rig.hosts["on"].current("mlp").version == "1.0.0"
    model = rig.state("on").models["mlp"]
    assert model.serving is not None
    assert model.serving.version == "1.0.0"
    assert (model.gate, model.rejected) == (None, [])
    monkeypatch.undo()
    assert rig.sync("on").updates["mlp"].result == "installed"
    assert rig.hosts["on"].current("mlp").version == "1.2.0"
