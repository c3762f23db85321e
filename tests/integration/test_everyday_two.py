"""Everyday work, round two (issue 27): what stood in the way of a new user with real
exports, each on a real repository through the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from tests.conftest import git

pytestmark = pytest.mark.integration


def _torch_like_export(path: Path) -> Path:
    """A detector head as ``torch.onnx.export`` writes its dimensions: named inputs, and
    outputs whose sizes are expressions of them (``floor(height/2 - 1/2)``), one too
    long to be a name, one written ``-1``."""
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "height", "width"])
    pooled = helper.make_tensor_value_info(
        "output0",
        TensorProto.FLOAT,
        [
            "batch",
            3,
            "floor(height/2 - 1/2) + 1",
            "(floor(floor(width/2 - 1/2)/2 - 1/2) + 1)*(floor(floor(width/2 - 1/2)/2 - 1/2) + 1)",
        ],
    )
    pool = helper.make_node("MaxPool", ["images"], ["output0"], kernel_shape=[2, 2], strides=[2, 2])
    model = helper.make_model(
        helper.make_graph([pool], "det", [x], [pooled]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 8
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = -1
    onnx.save(model, path)
    return path


def test_a_pytorch_export_with_expression_dims_is_declared(
    repo: Path, tmp_path: Path, cli: Any
) -> None:
    """Bug 1: ``version add`` refused a real export (``output 'output0' cannot be
    declared: Input should be a valid integer``).  Now an expression dimension is
    recorded unnamed, a plain name kept."""
    artifact = _torch_like_export(tmp_path / "det.onnx")
    assert cli("model", "add", "det", cwd=repo).code == 0
    r = cli("version", "add", "det", "1.0.0", "--artifact", str(artifact), cwd=repo)
    assert r.code == 0, r.err
    model = yaml.safe_load((repo / "manifests/det/model.yaml").read_text())
    signature = model["spec"]["signature"]
    assert signature["inputs"][0]["shape"] == ["batch", 3, "height", "width"]
    assert signature["outputs"][0]["shape"] == ["batch", None, None, None]
    git(repo, "add", "-A")
    assert cli("validate", cwd=repo).code == 0


def test_list_exits_1_when_a_manifest_does_not_load(mlp_repo: Path, cli: Any) -> None:
    """Bug 2: ``list`` printed what loaded and exited 0; ``status`` and ``show`` exit 1."""
    assert cli("list", cwd=mlp_repo).code == 0
    version = mlp_repo / "manifests/mlp/versions/1.1.0.yaml"
    version.write_text(version.read_text() + "bogus: 1\n")
    r = cli("list", cwd=mlp_repo)
    assert r.code == 1
    assert "mlp" in r.out  # what loaded is still listed
    assert "manifests/mlp/versions/1.1.0.yaml:" in r.err
    assert "unknown key 'bogus'" in r.err
    assert cli("list", "--json", cwd=mlp_repo).code == 1
