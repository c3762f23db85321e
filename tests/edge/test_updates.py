"""The updater end to end: releases made by ``modelreg ci release``, installed by a
device by the cheapest verified path, with every stage timed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from edge_sync.engine.base import Engine, LoadRequest
from edge_sync.engine.host import InProcessHost
from registry.config import load_config
from tests.conftest import git
from tests.edge.conftest import EdgeRig

pytestmark = pytest.mark.integration


def test_v1_full_then_v2_by_delta(rig: EdgeRig) -> None:
    first = rig.sync()
    assert first.result == "updated", first
    update = first.updates["mlp"]
    assert (update.result, update.version, update.method) == ("installed", "1.0.0", "full")
    artifact = (rig.root / "models/mlp/1.0.0.onnx").stat().st_size
    assert artifact <= update.bytes_fetched < artifact * 1.2  # the file, and metadata
    assert set(update.stages_ms) >= {
        "detect",
        "verify_metadata",
        "plan",
        "fetch",
        "verify_bytes",
        "build",
        "self_test",
        "swap",
        "commit",
    }
    state = rig.state()
    assert state.models["mlp"].serving.version == "1.0.0"
    assert rig.sync().result == "current"  # nothing new: one ls-remote

    rig.release_version("1.1.0", "1.0.0")
    second = rig.sync()
    update = second.updates["mlp"]
    assert (update.result, update.version, update.method) == ("installed", "1.1.0", "delta"), update
    delta = next((rig.remote / "targets").rglob("*.1.1.0.from-1.0.0.delta"))
    assert update.bytes_fetched < delta.stat().st_size + 64 * 1024
    state = rig.state()
    assert state.models["mlp"].serving.version == "1.1.0"
    assert state.models["mlp"].previous.version == "1.0.0"
    assert rig.hosts["device"].current("mlp").version == "1.1.0"


def _delta_size(rig: EdgeRig, version: str, base: str) -> int:
    (delta,) = (rig.remote / "targets").rglob(f"*.{version}.from-{base}.delta")
    return delta.stat().st_size


def test_v3_from_v1_through_a_chain_of_deltas(rig: EdgeRig) -> None:
    assert rig.sync().updates["mlp"].version == "1.0.0"
    rig.release_version("1.1.0", "1.0.0")  # released while the device was away
    rig.release_version("2.0.0", "1.1.0")
    update = rig.sync().updates["mlp"]
    assert (update.result, update.version, update.method) == ("installed", "2.0.0", "delta")
    chain = _delta_size(rig, "1.1.0", "1.0.0") + _delta_size(rig, "2.0.0", "1.1.0")
    assert chain <= update.bytes_fetched < chain + 64 * 1024
    model = rig.state().models["mlp"]
    assert (model.serving.version, model.previous.version) == ("2.0.0", "1.0.0")
    # the intermediate 1.1.0 was only a step: nothing references it, so it is gone
    held = {p.name for p in (rig.tmp / "device/state/blobs/sha256").iterdir()}
    assert held == {model.serving.sha256, model.previous.sha256}


def test_going_back_to_a_held_version_fetches_nothing(rig: EdgeRig) -> None:
    rig.sync()
    rig.release_version("1.1.0", "1.0.0")
    rig.sync()
    rig.promote("1.0.0")  # a rollback is a new channels document that points back
    update = rig.sync().updates["mlp"]
    assert (update.result, update.version, update.method) == ("installed", "1.0.0", "cached")
    assert update.bytes_fetched < 16 * 1024  # metadata only


def test_without_a_usable_delta_chain_the_full_file_is_fetched(
    rig: EdgeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge_sync.decide import plan

    rig.sync()
    rig.release_version("1.1.0", "1.0.0")
    monkeypatch.setattr(plan, "MAX_DELTA_CHAIN", 0)  # no delta may be applied
    update = rig.sync().updates["mlp"]
    assert (update.result, update.method) == ("installed", "full")
    assert update.bytes_fetched >= (rig.root / "models/mlp/1.1.0.onnx").stat().st_size


def test_a_corrupt_delta_falls_back_to_the_full_file(rig: EdgeRig) -> None:
    rig.sync()
    rig.release_version("1.1.0", "1.0.0")
    (delta,) = (rig.remote / "targets").rglob("*.1.1.0.from-1.0.0.delta")
    data = bytearray(delta.read_bytes())
    data[200] ^= 0xFF
    delta.write_bytes(bytes(data))  # the remote serves garbage for it
    update = rig.sync().updates["mlp"]
    assert (update.result, update.version, update.method) == ("installed", "1.1.0", "full")
    full = (rig.root / "models/mlp/1.1.0.onnx").stat().st_size
    assert update.bytes_fetched >= full + len(data)  # both count


def test_a_target_that_matches_no_label_is_rejected_once(rig: EdgeRig) -> None:
    rig.sync()
    rig.run("version", "add", "mlp", "1.1.0", "--artifact", str(rig.models / "mlp/1.1.0.onnx"),
            "--parent", "1.0.0", "--target", "gpu=onnxruntime")  # fmt: skip
    version = rig.root / "manifests/mlp/versions/1.1.0.yaml"
    text = version.read_text()
    assert "name: gpu" in text
    indent = re.search(r"\n( *)- name: gpu", text)
    assert indent is not None, text
    pad = indent.group(1) + "  "
    version.write_text(
        text.replace("- name: gpu", f"- name: gpu\n{pad}selector: {{accelerator: cuda}}")
    )
    rig.promote("1.1.0")
    report = rig.sync()
    update = report.updates["mlp"]
    assert update.result == "rejected"
    assert "matches this device's labels (arch=x86_64)" in (update.reason or "")
    assert report.result == "current"  # a rejection is not a failure: no backoff
    again = rig.sync()
    assert "mlp" not in again.updates  # not tried again: nothing signed changed
    model = rig.state().models["mlp"]
    assert model.serving.version == "1.0.0"
    assert [r.version for r in model.rejected] == ["1.1.0"]


def test_a_tensorrt_target_is_built_on_the_device_or_rejected_with_why(rig: EdgeRig) -> None:
    """A TensorRT target runs the verified ONNX artifact through ONNX Runtime's TensorRT
    provider (its engine built and cached on the device); a device without it rejects
    the version with the reason, and never runs it on the CPU in its place."""
    import onnxruntime as ort

    from edge_sync.engine.tensorrt import TRT_PROVIDER

    rig.sync()
    rig.run("version", "add", "mlp", "1.1.0", "--artifact", str(rig.models / "mlp/1.1.0.onnx"),
            "--parent", "1.0.0", "--target", "gpu=tensorrt:fp16")  # fmt: skip
    rig.promote("1.1.0")
    update = rig.sync().updates["mlp"]
    assert update.method == "delta"  # the ONNX artifact, by the cheapest path
    if TRT_PROVIDER in ort.get_available_providers():  # a GPU device: see tests/gpu
        assert update.result == "installed"
        return
    assert update.result == "rejected"
    assert update.reason is not None
    assert "target 'gpu' needs TensorRT: this device's ONNX Runtime has no" in update.reason
    assert rig.state().models["mlp"].serving.version == "1.0.0"


class _DriftingEngine:
    """An engine whose answers drift from the goldens (another runtime, a bad port: it
    runs in no session setup of ``registry.sessions``, so the self-test checks it alone)."""

    setup = None

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.model, self.version, self.sha256 = inner.model, inner.version, inner.sha256
        self.request, self.inputs, self.outputs = inner.request, inner.inputs, inner.outputs
        self.providers, self.intra_op_threads = inner.providers, inner.intra_op_threads
        self.size_bytes, self.run_s = inner.size_bytes, inner.run_s
        self.closed = False

    @property
    def loaded(self) -> bool:
        return self.inner.loaded

    @property
    def shared(self) -> bool:
        return self.inner.shared

    @property
    def weights(self) -> Any:
        return self.inner.weights

    @property
    def memory_bytes(self) -> int:
        return self.inner.memory_bytes

    def sample_inputs(self) -> dict[str, Any]:
        return self.inner.sample_inputs()

    def run(self, inputs: Any, outputs: Any = None) -> dict[str, Any]:
        return {k: v + 1.0 for k, v in self.inner.run(inputs, outputs).items()}

    def unload(self) -> None:
        self.inner.unload()

    def detach(self) -> object:
        self.closed = True
        return self.inner.detach()

    def close(self) -> None:
        self.closed = True
        self.inner.close()


class _DriftingHost(InProcessHost):
    """Builds drifting engines for one version: the host protocol's other implementation."""

    def __init__(self, version: str) -> None:
        super().__init__()
        self.drifting = version
        self.built: list[Any] = []

    def build(self, request: LoadRequest) -> Engine:
        engine = super().build(request)
        if request.version == self.drifting:
            engine = _DriftingEngine(engine)
        self.built.append(engine)
        return engine


def test_a_version_that_fails_its_signed_goldens_is_rejected_and_never_served(
    rig: EdgeRig,
) -> None:
    host = _DriftingHost("1.1.0")
    rig.hosts["device"] = host
    rig.sync()
    rig.run("version", "add", "mlp", "1.1.0", "--artifact", str(rig.models / "mlp/1.1.0.onnx"),
            "--parent", "1.0.0", "--golden-inputs", str(rig.models / "mlp/1.1.0.inputs.npz"))  # fmt: skip
    rig.promote("1.1.0")
    report = rig.sync()
    update = report.updates["mlp"]
    assert update.result == "rejected"
    assert update.reason == (
        "golden case 'default', output 'probs': 8 of 8 values out of tolerance "
        "(max abs error 1, rtol 0.0001, atol 1e-05)"
    )
    assert report.result == "current"  # not a failure: no backoff
    assert host.current("mlp").version == "1.0.0"  # type: ignore[union-attr]
    assert host.built[-1].closed  # the rejected engine was released
    model = rig.state().models["mlp"]
    assert model.serving is not None
    assert model.serving.version == "1.0.0"
    assert [r.version for r in model.rejected] == ["1.1.0"]
    builds = len(host.built)
    assert "mlp" not in rig.sync().updates  # the same signed bytes are not tried again
    assert len(host.built) == builds


def test_a_rollback_made_with_the_rollback_command_reaches_the_device(rig: EdgeRig) -> None:
    rig.sync()
    rig.release_version("1.1.0", "1.0.0")
    assert rig.sync().updates["mlp"].version == "1.1.0"
    rig.run("rollback", "mlp", "--channel", "canary")  # staged: a plain commit takes it
    git(rig.root, "commit", "-qm", "canary back to 1.0.0")
    rig.run("ci", "release")
    update = rig.sync().updates["mlp"]
    assert (update.result, update.version, update.method) == ("installed", "1.0.0", "cached")


def test_a_deprecated_version_is_never_installed_even_when_assigned(rig: EdgeRig) -> None:
    """CI refuses to assign a deprecated version; a device refuses it on its own too
    (here the holder of the online keys signs such a release)."""
    from pipelines.publish import TargetStore
    from signing.target_names import deprecation_path
    from signing.tuf_facts import TargetFacts, next_channels
    from signing.tuf_repo import TrustRepo
    from signing.workspace import signer, trust_paths

    rig.sync()
    rig.release_version("1.1.0", "1.0.0")
    assert rig.sync().updates["mlp"].version == "1.1.0"
    paths = trust_paths(rig.root, load_config(rig.root))
    trust = TrustRepo.load(paths.metadata, expiry=paths.expiry)
    store = TargetStore(rig.root, load_config(rig.root).remote)
    previous = store.load_channels(trust)
    assert previous is not None
    trust.add_target(
        deprecation_path("mlp", "1.0.0"),
        b"leaks PII",
        TargetFacts(kind="deprecation", model="mlp", version="1.0.0"),
    )
    trust.set_channels(next_channels(previous, {"mlp": {"canary": ("1.0.0", None)}}), previous)
    store.write(trust)
    trust.publish({role: signer(paths, role) for role in ("targets", "snapshot", "timestamp")})
    git(rig.root, "add", "-A")
    git(rig.root, "commit", "-qm", "assign a deprecated version")
    update = rig.sync().updates["mlp"]
    assert (update.result, update.version) == ("rejected", "1.0.0")
    assert update.reason == "version 1.0.0 is deprecated (leaks PII); not installed"
    assert rig.state().models["mlp"].serving.version == "1.1.0"
    assert "mlp" not in rig.sync().updates  # refused once, not again at every poll


def _manifest(rig: EdgeRig, version: str) -> Any:
    from signing.version_doc import VersionDoc

    (doc,) = (rig.remote / "targets/versions/mlp").glob(f"*.{version}.json")
    return VersionDoc.from_bytes(doc.read_bytes()).tensors


def test_a_fine_tune_comes_as_the_tensors_it_changed(rig: EdgeRig, tmp_path: Path) -> None:
    """Issue 25: the device fetches, verifies and writes only the tensors it lacks and
    builds from its skeleton; the whole file is never rebuilt, and can be exported."""
    from click.testing import CliRunner

    from modelreg.cli.main import cli
    from modelreg.examples import write_examples

    write_examples(tmp_path / "medium", "medium", models=["mlp"], goldens=False)
    rig.release_version("1.1.0", "1.0.0", artifact=tmp_path / "medium/mlp/1.0.0.onnx")
    assert rig.sync().updates["mlp"].method == "full"  # nothing held: the whole file
    rig.release_version("1.2.0", "1.1.0", artifact=tmp_path / "medium/mlp/1.1.0.onnx")
    old, new = _manifest(rig, "1.1.0"), _manifest(rig, "1.2.0")
    assert old is not None
    assert new is not None
    kept = {t.sha256 for t in old.tensors}
    changed = [t for t in new.tensors if t.sha256 not in kept]
    assert 0 < len(changed) < len(new.tensors)
    update = rig.sync().updates["mlp"]
    assert (update.result, update.version, update.method) == ("installed", "1.2.0", "delta")
    assert "layout" in update.stages_ms
    assert "apply_delta" not in update.stages_ms
    fetched = sum(t.length for t in changed) + new.graph.length
    assert fetched <= update.bytes_fetched < fetched + 64 * 1024  # and the metadata
    serving = rig.state().models["mlp"].serving
    assert serving.graph == new.graph.sha256
    assert serving.artifact_sha256 is None
    blobs = rig.tmp / "device/state/blobs/sha256"
    assert not (blobs / serving.sha256).exists()  # the whole file was never made
    for t in changed:
        assert (blobs / t.sha256).stat().st_size == t.length
    out = tmp_path / "exported.onnx"
    result = CliRunner().invoke(
        cli, ["edge", "export", "mlp", "--config", str(rig.config()), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == (tmp_path / "medium/mlp/1.1.0.onnx").read_bytes()
