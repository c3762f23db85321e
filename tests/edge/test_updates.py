"""The updater end to end: releases made by ``modelreg ci release``, installed by a
device by the cheapest verified path, with every stage timed."""

from __future__ import annotations

import pytest

from tests.edge.conftest import EdgeRig

pytestmark = pytest.mark.integration


def test_v1_full_then_v2_by_delta(rig: EdgeRig) -> None:
    first = rig.sync()
    assert first.result == "updated", first
    update = first.updates["mlp"]
    assert (update.result, update.version, update.method) == ("installed", "1.0.0", "full")
    artifact = (rig.root / "models/mlp/1.0.0.onnx").stat().st_size
    assert artifact <= update.bytes_fetched < artifact * 1.2  # the file, and metadata
    assert set(update.stages_ms) >= {"detect", "verify_metadata", "plan", "fetch",
                                     "verify_bytes", "build", "self_test", "swap", "commit"}
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
