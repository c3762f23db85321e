"""Rollout waves: whether a channel's staged rollout may take its next wave (pure; the
API may still change).

A channel's ``rollout`` may list waves (``registry.schema.Wave``: a percent and a
minimum soak time) and stop conditions (``registry.schema.RolloutStop``).  Its
``percent`` is the wave it is in.  :func:`decide` judges one channel from four values,
with no I/O, so that every rule is a row of a table in the tests:

* the channel's rollout as the manifest declares it;
* when its current wave started: the first release that served the current version
  and percent (``registry.history.rollout_started``; None when it is not released);
* now;
* the fleet's progress on the version, counted over the devices of the wave's cohort
  (:class:`Progress`, made from the device reports), with the sums of their shadow
  comparisons of the version (``registry.agreement``) when they made any.

The rules, in the order they are applied::

    rollout.hold set                        -> Stop(held=True)   a person must lift it
    percent is the last wave                -> Done
    failed / cohort > stop.failure_share    -> Stop              fleet advance holds it
    comparable >= stop.min_compared and     -> Stop              with the figures
      agreement < stop.min_agreement,
      or drift > stop.max_output_drift,
      or p99 ratio > stop.max_p99_ratio
    the wave is not released yet            -> Wait(until=None)
    released less than its soak ago         -> Wait(until=start + soak)
    on_target < stop.min_reports            -> Wait(until=None)   (an empty wave of
                                               a small fleet says how to go on)
    a behaviour condition is set and        -> Wait(until=None)   how many of how many
      comparable < stop.min_compared           (not for a wave no device falls in
                                               that min_reports 0 lets advance)
    a behaviour condition is set and its    -> Wait(until=None)   (a model with no
      figure cannot be read                                        class scores, say)
    otherwise                               -> Advance(next wave's percent)  with the
                                               figures when a behaviour condition is set

The behaviour conditions (``min_agreement``, ``max_output_drift``, ``max_p99_ratio``)
read the wave's comparisons summed over its devices, never an average of theirs; like
``failure_share`` they trip as soon as the evidence is there (``min_compared``
requests), during the soak or before the wave is released, and a figure at its
threshold is not over it.

A rollout only ever goes forward one wave at a time, and never back: a tripped stop
condition holds the rollout where it is and says why; rolling back is a person's
decision (``modelreg rollback``), as is lifting the hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from registry.agreement import Agreement
from registry.errors import UsageError
from registry.schema import Rollout, RolloutStop
from registry.units import format_duration

__all__ = [
    "HOLD_MAX",
    "Advance",
    "Decision",
    "Done",
    "Progress",
    "Stop",
    "Wait",
    "decide",
    "share_text",
]


@dataclass(frozen=True, slots=True)
class Progress:
    """How a version does on the devices of a wave's cohort (from device reports).

    Attributes:
        cohort: reporting devices that follow the channel and fall in the wave's
            cohort for this version.
        on_target: of those, devices that run the version.
        failed: of those, devices whose last update to the version failed, was
            rejected, or was rolled back by the health gate.
        subscribed: reporting devices that follow the channel, in the cohort or not.
        lowest_draw: their lowest cohort draw (a wave above it holds one), None when
            none reports.
        behaviour: the shadow comparisons of the version reported by devices of the
            cohort, summed (``registry.agreement.combine``: ``devices`` says how many),
            against the one previous version they compared with
            (``fleet.summary`` picks the one most of them compared with); None when
            none reported one.
    """

    cohort: int
    on_target: int
    failed: int
    subscribed: int = 0
    lowest_draw: float | None = None
    behaviour: Agreement | None = None

    def __post_init__(self) -> None:
        """Refuse counts that cannot come from one fleet.

        Raises:
            UsageError: a negative count.
        """
        if min(self.cohort, self.on_target, self.failed) < 0:
            raise UsageError(f"device counts cannot be negative: {self}")

    @property
    def failure_share(self) -> float:
        """``failed / cohort`` (0 for an empty cohort; a failed device always counts,
        even when reports disagree on the cohort)."""
        return self.failed / max(self.cohort, self.failed, 1)


@dataclass(frozen=True, slots=True)
class Advance:
    """Commit the next wave: ``rollout.percent`` becomes ``to_percent``.

    Attributes:
        to_percent: the next wave's percent.
        wave: its position in the waves, from 1.
        reason: the evidence, one line (for the commit message).
    """

    to_percent: float
    wave: int
    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Not yet: the wave soaks, is not released, or too few devices report.

    Attributes:
        reason: why, one line.
        until: when time alone will change the answer (the end of the soak); None
            when it waits for something else (a release, device reports).
    """

    reason: str
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class Stop:
    """The rollout must not go on.

    Attributes:
        reason: why, one line (what ``fleet advance`` writes as ``rollout.hold``).
        held: the rollout is already on hold in the manifest (nothing to write).
    """

    reason: str
    held: bool = False


@dataclass(frozen=True, slots=True)
class Done:
    """The channel is in its last wave: nothing left to advance."""

    reason: str


Decision = Advance | Wait | Stop | Done


HOLD_MAX: Final = 500
"""The longest reason ``rollout.hold`` holds (``registry.schema.Reason``): a stop's
figures are cut to fit, never the conditions it tripped."""


def share_text(share: float) -> str:
    """A share as a percentage: ``0.05`` -> ``5%``, ``1/7`` -> ``14.3%``."""
    return f"{share * 100:.3g}%"


def _empty_wave(percent: float, version: str, progress: Progress, needed: int) -> str:
    """Why a wave no device falls in waits, and the two ways on (a small fleet)."""
    draw = progress.lowest_draw
    holds = f"a wave of {math.floor(draw) + 1}% or more holds one" if draw is not None else ""
    return (
        f"the {percent:g}% wave holds none of the {progress.subscribed} reporting devices "
        f"of the channel (each falls in a wave by its cohort draw), so none can report "
        f"running {version}; {needed} needed: widen the wave in the channel's "
        f"rollout.waves ({holds}), or set rollout.stop.min_reports: 0 to let a wave "
        f"no device falls in advance once it soaked"
    ).replace(" ()", "")


def _clip(text: str, room: int) -> str:
    """``text`` cut to ``room`` characters (the last three ``...``) when longer."""
    return text if len(text) <= room else text[: max(room - 3, 0)] + "..."


def _held(what: str, figures: str, tripped: str) -> str:
    """``what: figures; tripped`` in :data:`HOLD_MAX` characters: the figures give way
    first, then ``what`` (versions may be long), never what tripped."""
    tail = f"; {tripped}"
    room = HOLD_MAX - len(what) - len(tail) - 2
    if room >= 3:
        return f"{what}: {_clip(figures, room)}{tail}"
    return f"{_clip(what, HOLD_MAX - len(tail))}{tail}"


def _apart(value: float, limit: float, unit: str) -> str:
    """``value`` as a percentage (``unit`` ``%``) or a ratio (``x``), with the digits
    that tell it from ``limit`` (94.98% is under 95%, though it rounds to it)."""
    scale = 100 if unit == "%" else 1
    for digits in range(3, 10):
        shown = f"{value * scale:.{digits}g}"
        if shown != f"{limit * scale:.{digits}g}":
            return f"{shown}{unit}"
    return f"{value * scale!r}{unit}"  # pragma: no cover - a value past its limit differs


def _tripped(stop: RolloutStop, found: Agreement) -> list[str]:
    """The behaviour conditions the figures are past (a figure at its threshold is not)."""
    tripped = []
    agreement, drift, p99 = found.agreement, found.drift, found.p99_ratio
    if (least := stop.min_agreement) is not None and agreement is not None and agreement < least:
        tripped.append(
            f"agreement {_apart(agreement, least, '%')} under the stop threshold of "
            f"{share_text(least)}"
        )
    if (most := stop.max_output_drift) is not None and drift is not None and drift > most:
        tripped.append(
            f"drift {_apart(drift, most, '%')} over the stop threshold of {share_text(most)}"
        )
    if (ratio := stop.max_p99_ratio) is not None and p99 is not None and p99 > ratio:
        tripped.append(f"p99 {_apart(p99, ratio, 'x')} over the stop threshold of {ratio:g}x")
    return tripped


def _unread(stop: RolloutStop, found: Agreement) -> list[str]:
    """The behaviour conditions set whose figure the comparisons do not give."""
    missing = []
    if stop.min_agreement is not None and found.agreement is None:
        missing.append("agreement (no output compared is shaped like class scores)")
    if stop.max_output_drift is not None and found.drift is None:
        missing.append("drift (no output value was compared)")
    if stop.max_p99_ratio is not None and found.p99_ratio is None:
        missing.append("p99 ratio (the reports carry no run times)")
    return missing


def _judged(stop: RolloutStop, found: Agreement | None) -> Agreement | None:
    """The comparisons when the behaviour conditions may judge them: a condition is set
    and the devices compared ``min_compared`` requests whose answers both versions gave
    alike (``Agreement.comparable``; else None)."""
    if stop.behaviour and found is not None and found.comparable >= stop.min_compared:
        return found
    return None


def _behaviour_wait(
    stop: RolloutStop, percent: float, version: str, progress: Progress
) -> Wait | None:
    """The wait of a soaked wave whose behaviour cannot be judged yet (None: it can)."""
    found = progress.behaviour
    judged = _judged(stop, found)
    if judged is not None:
        missing = _unread(stop, judged)
        if not missing:
            return None
        return Wait(
            f"the {percent:g}% wave's comparisons of {version} with {judged.against} give "
            f"no {' and no '.join(missing)} to judge: {judged.text()}"
        )
    if progress.cohort == 0 and stop.min_reports == 0:
        return None  # a wave no device falls in, let through by min_reports 0
    if found is None:
        done = f"0 requests of {version} with the previous version (no device reported any)"
    else:
        n = found.devices
        apart = f", {found.incomparable:,} answers not comparable" if found.incomparable else ""
        done = (
            f"{found.comparable:,} requests of {version} with {found.against} "
            f"({n:,} device{'' if n == 1 else 's'} reported comparisons{apart})"
        )
    return Wait(
        f"the devices of the {percent:g}% wave compared {done}; {stop.min_compared:,} "
        f"needed to judge its behaviour (rollout.stop.min_compared; devices compare only "
        f"when the channel declares shadow)"
    )


def _figures(stop: RolloutStop, judged: Agreement | None) -> str:
    """What an advance says of the behaviour: the figures when a condition judged them."""
    if judged is not None:
        return f"; compared with {judged.against}: {judged.text()}"
    return "; behaviour not judged: the wave holds no device" if stop.behaviour else ""


def decide(
    rollout: Rollout,
    started: datetime | None,
    now: datetime,
    progress: Progress,
    *,
    version: str,
) -> Decision:
    """What ``modelreg fleet advance`` does with one channel's staged rollout (pure).

    Args:
        rollout: the channel's rollout, with waves.
        started: when the current wave was released (timezone-aware), or None when
            no release serves it yet.
        now: the time to judge at (timezone-aware).
        progress: the version on the devices of the current wave's cohort.
        version: the version the channel serves (for the reasons).

    Returns:
        :class:`Advance`, :class:`Wait`, :class:`Stop` or :class:`Done`.

    Raises:
        UsageError: the rollout has no waves, a time is naive, or the progress's
            comparisons are of another version.
    """
    index = rollout.wave_index()
    if index is None:
        raise UsageError("a rollout without waves has nothing to advance")
    if now.tzinfo is None or (started is not None and started.tzinfo is None):
        raise UsageError("wave times must be timezone-aware")
    found = progress.behaviour
    if found is not None and found.version != version:
        raise UsageError(f"the comparisons are of {found.version}, not of {version}")
    percent = rollout.percent
    if rollout.hold is not None:
        return Stop(f"on hold: {rollout.hold}", held=True)
    if index == len(rollout.waves) - 1:
        return Done(f"{version} is in its last wave ({percent:g}%)")
    stop = rollout.stop or RolloutStop()
    if stop.failure_share is not None and progress.failure_share > stop.failure_share:
        return Stop(
            f"{progress.failed} of {progress.cohort} devices of the {percent:g}% wave "
            f"failed {version} ({share_text(progress.failure_share)}, over the stop "
            f"threshold of {share_text(stop.failure_share)})"
        )
    judged = _judged(stop, found)
    if judged is not None and (tripped := _tripped(stop, judged)):
        return Stop(_held(f"the {percent:g}% wave's devices compared {version} with "
                          f"{judged.against}", judged.text(), ", ".join(tripped)))  # fmt: skip
    if started is None:
        return Wait(f"the {percent:g}% wave of {version} is not released yet")
    soak = rollout.waves[index].soak
    ends = started + timedelta(seconds=soak)
    if now < ends:
        left = math.ceil((ends - now).total_seconds())
        return Wait(
            f"the {percent:g}% wave of {version} soaks for {format_duration(left)} more "
            f"(of {format_duration(soak)})",
            until=ends,
        )
    if progress.on_target < stop.min_reports and progress.cohort == 0 and progress.subscribed:
        return Wait(_empty_wave(percent, version, progress, stop.min_reports))
    if progress.on_target < stop.min_reports:
        return Wait(
            f"{progress.on_target} of {progress.cohort} devices of the {percent:g}% wave "
            f"report running {version}; {stop.min_reports} needed"
        )
    if stop.behaviour and (waits := _behaviour_wait(stop, percent, version, progress)):
        return waits
    nxt = rollout.waves[index + 1].percent
    reason = (
        f"the {percent:g}% wave soaked {format_duration((now - started).total_seconds())} "
        f"(at least {format_duration(soak)}); {progress.on_target} of {progress.cohort} "
        f"devices run {version}, {progress.failed} failed{_figures(stop, judged)}"
    )
    return Advance(nxt, index + 2, reason)
