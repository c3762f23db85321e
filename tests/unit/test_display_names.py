"""Names of files in messages: the loader's string-based ``_Display`` says what
``display_path`` (pathlib) says, except from a folder inside the repository, where every
name is absolute (one name per file: the parse cache keys on it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.config import RepoConfig
from registry.repository import Repository, _Display, display_path


@pytest.mark.parametrize(
    ("cwd", "root"),
    [
        ("work", "work/repo"),  # the repository below the working directory
        ("work/repo", "work/repo"),  # at its root
        ("work/re", "work/repo"),  # a sibling whose name is a prefix of the root's
        ("other", "work/repo"),
    ],
)
def test_display_names_match_pathlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cwd: str, root: str
) -> None:
    (tmp_path / cwd).mkdir(parents=True, exist_ok=True)
    (tmp_path / root / "manifests").mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(tmp_path / cwd)
    file = tmp_path / root / "manifests" / "mlp" / "model.yaml"
    assert _Display(tmp_path / root)(str(file)) == display_path(file)


def test_names_are_absolute_from_inside_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "repo"
    (root / "manifests" / "mlp").mkdir(parents=True)
    show = _Display(root)
    monkeypatch.chdir(root / "manifests")
    inside = _Display(root)
    file = root / "manifests" / "mlp" / "model.yaml"
    assert inside(str(file)) == str(file)
    assert inside.prefix == f"{root}/"
    assert show(str(file)) == str(file)  # made elsewhere: tmp_path is not below the cwd


def test_relative_names_are_posix_below_the_root(tmp_path: Path) -> None:
    config = RepoConfig.model_validate({"apiVersion": "modelreg/v1", "kind": "RegistryConfig"})
    repo = Repository(root=tmp_path, config=config)
    assert repo.relative(tmp_path / "manifests" / "a" / "model.yaml") == "manifests/a/model.yaml"
    with pytest.raises(ValueError, match="is not in the subpath"):
        repo.relative(tmp_path.parent / "elsewhere")
