"""``registry.sessions``: the session setups a device may run a version in, the one
list the device's self-test and CI's build both check (one verdict per version)."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from pipelines.build._goldens import golden_setups
from registry.schema import OnnxRuntimeTarget, TensorRTTarget
from registry.sessions import PREPACKED, SHARED, SessionSetup, session_setups

CPU = ("CPUExecutionProvider",)


def _ort(**fields: object) -> OnnxRuntimeTarget:
    return OnnxRuntimeTarget.model_validate({"name": "t", "engine": "onnxruntime", **fields})


def _trt() -> TensorRTTarget:
    return TensorRTTarget.model_validate({"name": "gpu", "engine": "tensorrt"})


@pytest.mark.parametrize(
    ("target", "kind", "setups"),
    [
        # ONNX Runtime on CPU: shared weights, or prepacked at the target's level
        (None, "artifact", [(SHARED, "disable", CPU), (PREPACKED, "all", CPU)]),
        (_ort(), "artifact", [(SHARED, "disable", CPU), (PREPACKED, "all", CPU)]),
        (_ort(optimization="basic"), "artifact",
         [(SHARED, "disable", CPU), (PREPACKED, "basic", CPU)]),
        # a graph CI optimized offline is loaded as it is
        (_ort(), "engine", [(SHARED, "disable", CPU), (PREPACKED, "disable", CPU)]),
        # other providers share nothing: one setup
        (_ort(providers=["CUDAExecutionProvider", "CPUExecutionProvider"]), "artifact",
         [(PREPACKED, "all", ("CUDAExecutionProvider", "CPUExecutionProvider"))]),
        (_trt(), "artifact", [(PREPACKED, "all", ("TensorrtExecutionProvider",))]),
    ],
)  # fmt: skip
def test_the_setups_of_each_kind_of_target(
    target: object, kind: str, setups: list[tuple[str, str, tuple[str, ...]]]
) -> None:
    found = session_setups(target, kind)  # type: ignore[arg-type]
    assert [(s.name, s.optimization, s.providers) for s in found] == setups
    assert [s.shared for s in found] == [name == SHARED for name, _, _ in setups]


def test_labels_name_what_is_unusual() -> None:
    assert SessionSetup(SHARED, "disable").label == "shared"
    assert SessionSetup(PREPACKED).label == "prepacked"
    assert SessionSetup(PREPACKED, "basic").label == "prepacked at basic"
    cuda = SessionSetup(PREPACKED, "all", ("CUDAExecutionProvider", "CPUExecutionProvider"))
    assert cuda.label == "prepacked on CUDA+CPU"


def test_configure_sets_the_level_and_prepacking() -> None:
    shared, prepacked = session_setups(None)
    options = ort.SessionOptions()
    shared.configure(options)
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert options.get_session_config_entry("session.disable_prepacking") == "1"
    options = ort.SessionOptions()
    prepacked.configure(options)
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with pytest.raises(Exception):  # noqa: B017, PT011 - ORT's own error type: not set
        options.get_session_config_entry("session.disable_prepacking")


@pytest.mark.parametrize(
    ("targets", "available", "labels"),
    [
        ([], CPU, ["shared", "prepacked"]),
        ([_ort(), _ort(optimization="basic")], CPU, ["shared", "prepacked", "prepacked at basic"]),
        # a CUDA target on a CPU runner: its device checks it; CI checks the CPU setups
        ([_ort(providers=["CUDAExecutionProvider"]), _trt()], CPU, ["shared", "prepacked"]),
        ([_ort(), _ort(providers=["CUDAExecutionProvider"])],
         ("CUDAExecutionProvider", *CPU), ["shared", "prepacked", "prepacked on CUDA"]),
    ],
)  # fmt: skip
def test_ci_runs_the_goldens_in_every_setup_it_has_the_providers_for(
    targets: list[object], available: tuple[str, ...], labels: list[str]
) -> None:
    assert [s.label for s in golden_setups(targets, available)] == labels  # type: ignore[arg-type]
