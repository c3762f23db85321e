"""``fleet.waves.decide`` as a table (issue 14, point 4): every rule at its boundary.

The rollout in most rows: waves 10 % (soak 1 h), 50 % (soak 4 h), 100 %; stop when more
than 5 % of the cohort failed; at least 3 devices on the version before the next wave.
The behaviour rows (issue 29) add: stop under 95 % agreement, over 5 % drift or over a
1.5x p99 ratio, judged once the wave's devices compared 1,000 requests together.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fleet.waves import (
    HOLD_MAX,
    Advance,
    Decision,
    Done,
    Progress,
    Stop,
    Wait,
    decide,
    share_text,
)
from registry.agreement import Agreement, OutputSums, bucket
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
BEHAVIOUR = STOP | {"min_agreement": 0.95, "max_output_drift": 0.05, "max_p99_ratio": 1.5,
                    "min_compared": 1000}  # fmt: skip
MS = bucket(0.01)
"""The previous version's run times: all in the bucket of 10 ms."""


def compared(
    n: int = 1234,
    *,
    agree: float | None = 0.999,
    drift: float | None = 0.01,
    slower: int | None = 0,
    devices: int = 12,
    version: str = "1.1.0",
) -> Agreement:
    """The wave's comparisons: ``n`` requests on ``devices`` devices; top-1 agreement
    ``agree`` (None: no class-score output), drift ``drift`` (None: no value compared),
    the new run times ``slower`` histogram buckets (x1.1 each) above the old ones
    (None: no run time reported)."""
    sums = OutputSums(
        rows=n if agree is not None else 0, top1=round(n * agree) if agree is not None else 0,
        topk=n if agree is not None else 0,
        values=4 * n if drift is not None else 0, abs_sum=(drift or 0.0) * 1000,
        ref_sum=1000.0 if drift is not None else 0.0,
    )  # fmt: skip
    hists = ([[MS + slower, n]], [[MS, n]]) if slower is not None else ([], [])
    return Agreement(
        version=version, against="1.0.0", compared=n, devices=devices, new_hist=hists[0],
        old_hist=hists[1], outputs={"scores": sums},
    )  # fmt: skip


def apart(found: Agreement, incomparable: int) -> Agreement:
    """``found`` with ``incomparable`` of its answers not comparable (the previous version
    failed on them, or gave its outputs unlike)."""
    sums = found.outputs["scores"].model_copy(update={"incomparable": incomparable})
    return found.model_copy(update={"outputs": {"scores": sums}})


def B(found: Agreement | None, cohort: int = 40, on_target: int = 38, failed: int = 0) -> Progress:  # noqa: N802 - a table's shorthand
    return Progress(cohort, on_target, failed, behaviour=found)


def behaviour(percent: float = 10, *, hold: str | None = None, **stop: Any) -> Rollout:
    return rollout(percent, stop=BEHAVIOUR | stop, hold=hold)


SOAKED = "the 10% wave soaked 2h (at least 1h); 38 of 40 devices run 1.1.0, 0 failed"
COMPARED = "the 10% wave's devices compared 1.1.0 with 1.0.0: "
WAVE_COMPARED = "the devices of the 10% wave compared "
NEEDED = ("1,000 needed to judge its behaviour (rollout.stop.min_compared; devices compare "
          "only when the channel declares shadow)")  # fmt: skip
FAITHFUL = "agreement 99.9% over 1,234 compared requests on 12 devices, drift 1%, p99 1.00x"

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

BEHAVIOUR_ROWS = [
    # (rollout, started, now, progress) -> decision (issue 29)
    pytest.param(behaviour(), T0, T0 + 2 * H, B(compared()),
                 Advance(50, 2, f"{SOAKED}; compared with 1.0.0: {FAITHFUL}"),
                 id="faithful and soaked: advance, with the figures"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(compared(1000, agree=0.95)),
                 Advance(50, 2, f"{SOAKED}; compared with 1.0.0: agreement 95% over 1,000 compared "
                                "requests on 12 devices, drift 1%, p99 1.00x"),
                 id="agreement at min_agreement: not under"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(compared(agree=0.95)),
                 Stop(f"{COMPARED}agreement 95% over 1,234 compared requests on 12 devices, drift 1%, "
                      "p99 1.00x; agreement 94.98% under the stop threshold of 95%"),
                 id="agreement a hair under min_agreement: stop, with the digits that show it"),
    pytest.param(behaviour(), T0, T0 + timedelta(minutes=5), B(compared(agree=0.801)),
                 Stop(f"{COMPARED}agreement 80.1% over 1,234 compared requests on 12 devices, drift 1%, "
                      "p99 1.00x; agreement 80.1% under the stop threshold of 95%"),
                 id="agreement under min_agreement: stop, during the soak"),
    pytest.param(behaviour(), None, T0, B(compared(agree=0.801)),
                 Stop(f"{COMPARED}agreement 80.1% over 1,234 compared requests on 12 devices, drift 1%, "
                      "p99 1.00x; agreement 80.1% under the stop threshold of 95%"),
                 id="agreement trips before the wave is released (earlier waves' devices)"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(compared(1000, agree=0.5)),
                 Stop(f"{COMPARED}agreement 50% over 1,000 compared requests on 12 devices, drift 1%, "
                      "p99 1.00x; agreement 50% under the stop threshold of 95%"),
                 id="exactly min_compared: judged"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(compared(999, agree=0.5)),
                 Wait(f"{WAVE_COMPARED}999 requests of 1.1.0 with 1.0.0 (12 devices reported "
                      f"comparisons); {NEEDED}"),
                 id="one request short of min_compared: not judged, waits"),
    pytest.param(behaviour(), T0, T0 + H / 2, B(compared(999, agree=0.5)),
                 Wait(f"{SOAK_10} 30m more (of 1h)", T0 + H),
                 id="too few compared during the soak: the soak is said"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(apart(compared(1500, agree=0.5), 600)),
                 Wait(f"{WAVE_COMPARED}900 requests of 1.1.0 with 1.0.0 (12 devices reported "
                      f"comparisons, 600 answers not comparable); {NEEDED}"),
                 id="answers the previous version gave unlike are not evidence: waits"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(compared(10, devices=1)),
                 Wait(f"{WAVE_COMPARED}10 requests of 1.1.0 with 1.0.0 (1 device reported "
                      f"comparisons); {NEEDED}"),
                 id="one device compared a few"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(None),
                 Wait(f"{WAVE_COMPARED}0 requests of 1.1.0 with the previous version (no device "
                      f"reported any); {NEEDED}"),
                 id="no comparison reported: waits, and says devices need shadow"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(compared(drift=0.05)),
                 Advance(50, 2, f"{SOAKED}; compared with 1.0.0: agreement 99.9% over 1,234 compared "
                                "requests on 12 devices, drift 5%, p99 1.00x"),
                 id="drift at max_output_drift: not over"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(compared(drift=0.072)),
                 Stop(f"{COMPARED}agreement 99.9% over 1,234 compared requests on 12 devices, drift "
                      "7.2%, p99 1.00x; drift 7.2% over the stop threshold of 5%"),
                 id="drift over max_output_drift: stop"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(compared(slower=4)),
                 Advance(50, 2, f"{SOAKED}; compared with 1.0.0: agreement 99.9% over 1,234 compared "
                                "requests on 12 devices, drift 1%, p99 1.46x"),
                 id="p99 1.46x: under max_p99_ratio 1.5"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(compared(slower=5)),
                 Stop(f"{COMPARED}agreement 99.9% over 1,234 compared requests on 12 devices, drift "
                      "1%, p99 1.61x; p99 1.61x over the stop threshold of 1.5x"),
                 id="p99 1.61x: over max_p99_ratio, stop"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(compared(agree=0.7, drift=0.2, slower=9)),
                 Stop(f"{COMPARED}agreement 70% over 1,234 compared requests on 12 devices, drift "
                      "20%, p99 2.36x; agreement 70% under the stop threshold of 95%, drift 20% over "
                      "the stop threshold of 5%, p99 2.36x over the stop threshold of 1.5x"),
                 id="every condition tripped: each said"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(compared(agree=None)),
                 Wait("the 10% wave's comparisons of 1.1.0 with 1.0.0 give no agreement (no output "
                      "compared is shaped like class scores) to judge: 1,234 compared requests on 12 "
                      "devices, drift 1%, p99 1.00x"),
                 id="min_agreement on a model without class scores: waits, says why"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(compared(slower=None, drift=None)),
                 Wait("the 10% wave's comparisons of 1.1.0 with 1.0.0 give no drift (no output value "
                      "was compared) and no p99 ratio (the reports carry no run times) to judge: "
                      "agreement 99.9% over 1,234 compared requests on 12 devices"),
                 id="no run times nor values reported: waits"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(compared(agree=None, drift=0.3)),
                 Stop(f"{COMPARED}1,234 compared requests on 12 devices, drift 30%, p99 1.00x; drift "
                      "30% over the stop threshold of 5%"),
                 id="a figure that can be read trips even when another cannot"),
    pytest.param(rollout(stop=STOP | {"max_p99_ratio": 2}), T0, T0 + 2 * H, B(compared(agree=0.5)),
                 Advance(50, 2, f"{SOAKED}; compared with 1.0.0: agreement 50% over 1,234 compared "
                                "requests on 12 devices, drift 1%, p99 1.00x"),
                 id="only max_p99_ratio set: agreement is shown, not judged"),
    pytest.param(rollout(), T0, T0 + 2 * H, B(compared(agree=0.5)),
                 Advance(50, 2, SOAKED), id="no behaviour condition: comparisons neither judged nor said"),
    pytest.param(behaviour(), T0, T0 + 2 * H, B(compared(agree=0.5), 40, 35, 3),
                 Stop("3 of 40 devices of the 10% wave failed 1.1.0 (7.5%, over the stop threshold of 5%)"),
                 id="failures are judged before behaviour"),
    pytest.param(behaviour(hold="agreement 80%"), T0, T0 + 9 * H, B(compared(agree=0.5)),
                 Stop("on hold: agreement 80%", held=True), id="held: behaviour does not matter"),
    pytest.param(behaviour(100), T0, T0 + 9 * H, B(compared(agree=0.5)),
                 Done("1.1.0 is in its last wave (100%)"), id="last wave: done, whatever the comparisons"),
    pytest.param(behaviour(min_reports=0), T0, T0 + 2 * H, Progress(0, 0, 0, 3, 41.2),
                 Advance(50, 2, "the 10% wave soaked 2h (at least 1h); 0 of 0 devices run 1.1.0, 0 failed; "
                                "behaviour not judged: the wave holds no device"),
                 id="a wave no device falls in, with min_reports 0: advances, behaviour not judged"),
    pytest.param(behaviour(), T0, T0 + 2 * H, Progress(0, 0, 0, 3, 41.2),
                 Wait("the 10% wave holds none of the 3 reporting devices of the channel (each falls in a wave by "
                      "its cohort draw), so none can report running 1.1.0; 3 needed: widen the wave in the "
                      "channel's rollout.waves (a wave of 42% or more holds one), or set "
                      "rollout.stop.min_reports: 0 to let a wave no device falls in advance once it soaked"),
                 id="an empty wave says how to go on first"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "started", "now", "progress", "expected"), ROWS + BEHAVIOUR_ROWS)
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


@pytest.mark.parametrize(("new", "old"), [(240, 120), (250, 250)])
def test_a_behaviour_stop_fits_a_hold_and_keeps_what_tripped(new: int, old: int) -> None:
    """``rollout.hold`` holds 500 characters: the figures give way, then the versions
    (SemVer allows 255 characters), never the conditions that tripped."""
    version, against = "1.1.0-rc." + "a" * (new - 9), "1.0.0-rc." + "b" * (old - 9)
    found = compared(agree=0.5, version=version).model_copy(update={"against": against})
    got = decide(behaviour(), T0, T0 + 2 * H, B(found), version=version)
    assert isinstance(got, Stop)
    assert len(got.reason) == HOLD_MAX
    assert got.reason.startswith(f"the 10% wave's devices compared {version} with 1.0.0-rc.")
    assert got.reason.endswith("...; agreement 50% under the stop threshold of 95%")
    Rollout.model_validate({"percent": 10, "waves": WAVES, "hold": got.reason})  # it fits
    short = decide(behaviour(), T0, T0 + 2 * H, B(compared(agree=0.5)), version="1.1.0")
    assert "..." not in short.reason


def test_misuse_is_refused() -> None:
    with pytest.raises(UsageError, match="without waves"):
        decide(Rollout(percent=10), T0, T0, HEALTHY, version="1.1.0")
    with pytest.raises(UsageError, match="timezone-aware"):
        decide(rollout(), T0, datetime(2024, 5, 1), HEALTHY, version="1.1.0")
    with pytest.raises(UsageError, match="timezone-aware"):
        decide(rollout(), datetime(2024, 5, 1), T0, HEALTHY, version="1.1.0")
    with pytest.raises(UsageError, match="negative"):
        Progress(1, -1, 0)
    with pytest.raises(UsageError, match=r"comparisons are of 1\.2\.0, not of 1\.1\.0"):
        decide(behaviour(), T0, T0, B(compared(version="1.2.0")), version="1.1.0")


@pytest.mark.parametrize(
    ("share", "text"), [(0, "0%"), (0.05, "5%"), (1 / 7, "14.3%"), (0.075, "7.5%"), (1, "100%")]
)
def test_share_text(share: float, text: str) -> None:
    assert share_text(share) == text
