"""`modelreg validate` of an unchanged tree reuses its stored result; any change anywhere
in the tree (or of where it runs from) validates again; a stored result cannot be forged
into use, and CI never uses one."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from modelreg.cli.main import cli
from registry import result_cache
from registry.cache import untrusted_checkout
from registry.validation import Validation, validate_repository
from tests.unit.test_parse_cache import copy_repo

RESULT = f"{result_cache.RESULTS_DIR}/validate.json"


@pytest.fixture(autouse=True)
def no_racy_window(monkeypatch: pytest.MonkeyPatch) -> None:
    # What a test copies or edits is always "racily new" (its ctime is now): without
    # this, every edit would be seen because nothing is stored, never because the
    # fingerprint changed.  test_a_recently_modified_tree_is_not_stored puts it back.
    monkeypatch.setattr(result_cache, "_RACY_NS", 0)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = copy_repo(tmp_path)
    monkeypatch.chdir(root)
    return root


def strings(result: Validation) -> list[str]:
    return sorted(str(p) for p in result.problems)


def test_an_unchanged_tree_reuses_the_result(repo: Path) -> None:
    fresh = validate_repository(repo, cache=False)
    first = validate_repository(repo)
    second = validate_repository(repo)
    assert (fresh.reused, first.reused, second.reused) == (False, False, True)
    assert strings(fresh) == strings(first) == strings(second) == []
    assert (second.models, second.versions, second.files) == (fresh.models, fresh.versions, 8)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda root: _rewrite(
                root / "manifests/mlp/versions/1.1.0.yaml", "parent: 1.0.0", "parent: 1.0.7"
            ),
            "spec.parent: version 1.0.7 is not declared",
        ),
        (
            lambda root: _rewrite(
                root / "models/mlp/1.1.0.onnx.dvc", "path: 1.1.0.onnx", "path: x.onnx"
            ),
            "tracks 'x.onnx', expected '1.1.0.onnx'",
        ),
        (lambda root: (root / "models/mlp/1.1.0.onnx.dvc").unlink(), "no DVC pointer"),
        (
            lambda root: (root / "manifests/mlp/stray.yaml").write_text("a: 1\n"),
            "unexpected file",
        ),
        (
            lambda root: (root / "models/mlp/1.1.0.onnx").symlink_to("/etc/hostname"),
            "is a symbolic link",
        ),
    ],
    ids=["manifest", "pointer", "pointer-removed", "new-file", "artifact-link"],
)
def test_any_change_in_the_tree_validates_again(
    repo: Path, change: Callable[[Path], object], expected: str
) -> None:
    assert validate_repository(repo).problems == []
    assert validate_repository(repo).reused
    change(repo)
    after = validate_repository(repo)
    assert not after.reused
    assert any(expected in p for p in strings(after)), strings(after)
    again = validate_repository(repo)
    assert again.reused  # the new result is stored in turn
    assert strings(again) == strings(after)


def _rewrite(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_a_recently_modified_tree_is_not_stored(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(result_cache, "_RACY_NS", 2_000_000_000)
    past = (repo / "modelreg.yaml").stat().st_mtime
    edited = repo / "manifests/mlp/versions/1.1.0.yaml"
    os.utime(edited, (past, past))  # an old mtime set back: the ctime is still now
    assert result_cache.fingerprint(repo, "x") is None
    validate_repository(repo)
    assert not (repo / RESULT).exists()
    assert not validate_repository(repo).reused


def test_the_working_directory_is_part_of_the_key(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _rewrite(repo / "manifests/mlp/versions/1.1.0.yaml", "parent: 1.0.0", "parent: 1.0.7")
    at_root = strings(validate_repository(repo))
    assert at_root[0].startswith("manifests/mlp/versions/1.1.0.yaml:")
    monkeypatch.chdir(repo / "manifests")
    inside = validate_repository(repo)
    assert not inside.reused
    assert strings(inside)[0].startswith(f"{repo}/manifests/mlp/versions/1.1.0.yaml:")


def test_a_forged_result_is_never_used(repo: Path) -> None:
    validate_repository(repo)
    stored = json.loads((repo / RESULT).read_text())
    lie = {"problems": [], "models": 99, "versions": 99, "files": 99}
    # Another key (what a committed file would have): ignored.
    (repo / RESULT).write_text(json.dumps({**stored, "key": "0" * 64, "result": lie}))
    assert validate_repository(repo).models == 2
    # The right key with a malformed result: ignored, and replaced.
    bad: object
    for bad in ({**lie, "problems": [["f", "m", "1", None, None]]}, {**lie, "models": -1}, []):
        (repo / RESULT).write_text(json.dumps({**stored, "result": bad}))
        again = validate_repository(repo)
        assert (again.reused, again.models) == (False, 2)


def test_ci_never_reads_or_writes_a_result(repo: Path) -> None:
    with untrusted_checkout():
        validate_repository(repo)
        assert not (repo / RESULT).exists()
        validate_repository(repo, cache=True)
    validate_repository(repo)
    assert (repo / RESULT).exists()
    with untrusted_checkout():
        assert not validate_repository(repo).reused


def test_the_command_prints_the_same_both_times(repo: Path) -> None:
    _rewrite(repo / "manifests/mlp/versions/1.1.0.yaml", "parent: 1.0.0", "parent: 1.0.7")
    runner = CliRunner()
    runs = [runner.invoke(cli, ["validate", "--json"])]
    assert (repo / RESULT).is_file()
    runs.append(runner.invoke(cli, ["validate", "--json"]))
    assert [r.exit_code for r in runs] == [1, 1]
    assert runs[0].output == runs[1].output
    assert json.loads(runs[0].output)["problems"][0]["field"] == "spec.parent"


def _git(root: Path, *args: str) -> str:
    import subprocess

    ident = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    return subprocess.run(
        ["git", "-C", str(root), *ident, *args], check=True, capture_output=True, text=True
    ).stdout


def _status(root: Path) -> tuple[dict[str, tuple[str | None, bool]], bool]:
    from registry.status_report import cached_status

    report, reused = cached_status(root)
    return {f"{r.model} {r.version}": (r.commit, r.dirty) for r in report.rows}, reused


def test_status_is_reused_until_the_tree_or_git_moves(repo: Path) -> None:
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "first")
    first, reused = _status(repo)
    assert not reused
    assert _status(repo) == (first, True)
    head = _git(repo, "rev-parse", "HEAD").strip()
    assert first["mlp 1.1.0"] == (head, False)
    # an edit, uncommitted: the row is dirty
    _rewrite(repo / "manifests/mlp/versions/1.1.0.yaml", "parent: 1.0.0", "parent: 1.0.0  # x")
    edited, reused = _status(repo)
    assert (edited["mlp 1.1.0"], reused) == ((head, True), False)
    # staged: the tree is the same, only git's index moved
    _git(repo, "add", "-A")
    assert _status(repo)[1] is False
    # committed: HEAD moved, the row names the new commit
    _git(repo, "commit", "-qm", "second")
    second = _git(repo, "rev-parse", "HEAD").strip()
    after, reused = _status(repo)
    assert (after["mlp 1.1.0"], reused) == ((second, False), False)
    assert _status(repo) == (after, True)


def test_status_of_a_repository_in_a_folder_of_a_larger_work_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = copy_repo(tmp_path)  # tmp_path/repo, with git at tmp_path
    monkeypatch.chdir(root)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "first")
    head = _git(tmp_path, "rev-parse", "HEAD").strip()
    rows, _ = _status(root)
    assert rows["mlp 1.1.0"] == (head, False)
    _rewrite(root / "manifests/mlp/versions/1.1.0.yaml", "parent: 1.0.0", "parent: 1.0.0  # x")
    assert _status(root)[0]["mlp 1.1.0"] == (head, True)


def test_status_follows_gits_own_ignore_rules(repo: Path) -> None:
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "first")
    new = repo / "manifests/mlp/versions/1.1.0.yaml"
    _rewrite(new, "parent: 1.0.0", "parent: 1.0.0  # x")
    assert _status(repo)[0]["mlp 1.1.0"][1] is True
    assert _status(repo)[1] is True
    # git's own files are outside the tree's fingerprint, but in the key
    exclude = repo / ".git/info/exclude"
    exclude.write_text(exclude.read_text() + "# another rule\n")
    assert _status(repo)[1] is False


def test_a_manifest_may_not_name_a_file_in_a_tool_folder(repo: Path) -> None:
    _rewrite(
        repo / "manifests/mlp/versions/1.1.0.yaml",
        "path: models/mlp/1.1.0.onnx",
        "path: .git/mlp/1.1.0.onnx",
    )
    problems = strings(validate_repository(repo))
    assert any("'.git/mlp/1.1.0.onnx' is inside .git, which git" in p for p in problems), problems


def test_a_linked_cache_folder_is_neither_read_nor_written(repo: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "shared"
    elsewhere.mkdir()
    (repo / ".modelreg").mkdir()
    (repo / ".modelreg/cache").symlink_to(elsewhere)
    validate_repository(repo)
    assert not validate_repository(repo).reused
    assert list(elsewhere.iterdir()) == []


def test_a_working_directory_that_is_not_utf8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    odd = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/odd\xff"))
    odd.mkdir()
    root = copy_repo(odd)
    monkeypatch.chdir(root)
    assert validate_repository(root).problems == []
    assert validate_repository(root).reused
