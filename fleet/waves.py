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
  (:class:`Progress`, made from the device reports).

The rules, in the order they are applied::

    rollout.hold set                        -> Stop(held=True)   a person must lift it
    percent is the last wave                -> Done
    failed / cohort > stop.failure_share    -> Stop              fleet advance holds it
    the wave is not released yet            -> Wait(until=None)
    released less than its soak ago         -> Wait(until=start + soak)
    on_target < stop.min_reports            -> Wait(until=None)   (an empty wave of
                                               a small fleet says how to go on)
    otherwise                               -> Advance(next wave's percent)

A rollout only ever goes forward one wave at a time, and never back: a tripped stop
condition holds the rollout where it is and says why; rolling back is a person's
decision (``modelreg rollback``), as is lifting the hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from registry.errors import UsageError
from registry.schema import Rollout, RolloutStop
from registry.units import format_duration

__all__ = [
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
    """

    cohort: int
    on_target: int
    failed: int
    subscribed: int = 0
    lowest_draw: float | None = None

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
        UsageError: the rollout has no waves, or a time is naive.
    """
    index = rollout.wave_index()
    if index is None:
        raise UsageError("a rollout without waves has nothing to advance")
    if now.tzinfo is None or (started is not None and started.tzinfo is None):
        raise UsageError("wave times must be timezone-aware")
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
    nxt = rollout.waves[index + 1].percent
    return Advance(
        nxt,
        index + 2,
        f"the {percent:g}% wave soaked {format_duration((now - started).total_seconds())} "
        f"(at least {format_duration(soak)}); {progress.on_target} of {progress.cohort} "
        f"devices run {version}, {progress.failed} failed",
    )
