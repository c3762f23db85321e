"""Loading a repository large enough for the worker pool gives what one process gives.

The pool only starts from ``registry.repository._PARALLEL_FROM`` files, so these tests
write a repository that size (the benchmark's generator), break some of its files in
every way a load reports, and compare a pooled load with a single-process one: the
same manifests, documents, pointer checks and problems, in the same order.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from benchmarks._scale_repos import write_modelreg_tree
from registry import repository
from registry.checks import validate_paths
from registry.gitinfo import dirty_paths, last_commits
from registry.repository import Repository, load_repository, map_models, outline
from registry.status import collect_status
from registry.status_report import repository_status
from registry.validation import validate_repository


@pytest.fixture(scope="module")
def big_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pooled") / "repo"
    versions = 10
    models = repository._PARALLEL_FROM // (versions + 1) + 10
    write_modelreg_tree(root, models, versions)
    manifests = root / "manifests"
    # One of each kind of problem a load meets, spread over the chunks of the pool.
    (manifests / "m0003" / "versions" / "1.2.0.yaml").write_text("spec: [unclosed\n")
    bad = manifests / "m0040" / "versions" / "1.1.0.yaml"
    bad.write_text(bad.read_text().replace("format: onnx", "format: onnx\n    extra: 1"))
    (root / "models" / "m0077" / "1.3.0.onnx.dvc").unlink()
    (root / "models" / "m0090" / "1.0.0.onnx.dvc").write_text("outs: nope\n")
    linked = manifests / "m0120" / "versions" / "1.4.0.yaml"
    linked.unlink()
    linked.symlink_to(manifests / "m0120" / "versions" / "1.3.0.yaml")
    shutil.rmtree(manifests / "m0130" / "versions" / "1.5.0.yaml", ignore_errors=True)
    (manifests / "m0130" / "versions" / "1.5.0.yaml").write_bytes(b"\xff\xfe")
    (manifests / "m0141" / "model.yaml").unlink()
    # Two versions naming one file, across models (so across groups of the pool) and
    # within a model where the newer version comes first in the file listing.
    _point(manifests / "m0145" / "versions" / "1.1.0.yaml", "models/m0002/1.0.0.onnx")
    _point(manifests / "m0020" / "versions" / "1.2.0.yaml", "models/m0020/1.5.0.onnx")
    (manifests / "stray.yaml").write_text("kind: nothing\n")
    (manifests / "m0033" / "notes.yaml").write_text("x: 1\n")
    return root


def _point(version_file: Path, artifact: str) -> None:
    text = version_file.read_text()
    old = text.split("    path: ", 1)[1].split("\n", 1)[0]
    version_file.write_text(text.replace(f"    path: {old}", f"    path: {artifact}"))


def _picture(root: Path, jobs: int) -> dict[str, Any]:
    repo = load_repository(root, jobs=jobs, cache=False)
    return {
        "models": {n: (m.file, m.path, m.doc.data, m.manifest) for n, m in repo.models.items()},
        "versions": [
            (e.name, e.version, e.file, e.path, e.doc.data, e.manifest) for e in repo.all_versions()
        ],
        "pointers": repo.pointers,
        "broken": repo.broken,
        "files": repo.files,
        "problems": [str(p) for p in validate_paths(repo)],
        "positions": [e.doc.position(("spec", "artifact")) for e in repo.all_versions()][:50],
    }


def test_a_pooled_load_equals_a_single_process_load(big_repo: Path) -> None:
    pooled, single = _picture(big_repo, 2), _picture(big_repo, 1)
    assert pooled == single
    problems = "\n".join(pooled["problems"])
    for expected in (
        "m0003/versions/1.2.0.yaml:1:7: invalid YAML",
        "m0040/versions/1.1.0.yaml:12:5: spec.artifact.extra: unknown key",
        "no DVC pointer models/m0077/1.3.0.onnx.dvc",
        "models/m0090/1.0.0.onnx.dvc:1:7: outs: expected a list",
        "m0120/versions/1.4.0.yaml: is a symbolic link",
        "m0130/versions/1.5.0.yaml:1:1: not UTF-8",
        "m0141/model.yaml: model folder 'm0141' has versions but no model.yaml",
        (
            "m0145/versions/1.1.0.yaml:10:11: spec.artifact.path: models/m0002/1.0.0.onnx is "
            "already the artifact of m0002 1.0.0"
        ),
        (
            "m0020/versions/1.5.0.yaml:10:11: spec.artifact.path: models/m0020/1.5.0.onnx is "
            "already the artifact of m0020 1.2.0"
        ),
        "manifests/stray.yaml: unexpected manifest location",
        "m0033/notes.yaml: unexpected file",
    ):
        assert expected in problems, expected
    assert len(pooled["versions"]) == sum(1 for _ in big_repo.rglob("versions/*.yaml")) - 4


def test_the_pool_runs_in_other_processes(big_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pooled load parses in workers (not a quiet fallback to this process)."""
    parsed_here: list[int] = []
    original = repository._parse

    def counting(task: Any, show: Any) -> Any:
        parsed_here.append(os.getpid())
        return original(task, show)

    monkeypatch.setattr(repository, "_parse", counting)
    load_repository(big_repo, jobs=2, cache=False)
    assert os.getpid() not in parsed_here
    load_repository(big_repo, jobs=1, cache=False)
    assert os.getpid() in parsed_here


def test_validate_by_groups_of_models_equals_validate_of_the_whole(big_repo: Path) -> None:
    """``validate`` without the parse cache loads and checks groups of models in
    workers: the same problems, counts and order as one process checking the whole."""
    grouped = validate_repository(big_repo, jobs=2, cache=False)
    whole = load_repository(big_repo, jobs=1, cache=False)
    assert sorted(map(str, grouped.problems)) == sorted(map(str, validate_paths(whole)))
    assert (grouped.models, grouped.versions, grouped.files) == (
        len(whole.models),
        sum(len(v) for v in whole.versions.values()),
        len(whole.files),
    )
    # ... and it did run in groups (not the whole-repository fallback).
    found = outline(big_repo)
    groups = map_models(found, lambda repo: (os.getpid(), sorted(repo.models)), jobs=2)
    assert groups is not None
    assert len(groups) >= 8
    assert os.getpid() not in {pid for pid, _ in groups}
    names = [name for _, models in groups for name in models]
    assert names == sorted(whole.models)
    assert len(set(names)) == len(names)


def test_small_repositories_and_one_job_are_not_grouped(big_repo: Path, tmp_path: Path) -> None:
    assert map_models(outline(big_repo), _model_count, jobs=1) is None
    small = tmp_path / "small"
    write_modelreg_tree(small, 3, 2)
    assert map_models(outline(small), _model_count, jobs=2) is None


def _model_count(repo: Repository) -> int:
    return len(repo.models)


def test_status_by_groups_of_models_equals_status_of_the_whole(
    big_repo: Path, tmp_path: Path
) -> None:
    """``status`` without the parse cache reads groups of models in workers while git
    answers: the same rows (commits, uncommitted files, channels) and problems as the
    rows built from one load and git asked file by file."""
    repo_dir = tmp_path / "status"
    shutil.copytree(big_repo, repo_dir, symlinks=True)
    git = ["git", "-C", str(repo_dir), "-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "all", "--no-verify"], check=True)
    edited = repo_dir / "manifests" / "m0007" / "versions" / "1.1.0.yaml"
    edited.write_text(edited.read_text().replace("Retrained", "Re-trained"))
    new = repo_dir / "manifests" / "m0008" / "versions" / "1.10.0.yaml"
    new.write_text(
        (repo_dir / "manifests" / "m0008" / "versions" / "1.9.0.yaml")
        .read_text()
        .replace("version: 1.9.0", "version: 1.10.0")
        .replace("1.9.0.onnx", "1.8.0.onnx")
    )

    grouped = repository_status(repo_dir, jobs=2, cache=False)
    whole = load_repository(repo_dir, jobs=1, cache=False)
    relative = {e.file: e.path.relative_to(repo_dir).as_posix() for e in whole.all_versions()}
    expected = collect_status(
        whole,
        last_commits(repo_dir, relative.values(), "manifests"),
        dirty_paths(repo_dir, "manifests"),
        relative,
    )
    assert grouped.rows == expected
    assert sorted(map(str, grouped.problems)) == sorted(map(str, whole.problems))
    # the same order too, whichever way the files were read (--json prints it as is)
    assert grouped.problems == repository_status(repo_dir, jobs=1, cache=False).problems
    assert grouped.models == tuple(whole.models)
    by_file = {r.file.rsplit("manifests/", 1)[1]: r for r in grouped.rows}
    assert by_file["m0007/versions/1.1.0.yaml"].dirty
    assert by_file["m0007/versions/1.1.0.yaml"].commit is not None
    assert by_file["m0008/versions/1.10.0.yaml"].commit is None
    assert by_file["m0008/versions/1.10.0.yaml"].dirty
    assert sum(r.commit is not None for r in grouped.rows) == len(grouped.rows) - 1


def test_a_model_bigger_than_a_workers_share_is_not_grouped(tmp_path: Path) -> None:
    """Groups are whole models: one model holding most files would keep one worker busy
    and the other idle, so such a repository is loaded whole (its parse pooled)."""
    root = tmp_path / "lopsided"
    write_modelreg_tree(root, 3, 2)
    versions = root / "manifests" / "m0001" / "versions"
    template = (versions / "1.0.0.yaml").read_text()
    for i in range(repository._PARALLEL_FROM):
        (versions / f"2.0.{i}.yaml").write_text(template.replace("1.0.0", f"2.0.{i}"))
    assert map_models(outline(root), _model_count, jobs=2) is None


def test_a_linked_versions_folder_is_not_listed(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    write_modelreg_tree(root, 2, 2)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for i in range(50):
        (elsewhere / f"{i}.yaml").write_text("x: 1\n")
    linked = root / "manifests" / "m0002" / "versions"
    shutil.rmtree(linked)
    linked.symlink_to(elsewhere)
    assert repository._files_per_model(outline(root)) == [3, 1]


def test_groups_are_scanned_by_the_workers_only(big_repo: Path) -> None:
    """An outline that scanned the files already would have its scan problems reported
    twice (by the caller and by each group): refused."""
    with pytest.raises(ValueError, match="outline"):
        map_models(outline(big_repo, files=True), _model_count, jobs=2)
