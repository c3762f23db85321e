"""Repositories the authoring and inspection tests start from."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import git


@pytest.fixture
def repo(tmp_path: Path, cli) -> Path:
    root = tmp_path / "models-repo"
    result = cli("init", str(root), cwd=tmp_path)
    assert result.code == 0, result.err
    return root


@pytest.fixture
def mlp_repo(repo: Path, cli, example_models: Path) -> Path:
    assert cli("model", "add", "mlp", "--task", "classification",
               "--channel-order", "canary,production", cwd=repo).code == 0  # fmt: skip
    r = cli("version", "add", "mlp", "1.0.0", "--artifact", str(example_models / "mlp/1.0.0.onnx"),
            "--metric", "accuracy=0.91", "--golden-inputs",
            str(example_models / "mlp/1.0.0.inputs.npz"), cwd=repo)  # fmt: skip
    assert r.code == 0, r.err
    r = cli("version", "add", "mlp", "1.1.0", "--artifact", str(example_models / "mlp/1.1.0.onnx"),
            cwd=repo)  # fmt: skip
    assert r.code == 0, r.err
    git(repo, "commit", "-qm", "mlp 1.0.0 and 1.1.0")
    return repo
