"""``modelreg fleet advance`` on real git repositories and device reports in a folder
(issue 14, point 4): waves committed when the fleet allows, a tripped stop condition
held and committed, never a step back; and a wave advance released and signed."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.advance import advance
from fleet.waves import Progress
from registry.cohort import cohort_draw, in_cohort
from registry.errors import RepositoryError
from tests.conftest import git
from tests.fleet_reports import NOW as REPORTED
from tests.fleet_reports import model, report, shadow, stamp, write

pytestmark = pytest.mark.integration

MODEL_YAML = """\
apiVersion: modelreg/v1
kind: RegisteredModel
metadata:
  name: mlp
spec:
  channels:
    production: 1.0.0
    canary:
      version: 1.1.0
      rollout:
        percent: 10
        waves:
          - {percent: 10, soak: 1h}
          - {percent: 50, soak: 4h}
          - {percent: 100}
        stop: {failure_share: 0.2, min_reports: 2}
  promotion:
    order: [canary, production]
"""
CONFIG = "apiVersion: modelreg/v1\nkind: RegistryConfig\nmanifests: manifests\nartifacts: models\n"


def _version(v: str) -> str:
    return (
        "apiVersion: modelreg/v1\nkind: ModelVersion\n"
        f"metadata:\n  name: mlp\n  version: {v}\nspec:\n  artifact: models/mlp/{v}.onnx\n"
    )


def _pointer(v: str) -> str:
    return f"outs:\n- md5: {'0123456789abcdef' * 2}\n  size: 123\n  hash: md5\n  path: {v}.onnx\n"


def _commit(
    root: Path, message: str, *, at: datetime | None = None, authored: datetime | None = None
) -> str:
    env = dict(os.environ)
    if at is not None:
        stamp = at.isoformat()
        env |= {"GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}
    if authored is not None:
        env["GIT_AUTHOR_DATE"] = authored.isoformat()
    git(root, "add", "-A")
    subprocess.run(["git", "commit", "-qm", message], cwd=root, env=env, check=True)
    return git(root, "rev-parse", "HEAD").strip()


_releases = iter(range(2, 1000))


def release(root: Path, at: datetime, *, authored: datetime | None = None) -> str:
    """What `ci release` commits on the promotion branch: new signed targets metadata."""
    folder = root / "trust/metadata"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{next(_releases)}.targets.json").write_text("{}")
    return _commit(root, "modelreg release [skip ci]", at=at, authored=authored)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "fleet"
    (root / "manifests/mlp/versions").mkdir(parents=True)
    (root / "models/mlp").mkdir(parents=True)
    (root / "modelreg.yaml").write_text(CONFIG)
    (root / "manifests/mlp/model.yaml").write_text(MODEL_YAML)
    for v in ("1.0.0", "1.1.0"):
        (root / f"manifests/mlp/versions/{v}.yaml").write_text(_version(v))
        (root / f"models/mlp/{v}.onnx.dvc").write_text(_pointer(v))
    git(root, "init", "-q", "-b", "main")
    _commit(root, "mlp 1.1.0 to 10% of canary, in waves")
    return root


def cohort(percent: float, n: int, version: str = "1.1.0") -> list[str]:
    """``n`` device ids in the canary cohort of mlp ``version`` at ``percent``."""
    found = []
    for i in range(100_000):
        device = f"cam-{i:05d}"
        if in_cohort(device, "mlp", version, percent):
            found.append(device)
            if len(found) == n:
                return found
    raise AssertionError("not enough devices")  # pragma: no cover


def reports(folder: Path, on: list[str], failed: list[str] | None = None) -> str:
    """Reports of canary devices: ``on`` run 1.1.0, ``failed`` were rejected by the gate."""
    rejected = {"result": "rejected", "version": "1.1.0", "method": "delta", "bytes_fetched": 10,
                "reason": "health gate: p99 3.1x the previous version", "finished": stamp(REPORTED),
                "stages_ms": {}}  # fmt: skip
    docs = [report(d, {"mlp": model("1.1.0", "canary")}) for d in on]
    docs += [report(d, {"mlp": model("1.0.0", "canary", update=rejected)}) for d in failed or []]
    shutil.rmtree(folder, ignore_errors=True)
    write(folder, *docs)
    return str(folder)


def percent_of(root: Path) -> Any:
    return yaml.safe_load((root / "manifests/mlp/model.yaml").read_text())["spec"]["channels"][
        "canary"
    ]["rollout"]


def head(root: Path) -> str:
    return git(root, "rev-parse", "HEAD").strip()


NOW = datetime.now(UTC).replace(microsecond=0)
H = timedelta(hours=1)


def test_waves_advance_one_at_a_time_as_the_fleet_allows(
    repo: Path, tmp_path: Path, cli: Any
) -> None:
    folder = tmp_path / "reports"
    ten = cohort(10, 3)
    url = reports(folder, on=ten)
    # not released yet: nothing to soak from
    r = cli("fleet", "advance", "--reports", url, cwd=repo)
    assert (r.code, r.out.strip()) == (0, (
        "mlp canary 1.1.0 at 10% (wave 1 of 3): wait: the 10% wave of 1.1.0 is not released yet"
    )), r.err  # fmt: skip
    # released two hours ago; judged half an hour after the release, it soaks
    before = release(repo, NOW - 2 * H)
    (step,) = advance(repo, lambda *_: Progress(3, 3, 0), now=NOW - 1.5 * H)
    assert (step.action, step.commit) == ("wait", None)
    assert step.decision.until == NOW - H  # type: ignore[union-attr]
    # a later release (of anything) does not restart the wave
    release(repo, NOW - H / 2)
    # judged now, 3 devices on 1.1.0: the next wave is committed
    r = cli("fleet", "advance", "--reports", url, cwd=repo)
    assert r.code == 0, r.err
    assert r.out.startswith(
        "mlp canary 1.1.0 at 10% (wave 1 of 3): advance to 50%: the 10% wave soaked 2h"
    )
    assert git(repo, "rev-parse", "HEAD~2").strip() == before
    assert git(repo, "log", "-1", "--format=%s").strip() == (
        "modelreg: mlp canary 1.1.0 rollout 10% -> 50% (wave 2 of 3)"
    )
    body = git(repo, "log", "-1", "--format=%b")
    assert "3 of 3 devices run 1.1.0, 0 failed" in body
    assert f"wave release: {before[:12]}" in body
    assert git(repo, "show", "--name-only", "--format=", "HEAD").split() == [
        "manifests/mlp/model.yaml"
    ]
    assert percent_of(repo)["percent"] == 50
    assert [w["percent"] for w in percent_of(repo)["waves"]] == [10, 50, 100]
    assert git(repo, "status", "--porcelain") == ""
    # the new wave is not released: the next run waits, whatever the reports say
    tip = head(repo)
    url = reports(folder, on=cohort(50, 12))
    r = cli("fleet", "advance", "--reports", url, cwd=repo)
    assert r.code == 0
    assert "wait: the 50% wave of 1.1.0 is not released yet" in r.out
    assert head(repo) == tip
    # released, soaked 4 h: the last wave; then done
    release(repo, NOW - 5 * H)
    assert cli("fleet", "advance", "--reports", url, cwd=repo).code == 0
    assert percent_of(repo)["percent"] == 100
    release(repo, NOW - H)
    r = cli("fleet", "advance", "--reports", url, cwd=repo)
    assert (r.code, r.out.strip()) == (
        0, "mlp canary 1.1.0 at 100% (wave 3 of 3): done: 1.1.0 is in its last wave (100%)"
    )  # fmt: skip
    # the whole rollout is in the history of model.yaml
    history = cli("history", "mlp", "-c", "canary", "--json", cwd=repo)
    summaries = [e["summary"] for e in json.loads(history.out)["events"]]
    assert summaries[:2] == [
        "channel canary: 1.1.0 (50%) -> 1.1.0 (100%)",
        "channel canary: 1.1.0 (10%) -> 1.1.0 (50%)",
    ]


def test_a_backdated_author_date_does_not_shorten_the_soak(repo: Path) -> None:
    # A commit that reached the branch an hour ago, authored "a week ago" (anyone may set
    # an author date; a merge, rebase or squash sets the committer date): the wave
    # started when the commit reached the branch.
    release(repo, NOW - H / 2, authored=NOW - 7 * 24 * H)
    (step,) = advance(repo, lambda *_: Progress(3, 3, 0), now=NOW)
    assert (step.action, step.commit) == ("wait", None)
    assert step.decision.until == NOW + H / 2  # type: ignore[union-attr]


def test_a_tripped_stop_condition_holds_the_rollout_and_says_why(
    repo: Path, tmp_path: Path, cli: Any
) -> None:
    release(repo, NOW - 2 * H)
    devices = cohort(10, 4)
    url = reports(tmp_path / "reports", on=devices[:3], failed=devices[3:])  # 25% > 20%
    r = cli("fleet", "advance", "--reports", url, cwd=repo)
    assert r.code == 1
    assert r.out == ""
    assert r.err.splitlines() == [
        (
            "modelreg: mlp canary 1.1.0 at 10% (wave 1 of 3): stop, rollout held: 1 of 4 "
            "devices of the 10% wave failed 1.1.0 (25%, over the stop threshold of 20%) "
            f"[{head(repo)[:12]}]"
        ),
        f"  {devices[3]}: health gate: p99 3.1x the previous version",
    ]
    assert git(repo, "log", "-1", "--format=%s").strip() == (
        "modelreg: hold mlp canary 1.1.0 rollout at 10%"
    )
    assert "modelreg rollback mlp --channel canary" in git(repo, "log", "-1", "--format=%b")
    rollout = percent_of(repo)
    assert rollout["percent"] == 10  # held where it was: never a step back
    assert rollout["hold"] == (
        "1 of 4 devices of the 10% wave failed 1.1.0 (25%, over the stop threshold of 20%)"
    )
    # held: nothing more is committed, even when the reports look better again
    tip = head(repo)
    url = reports(tmp_path / "reports", on=devices)
    r = cli("fleet", "advance", "--reports", url, "--json", cwd=repo)
    assert r.code == 0
    (step,) = json.loads(r.out)["channels"]
    assert (step["action"], step["reason"]) == ("held", f"on hold: {rollout['hold']}")
    assert head(repo) == tip
    r = cli("fleet", "advance", "--reports", url, cwd=repo)
    assert (r.code, r.out.strip()) == (
        0, f"mlp canary 1.1.0 at 10% (wave 1 of 3): on hold: {rollout['hold']}"
    )  # fmt: skip
    # a person lifts the hold (a reviewed commit): the waves go on
    text = (repo / "manifests/mlp/model.yaml").read_text()
    (repo / "manifests/mlp/model.yaml").write_text(
        "\n".join(ln for ln in text.splitlines() if "hold:" not in ln) + "\n"
    )
    _commit(repo, "lift the hold")
    r = cli("fleet", "advance", "--reports", url, cwd=repo)
    assert r.code == 0, r.err
    assert percent_of(repo)["percent"] == 50


def test_dry_run_and_json_commit_nothing(repo: Path, tmp_path: Path, cli: Any) -> None:
    release(repo, NOW - 2 * H)
    devices = cohort(10, 3)
    url = reports(tmp_path / "reports", on=devices)
    tip = head(repo)
    r = cli("fleet", "advance", "--reports", url, "--dry-run", "--json", cwd=repo)
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert out["ok"] is True
    assert out["dry_run"] is True
    assert out["reports"] == {"source": url, "read": 3, "unreadable": 0, "skipped": 0,
                              "authenticated": False, "not_counted": []}  # fmt: skip
    (step,) = out["channels"]
    assert {k: step[k] for k in ("model", "channel", "version", "percent", "wave", "waves",
                                 "action", "to_percent", "commit")} == {
        "model": "mlp", "channel": "canary", "version": "1.1.0", "percent": 10, "wave": 1,
        "waves": [10, 50, 100], "action": "advance", "to_percent": 50, "commit": None,
    }  # fmt: skip
    assert step["progress"] == {"cohort": 3, "on_target": 3, "failed": 0, "failure_share": 0.0,
                                "behaviour": None, "failed_devices": [], "stale": 3}  # fmt: skip
    assert step["started"]["commit"] == tip
    assert head(repo) == tip
    assert git(repo, "status", "--porcelain") == ""


def test_reports_url_from_the_environment(
    repo: Path, tmp_path: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    release(repo, NOW - 2 * H)
    monkeypatch.setenv("MODELREG_FLEET_REPORTS", reports(tmp_path / "r", on=cohort(10, 3)))
    r = cli("fleet", "advance", "--dry-run", cwd=repo)
    assert r.code == 0, r.err
    assert r.out.strip().endswith("(dry run: nothing committed)")
    assert "advance to 50%" in r.out


def test_what_fleet_advance_refuses(repo: Path, tmp_path: Path, cli: Any) -> None:
    release(repo, NOW - 2 * H)
    url = reports(tmp_path / "reports", on=cohort(10, 3))
    model_file = repo / "manifests/mlp/model.yaml"
    # uncommitted edits of model.yaml: it decides from HEAD and commits that file alone
    model_file.write_text(MODEL_YAML + "# a local edit\n")
    r = cli("fleet", "advance", "--reports", url, cwd=repo)
    assert r.code == 1
    assert "has changes that are not committed" in r.err
    assert cli("fleet", "advance", "--reports", url, "--dry-run", cwd=repo).code == 0
    git(repo, "checkout", "-q", "--", str(model_file))
    # another branch than the model's promotion branch: not there (dry run: fine)
    git(repo, "switch", "-qc", "feature")
    r = cli("fleet", "advance", "--reports", url, cwd=repo)
    assert r.code == 1
    assert r.err.strip() == (
        "manifests/mlp/model.yaml: rollout waves of 'mlp' are committed on 'main', "
        "its promotion branch, not on branch 'feature' (use --dry-run to see the decision)"
    )
    assert cli("fleet", "advance", "--reports", url, "--dry-run", cwd=repo).code == 0
    git(repo, "switch", "-q", "main")
    # a filter that matches nothing is a usage error; an unknown model a domain one
    r = cli("fleet", "advance", "--reports", url, "--channel", "production", cwd=repo)
    assert r.code == 2
    assert "no channel with rollout waves matches channel 'production'" in r.err
    r = cli("fleet", "advance", "--reports", url, "--model", "cnn", cwd=repo)
    assert r.code == 1
    assert "model 'cnn' is not declared" in r.err
    # reports that cannot be read at all
    r = cli("fleet", "advance", "--reports", str(tmp_path / "none"), cwd=repo)
    assert r.code == 1
    # an invalid manifest: nothing is decided
    model_file.write_text(MODEL_YAML.replace("percent: 10\n", "percent: 20\n"))
    _commit(repo, "typo")
    r = cli("fleet", "advance", "--reports", url, cwd=repo)
    assert r.code == 1
    assert "rollout.percent 20 is not one of the waves' percents" in r.err


def test_channels_of_one_model_advance_in_their_own_commits(repo: Path) -> None:
    text = MODEL_YAML.replace(
        "    production: 1.0.0\n",
        "    production:\n      version: 1.0.0\n      rollout:\n        percent: 50\n"
        "        waves: [{percent: 50, soak: 1h}, {percent: 100}]\n",
    )
    (repo / "manifests/mlp/model.yaml").write_text(text)
    _commit(repo, "production in waves too")
    release(repo, NOW - 2 * H)
    asked: list[tuple[str, str, str, float]] = []

    def progress_of(model: str, channel: str, version: str, percent: float) -> Progress:
        asked.append((model, channel, version, percent))
        return Progress(10, 10, 0)

    steps = advance(repo, progress_of, now=NOW)
    assert asked == [("mlp", "canary", "1.1.0", 10.0), ("mlp", "production", "1.0.0", 50.0)]
    assert [(s.target.channel, s.action) for s in steps] == [
        ("canary", "advance"), ("production", "advance")
    ]  # fmt: skip
    subjects = git(repo, "log", "-2", "--format=%s").splitlines()
    assert subjects == [
        "modelreg: mlp production 1.0.0 rollout 50% -> 100% (wave 2 of 2)",
        "modelreg: mlp canary 1.1.0 rollout 10% -> 50% (wave 2 of 3)",
    ]
    assert steps[1].commit == head(repo)
    with pytest.raises(RepositoryError, match=r"modelreg\.yaml"):
        advance(repo.parent, progress_of, now=NOW)


def test_advance_joins_an_existing_fleet_group() -> None:
    """`fleet status` and `fleet advance` live in one group, whichever module made it."""
    import click

    from modelreg.cli.fleet_advance_cmd import advance as command
    from modelreg.cli.fleet_advance_cmd import attach

    root = click.Group("modelreg")
    status = click.Group("fleet", commands={"status": click.Command("status")})
    root.add_command(status)
    attach(root)
    assert root.commands["fleet"] is status
    assert status.commands == {"status": status.commands["status"], "advance": command}
    bare = click.Group("modelreg")
    attach(bare)
    assert isinstance(bare.commands["fleet"], click.Group)
    assert list(bare.commands["fleet"].commands) == ["advance"]


@pytest.fixture
def fleet(_released_template: Path, tmp_path: Path) -> Path:
    """A copy of the released fleet (mlp 1.0.0 released to canary by ci release)."""
    root = tmp_path / "fleet"
    shutil.copytree(_released_template, root, symlinks=True)
    return root


def test_a_wave_advance_is_released_and_signed_like_any_promotion(
    fleet: Path, tmp_path: Path, cli: Any
) -> None:
    """On the promotion branch the release signs the new percent (devices read only that);
    the same change from another branch would not be released."""
    from edge_sync.sync.trust import DeviceTrust

    root = fleet
    model_file = root / "manifests/mlp/model.yaml"
    model_file.write_text(
        model_file.read_text().replace(
            "    canary: 1.0.0\n",
            "    canary: 1.0.0\n    production:\n      version: 1.0.0\n      rollout:\n"
            "        percent: 10\n        waves: [{percent: 10, soak: 1h}, {percent: 100}]\n",
        )
    )
    _commit(root, "mlp 1.0.0 to production, in waves")

    def released() -> str:
        r = cli("publish", "--no-push", "--json", cwd=root)
        assert r.code == 0, r.err
        return _commit(root, "modelreg release [skip ci]", at=NOW - 2 * H)

    def production() -> tuple[str, float | None]:
        trust.refresh()
        entry = trust.channels().models["mlp"]["production"]
        return entry.version, entry.percent

    released()
    state = tmp_path / "device"
    DeviceTrust.provision(state, (root / "trust/metadata/1.root.json").read_bytes())
    trust = DeviceTrust(state, root, root / ".modelreg/remote/modelreg")
    assert production() == ("1.0.0", 10)
    (step,) = advance(root, lambda *_: Progress(5, 5, 0))
    assert (step.action, step.decision.to_percent) == ("advance", 100)  # type: ignore[union-attr]
    assert git(root, "log", "-1", "--format=%s").strip() == (
        "modelreg: mlp production 1.0.0 rollout 10% -> 100% (wave 2 of 2)"
    )
    # the release job on another branch refuses the channel change; on main it signs it
    git(root, "switch", "-qc", "feature")
    r = cli("publish", "--no-push", cwd=root)
    assert r.code == 1
    assert "channel changes of 'mlp' are released from branch 'main' only" in r.err
    git(root, "switch", "-q", "main")
    released()
    assert production() == ("1.0.0", 100)
    (step,) = advance(root, lambda *_: Progress(5, 5, 0))
    assert step.action == "done"


def outside(percent: float, n: int, version: str = "1.1.0") -> list[str]:
    """``n`` device ids outside the canary cohort of mlp ``version`` at ``percent``."""
    return [
        f"cam-{i:05d}"
        for i in range(1000)
        if not in_cohort(f"cam-{i:05d}", "mlp", version, percent)
    ][:n]


def test_a_small_fleets_empty_wave_says_how_to_go_on(repo: Path, tmp_path: Path, cli: Any) -> None:
    """Three devices, none in the 10% wave (issue 27, bug 3): the wave waited for "0 of
    0 devices" forever.  Now the wait says the wave holds none of the 3 and the two
    ways on: a wider wave (the smallest that holds one) or ``min_reports: 0``, which
    then advances it once soaked."""
    three = outside(10, 3)
    lowest = min(cohort_draw(d, "mlp", "1.1.0") for d in three)
    url = reports(tmp_path / "reports", on=three)
    release(repo, NOW - 2 * H)
    r = cli("fleet", "advance", "--reports", url, cwd=repo)
    assert r.code == 0, r.err
    assert "wait: the 10% wave holds none of the 3 reporting devices of the channel" in r.out
    assert f"a wave of {math.floor(lowest) + 1}% or more holds one" in r.out
    assert "rollout.stop.min_reports: 0" in r.out
    model_yaml = repo / "manifests/mlp/model.yaml"
    model_yaml.write_text(model_yaml.read_text().replace("min_reports: 2", "min_reports: 0"))
    _commit(repo, "empty waves may advance", at=NOW - 2 * H)
    r = cli("fleet", "advance", "--reports", url, cwd=repo)
    assert r.code == 0, r.err
    assert "advance to 50%" in r.out
    assert percent_of(repo)["percent"] == 50


def test_outside_a_repository_it_says_to_give_repo(tmp_path: Path, cli: Any) -> None:
    """Issue 27, point 15: run where the reports are, not the repository, it says how."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = cli("fleet", "advance", "--reports", str(elsewhere), cwd=elsewhere)
    assert r.code == 1
    assert "not inside a modelreg repository" in r.err
    assert "run it there, or give --repo PATH" in r.err


BEHAVIOUR_STOP = (
    "        stop: {failure_share: 0.2, min_reports: 2, min_agreement: 0.95, min_compared: 1000}\n"
    "      shadow: {sample: 0.05}\n"
)


def compared(folder: Path, devices: list[str], each: int, agree: int) -> str:
    """Reports of canary devices on 1.1.0 that each compared ``each`` requests with 1.0.0,
    ``agree`` of them keeping the top class (report format 4)."""
    docs = []
    for device in devices:
        entry = model("1.1.0", "canary")
        entry["shadow"] = shadow(compared=each, agree=agree)
        docs.append(report(device, {"mlp": entry}, format=4))
    shutil.rmtree(folder, ignore_errors=True)
    write(folder, *docs)
    return str(folder)


@pytest.fixture
def judged(repo: Path) -> Path:
    """The canary channel declares shadow and stops under 95 % agreement (issue 29)."""
    model_file = repo / "manifests/mlp/model.yaml"
    text = model_file.read_text()
    model_file.write_text(
        text.replace("        stop: {failure_share: 0.2, min_reports: 2}\n", BEHAVIOUR_STOP)
    )
    _commit(repo, "judge the canary's answers")
    release(repo, NOW - 2 * H)
    return repo


def test_answers_that_disagree_hold_the_rollout_with_their_figures(
    judged: Path, tmp_path: Path, cli: Any
) -> None:
    """Issue 29: the wave's devices' shadow sums, added up, trip min_agreement: the hold
    is committed with the figures; too few compared requests wait for more."""
    repo, devices, folder = judged, cohort(10, 3), tmp_path / "reports"
    # 900 compared (under min_compared): soaked, but nothing judged yet
    url = compared(folder, devices, 300, 240)
    tip = head(repo)
    r = cli("fleet", "advance", "--reports", url, cwd=repo)
    assert (r.code, r.out.strip()) == (0, (
        "mlp canary 1.1.0 at 10% (wave 1 of 3): wait: the devices of the 10% wave compared "
        "900 requests of 1.1.0 with 1.0.0 (3 devices reported comparisons); 1,000 needed to "
        "judge its behaviour (rollout.stop.min_compared; devices compare only when the "
        "channel declares shadow)"
    )), r.err  # fmt: skip
    assert head(repo) == tip
    # 1,200 compared, 80 % kept the top class: held, committed, exit 1
    url = compared(folder, devices, 400, 320)
    r = cli("fleet", "advance", "--reports", url, cwd=repo)
    why = (
        "the 10% wave's devices compared 1.1.0 with 1.0.0: agreement 80% over 1,200 compared "
        "requests on 3 devices, drift 1%, p99 1.00x; agreement 80% under the stop threshold "
        "of 95%"
    )
    assert r.code == 1
    held = f"stop, rollout held: {why} [{head(repo)[:12]}]"
    assert r.err.splitlines() == [f"modelreg: mlp canary 1.1.0 at 10% (wave 1 of 3): {held}"]
    assert (percent_of(repo)["percent"], percent_of(repo)["hold"]) == (10, why)
    assert git(repo, "log", "-1", "--format=%s").strip() == (
        "modelreg: hold mlp canary 1.1.0 rollout at 10%"
    )
    assert f"{why}. Remove rollout.hold to go on" in git(repo, "log", "-1", "--format=%b")
    # held: the JSON shows the figures it was held on, and nothing more is committed
    tip = head(repo)
    r = cli("fleet", "advance", "--reports", url, "--json", cwd=repo)
    assert r.code == 0
    (step,) = json.loads(r.out)["channels"]
    assert (step["action"], step["reason"]) == ("held", f"on hold: {why}")
    figures = step["progress"]["behaviour"]
    assert (figures["compared"], figures["devices"], figures["against"]) == (1200, 3, "1.0.0")
    assert figures["agreement"] == pytest.approx(0.8)
    assert head(repo) == tip


def test_answers_that_agree_advance_the_wave_with_their_figures(
    judged: Path, tmp_path: Path, cli: Any
) -> None:
    url = compared(tmp_path / "reports", cohort(10, 3), 400, 399)
    r = cli("fleet", "advance", "--reports", url, cwd=judged)
    assert r.code == 0, r.err
    assert "advance to 50%" in r.out
    assert percent_of(judged)["percent"] == 50
    assert (
        "3 of 3 devices run 1.1.0, 0 failed; compared with 1.0.0: agreement 99.8% over 1,200 "
        "compared requests on 3 devices, drift 1%, p99 1.00x."
    ) in git(judged, "log", "-1", "--format=%b")
