"""``rollback`` and ``version deprecate`` on real git repositories, through ``ci pr``,
``publish`` and MLflow: one pull request goes back, a deprecated version never serves."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import git
from tests.integration.test_ci import add_version, github_env

pytestmark = pytest.mark.integration


def _ok(cli: Any, root: Path, *args: str) -> Any:
    r = cli(*args, cwd=root)
    assert r.code == 0, r.err
    return r


def _release(cli: Any, root: Path) -> None:
    """What ``ci release`` signs and commits (publish, then the metadata on top)."""
    _ok(cli, root, "publish")
    git(root, "add", "trust")
    if subprocess.run(["git", "diff", "--cached", "--quiet"], cwd=root, check=False).returncode:
        git(root, "commit", "-qm", "release [skip ci]")  # as ci release: only when it signed


@pytest.fixture
def fleet(tmp_path: Path, cli: Any, example_models: Path) -> Path:
    """mlp: 1.0.0 served canary only; 1.1.0 then 2.0.0 went canary -> production, each
    step released (a rollback leans on what was released, not on any commit)."""
    root = tmp_path / "fleet"
    _ok(cli, tmp_path, "init", str(root))
    _ok(cli, root, "model", "add", "mlp", "--channel-order", "canary,production")
    for version in ("1.0.0", "1.1.0", "2.0.0"):
        add_version(cli, root, example_models, version)
    git(root, "commit", "-qm", "three versions")
    for step in ([("1.0.0", "canary")], [("1.1.0", "canary"), ("1.1.0", "production")],
                 [("2.0.0", "canary"), ("2.0.0", "production")]):  # fmt: skip
        for version, channel in step:
            _ok(cli, root, "promote", "mlp", version, "-c", channel)
            git(root, "commit", "-qm", f"mlp {version} to {channel}")  # promote staged it
        _release(cli, root)
    return root


def _channels(root: Path) -> dict[str, Any]:
    text = (root / "manifests/mlp/model.yaml").read_text()
    import yaml

    channels: dict[str, Any] = yaml.safe_load(text)["spec"]["channels"]
    return channels


def test_rollback_goes_back_to_what_the_channel_served_and_stages_it(fleet: Path, cli: Any) -> None:
    r = _ok(cli, fleet, "rollback", "mlp", "--channel", "production")
    assert "rolled back mlp production: 2.0.0 -> 1.1.0" in r.out
    assert _channels(fleet)["production"] == "1.1.0"
    # staged like promote: a plain commit takes it
    assert git(fleet, "diff", "--cached", "--name-only").split() == ["manifests/mlp/model.yaml"]
    assert _ok(cli, fleet, "validate").code == 0
    git(fleet, "commit", "-qm", "production back to 1.1.0")
    events = json.loads(_ok(cli, fleet, "history", "mlp", "-c", "production", "--json").out)
    latest = events["events"][0]
    assert (latest["kind"], latest["previous"], latest["version"]) == ("rollback", "2.0.0", "1.1.0")
    # again: further back only to what production served; 1.0.0 served canary alone
    again = cli("rollback", "mlp", "--channel", "production", cwd=fleet)
    assert again.code == 1
    assert "no release of 'mlp' served a version below 1.1.0 on 'production'" in again.err
    assert len(again.err.strip().splitlines()) == 1


def test_rollback_to_a_named_version(fleet: Path, cli: Any) -> None:
    canary = _ok(cli, fleet, "rollback", "mlp", "-c", "canary", "--to", "1.0.0", "--json")
    assert json.loads(canary.out) | {"manifest": None} == {
        "model": "mlp", "channel": "canary", "version": "1.0.0", "previous": "2.0.0",
        "changed": True, "manifest": None,
    }  # fmt: skip
    cases = {
        ("production", "1.0.0"): "version 1.0.0 never served 'production' or a later channel",
        ("production", "2.0.0"): "channel 'production' of 'mlp' already serves 2.0.0",
        ("production", "1.1"): "version 1.1 is not declared for model 'mlp'",
        ("canary", "2.0.0"): "going forward is a promotion (modelreg promote mlp 2.0.0",
        ("prod", None): "channel 'prod' is not in the promotion order of 'mlp'",
    }
    before = (fleet / "manifests/mlp/model.yaml").read_text()
    for (channel, to), message in cases.items():
        args = ["rollback", "mlp", "-c", channel] + (["--to", to] if to else [])
        r = cli(*args, cwd=fleet)
        assert r.code == 1, (channel, to)
        assert message in r.err
        assert len(r.err.strip().splitlines()) == 1
    assert (fleet / "manifests/mlp/model.yaml").read_text() == before


def test_promote_accepts_a_version_that_served_the_channel_before(fleet: Path, cli: Any) -> None:
    # 1.1.0 no longer serves canary, but it served production: going back needs no canary step
    _ok(cli, fleet, "promote", "mlp", "1.1.0", "-c", "production")
    # 1.0.0 never served production: the order still applies
    r = cli("promote", "mlp", "1.0.0", "-c", "production", cwd=fleet)
    assert r.code == 1
    assert "must be promoted to 'canary' before 'production'" in r.err


def test_ci_pr_accepts_a_rollback_and_says_so_in_its_comment(
    fleet: Path, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = git(fleet, "rev-parse", "HEAD").strip()
    git(fleet, "checkout", "-qb", "rollback")
    _ok(cli, fleet, "rollback", "mlp", "-c", "production")
    git(fleet, "commit", "-qm", "production back to 1.1.0")
    github_env(tmp_path, monkeypatch, base, "main")
    r = cli("ci", "pr", cwd=fleet)
    assert r.code == 0, r.err
    comment = (fleet / ".modelreg/ci/pr-comment.md").read_text()
    assert "ready for review" in comment
    assert "rollback: `mlp production: 2.0.0 -> 1.1.0 (rollback; it served production before)`" in (
        comment
    )
    report = json.loads((fleet / ".modelreg/ci/pr-report.json").read_text())
    assert report["channels"] == [{
        "model": "mlp", "channel": "production", "previous": "2.0.0", "version": "1.1.0",
        "kind": "rollback", "served_before": ["production"],
    }]  # fmt: skip


def _pr(cli: Any, root: Path, base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    github_env(tmp_path, monkeypatch, base, "main")
    return cli("ci", "pr", cwd=root)


def test_ci_pr_judges_served_versions_by_the_base_history_not_the_pull_request(
    fleet: Path, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = git(fleet, "rev-parse", "HEAD").strip()
    git(fleet, "checkout", "-qb", "sneaky")
    # a commit inside the pull request that "served" 1.0.0 on production does not count
    _ok(cli, fleet, "promote", "mlp", "1.0.0", "-c", "production", "--force")
    git(fleet, "commit", "-qm", "1.0.0 to production")
    _ok(cli, fleet, "promote", "mlp", "2.0.0", "-c", "production")
    git(fleet, "commit", "-qm", "and back")
    _ok(cli, fleet, "promote", "mlp", "1.0.0", "-c", "production", "--force")
    git(fleet, "commit", "-qm", "and again")
    r = _pr(cli, fleet, base, tmp_path, monkeypatch)
    assert r.code == 1
    assert "version 1.0.0 must be promoted to 'canary' before 'production'" in r.err


def test_history_merged_without_a_release_does_not_count(
    fleet: Path, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast-forward merge of two commits (1.0.0 to production, then back) changes no
    channel as a whole, so it needed no approval; the middle state was never released:
    it is not history a rollback may lean on."""
    git(fleet, "checkout", "-qb", "feature")
    _ok(cli, fleet, "promote", "mlp", "1.0.0", "-c", "production", "--force")
    git(fleet, "commit", "-qm", "1.0.0 to production")
    _ok(cli, fleet, "promote", "mlp", "2.0.0", "-c", "production")
    git(fleet, "commit", "-qm", "and back")
    git(fleet, "checkout", "-q", "main")
    git(fleet, "merge", "-q", "--ff-only", "feature")
    _release(cli, fleet)
    base = git(fleet, "rev-parse", "HEAD").strip()
    assert cli("rollback", "mlp", "-c", "production", "--to", "1.0.0", cwd=fleet).code == 1
    git(fleet, "checkout", "-qb", "next")
    model = fleet / "manifests/mlp/model.yaml"
    model.write_text(model.read_text().replace("production: 2.0.0", "production: 1.0.0"))
    git(fleet, "commit", "-qam", "production to 1.0.0")
    r = _pr(cli, fleet, base, tmp_path, monkeypatch)
    assert r.code == 1
    assert "version 1.0.0 must be promoted to 'canary' before 'production'" in r.err


def test_a_version_pulled_back_goes_through_the_order_again(
    fleet: Path, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ok(cli, fleet, "rollback", "mlp", "-c", "production")
    _ok(cli, fleet, "rollback", "mlp", "-c", "canary", "--to", "1.1.0")
    git(fleet, "commit", "-qm", "2.0.0 pulled back everywhere")
    _release(cli, fleet)
    # going forward again is a promotion: 2.0.0 must pass canary first, locally and in CI
    local = cli("promote", "mlp", "2.0.0", "-c", "production", cwd=fleet)
    assert local.code == 1
    assert "must be promoted to 'canary' before 'production'" in local.err
    base = git(fleet, "rev-parse", "HEAD").strip()
    git(fleet, "checkout", "-qb", "forward")
    model = fleet / "manifests/mlp/model.yaml"
    model.write_text(model.read_text().replace("production: 1.1.0", "production: 2.0.0"))
    git(fleet, "commit", "-qam", "production to 2.0.0 again")
    r = _pr(cli, fleet, base, tmp_path, monkeypatch)
    assert r.code == 1
    assert "version 2.0.0 must be promoted to 'canary' before 'production'" in r.err


def test_deprecate_marks_the_version_and_everything_refuses_it(fleet: Path, cli: Any) -> None:
    serving = cli("version", "deprecate", "mlp", "2.0.0", "--reason", "bad recall", cwd=fleet)
    assert serving.code == 1
    assert "still serves channel(s) canary, production" in serving.err
    assert "modelreg rollback mlp --channel canary (to 1.1.0)" in serving.err
    r = _ok(cli, fleet, "version", "deprecate", "mlp", "1.0.0", "--reason", "leaks  PII\n")
    assert "deprecated mlp 1.0.0 (leaks PII)" in r.out
    path = fleet / "manifests/mlp/versions/1.0.0.yaml"
    assert "deprecated:\n    reason: leaks PII\n" in path.read_text()
    assert "manifests/mlp/versions/1.0.0.yaml" in git(fleet, "diff", "--cached", "--name-only")
    assert _ok(cli, fleet, "validate").code == 0
    shown = json.loads(_ok(cli, fleet, "show", "mlp:1.0.0", "--json").out)
    assert shown["deprecated"] == "leaks PII"
    # promote and rollback refuse it, even forced
    for args in (("promote", "mlp", "1.0.0", "-c", "canary", "--force"),
                 ("rollback", "mlp", "-c", "canary", "--to", "1.0.0")):  # fmt: skip
        refused = cli(*args, cwd=fleet)
        assert refused.code == 1
        assert "version 1.0.0 of 'mlp' is deprecated (leaks PII)" in refused.err
    # rollback without --to skips it: canary served 1.1.0 after 1.0.0
    _ok(cli, fleet, "rollback", "mlp", "-c", "canary")
    assert _channels(fleet)["canary"] == "1.1.0"
    # a hand edit that points a channel at it fails validation at the channel
    model = fleet / "manifests/mlp/model.yaml"
    model.write_text(model.read_text().replace("canary: 1.1.0", "canary: 1.0.0"))
    bad = cli("validate", cwd=fleet)
    assert bad.code == 1
    assert "manifests/mlp/model.yaml:" in bad.err
    assert "points at version 1.0.0, which is deprecated (leaks PII)" in bad.err
    unknown = cli("version", "deprecate", "mlp", "1.0", "--reason", "x", cwd=fleet)
    assert unknown.code == 1
    assert "version '1.0' is not declared for model 'mlp'" in unknown.err
    empty = cli("version", "deprecate", "mlp", "1.1.0", "--reason", "  ", cwd=fleet)
    assert empty.code == 2  # a usage error
    assert "--reason must be one line" in empty.err


def test_ci_pr_refuses_promoting_a_deprecated_version(
    fleet: Path, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ok(cli, fleet, "version", "deprecate", "mlp", "1.0.0", "--reason", "leaks PII")
    git(fleet, "commit", "-qm", "deprecate 1.0.0")
    base = git(fleet, "rev-parse", "HEAD").strip()
    model = fleet / "manifests/mlp/model.yaml"
    model.write_text(model.read_text().replace("canary: 2.0.0", "canary: 1.0.0"))
    git(fleet, "commit", "-qam", "canary to a deprecated version")
    github_env(tmp_path, monkeypatch, base, "main")
    r = cli("ci", "pr", cwd=fleet)
    assert r.code == 1
    assert "which is deprecated (leaks PII)" in r.err


def test_publish_signs_the_deprecation_as_a_file_of_its_own(
    fleet: Path, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from signing.target_names import deprecation_path
    from signing.tuf_facts import TargetFacts
    from signing.tuf_repo import TrustRepo

    metadata = fleet / "trust/metadata"
    channels_before = TrustRepo.load(metadata).published("channels.json")
    _ok(cli, fleet, "version", "deprecate", "mlp", "1.0.0", "--reason", "leaks PII")
    git(fleet, "commit", "-qm", "deprecate 1.0.0")
    _release(cli, fleet)
    trust = TrustRepo.load(metadata)
    info = trust.published(deprecation_path("mlp", "1.0.0"))
    assert info is not None
    facts = TargetFacts.from_custom(info.custom)
    assert (facts.kind, facts.model, facts.version) == ("deprecation", "mlp", "1.0.0")
    (stored,) = (fleet / ".modelreg/remote/modelreg").rglob("*1.0.0.txt")
    assert stored.read_bytes() == b"leaks PII"
    # the channels document a daemon older than deprecation reads is untouched
    assert trust.published("channels.json") == channels_before
    # the command itself refuses to reword it, and says nothing changes for the same words
    reword = cli("version", "deprecate", "mlp", "1.0.0", "--reason", "other", cwd=fleet)
    assert reword.code == 1
    assert "released as deprecated and its reason is signed" in reword.err
    same = _ok(cli, fleet, "version", "deprecate", "mlp", "1.0.0", "--reason", "leaks PII")
    assert "already deprecated: mlp 1.0.0" in same.out
    # a released deprecation is signed: it cannot be taken back, nor reworded
    base = git(fleet, "rev-parse", "HEAD").strip()
    path = fleet / "manifests/mlp/versions/1.0.0.yaml"
    for edit in ("    reason: no PII after all\n", ""):
        git(fleet, "checkout", "-q", "-B", "undo", base)
        path.write_text(
            path.read_text()
            .replace("    reason: leaks PII\n", edit)
            .replace("  deprecated:\n", "  deprecated:\n" if edit else "")
        )
        git(fleet, "commit", "-qam", "undo")
        r = _pr(cli, fleet, base, tmp_path, monkeypatch)
        assert r.code == 1
        assert "version 1.0.0 is released as deprecated (devices refuse it); the deprecation " in (
            r.err
        )
        refused = cli("publish", cwd=fleet)
        assert refused.code == 1
        assert "the deprecation cannot be" in refused.err


def test_taking_an_unreleased_deprecation_away_needs_approvals_and_is_said(
    fleet: Path, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ok(cli, fleet, "version", "deprecate", "mlp", "1.0.0", "--reason", "leaks PII")
    git(fleet, "commit", "-qm", "deprecate 1.0.0")  # merged, not released yet
    base = git(fleet, "rev-parse", "HEAD").strip()
    git(fleet, "checkout", "-qb", "undo")
    path = fleet / "manifests/mlp/versions/1.0.0.yaml"
    path.write_text(path.read_text().replace("  deprecated:\n    reason: leaks PII\n", ""))
    git(fleet, "commit", "-qam", "1.0.0 is fine")
    event = tmp_path / "event.json"
    github_env(tmp_path, monkeypatch, base, "main")
    head = git(fleet, "rev-parse", "HEAD").strip()
    event.write_text(json.dumps({"pull_request": {"number": 7, "base": {"sha": base, "ref": "main"},
                                                  "head": {"sha": head}}}))  # fmt: skip
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    r = cli("ci", "pr", cwd=fleet)
    assert r.code == 1
    assert "cannot count the approvals this change needs" in r.err
    comment = (fleet / ".modelreg/ci/pr-comment.md").read_text()
    assert "deprecation: `mlp 1.0.0 no longer deprecated (was: leaks PII)`" in comment


def test_deprecating_what_a_partial_rollout_leaves_running_is_refused(
    fleet: Path, cli: Any
) -> None:
    _ok(cli, fleet, "rollback", "mlp", "-c", "canary", "--to", "1.1.0")
    git(fleet, "commit", "-qm", "canary to 1.1.0")
    _release(cli, fleet)
    _ok(cli, fleet, "promote", "mlp", "2.0.0", "-c", "canary", "--percent", "10")
    git(fleet, "commit", "-qm", "canary 2.0.0 at 10%")
    r = cli("version", "deprecate", "mlp", "1.1.0", "--reason", "x", cwd=fleet)
    assert r.code == 1
    assert "rolls 2.0.0 out to 10% of its devices; the others still run 1.1.0" in r.err


def test_ci_pr_refuses_deleting_a_released_version_or_editing_its_parent(
    fleet: Path, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = git(fleet, "rev-parse", "HEAD").strip()  # every version released
    github_env(tmp_path, monkeypatch, base, "main")
    git(fleet, "checkout", "-qb", "cleanup")
    git(fleet, "rm", "-q", "manifests/mlp/versions/1.0.0.yaml", "models/mlp/1.0.0.onnx.dvc")
    # 1.1.0's parent was 1.0.0; a released version's parent is signed with it
    path = fleet / "manifests/mlp/versions/1.1.0.yaml"
    path.write_text(path.read_text().replace("  parent: 1.0.0\n", ""))
    git(fleet, "commit", "-qam", "drop 1.0.0")
    r = cli("ci", "pr", cwd=fleet)
    assert r.code == 1
    lines = r.err.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("manifests/mlp/versions/1.0.0.yaml: version 1.0.0 of 'mlp' is "
                               "released; its manifest cannot be deleted (deprecate it: "
                               "modelreg version deprecate mlp 1.0.0 --reason TEXT)")  # fmt: skip
    assert lines[1].startswith("manifests/mlp/versions/1.1.0.yaml:")
    assert "spec.parent: version 1.1.0 is released and its parent is signed with it" in lines[1]


def test_an_undeprecation_in_a_moved_manifests_folder_is_seen_from_any_folder(
    fleet: Path, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pull request that moves the manifests folder and takes a deprecation away:
    the deprecation change is found by the file's path in the repository, not by how
    a message would name it, so running ``ci pr`` from a folder inside the repository
    does not hide it."""
    _ok(cli, fleet, "version", "deprecate", "mlp", "1.0.0", "--reason", "leaks PII")
    git(fleet, "commit", "-qm", "deprecate 1.0.0")
    base = git(fleet, "rev-parse", "HEAD").strip()
    git(fleet, "checkout", "-qb", "move-and-undo")
    git(fleet, "mv", "manifests", "defs")
    config = fleet / "modelreg.yaml"
    config.write_text(config.read_text().replace("manifests: manifests", "manifests: defs"))
    path = fleet / "defs/mlp/versions/1.0.0.yaml"
    path.write_text(path.read_text().replace("  deprecated:\n    reason: leaks PII\n", ""))
    git(fleet, "add", "-A")
    git(fleet, "commit", "-qm", "move, and 1.0.0 is fine")
    github_env(tmp_path, monkeypatch, base, "main")
    head = git(fleet, "rev-parse", "HEAD").strip()
    (tmp_path / "event.json").write_text(json.dumps({"pull_request": {
        "number": 7, "base": {"sha": base, "ref": "main"}, "head": {"sha": head}}}))  # fmt: skip
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    r = cli("ci", "pr", cwd=fleet / "defs" / "mlp")
    assert r.code == 1
    assert "cannot count the approvals this change needs" in r.err
    comment = (fleet / ".modelreg/ci/pr-comment.md").read_text()
    assert "deprecation: `mlp 1.0.0 no longer deprecated (was: leaks PII)`" in comment


def test_history_shows_deprecations_and_holds(fleet: Path, cli: Any) -> None:
    """``history`` lists a deprecation when it is committed and when its signed
    release lands, and a rollout hold when it is set and lifted (issue 27, bug 4:
    the three were left out)."""
    _ok(cli, fleet, "version", "deprecate", "mlp", "1.0.0", "--reason", "leaks PII")
    git(fleet, "commit", "-qm", "deprecate 1.0.0")
    _release(cli, fleet)
    model = fleet / "manifests/mlp/model.yaml"
    plain = model.read_text()
    held = "canary:\n      version: 2.0.0\n      rollout: {percent: 50, hold: p99 up 3x}\n"
    model.write_text(plain.replace("canary: 2.0.0\n", held))
    assert "hold: p99 up 3x" in model.read_text()
    git(fleet, "commit", "-qam", "hold canary")
    model.write_text(plain)
    git(fleet, "commit", "-qam", "resume canary")
    events = json.loads(_ok(cli, fleet, "history", "mlp", "--json").out)["events"]
    summaries = [(e["kind"], e["summary"]) for e in events]
    assert summaries[:5] == [
        ("rollout", "channel canary: 2.0.0 (50%) -> 2.0.0"),
        ("hold lifted", "channel canary: rollout resumed: p99 up 3x"),
        ("rollout", "channel canary: 2.0.0 -> 2.0.0 (50%)"),
        ("hold", "channel canary: rollout held: p99 up 3x"),
        ("deprecation released", "version 1.0.0 deprecation released"),
    ]
    assert ("deprecated", "version 1.0.0 deprecated: leaks PII") in summaries
    text = _ok(cli, fleet, "history", "mlp", "-c", "canary").out
    assert "rollout held: p99 up 3x" in text


def test_rollback_keeps_the_channels_waves_and_says_what_becomes_of_the_percent(
    fleet: Path, cli: Any
) -> None:
    """A 10% wave of canary rolled back: the channel goes to all its devices at its last
    wave, its waves and stop conditions stay for the next promotion (issue 27, bug 5:
    they were deleted), and the command says so (point 15)."""
    model = fleet / "manifests/mlp/model.yaml"
    staged = (
        "canary:\n      version: 2.0.0\n      rollout:\n        percent: 10\n"
        "        waves: [{percent: 10, soak: 1h}, {percent: 100}]\n"
        "        stop: {failure_share: 0.05, min_reports: 2}\n"
        "        hold: p99 up 3x\n"
    )
    model.write_text(model.read_text().replace("canary: 2.0.0\n", staged))
    git(fleet, "commit", "-qam", "canary in waves")
    r = _ok(cli, fleet, "rollback", "mlp", "-c", "canary")
    assert "2.0.0 -> 1.1.0 (rollout 10% -> all devices; its waves and stop conditions stay " in (
        r.out
    )
    canary = _channels(fleet)["canary"]
    assert canary == {
        "version": "1.1.0",
        "rollout": {
            "percent": 100,
            "waves": [{"percent": 10, "soak": "1h"}, {"percent": 100}],
            "stop": {"failure_share": 0.05, "min_reports": 2},
        },
    }
    # a promotion with --percent starts the next rollout from those waves
    _ok(cli, fleet, "promote", "mlp", "2.0.0", "-c", "canary", "--percent", "10")
    assert _channels(fleet)["canary"]["rollout"]["stop"] == {
        "failure_share": 0.05,
        "min_reports": 2,
    }


def test_deprecating_the_oldest_served_version_suggests_a_command_that_works(
    fleet: Path, cli: Any
) -> None:
    """Canary serves 1.0.0, the first it ever served: there is nothing to roll back to,
    yet the refusal said ``modelreg rollback``, which then failed (issue 27, bug 6).
    Now it names the promotion that moves the channel, and that command works."""
    model = fleet / "manifests/mlp/model.yaml"
    model.write_text(model.read_text().replace("canary: 2.0.0", "canary: 1.0.0"))
    git(fleet, "commit", "-qam", "canary back to 1.0.0 by hand")
    refused = cli("version", "deprecate", "mlp", "1.0.0", "--reason", "leaks PII", cwd=fleet)
    assert refused.code == 1
    assert "(modelreg promote mlp 2.0.0 --channel canary)" in refused.err
    assert "rollback" not in refused.err
    _ok(cli, fleet, "promote", "mlp", "2.0.0", "--channel", "canary")
    _ok(cli, fleet, "version", "deprecate", "mlp", "1.0.0", "--reason", "leaks PII")


def test_the_pr_comment_shows_a_hold_and_its_lifting(
    fleet: Path, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27, point 10: ``fleet hold`` in a pull request is a line of its comment
    (and of the JSON report), as is ``fleet resume``."""
    _ok(cli, fleet, "promote", "mlp", "2.0.0", "-c", "canary", "--waves", "10:1h,100")
    git(fleet, "commit", "-qm", "canary in waves")
    base = git(fleet, "rev-parse", "HEAD").strip()
    git(fleet, "checkout", "-qb", "hold")
    _ok(cli, fleet, "fleet", "hold", "mlp", "-c", "canary", "--reason", "p99 up 3x")
    git(fleet, "commit", "-qm", "hold canary")
    r = _pr(cli, fleet, base, tmp_path, monkeypatch)
    comment = (fleet / ".modelreg/ci/pr-comment.md").read_text()
    assert "- hold: `mlp canary 2.0.0: p99 up 3x`" in comment, r.err
    report = json.loads((fleet / ".modelreg/ci/pr-report.json").read_text())
    assert report["holds"] == [
        {"model": "mlp", "channel": "canary", "version": "2.0.0", "hold": "p99 up 3x", "was": None}
    ]
    base = git(fleet, "rev-parse", "HEAD").strip()
    _ok(cli, fleet, "fleet", "resume", "mlp", "-c", "canary")
    git(fleet, "commit", "-qm", "resume canary")
    _pr(cli, fleet, base, tmp_path, monkeypatch)
    comment = (fleet / ".modelreg/ci/pr-comment.md").read_text()
    assert "- resume: `mlp canary 2.0.0 (was held: p99 up 3x)`" in comment
