"""Repositories the authoring and inspection tests start from."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import git, session_cli


@pytest.fixture(scope="session")
def _init_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository as ``modelreg init`` leaves it, once a session (it makes keys and a
    trust root: most of the second a repository took to set up)."""
    base = tmp_path_factory.mktemp("init-template")
    with session_cli(base) as run:
        run("init", str(base / "models-repo"), cwd=base)
    return base / "models-repo"


@pytest.fixture
def repo(tmp_path: Path, _init_template: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of :func:`_init_template` (the working directory is its parent, where
    ``init`` ran)."""
    root = tmp_path / "models-repo"
    shutil.copytree(_init_template, root, symlinks=True)
    monkeypatch.chdir(tmp_path)
    return root


@pytest.fixture(scope="session")
def _mlp_template(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> Path:
    """mlp 1.0.0 and 1.1.0 declared and committed, once a session (``init`` makes keys
    and a trust root: most of the second a repository took to set up)."""
    base = tmp_path_factory.mktemp("mlp-template")
    root = base / "models-repo"
    with session_cli(base) as run:
        run("init", str(root), cwd=base)
        run("model", "add", "mlp", "--task", "classification",
            "--channel-order", "canary,production", cwd=root)  # fmt: skip
        run("version", "add", "mlp", "1.0.0", "--artifact",
            str(example_models / "mlp/1.0.0.onnx"), "--metric", "accuracy=0.91",
            "--golden-inputs", str(example_models / "mlp/1.0.0.inputs.npz"), cwd=root)  # fmt: skip
        run("version", "add", "mlp", "1.1.0", "--artifact",
            str(example_models / "mlp/1.1.0.onnx"), cwd=root)  # fmt: skip
        git(root, "commit", "-qm", "mlp 1.0.0 and 1.1.0")
    return root


@pytest.fixture
def mlp_repo(tmp_path: Path, _mlp_template: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of :func:`_mlp_template`, the working directory (as the commands that
    made it left it)."""
    root = tmp_path / "models-repo"
    shutil.copytree(_mlp_template, root, symlinks=True)
    monkeypatch.chdir(root)
    return root
