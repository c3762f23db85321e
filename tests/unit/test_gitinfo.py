"""What git says of manifest files (``registry.gitinfo``): last commits and uncommitted
paths, read from a real git repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from registry.errors import ToolError
from registry.gitinfo import StatusQuery, dirty_paths, last_commits

_ID = ("-c", "user.name=t", "-c", "user.email=t@t.invalid")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *_ID, *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """Three commits under ``m/``: the second touches more names than one 64 KiB block
    of ``git log`` output holds, the third one file again."""
    root = tmp_path / "repo"
    (root / "m").mkdir(parents=True)
    _git(root, "init", "-q")
    (root / "m" / "a.yaml").write_text("1\n")
    (root / "outside.txt").write_text("x\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "first")
    first = _git(root, "rev-parse", "HEAD")
    many = root / "m" / ("long-folder-name-" * 4)
    many.mkdir()
    for i in range(1500):
        (many / f"file-{i:05d}.yaml").write_text(f"{i}\n")
    (root / "m" / "b.yaml").write_text("2\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "second")
    second = _git(root, "rev-parse", "HEAD")
    (root / "m" / "b.yaml").write_text("3\n")
    _git(root, "commit", "-qam", "third")
    third = _git(root, "rev-parse", "HEAD")
    return root, {"first": first, "second": second, "third": third}


def test_last_commits_read_across_blocks(history: tuple[Path, dict[str, str]]) -> None:
    root, shas = history
    names = [f"m/{'long-folder-name-' * 4}/file-{i:05d}.yaml" for i in (0, 777, 1499)]
    found = last_commits(root, ["m/a.yaml", "m/b.yaml", *names, "m/never.yaml"], "m")
    assert found["m/a.yaml"].sha == shas["first"]
    assert found["m/b.yaml"].sha == shas["third"]
    assert {found[n].sha for n in names} == {shas["second"]}
    assert "m/never.yaml" not in found


def test_a_status_query_answers_for_every_file_in_head(
    history: tuple[Path, dict[str, str]],
) -> None:
    root, shas = history
    (root / "m" / "a.yaml").write_text("edited\n")
    (root / "m" / "new.yaml").write_text("new\n")
    with StatusQuery(root, "m") as query:
        commits, dirty = query.commits(), query.dirty()
    assert len(commits) == 1502  # every file in HEAD under m/, none outside
    assert commits["m/a.yaml"].sha == shas["first"]
    assert commits["m/b.yaml"].sha == shas["third"]
    assert "outside.txt" not in commits
    assert dirty == {"m/a.yaml", "m/new.yaml"} == dirty_paths(root, "m")


def test_a_status_query_without_commits_says_nothing(tmp_path: Path) -> None:
    root = tmp_path / "unborn"
    (root / "m").mkdir(parents=True)
    _git(root, "init", "-q")
    (root / "m" / "a.yaml").write_text("1\n")
    with StatusQuery(root, "m") as query:
        assert query.commits() == {}
        assert query.dirty() == {"m/a.yaml"}


def test_status_asks_git_about_the_folder_the_validated_config_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """git starts on the manifests folder read from modelreg.yaml without the schema; when
    that read names another folder, the folder the validated configuration names is
    asked instead."""
    from benchmarks._scale_repos import write_modelreg_tree
    from registry import status_report

    root = tmp_path / "repo"
    write_modelreg_tree(root, 2, 2)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "all")
    head = _git(root, "rev-parse", "HEAD")
    asked: list[str] = []
    original = status_report._git_query

    def spy(root_: Path, top: Path | None, manifests: str) -> object:
        asked.append(manifests)
        return original(root_, top, manifests)

    monkeypatch.setattr(status_report, "_git_query", spy)
    monkeypatch.setattr(status_report, "_manifests_named", lambda _root: "models")
    report = status_report.repository_status(root, cache=False)
    assert asked == ["models", "manifests"]
    assert [r.commit for r in report.rows] == [head] * 4
    asked.clear()
    monkeypatch.setattr(status_report, "_manifests_named", lambda _root: "manifests")
    assert status_report.repository_status(root, cache=False).rows == report.rows
    assert asked == ["manifests"]


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("", "manifests"),  # the default
        ("manifests: defs/models\n", "defs/models"),
        ("manifests: ../outside\n", None),
        ("manifests: a/../b\n", None),
        ("manifests: ':(glob)**'\n", None),
        ("manifests: [a]\n", None),
        ("manifests: {\n", None),  # not YAML: loading the configuration says so
        (f"manifests: {'a' * 300}\n", None),  # longer than folder names are written
    ],
)
def test_the_manifests_folder_read_without_the_schema(
    tmp_path: Path, line: str, named: str | None
) -> None:
    from registry.status_report import _manifests_named

    (tmp_path / "modelreg.yaml").write_text(
        "apiVersion: modelreg/v1\nkind: RegistryConfig\n" + line
    )
    assert _manifests_named(tmp_path) == named


def test_a_repository_in_a_folder_of_a_larger_work_tree(tmp_path: Path) -> None:
    """Paths are relative to git's top level, whatever folder the repository is in."""
    top = tmp_path / "mono"
    sub = top / "ml" / "registry"
    (sub / "m").mkdir(parents=True)
    _git(top, "init", "-q")
    (sub / "m" / "a.yaml").write_text("1\n")
    _git(top, "add", "-A")
    _git(top, "commit", "-qm", "one")
    head = _git(top, "rev-parse", "HEAD")
    (sub / "m" / "b.yaml").write_text("new\n")
    found = last_commits(sub, ["ml/registry/m/a.yaml"], "ml/registry/m")
    assert found["ml/registry/m/a.yaml"].sha == head
    assert dirty_paths(sub, "ml/registry/m") == {"ml/registry/m/b.yaml"}
    with StatusQuery(top, "ml/registry/m") as query:
        assert set(query.commits()) == {"ml/registry/m/a.yaml"}


def test_names_with_other_line_breaks(tmp_path: Path) -> None:
    """With core.quotePath off git prints names as they are: a name holding U+2028 is
    one name (not cut where str.splitlines would cut it)."""
    root = tmp_path / "repo"
    (root / "m").mkdir(parents=True)
    _git(root, "init", "-q")
    _git(root, "config", "core.quotePath", "false")
    odd = "m/a\u2028b.yaml"
    (root / odd).write_text("1\n")
    (root / "m" / "café.yaml").write_text("1\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "one")
    head = _git(root, "rev-parse", "HEAD")
    with StatusQuery(root, "m") as query:
        commits = query.commits()
    assert {name: c.sha for name, c in commits.items()} == {odd: head, "m/café.yaml": head}


def test_a_query_that_cannot_start_stops_what_it_started(
    history: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = history
    started: list[subprocess.Popen[str]] = []
    real = subprocess.Popen

    def popen(*args: object, **kwargs: object) -> subprocess.Popen[str]:
        if started:
            raise OSError(24, "Too many open files")
        proc: subprocess.Popen[str] = real(*args, **kwargs)  # type: ignore[call-overload]
        started.append(proc)
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(ToolError, match="cannot run git: Too many open files"):
        StatusQuery(root, "m")
    assert started[0].returncode is not None  # stopped and reaped


def test_release_refuses_uncommitted_content_of_a_repository_in_a_larger_work_tree(
    tmp_path: Path,
) -> None:
    """``ci release`` signs only committed content: the guard sees the repository's own
    uncommitted files wherever it sits in the work tree, and only those."""
    from benchmarks._scale_repos import write_modelreg_tree
    from pipelines.ci._base import refuse_uncommitted
    from registry.errors import RepositoryError
    from registry.repository import load_repository

    top = tmp_path / "mono"
    root = top / "ml" / "registry"
    write_modelreg_tree(root, 2, 2)
    (top / "README.md").write_text("mono\n")
    _git(top, "init", "-q")
    _git(top, "add", "-A")
    _git(top, "commit", "-qm", "all")
    (top / "README.md").write_text("edited, outside the repository\n")
    repo = load_repository(root, jobs=1, cache=False)
    refuse_uncommitted(repo)  # nothing of the repository's own is uncommitted
    version = root / "manifests" / "m0001" / "versions" / "1.1.0.yaml"
    version.write_text(version.read_text().replace("Retrained", "Re-trained"))
    with pytest.raises(RepositoryError, match=r"'manifests/m0001/versions/1\.1\.0\.yaml'") as e:
        refuse_uncommitted(repo)
    assert "README" not in str(e.value)
