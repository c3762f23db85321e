"""``signing.target_names``: every signed target path, and nothing that could climb out.

The path strings are a contract with devices and released repositories: the expected
values below are literal on purpose, and must never change.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from registry.errors import UsageError
from signing.target_names import (
    CHANNELS_PATH,
    artifact_path,
    bundle_path,
    delta_path,
    engine_file_name,
    engine_path,
    golden_path,
    version_path,
)

BAD_MODELS = ["", "..", ".", "a/b", "../mlp", "MLP", "-mlp", "mlp-", "m" * 64, "mlp\n", "ml p"]
BAD_VERSIONS = ["", "1.0", "v1.0.0", "01.0.0", "1.0.0/x", "../1.0.0", "1.0.0\n", "latest"]


def test_each_kind_has_its_released_path() -> None:
    assert artifact_path("mlp", "1.0.0") == "models/mlp/1.0.0.onnx"
    assert bundle_path("mlp", "1.0.0") == "bundles/mlp/1.0.0.sigstore.json"
    assert delta_path("mlp", "1.1.0", "1.0.0") == "deltas/mlp/1.1.0.from-1.0.0.delta"
    assert engine_file_name("cpu", "onnxruntime") == "cpu.ort.onnx"
    assert engine_file_name("jetson-gpu", "tensorrt") == "jetson-gpu.plan"
    assert engine_path("mlp", "1.0.0", "cpu", "onnxruntime") == "engines/mlp/1.0.0/cpu.ort.onnx"
    assert engine_path("mlp", "1.0.0", "gpu", "tensorrt") == "engines/mlp/1.0.0/gpu.plan"
    assert version_path("mlp", "1.0.0") == "versions/mlp/1.0.0.json"
    assert (
        golden_path("mlp", "1.0.0", "default", "inputs") == "goldens/mlp/1.0.0/default.inputs.npz"
    )
    assert golden_path("mlp", "1.0.0", "case_2.b-c", "outputs") == (
        "goldens/mlp/1.0.0/case_2.b-c.outputs.npz"
    )
    assert CHANNELS_PATH == "channels.json"


def test_semver_with_prerelease_and_build_is_a_name() -> None:
    assert artifact_path("mlp", "2.0.0-rc.1+build.5") == "models/mlp/2.0.0-rc.1+build.5.onnx"
    assert delta_path("mlp", "2.0.0-rc.1", "1.0.0") == "deltas/mlp/2.0.0-rc.1.from-1.0.0.delta"


PER_VERSION: list[Callable[[str, str], str]] = [
    artifact_path,
    bundle_path,
    version_path,
    lambda m, v: delta_path(m, v, "1.0.0"),
    lambda m, v: engine_path(m, v, "cpu", "onnxruntime"),
    lambda m, v: golden_path(m, v, "default", "inputs"),
]


@pytest.mark.parametrize("name", PER_VERSION)
@pytest.mark.parametrize("model", BAD_MODELS)
def test_a_model_that_is_not_a_dns_label_is_refused(
    name: Callable[[str, str], str], model: str
) -> None:
    with pytest.raises(UsageError, match="is not a DNS label"):
        name(model, "1.0.0")


@pytest.mark.parametrize("name", PER_VERSION)
@pytest.mark.parametrize("version", BAD_VERSIONS)
def test_a_version_that_is_not_semver_is_refused(
    name: Callable[[str, str], str], version: str
) -> None:
    with pytest.raises(UsageError, match="is not SemVer"):
        name("mlp", version)


@pytest.mark.parametrize("base", BAD_VERSIONS)
def test_a_delta_base_that_is_not_semver_is_refused(base: str) -> None:
    with pytest.raises(UsageError, match="is not SemVer"):
        delta_path("mlp", "1.1.0", base)


@pytest.mark.parametrize(
    ("target", "engine", "message"),
    [
        ("..", "onnxruntime", "not a DNS label"),
        ("../x", "tensorrt", "not a DNS label"),
        ("a/b", "onnxruntime", "not a DNS label"),
        ("", "onnxruntime", "not a DNS label"),
        ("cpu", None, "makes no prebuilt file"),
        ("cpu", "openvino", "makes no prebuilt file"),
        ("cpu", "", "makes no prebuilt file"),
    ],
)
def test_an_engine_name_is_refused_for_a_bad_target_or_engine(
    target: str, engine: str | None, message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        engine_file_name(target, engine)
    with pytest.raises(UsageError, match=message):
        engine_path("mlp", "1.0.0", target, engine)


@pytest.mark.parametrize(
    "case", ["", ".", "..", ".hidden", "a/b", "../x", "1st", "a b", "x" * 65, "a\nb"]
)
def test_a_golden_case_that_is_not_a_case_name_is_refused(case: str) -> None:
    with pytest.raises(UsageError, match="is not a case name"):
        golden_path("mlp", "1.0.0", case, "inputs")


def test_a_golden_side_is_inputs_or_outputs() -> None:
    with pytest.raises(UsageError, match="neither inputs nor outputs"):
        golden_path("mlp", "1.0.0", "default", "both")  # type: ignore[arg-type]


def test_every_refusal_is_a_usage_error_a_value_error() -> None:
    assert issubclass(UsageError, ValueError)
