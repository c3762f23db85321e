"""``history``, ``show`` and ``list`` on a real git repository made by modelreg itself."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import git

pytestmark = pytest.mark.integration


def _add(cli: Any, root: Path, examples: Path, version: str, *extra: str) -> None:
    r = cli("version", "add", "mlp", version, "--artifact", str(examples / f"mlp/{version}.onnx"),
            *extra, cwd=root)  # fmt: skip
    assert r.code == 0, r.err


def _promote(cli: Any, root: Path, *args: str) -> None:
    r = cli("promote", "mlp", *args, cwd=root)
    assert r.code == 0, r.err


@pytest.fixture
def fleet(tmp_path: Path, cli: Any, example_models: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """mlp 1.0.0 released to production, 1.1.0 released to canary and rolled back by a PR."""
    monkeypatch.setenv("GITHUB_RUN_ID", "4242")
    root = tmp_path / "fleet"
    assert cli("init", str(root), cwd=tmp_path).code == 0
    r = cli("model", "add", "mlp", "--channel-order", "canary,production", cwd=root)
    assert r.code == 0, r.err
    _add(cli, root, example_models, "1.0.0", "--metric", "accuracy=0.91")
    git(root, "commit", "-qm", "mlp 1.0.0 (#3)")
    _promote(cli, root, "1.0.0", "-c", "canary")
    _promote(cli, root, "1.0.0", "-c", "production")
    git(root, "commit", "-qam", "mlp 1.0.0 to canary and production")
    assert cli("publish", cwd=root).code == 0
    git(root, "add", "trust")
    git(root, "commit", "-qm", "release [skip ci]")
    _add(cli, root, example_models, "1.1.0")
    git(root, "commit", "-qm", "mlp 1.1.0")
    _promote(cli, root, "1.1.0", "-c", "canary", "--percent", "10")
    git(root, "commit", "-qam", "mlp 1.1.0 to 10% of canary")
    assert cli("publish", cwd=root).code == 0
    git(root, "add", "trust")
    git(root, "commit", "-qm", "release [skip ci]")
    # the rollback arrives as a merged pull request
    git(root, "checkout", "-qb", "rollback")
    _promote(cli, root, "1.0.0", "-c", "canary")
    git(root, "commit", "-qam", "canary back to 1.0.0")
    git(root, "checkout", "-q", "main")
    git(root, "merge", "--no-ff", "-qm", "Merge pull request #12 from acme/rollback", "rollback")
    return root


def _events(cli: Any, root: Path, *args: str) -> list[dict[str, Any]]:
    r = cli("history", "mlp", "--json", *args, cwd=root)
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert set(out) == {"model", "channel", "events"}
    events: list[dict[str, Any]] = out["events"]
    return events


def test_history_lists_versions_promotions_rollbacks_and_releases(fleet: Path, cli: Any) -> None:
    events = _events(cli, fleet)
    head = git(fleet, "rev-parse", "HEAD").strip()
    assert [(e["kind"], e["summary"]) for e in events] == [
        ("rollback", "channel canary: 1.1.0 (10%) -> 1.0.0"),
        ("released", "version 1.1.0 released by CI run 4242"),
        ("promotion", "channel canary: 1.0.0 -> 1.1.0 (10%)"),
        ("version added", "version 1.1.0 added"),
        ("released", "version 1.0.0 released by CI run 4242"),
        ("promotion", "channel canary: - -> 1.0.0"),
        ("promotion", "channel production: - -> 1.0.0"),
        ("version added", "version 1.0.0 added"),
    ]
    rollback = events[0]
    assert rollback["commit"] == head  # the merge commit, not the branch's
    assert rollback["pr"] == 12
    assert (rollback["previous"], rollback["previous_percent"]) == ("1.1.0", 10.0)
    assert (rollback["version"], rollback["percent"]) == ("1.0.0", None)
    assert rollback["author"] == "modelreg tests"
    assert rollback["date"].startswith(git(fleet, "log", "-1", "--format=%aI").strip()[:10])
    assert events[-1]["pr"] == 3  # "(#3)" in a squashed subject
    assert events[1]["subject"] == "release [skip ci]"
    assert events[1]["ci_run"] == "4242"
    expected = {
        "kind", "commit", "author", "date", "subject", "pr", "version", "channel", "previous",
        "previous_percent", "percent", "ci_run", "reason", "summary",
    }  # fmt: skip
    assert all(set(e) == expected for e in events)


def test_history_of_one_channel_and_as_text(fleet: Path, cli: Any) -> None:
    events = _events(cli, fleet, "--channel", "canary")
    assert [(e["kind"], e["previous"], e["version"]) for e in events] == [
        ("rollback", "1.1.0", "1.0.0"),
        ("promotion", "1.0.0", "1.1.0"),
        ("promotion", None, "1.0.0"),
    ]
    r = cli("history", "mlp", "-c", "canary", cwd=fleet)
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == ["date", "commit", "pr", "author", "event", "what"]
    assert "#12" in lines[1]
    assert lines[1].split()[-7:] == [
        "rollback",
        "channel",
        "canary:",
        "1.1.0",
        "(10%)",
        "->",
        "1.0.0",
    ]
    assert len(lines) == 4


def test_history_runs_two_git_processes_whatever_the_number_of_commits(
    fleet: Path, cli: Any, example_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for percent in range(20, 100, 10):
        _promote(cli, fleet, "1.1.0", "-c", "canary", "--percent", str(percent))
        git(fleet, "commit", "-qam", f"canary {percent}%")
    from registry import history

    calls: list[list[str]] = []
    real = subprocess.run

    def counting(argv: list[str], *args: Any, **kwargs: Any) -> Any:
        calls.append(argv)
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", counting)
    log = history.ModelLog("manifests/mlp", "trust/metadata")
    events = history.model_history(fleet, log)
    rollouts = [e for e in events if e.kind == "rollout"]
    assert len(rollouts) == 7  # 20% was a promotion: canary served 1.0.0 after the rollback
    assert rollouts[0].summary() == "channel canary: 1.1.0 (80%) -> 1.1.0 (90%)"
    # rev-parse, one log and one cat-file: never one process per commit
    assert [a[3] for a in calls] == ["rev-parse", "-c", "cat-file"]


def test_history_errors_are_one_line_with_a_suggestion(fleet: Path, cli: Any) -> None:
    r = cli("history", "mpl", cwd=fleet)
    assert (r.code, r.err) == (1, "modelreg: model 'mpl' is not declared; did you mean 'mlp'?\n")
    r = cli("history", "mlp", "--channel", "producton", cwd=fleet)
    assert r.code == 1
    assert r.err.strip().splitlines() == [
        "modelreg: channel 'producton' is not declared for model 'mlp'; did you mean 'production'?"
    ]


def test_show_a_version_by_name_and_by_channel(fleet: Path, cli: Any) -> None:
    r = cli("show", "mlp:1.0.0", "--json", cwd=fleet)
    assert r.code == 0, r.err
    facts = json.loads(r.out)
    assert facts["kind"] == "version"
    assert (facts["model"], facts["version"], facts["parent"]) == ("mlp", "1.0.0", None)
    assert facts["metrics"] == {"accuracy": 0.91}
    assert facts["channels"] == ["canary", "production"]
    assert facts["released"] is True
    release = facts["release"]
    assert (release["signed"], release["published"], release["ci_run"]) == (True, True, "4242")
    assert len(release["sha256"]) == 64
    pointer = (fleet / "models/mlp/1.0.0.onnx.dvc").read_text()
    assert facts["artifact"]["dvc_md5"] in pointer
    assert facts["artifact"]["path"] == "models/mlp/1.0.0.onnx"
    assert facts["signature"]["inputs"][0]["name"] == "input"
    assert (
        facts["commit"]["sha"]
        == git(fleet, "log", "-1", "--format=%H", "--", "manifests/mlp/versions/1.0.0.yaml").strip()
    )
    by_channel = json.loads(cli("show", "mlp@production", "--json", cwd=fleet).out)
    assert by_channel["via_channel"] == "production"
    assert {k: v for k, v in by_channel.items() if k != "via_channel"} == facts
    newer = json.loads(cli("show", "mlp:1.1.0", "--json", cwd=fleet).out)
    assert (newer["parent"], newer["channels"], newer["released"]) == ("1.0.0", [], True)
    text = cli("show", "mlp@canary", cwd=fleet).out
    assert text.splitlines()[0] == "mlp:1.0.0 (channel canary)"
    assert "released:       yes" in text


def test_show_a_model(fleet: Path, cli: Any) -> None:
    r = cli("show", "mlp", "--json", cwd=fleet)
    assert r.code == 0, r.err
    facts = json.loads(r.out)
    assert facts["kind"] == "model"
    assert facts["versions"] == ["1.0.0", "1.1.0"]
    assert facts["latest"] == "1.1.0"
    assert facts["released"] == ["1.0.0", "1.1.0"]
    assert facts["channels"] == {
        "canary": {"version": "1.0.0", "percent": None, "hold": None},
        "production": {"version": "1.0.0", "percent": None, "hold": None},
    }
    assert facts["promotion"]["order"] == ["canary", "production"]
    assert "channels:       canary=1.0.0, production=1.0.0" in cli("show", "mlp", cwd=fleet).out


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("mpl", "model 'mpl' is not declared; did you mean 'mlp'?"),
        ("mlp:1.0.1", "version '1.0.1' is not declared for model 'mlp'; did you mean '1.0.0'?"),
        ("mlp@prod", "channel 'prod' is not declared for model 'mlp'; did you mean 'production'?"),
        (
            "mlp@beta",
            "channel 'beta' is not declared for model 'mlp' (declared: canary, production)",
        ),
    ],
)
def test_show_unknown_names_fail_with_one_line(
    fleet: Path, cli: Any, ref: str, message: str
) -> None:
    r = cli("show", ref, cwd=fleet)
    assert r.code == 1
    assert r.err == f"modelreg: {message}\n"
    assert r.out == ""


def test_list_models_versions_and_channels(fleet: Path, cli: Any, example_models: Path) -> None:
    r = cli("model", "add", "tiny", cwd=fleet)
    assert r.code == 0, r.err
    r = cli("list", "--json", cwd=fleet)
    assert r.code == 0, r.err
    assert json.loads(r.out) == {
        "models": [
            {
                "model": "mlp",
                "versions": ["1.0.0", "1.1.0"],
                "latest": "1.1.0",
                "channels": {
                    "canary": {"version": "1.0.0", "percent": None, "hold": None},
                    "production": {"version": "1.0.0", "percent": None, "hold": None},
                },
                "loaded": True,
                "released": ["1.0.0", "1.1.0"],
            },
            {
                "model": "tiny",
                "versions": [],
                "latest": None,
                "channels": {},
                "loaded": True,
                "released": [],
            },
        ]
    }
    lines = cli("list", cwd=fleet).out.splitlines()
    assert lines[0].split() == ["model", "count", "latest", "versions", "channels"]
    assert lines[1].split() == [
        "mlp", "2", "1.1.0", "1.0.0,", "1.1.0", "canary=1.0.0,", "production=1.0.0"
    ]  # fmt: skip
    assert lines[2].split() == ["tiny", "0", "-", "-", "-"]


def test_a_hostile_author_name_cannot_drive_the_terminal(fleet: Path, cli: Any) -> None:
    """A commit's author comes from whoever pushed it: escape sequences (retitle the
    terminal, clear the screen), a carriage return that overwrites the line and a bidi
    override reach ``history``'s table as text, never as control characters."""
    hostile = "Eve\x1b]0;owned\x07\x1b[2J\rroot\u202e"
    _promote(cli, fleet, "1.1.0", "-c", "canary")
    git(fleet, "-c", f"user.name={hostile}", "commit", "-qam", "canary to 1.1.0")
    r = cli("history", "mlp", cwd=fleet)
    assert r.code == 0, r.err
    line = next(x for x in r.out.splitlines() if "canary: 1.0.0 -> 1.1.0" in x)
    assert "Eve]0;owned[2J root" in line  # the carriage return: a space in one line
    assert not any(ch in r.out for ch in "\x1b\x07\r\u202e")
    # JSON keeps the name as git gave it (a carriage return read as a newline), escaped
    # by JSON itself
    assert _events(cli, fleet)[0]["author"] == hostile.replace("\r", "\n")


def test_show_and_history_of_one_model_read_only_its_folder(fleet: Path, cli: Any) -> None:
    """At 10,000 versions a fresh CI checkout has no parse cache: one model's show or
    history must not parse every other model's manifests."""
    other = fleet / "manifests/other"
    other.mkdir()
    (other / "model.yaml").write_text("this: [is not a manifest\n")
    for args in (("show", "mlp"), ("show", "mlp:1.0.0"), ("history", "mlp")):
        r = cli(*args, "--no-cache", cwd=fleet)
        assert r.code == 0, r.err
        assert "manifest problem" not in r.err  # the broken model was never read
    # a name that is not there still gets the closest one, from a full load
    r = cli("show", "mpl", cwd=fleet)
    assert r.code == 1
    assert "did you mean 'mlp'?" in r.err
    assert cli("validate", cwd=fleet).code == 1  # validation reads everything
