"""The health gate's decisions without I/O (issue 24, point 3): the verdict on a window
(``edge_sync.decide.health.judge``), what a start-up does with a version tried when the
daemon stopped (``edge_sync.decide.gate_state.after_restart``), and what a gate's close
or rollback records (``edge_sync.decide.gate_state``).  Each row builds its windows or
states in memory and names the exact outcome."""

from __future__ import annotations

import pytest

from edge_sync.decide.gate_state import (
    after_restart,
    baseline_span,
    confirmed,
    kept,
    rejected,
    restored,
    rolled_back,
)
from edge_sync.decide.health import MAX_EXTENSION, MIN_ERRORS, GatePolicy, Window, judge
from edge_sync.state.models import (
    MAX_REJECTED,
    Attempt,
    GateRecord,
    Installed,
    ModelState,
    Rejected,
    UpdateRecord,
)
from registry.agreement import Agreement

# --- the verdict --------------------------------------------------------------------------

POLICY = GatePolicy(window_s=10.0, min_requests=20, max_error_rate=0.05, max_latency_ratio=2.0)
ENDED, EXTENDED = 10.0, 10.0 * MAX_EXTENSION


def _window(requests: int, errors: int = 0, seconds: float = 0.002, units: int = 32) -> Window:
    """``requests`` answers, ``errors`` of them server errors, the rest taking ``seconds``."""
    return Window(requests, errors, tuple((units, seconds) for _ in range(requests - errors)))


BASELINE = _window(40, seconds=0.002)


@pytest.mark.parametrize(
    ("new", "before", "elapsed", "retried", "expected"),
    [
        pytest.param(_window(30, seconds=0.003), BASELINE, ENDED, False, ("pass", "health gate passed: 30 requests, 0 failed"), id="pass: enough requests, 1.5x latency"),
        pytest.param(_window(30, seconds=0.003), BASELINE, 5.0, False, ("wait", ""), id="window not over: wait"),
        pytest.param(_window(20, errors=2), BASELINE, 1.0, False, ("fail", "health gate: 2 of 20 requests failed (10.0%"), id="fail on errors at once (min_requests answered)"),
        pytest.param(_window(21, errors=1), BASELINE, ENDED, False, ("pass", "health gate passed: 21 requests, 1 failed"), id="errors under the bound (4.8%): pass"),
        pytest.param(_window(20, errors=1), BASELINE, ENDED, False, ("wait", ""), id="errors at the bound (5%), 19 latencies to compare: wait"),
        pytest.param(_window(10, errors=2), BASELINE, 1.0, False, ("wait", ""), id="errors, too few requests, window open: wait"),
        pytest.param(_window(10, errors=MIN_ERRORS), BASELINE, ENDED, False, ("fail", f"health gate: {MIN_ERRORS} of 10 requests failed"), id="MIN_ERRORS at the window's end fail it"),
        pytest.param(_window(10, errors=MIN_ERRORS - 1), BASELINE, ENDED, False, ("wait", ""), id="fewer than MIN_ERRORS, too few requests: extended"),
        pytest.param(_window(5), BASELINE, ENDED, False, ("wait", ""), id="too few requests: the window is extended"),
        pytest.param(_window(5), BASELINE, EXTENDED, False, ("pass", "health gate not judged: 5 requests in 40 s, fewer than 20"), id="not judged without traffic: the version stands"),
        pytest.param(_window(0), BASELINE, EXTENDED, False, ("pass", "health gate not judged: 0 requests"), id="no traffic at all: not judged"),
        pytest.param(_window(30, seconds=0.010), BASELINE, ENDED, False, ("retry", "health gate: median latency 5.00x the previous version's"), id="latency over the bound, first window: retry"),
        pytest.param(_window(30, seconds=0.010), BASELINE, ENDED, True, ("fail", "health gate: median latency 5.00x"), id="latency over the bound again: fail"),
        pytest.param(_window(30, seconds=0.010, units=100_000), BASELINE, ENDED, False, ("wait", ""), id="no comparable sizes yet: wait"),
        pytest.param(_window(30, seconds=0.010, units=100_000), BASELINE, EXTENDED, False, ("pass", "health gate passed: 30 requests, 0 failed, latency not compared"), id="no comparable sizes after the extension: pass, not compared"),
        pytest.param(_window(30, seconds=0.010), _window(3), ENDED, False, ("pass", "health gate passed: 30 requests, 0 failed, latency not compared"), id="a thin baseline: latency not compared"),
    ],
)  # fmt: skip
def test_judge(
    new: Window, before: Window, elapsed: float, retried: bool, expected: tuple[str, str]
) -> None:
    verdict = judge(POLICY, new, before, elapsed, retried=retried)
    decision, starts = expected
    assert verdict.decision == decision
    assert verdict.reason.startswith(starts), verdict.reason
    if decision == "wait":
        assert verdict.reason == ""


@pytest.mark.parametrize(
    ("swapped", "until", "expected"),
    [
        pytest.param(100.0, 100.0, (0.0, 100.0), id="ten windows before the swap"),
        pytest.param(130.0, 100.0, (0.0, 100.0), id="a retried window keeps the swap's baseline"),
        pytest.param(100.0, 0.0, (0.0, 100.0), id="no swap time recorded: the window's start"),
    ],
)  # fmt: skip
def test_baseline_span(swapped: float, until: float, expected: tuple[float, float]) -> None:
    assert baseline_span(swapped, until, 10.0, 10) == expected


# --- what the state records -----------------------------------------------------------------

V1 = Installed(version="1.0.0", sha256="a" * 64, artifact_sha256="a" * 64)
V2 = Installed(version="1.1.0", sha256="b" * 64, artifact_sha256="b" * 64)
V0 = Installed(version="0.9.0", sha256="c" * 64, artifact_sha256="c" * 64)
AT = "2026-01-01T00:00:00Z"


def _gate(stops: int = 0, *, confirmed: bool = True) -> GateRecord:
    return GateRecord(
        version="1.1.0", sha256=V2.sha256, signed="s2", opened=AT, restore_serving=V1,
        restore_previous=V0, restore_last_known_good=V1, unclean_stops=stops,
        confirmed=confirmed,
    )  # fmt: skip


def _gated(stops: int = 0, *, confirmed: bool = True) -> ModelState:
    """1.1.0 served under an open gate; 1.0.0 served and known good before it
    (``confirmed``: 1.1.0's goldens passed in every session setup)."""
    return ModelState(channel="stable", serving=V2, previous=V1, last_known_good=V1,
                      gate=_gate(stops, confirmed=confirmed))  # fmt: skip


def _attempting(stops: int = 0) -> ModelState:
    attempt = Attempt(version="1.1.0", signed="s2", sha256=V2.sha256, started=AT,
                      unclean_stops=stops)  # fmt: skip
    return ModelState(channel="stable", serving=V1, last_known_good=V1, attempt=attempt)


def _version(installed: Installed | None) -> str | None:
    return installed.version if installed is not None else None


def _shape(model: ModelState) -> tuple[object, ...]:
    """(serving, previous, last known good, gate stops or None, attempt stops or None,
    rejected versions, last update's result)."""
    return (
        _version(model.serving), _version(model.previous), _version(model.last_known_good),
        model.gate.unclean_stops if model.gate else None,
        model.attempt.unclean_stops if model.attempt else None,
        [r.version for r in model.rejected],
        model.last_update.result if model.last_update else None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("model", "unclean", "gated", "expected"),
    [
        pytest.param(_gated(), False, True, ("1.1.0", "1.0.0", "1.0.0", 0, None, [], None), id="gate, clean stop: reopened, not counted"),
        pytest.param(_gated(), True, True, ("1.1.0", "1.0.0", "1.0.0", 1, None, [], None), id="gate, first unclean stop: reopened, counted"),
        pytest.param(_gated(1), True, True, ("1.0.0", "0.9.0", "1.0.0", None, None, ["1.1.0"], "rejected"), id="gate, second unclean stop: rejected, what it replaced served"),
        pytest.param(_gated(1), False, True, ("1.1.0", "1.0.0", "1.0.0", 1, None, [], None), id="gate, a clean stop after an unclean one: reopened"),
        pytest.param(_gated(), True, False, ("1.1.0", "1.0.0", "1.1.0", None, None, [], None), id="gates turned off: the version stands, known good"),
        pytest.param(_gated(1), True, False, ("1.0.0", "0.9.0", "1.0.0", None, None, ["1.1.0"], "rejected"), id="gates off, second unclean stop: still rejected"),
        pytest.param(_gated(confirmed=False), False, True, ("1.0.0", "0.9.0", "1.0.0", None, 0, [], None), id="unconfirmed, clean stop: what it replaced serves, an attempt again"),
        pytest.param(_gated(confirmed=False), True, True, ("1.0.0", "0.9.0", "1.0.0", None, 1, [], None), id="unconfirmed, first unclean stop: an attempt, counted"),
        pytest.param(_gated(confirmed=False), True, False, ("1.0.0", "0.9.0", "1.0.0", None, 1, [], None), id="unconfirmed, gates off: never stands unchecked"),
        pytest.param(_gated(1, confirmed=False), True, True, ("1.0.0", "0.9.0", "1.0.0", None, None, ["1.1.0"], "rejected"), id="unconfirmed, second unclean stop: rejected, what it replaced served"),
        pytest.param(_attempting(), False, True, ("1.0.0", None, "1.0.0", None, 0, [], None), id="attempt, clean stop: kept"),
        pytest.param(_attempting(), True, True, ("1.0.0", None, "1.0.0", None, 1, [], None), id="attempt, first unclean stop: counted"),
        pytest.param(_attempting(1), True, True, ("1.0.0", None, "1.0.0", None, None, ["1.1.0"], "rejected"), id="attempt, second unclean stop: rejected, dropped"),
        pytest.param(ModelState(channel="stable", serving=V1), True, True, ("1.0.0", None, None, None, None, [], None), id="nothing being tried: unchanged"),
    ],
)  # fmt: skip
def test_after_restart(
    model: ModelState, unclean: bool, gated: bool, expected: tuple[object, ...]
) -> None:
    after = after_restart(model, unclean=unclean, gated=gated, at=AT)
    assert _shape(after) == expected
    if after.rejected:
        (entry,) = after.rejected
        assert (entry.sha256, entry.signed, entry.at) == (V2.sha256, "s2", AT)
        assert "stopped unexpectedly twice" in entry.reason


def test_a_comparison_open_at_a_stop_is_closed_with_its_sums_kept() -> None:
    running = Agreement(version="1.1.0", against="1.0.0", compared=12, open=True)
    model = ModelState(channel="stable", serving=V2, shadow=running)
    for unclean in (False, True):
        after = after_restart(model, unclean=unclean, gated=True, at=AT)
        assert after.shadow == running.model_copy(update={"open": False})


RECORD = UpdateRecord(result="rejected", version="1.1.0", reason="health gate: slow", finished=AT)
REJECTION = Rejected(version="1.1.0", sha256=V2.sha256, signed="s2", reason="slow", at=AT)
BEFORE = ModelState(channel="stable", serving=V1, previous=V0, last_known_good=V1)
NEWER = Installed(version="1.2.0", sha256="d" * 64)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        pytest.param(_gated(), ("1.0.0", "0.9.0", "1.0.0", None, None, ["1.1.0"], "rejected"), id="failed gate: rolled back to what it replaced"),
        pytest.param(_gated().model_copy(update={"serving": NEWER, "gate": None}), ("1.2.0", "1.0.0", "1.0.0", None, None, ["1.1.0"], "rejected"), id="replaced since by a newer install: only rejected"),
    ],
)  # fmt: skip
def test_rolled_back(model: ModelState, expected: tuple[object, ...]) -> None:
    assert _shape(rolled_back(model, BEFORE, V2, REJECTION, RECORD)) == expected


def test_a_passed_gate_makes_the_version_known_good() -> None:
    after = kept(_gated(), V2)
    assert after is not None
    assert _shape(after) == ("1.1.0", "1.0.0", "1.1.0", None, None, [], None)
    replaced = _gated().model_copy(update={"serving": NEWER})
    assert kept(replaced, V2) is None  # another version served by now: nothing recorded


@pytest.mark.parametrize(
    ("model", "gated", "expected"),
    [
        pytest.param(_gated(confirmed=False), True, (("1.1.0", "1.0.0", "1.0.0", 0, None, [], None), True), id="health gate on: the gate stays open, confirmed"),
        pytest.param(_gated(confirmed=False), False, (("1.1.0", "1.0.0", "1.1.0", None, None, [], None), None), id="no health gate: known good, no gate"),
        pytest.param(_gated(confirmed=False).model_copy(update={"serving": NEWER}), True, (("1.2.0", "1.0.0", "1.0.0", 0, None, [], None), False), id="another version served by now: unchanged"),
    ],
)  # fmt: skip
def test_confirmed(model: ModelState, gated: bool, expected: tuple[object, ...]) -> None:
    after = confirmed(model, V2, gated=gated)
    assert (_shape(after), after.gate.confirmed if after.gate else None) == expected


def test_restored_serves_the_gate_record() -> None:
    assert _shape(restored(_gated(), _gate())) == ("1.0.0", "0.9.0", "1.0.0", None, None, [], None)


def test_the_rejected_history_keeps_the_newest() -> None:
    model = ModelState(channel="stable")
    for n in range(MAX_REJECTED + 5):
        model = rejected(model, f"1.{n}.0", "e" * 64, f"s{n}", "broken", AT)
    assert len(model.rejected) == MAX_REJECTED
    assert model.rejected[0].version == "1.5.0"  # the oldest five forgotten
    assert model.rejected[-1].version == f"1.{MAX_REJECTED + 4}.0"
    assert model.last_update is not None
    assert (model.last_update.result, model.last_update.version) == (
        "rejected",
        f"1.{MAX_REJECTED + 4}.0",
    )
