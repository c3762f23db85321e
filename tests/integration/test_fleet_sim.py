"""A small fleet through the fleet benchmark's own simulation (``benchmarks.fleet``, issue
14): 24 devices, each the daemon's real loop with its own id and state dir, follow one
``git daemon`` and then the metadata mirrored to one HTTP artifact server, through a
canary release at 10 % and the release to all.  About a minute.

Then the behaviour scenario (``benchmarks.fleet_behaviour``, issue 29) with 300
simulated devices reporting their shadow comparisons: ``fleet advance`` holds a version
whose answers disagree at its first wave and takes a faithful one to 100 %.  About 30 s.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.fleet import Size, simulate_fleet
from benchmarks.fleet_behaviour import goals

# One worker runs them all (`--dist loadgroup`): the module's simulation, a minute of
# both cores, runs once rather than once in each worker that draws one of its tests.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("fleet-sim")]

SIZE = Size(devices=24, poll_s=3.0, workers=1)
SHARE = 0.10


@contextlib.contextmanager
def _own_home(base: Path) -> Iterator[None]:
    """The module's own HOME and git configuration: not the autouse one."""
    home = base / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(
        "[user]\n\tname = fleet\n\temail = fleet@example.invalid\n[init]\n\tdefaultBranch = main\n"
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
        mp.setenv("GIT_CONFIG_NOSYSTEM", "1")
        yield


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Both modes at jitter 0.2, simulated once for the module."""
    base = tmp_path_factory.mktemp("fleet")
    with _own_home(base):
        yield simulate_fleet(SIZE, base / "work", modes=["git", "artifacts"], jitters=[0.2])


def _binomial_range(n: int, p: float, outside: float = 0.001) -> tuple[int, int]:
    """The counts k with P(X < k) and P(X > k) both at least ``outside`` / 2."""
    pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    below = [sum(pmf[:k]) for k in range(n + 1)]
    lo = max(k for k in range(n + 1) if below[k] <= outside / 2)
    hi = min(k for k in range(n + 1) if 1 - below[k] - pmf[k] <= outside / 2)
    return lo, hi


def test_both_modes_ran(runs: dict[str, dict[str, Any]]) -> None:
    assert set(runs) == {"git, jitter 0.2", "gitless, jitter 0.2"}
    for run in runs.values():
        assert run["failed_syncs"] == 0, run["failure_reasons"]
        assert run["problems"] == []


def test_the_canary_reaches_its_cohort_and_no_other(runs: dict[str, dict[str, Any]]) -> None:
    lo, hi = _binomial_range(SIZE.devices, SHARE)
    for run in runs.values():
        canary = run["canary"]
        assert canary["outside_cohort"] == []
        assert canary["cohort_missing"] == []
        assert lo <= canary["devices"] <= hi, (canary, lo, hi)


def test_every_device_converges_after_the_production_release(
    runs: dict[str, dict[str, Any]],
) -> None:
    for run in runs.values():
        convergence = run["convergence"]
        assert convergence["all_on_new"]
        # the daemon waits at most poll * (1 + jitter) between polls; the rest is the
        # update itself (and a shared CI machine)
        assert convergence["poll_intervals"] <= 2.5, convergence


def test_a_gitless_idle_poll_is_one_small_conditional_request(
    runs: dict[str, dict[str, Any]],
) -> None:
    idle = runs["gitless, jitter 0.2"]["costs"]["idle_poll"]
    # one request per poll, answered 304 (a poll cut by a window's edge may count twice)
    assert 0.95 <= idle["http_requests"] <= 1.05, idle
    assert 0.95 <= idle["http_304"] <= 1.05, idle
    assert idle["bytes"] <= 1000, idle
    assert idle["git_requests"] == 0


def test_a_git_idle_poll_is_one_round_trip_to_the_git_host(
    runs: dict[str, dict[str, Any]],
) -> None:
    idle = runs["git, jitter 0.2"]["costs"]["idle_poll"]
    # One ls-remote; a poll that met git daemon's full accept backlog (5) connects again,
    # so a loaded machine may count a little over one.  A fetch on an idle poll would
    # make it two or more.
    assert 0.95 <= idle["git_requests"] <= 1.5, idle
    assert idle["http_requests"] == 0


def test_the_servers_counted_what_the_devices_did(runs: dict[str, dict[str, Any]]) -> None:
    for run in runs.values():
        counts, downloads = run["costs"]["counts"], run["downloads"]
        # one download (the delta from 1.0.0) per install, in the window it happened
        assert downloads["canary"] == counts["canary_installs"] == run["canary"]["devices"]
        assert downloads["production"] == counts["production_installs"]
        assert counts["canary_installs"] + counts["production_installs"] == SIZE.devices
        # and the template device's full download of 1.0.0 before the fleet started
        assert downloads["total"] == SIZE.devices + 1
        assert counts["idle_polls"] >= SIZE.devices  # each polled at least once when idle
        update = run["costs"]["update"]
        assert update["requests"] > run["costs"]["idle_poll"]["requests"]


# --- the behaviour scenario (issue 29) ---------------------------------------------------

BEHAVIOUR_DEVICES = 300
FIGURES = re.compile(
    r"^the 10% wave's devices compared 1\.1\.0 with 1\.0\.0: agreement (?P<agreement>[\d.]+)% "
    r"over (?P<compared>[\d,]+) compared requests on (?P<devices>\d+) devices, drift [\d.]+%, "
    r"p99 [\d.]+x; agreement (?P=agreement)% under the stop threshold of 95%"
)


@pytest.fixture(scope="module")
def behaviour(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """The disagreeing and the faithful version, rolled out once for the module."""
    from benchmarks._fleet_behaviour import simulate

    base = tmp_path_factory.mktemp("behaviour")
    with _own_home(base):
        yield simulate(BEHAVIOUR_DEVICES, base / "work")


def test_a_version_whose_answers_disagree_is_held_at_its_first_wave(
    behaviour: dict[str, dict[str, Any]],
) -> None:
    bad = behaviour["disagreeing"]
    assert (bad["final"], bad["percent"], bad["waves_reached"]) == ("stop", 10, [10.0])
    found = FIGURES.match(bad["hold"])
    assert found is not None, bad["hold"]
    # about one row in five changed its top class, summed over the wave's devices
    assert 75 <= float(found["agreement"]) <= 85
    assert int(found["compared"].replace(",", "")) >= bad["params"]["min_compared"]
    stop = bad["decisions"][-1]
    assert stop["action"] == "stop"
    assert int(found["devices"]) == stop["behaviour"]["devices"] <= stop["cohort"]
    assert stop["at_h"] < 1  # tripped during the first wave's hour of soak
    # the hold is committed alone, with the figures in the manifest and the message
    commit = bad["hold_commit"]
    assert commit["subject"] == "modelreg: hold mlp production 1.1.0 rollout at 10%"
    assert commit["body"].startswith(f"{bad['hold']}. Remove rollout.hold to go on")
    assert commit["files"] == ["manifests/mlp/model.yaml"]
    # nobody past the first wave runs it; fleet status shows the wave's figures
    assert bad["devices_on_new"] == stop["on_target"] == bad["status"]["cohort"]
    assert bad["status"]["behaviour"] in bad["hold"]


def test_a_faithful_version_reaches_every_device(behaviour: dict[str, dict[str, Any]]) -> None:
    good = behaviour["faithful"]
    assert (good["final"], good["percent"], good["hold"]) == ("done", 100, None)
    assert good["waves_reached"] == [10.0, 50.0, 100.0]
    assert good["devices_on_new"] == good["status"]["cohort"] == BEHAVIOUR_DEVICES
    advances = [d for d in good["decisions"] if d["action"] == "advance"]
    assert [d["percent"] for d in advances] == [10.0, 50.0]
    for step in advances:
        figures = step["behaviour"]
        assert figures["compared"] >= good["params"]["min_compared"]
        assert figures["agreement"] > 0.995
        assert f"compared with 1.0.0: agreement {figures['agreement'] * 100:.3g}%" in step["reason"]
    assert {d["action"] for d in good["decisions"]} == {"wait", "advance", "done"}


def test_the_behaviour_benchmarks_goals_pass(behaviour: dict[str, dict[str, Any]]) -> None:
    found = goals(behaviour, indicative=True)
    assert len(found) == 4
    assert [g["name"] for g in found if not g["passed"]] == []
