"""The manifest parse cache: same results, invalidated by edits, safe to ignore."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

import registry.cache
from registry.cache import CACHE_FILE
from registry.checks import validate_paths
from registry.repository import load_repository
from tests.conftest import REPO_ROOT


@pytest.fixture(autouse=True)
def no_racy_window(monkeypatch: pytest.MonkeyPatch) -> None:
    # A file is "racily new" for two seconds after its mtime or ctime; a copy made by a
    # test always is (its ctime cannot be set back).  test_racily_new_files_are_not_kept
    # puts the window back.
    monkeypatch.setattr(registry.cache, "_RACY_SECONDS", 0.0)


def copy_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(REPO_ROOT / "modelreg.yaml", root)
    shutil.copytree(REPO_ROOT / "manifests", root / "manifests")
    shutil.copytree(REPO_ROOT / "models", root / "models", ignore=shutil.ignore_patterns("*.onnx"))
    past = time.time() - 3600  # older than the racy window, so entries are stored
    for path in root.rglob("*"):
        os.utime(path, (past, past))
    return root


def summary(root: Path, cache: bool) -> tuple[dict[object, object], dict[str, object], list[str]]:
    repo = load_repository(root, jobs=1, cache=cache)
    versions: dict[object, object] = {(e.name, e.version): e.manifest for e in repo.all_versions()}
    models: dict[str, object] = {n: m.manifest for n, m in repo.models.items()}
    return versions, models, [str(p) for p in validate_paths(repo)]


def test_cached_load_equals_fresh_load(tmp_path: Path) -> None:
    root = copy_repo(tmp_path)
    fresh = summary(root, cache=False)
    assert not (root / CACHE_FILE).exists()
    first = summary(root, cache=True)
    entries = json.loads((root / CACHE_FILE).read_text())["entries"]
    assert len(entries) == 14  # 2 models + 6 versions + the 6 versions' DVC pointer checks
    second = summary(root, cache=True)
    assert fresh == first == second


def test_an_edit_is_seen_through_the_cache(tmp_path: Path) -> None:
    root = copy_repo(tmp_path)
    summary(root, cache=True)
    path = root / "manifests/mlp/versions/1.1.0.yaml"
    path.write_text(path.read_text().replace("parent: 1.0.0", "parent: 1.0.7"))
    problems = summary(root, cache=True)[2]
    assert len(problems) == 1
    assert "spec.parent: version 1.0.7 is not declared for model 'mlp'" in problems[0]
    # the position is read from the edited file, not from anything cached
    lines = path.read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if "parent: 1.0.7" in text)
    assert f"1.1.0.yaml:{line}:11: spec.parent:" in problems[0]


def test_a_crafted_cache_cannot_bypass_validation(tmp_path: Path) -> None:
    root = copy_repo(tmp_path)
    summary(root, cache=True)
    cache = root / CACHE_FILE
    payload = json.loads(cache.read_text())
    key = next(k for k in payload["entries"] if k.endswith("mlp/versions/1.1.0.yaml"))
    payload["entries"][key][1]["spec"]["artifact"]["format"] = "pickle"  # invalid data
    cache.write_text(json.dumps(payload))
    problems = summary(root, cache=True)[2]
    assert any("spec.artifact.format: expected one of 'onnx'" in p for p in problems)
    cache.write_text("{ not json")
    assert summary(root, cache=True)[2] == []  # unreadable cache: ignored, rebuilt
    assert json.loads(cache.read_text())["format"] == 1


def pointers(root: Path) -> dict[str, str | None]:
    return {a: c.md5 for a, c in load_repository(root, jobs=1, cache=True).pointers.items()}


def test_a_pointer_edit_is_seen_through_the_cache(tmp_path: Path) -> None:
    root = copy_repo(tmp_path)
    before = pointers(root)
    assert len(before) == 6
    assert pointers(root) == before  # from the cache now
    pointer = root / "models/mlp/1.1.0.onnx.dvc"
    old = before["models/mlp/1.1.0.onnx"]
    assert old is not None
    pointer.write_text(pointer.read_text().replace(old, "a" * 32))
    assert pointers(root)["models/mlp/1.1.0.onnx"] == "a" * 32
    pointer.write_text(pointer.read_text().replace("path: 1.1.0.onnx", "path: other.onnx"))
    problems = summary(root, cache=True)[2]
    assert any("tracks 'other.onnx', expected '1.1.0.onnx'" in p for p in problems)
    pointer.unlink()
    problems = summary(root, cache=True)[2]
    assert any("no DVC pointer models/mlp/1.1.0.onnx.dvc" in p for p in problems)


def test_a_crafted_pointer_entry_is_read_again(tmp_path: Path) -> None:
    root = copy_repo(tmp_path)
    truth = pointers(root)
    cache = root / CACHE_FILE
    payload = json.loads(cache.read_text())
    key = next(k for k in payload["entries"] if k.endswith("mlp/versions/1.1.0.yaml#pointer"))
    for forged in (["models/mlp/1.1.0.onnx", "../../etc/passwd"], ["models/x.onnx", "0" * 32]):
        payload["entries"][key][1] = forged
        cache.write_text(json.dumps(payload))
        assert pointers(root) == truth


def test_a_pointer_folder_replaced_by_a_link_is_refused_through_the_cache(tmp_path: Path) -> None:
    root = copy_repo(tmp_path)
    assert summary(root, cache=True)[2] == []
    assert summary(root, cache=True)[2] == []  # pointers from the cache now
    # the pointers keep their own stamps when their folder moves
    (root / "models/mlp").rename(root / "models/mlp.real")
    (root / "models/mlp").symlink_to("mlp.real")
    problems = summary(root, cache=True)[2]
    assert problems == summary(root, cache=False)[2]
    assert any("folder models/mlp is a symbolic link" in p for p in problems), problems


def test_racily_new_files_are_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry.cache, "_RACY_SECONDS", 2.0)
    root = copy_repo(tmp_path)  # old mtimes, but every ctime is now
    summary(root, cache=True)
    assert (
        not (root / CACHE_FILE).exists()
        or not json.loads((root / CACHE_FILE).read_text())["entries"]
    )
