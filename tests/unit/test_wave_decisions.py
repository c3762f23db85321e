"""``fleet.waves.decide`` as a table (issue 14, point 4): every rule at its boundary.

The rollout in most rows: waves 10 % (soak 1 h), 50 % (soak 4 h), 100 %; stop when more
than 5 % of the cohort failed; at least 3 devices on the version before the next wave.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fleet.waves import Advance, Decision, Done, Progress, Stop, Wait, decide, share_text
from registry.errors import UsageError
from registry.schema import Rollout

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
WAVES: list[dict[str, Any]] = [
    {"percent": 10, "soak": "1h"}, {"percent": 50, "soak": "4h"}, {"percent": 100},
]  # fmt: skip
STOP = {"failure_share": 0.05, "min_reports": 3}


def rollout(percent: float = 10, **extra: Any) -> Rollout:
    fields: dict[str, Any] = {"percent": percent, "waves": WAVES, "stop": STOP}
    return Rollout.model_validate(fields | extra)


def P(cohort: int, on_target: int, failed: int = 0) -> Progress:  # noqa: N802 - a table's shorthand
    return Progress(cohort, on_target, failed)


HEALTHY = P(40, 38)
SOAK_10 = "the 10% wave of 1.1.0 soaks for"

ROWS = [
    # (rollout, started, now, progress) -> decision
    pytest.param(rollout(), T0, T0 + H, HEALTHY,
                 Advance(50, 2, "the 10% wave soaked 1h (at least 1h); 38 of 40 devices run 1.1.0, 0 failed"),
                 id="soaked exactly: advance"),
    pytest.param(rollout(50), T0, T0 + 5 * H, HEALTHY,
                 Advance(100, 3, "the 50% wave soaked 5h (at least 4h); 38 of 40 devices run 1.1.0, 0 failed"),
                 id="second wave: advance to the last"),
    pytest.param(rollout(), T0, T0 + H - timedelta(seconds=1), HEALTHY,
                 Wait(f"{SOAK_10} 1s more (of 1h)", T0 + H), id="a second short of the soak"),
    pytest.param(rollout(), T0, T0, HEALTHY,
                 Wait(f"{SOAK_10} 1h more (of 1h)", T0 + H), id="just released"),
    pytest.param(rollout(), T0 + H, T0, HEALTHY,
                 Wait(f"{SOAK_10} 2h more (of 1h)", T0 + 2 * H), id="released in the future (clock skew): soak from it"),
    pytest.param(rollout(), None, T0, HEALTHY,
                 Wait("the 10% wave of 1.1.0 is not released yet"), id="not released"),
    # evidence: min_reports devices on the version
    pytest.param(rollout(), T0, T0 + 2 * H, P(0, 0),
                 Wait("0 of 0 devices of the 10% wave report running 1.1.0; 3 needed"), id="empty fleet never advances"),
    pytest.param(rollout(), T0, T0 + 2 * H, Progress(0, 0, 0, 3, 41.2),
                 Wait("the 10% wave holds none of the 3 reporting devices of the channel (each falls in a wave by its "
                      "cohort draw), so none can report running 1.1.0; 3 needed: widen the wave in the channel's "
                      "rollout.waves (a wave of 42% or more holds one), or set rollout.stop.min_reports: 0 to let a "
                      "wave no device falls in advance once it soaked"),
                 id="a small fleet's empty wave says how to go on (issue 27, bug 3)"),
    pytest.param(rollout(stop={"min_reports": 0}), T0, T0 + 2 * H, Progress(0, 0, 0, 3, 41.2),
                 Advance(50, 2, "the 10% wave soaked 2h (at least 1h); 0 of 0 devices run 1.1.0, 0 failed"),
                 id="a small fleet's empty wave with min_reports 0: advances once soaked"),
    pytest.param(rollout(), T0, T0 + 2 * H, P(10, 2),
                 Wait("2 of 10 devices of the 10% wave report running 1.1.0; 3 needed"), id="one report short"),
    pytest.param(rollout(), T0, T0 + 2 * H, P(3, 3),
                 Advance(50, 2, "the 10% wave soaked 2h (at least 1h); 3 of 3 devices run 1.1.0, 0 failed"), id="exactly min_reports"),
    pytest.param(rollout(stop=None), T0, T0 + 2 * H, P(0, 0),
                 Wait("0 of 0 devices of the 10% wave report running 1.1.0; 1 needed"), id="no stop block: one device needed"),
    pytest.param(rollout(stop={"min_reports": 0}), T0, T0 + 2 * H, P(0, 0),
                 Advance(50, 2, "the 10% wave soaked 2h (at least 1h); 0 of 0 devices run 1.1.0, 0 failed"), id="min_reports 0: time alone"),
    # stop: more than failure_share of the cohort failed
    pytest.param(rollout(), T0, T0 + 2 * H, P(40, 36, 2),
                 Advance(50, 2, "the 10% wave soaked 2h (at least 1h); 36 of 40 devices run 1.1.0, 2 failed"), id="5% failed: at the threshold, not over"),
    pytest.param(rollout(), T0, T0 + 2 * H, P(40, 35, 3),
                 Stop("3 of 40 devices of the 10% wave failed 1.1.0 (7.5%, over the stop threshold of 5%)"), id="7.5% failed: stop"),
    pytest.param(rollout(), T0, T0 + timedelta(minutes=5), P(40, 5, 3),
                 Stop("3 of 40 devices of the 10% wave failed 1.1.0 (7.5%, over the stop threshold of 5%)"), id="stop trips during the soak"),
    pytest.param(rollout(), None, T0, P(4, 0, 1),
                 Stop("1 of 4 devices of the 10% wave failed 1.1.0 (25%, over the stop threshold of 5%)"), id="stop trips before the wave is released (earlier waves' devices)"),
    pytest.param(rollout(stop={"failure_share": 0}), T0, T0 + 2 * H, P(40, 39, 1),
                 Stop("1 of 40 devices of the 10% wave failed 1.1.0 (2.5%, over the stop threshold of 0%)"), id="failure_share 0: any failure stops"),
    pytest.param(rollout(stop={"failure_share": 0}), T0, T0 + 2 * H, P(40, 40, 0),
                 Advance(50, 2, "the 10% wave soaked 2h (at least 1h); 40 of 40 devices run 1.1.0, 0 failed"), id="failure_share 0, no failure: advance"),
    pytest.param(rollout(stop={"min_reports": 1}), T0, T0 + 2 * H, P(40, 0, 40),
                 Wait("0 of 40 devices of the 10% wave report running 1.1.0; 1 needed"), id="no failure_share: failures never stop"),
    pytest.param(rollout(), T0, T0 + 2 * H, P(0, 0, 2),
                 Stop("2 of 0 devices of the 10% wave failed 1.1.0 (100%, over the stop threshold of 5%)"), id="failures outside a counted cohort still count"),
    # hold and done come first
    pytest.param(rollout(hold="3 of 40 failed"), T0, T0 + 9 * H, HEALTHY,
                 Stop("on hold: 3 of 40 failed", held=True), id="held: never advances"),
    pytest.param(rollout(100, hold="x"), T0, T0 + 9 * H, HEALTHY,
                 Stop("on hold: x", held=True), id="held in the last wave: still said"),
    pytest.param(rollout(100), T0, T0 + 9 * H, P(40, 0, 40),
                 Done("1.1.0 is in its last wave (100%)"), id="last wave: done, whatever the reports"),
    pytest.param(rollout(50, waves=[{"percent": 10, "soak": "1h"}, {"percent": 50}]), None, T0, HEALTHY,
                 Done("1.1.0 is in its last wave (50%)"), id="a last wave below 100%"),
    pytest.param(rollout(10, waves=[{"percent": 10}, {"percent": 100}]), T0, T0, HEALTHY,
                 Advance(100, 2, "the 10% wave soaked 0s (at least 0s); 38 of 40 devices run 1.1.0, 0 failed"), id="no soak: advance at once"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "started", "now", "progress", "expected"), ROWS)
def test_decide(
    spec: Rollout, started: datetime | None, now: datetime, progress: Progress, expected: Decision
) -> None:
    assert decide(spec, started, now, progress, version="1.1.0") == expected


def test_advance_goes_one_wave_at_a_time_and_never_back() -> None:
    """Whatever the time and the reports, the next percent is the next wave's."""
    percents = [w["percent"] for w in WAVES]
    for i, percent in enumerate(percents):
        for hours in (0, 1, 5, 1000):
            for progress in (P(0, 0), HEALTHY, P(40, 40), P(40, 0, 40)):
                got = decide(rollout(percent), T0, T0 + hours * H, progress, version="1.1.0")
                if isinstance(got, Advance):
                    assert got.to_percent == percents[i + 1]
                    assert got.wave == i + 2


def test_misuse_is_refused() -> None:
    with pytest.raises(UsageError, match="without waves"):
        decide(Rollout(percent=10), T0, T0, HEALTHY, version="1.1.0")
    with pytest.raises(UsageError, match="timezone-aware"):
        decide(rollout(), T0, datetime(2024, 5, 1), HEALTHY, version="1.1.0")
    with pytest.raises(UsageError, match="timezone-aware"):
        decide(rollout(), datetime(2024, 5, 1), T0, HEALTHY, version="1.1.0")
    with pytest.raises(UsageError, match="negative"):
        Progress(1, -1, 0)


@pytest.mark.parametrize(
    ("share", "text"), [(0, "0%"), (0.05, "5%"), (1 / 7, "14.3%"), (0.075, "7.5%"), (1, "100%")]
)
def test_share_text(share: float, text: str) -> None:
    assert share_text(share) == text
