"""What a fleet runs, from its devices' reports: pure aggregation, no I/O (stable API).

:func:`channel_progress` answers for one channel what a rollout decision needs (how
many devices the rollout reaches, how many run the target, which failed and why, which
have not reported lately, how the version's answers compare with the previous
version's); :func:`summarize` does it for every declared channel in one pass and counts
the devices on each version.  Both take reports already read
(:mod:`fleet.reports`) and the channels as the repository declares them; ``now`` is a
parameter, so every answer is reproducible in a test.

Cohorts are drawn by :func:`registry.cohort.in_cohort`, the function each device uses to
decide for itself.  A device belongs to a channel's rollout when its report subscribes
the model to that channel and it falls in the cohort of the channel's version and
percent; every member is then exactly one of *on target* (serving the version),
*failed* (its last attempt at the version failed or was rejected, or it rejected the
version before) or *pending*.  Members whose report is older than ``stale_after_s`` are
listed in ``stale`` as well: what their report says may no longer hold.

A member whose report carries a shadow comparison of the channel's version (its
``shadow``, ``registry.agreement``) adds its sums to the channel's, whatever it serves
now (a device whose health gate rolled the version back still says how it answered).
The sums are added per previous version compared with; the rollout is judged on those
against the version most members compared with (ties: more compared requests, then the
newer version), which is the version the channel's devices ran before this rollout
unless most of them lagged behind: a version compared with an older one differs from it
by every change since, which earlier rollouts judged already.  The others are kept and
shown, not judged.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

import semver

from registry.agreement import Agreement, combine
from registry.cohort import cohort_draw, in_cohort
from registry.device_report import DeviceReport, ModelReport

__all__ = [
    "DEFAULT_STALE_AFTER_S",
    "ChannelProgress",
    "ChannelTarget",
    "FleetSummary",
    "StaleDevice",
    "channel_progress",
    "latest",
    "summarize",
]

DEFAULT_STALE_AFTER_S: Final = 15 * 60.0
"""A report older than this is stale (three heartbeats at the default 5 minutes)."""


class ChannelTarget(NamedTuple):
    """What a channel serves, as the repository declares it."""

    version: str
    percent: float | None = None
    hold: str | None = None
    """Why the staged rollout is held (``modelreg fleet hold``), or None."""


@dataclass(frozen=True)
class ChannelProgress:
    """One channel's rollout, as its devices report it.

    Attributes:
        model: the model.
        channel: the channel.
        version: the channel's target version.
        percent: its rollout percent (None: every device).
        subscribed: devices whose report follows ``model`` on ``channel``.
        cohort: of those, the devices the rollout reaches (``in_cohort``).
        on_target: cohort devices serving ``version``.
        failed: cohort devices whose attempt at ``version`` failed or was rejected,
            with the reason, by device id.
        pending: the other cohort devices, with the device-wide reason when their
            last sync failed (an unreachable repository, say), else None.
        stale: cohort devices whose last report is older than the stale limit
            (counted above by what that report says).
        hold: why the rollout is held (None: it is not).
        lowest_draw: the lowest cohort draw of the subscribed devices
            (``registry.cohort.cohort_draw``): a rollout above it reaches one; None
            with no subscribed device.
        comparisons: the cohort devices' shadow comparisons of ``version``, summed per
            previous version compared with (``registry.agreement.combine``), the one
            judged first (:attr:`behaviour`; the module doc says which).
    """

    model: str
    channel: str
    version: str
    percent: float | None
    subscribed: int = 0
    cohort: int = 0
    on_target: int = 0
    failed: tuple[tuple[str, str], ...] = ()
    pending: tuple[tuple[str, str | None], ...] = ()
    stale: tuple[str, ...] = ()
    lowest_draw: float | None = None
    hold: str | None = None
    comparisons: tuple[Agreement, ...] = ()

    @property
    def behaviour(self) -> Agreement | None:
        """The comparisons a rollout's behaviour conditions judge (None: no device of the
        cohort reported one of ``version``)."""
        return self.comparisons[0] if self.comparisons else None

    @property
    def failure_share(self) -> float:
        """Failed cohort devices over the cohort (0 for an empty cohort)."""
        return len(self.failed) / self.cohort if self.cohort else 0.0

    def to_json(self) -> dict[str, Any]:
        """The progress as a JSON object (``fleet status --json``)."""
        return {
            "model": self.model,
            "channel": self.channel,
            "version": self.version,
            "percent": self.percent,
            "hold": self.hold,
            "subscribed": self.subscribed,
            "cohort": self.cohort,
            "on_target": self.on_target,
            "failed": [{"device": d, "reason": r} for d, r in self.failed],
            "pending": [{"device": d, "reason": r} for d, r in self.pending],
            "stale": list(self.stale),
            "behaviour": None if self.behaviour is None else self.behaviour.figures(),
            "behaviour_not_judged": [c.figures() for c in self.comparisons[1:]],
        }


class StaleDevice(NamedTuple):
    """A device whose last report is older than the stale limit."""

    device: str
    reported: datetime
    age_s: float


@dataclass(frozen=True)
class FleetSummary:
    """The whole fleet, from its reports.

    Attributes:
        devices: devices reporting (one report each, the newest).
        versions: per model, devices serving each version (``None``: subscribed but
            serving nothing yet).
        channels: the progress of each declared channel a device follows, or that
            the repository declares for a model devices report.
        undeclared: (model, channel) pairs devices follow that the repository does
            not declare, with how many devices follow each.
        stale: devices whose last report is older than the stale limit, oldest first.
        trust_stale: devices whose trusted timestamp has expired (they install
            nothing until the metadata is re-signed).
        stopped: devices whose last report says their daemon stopped (a clean stop
            sends one): what they serve is not served now.
        approvers: per model, per version served, who approved it, as the signed
            provenance the devices report says (the list most devices report; None:
            not counted at release).  A version no device reported provenance for is
            absent.
    """

    devices: int
    versions: dict[str, dict[str | None, int]]
    channels: list[ChannelProgress]
    undeclared: list[tuple[str, str, int]] = field(default_factory=list)
    stale: list[StaleDevice] = field(default_factory=list)
    trust_stale: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    approvers: dict[str, dict[str, list[str] | None]] = field(default_factory=dict)


def _approvers(
    seen: Mapping[tuple[str, str], Counter[tuple[str, ...] | None]],
) -> dict[str, dict[str, list[str] | None]]:
    found: dict[str, dict[str, list[str] | None]] = defaultdict(dict)
    for (model, version), counts in sorted(seen.items()):
        # ties go to the first listed: devices of one release agree unless one lies
        top, _ = max(counts.items(), key=lambda item: item[1])
        found[model][version] = None if top is None else list(top)
    return dict(found)


def latest(reports: Iterable[DeviceReport]) -> dict[str, DeviceReport]:
    """One report per device: the newest it sent (by its ``reported`` time)."""
    found: dict[str, DeviceReport] = {}
    for report in reports:
        held = found.get(report.device)
        if held is None or report.reported > held.reported:
            found[report.device] = report
    return found


def _by_version(item: tuple[str | None, int]) -> tuple[bool, semver.Version | None]:
    """SemVer order (1.9.0 before 1.10.0), nothing served last."""
    return item[0] is None, semver.Version.parse(item[0]) if item[0] else None


def _failure(state: ModelReport, version: str) -> str | None:
    """Why the device does not run ``version``, when its attempt failed (else None)."""
    update = state.last_update
    if (
        update is not None
        and update.result in ("failed", "rejected")
        and update.version in (version, None)
    ):
        return update.reason or update.result
    for rejected in reversed(state.rejected):
        if rejected.version == version:
            return f"rejected: {rejected.reason}"
    return None


def _comparisons(found: Iterable[Agreement]) -> tuple[Agreement, ...]:
    """Comparisons summed per previous version, the judged one first (module doc)."""
    by: dict[str, list[Agreement]] = defaultdict(list)
    for agreement in found:
        by[agreement.against].append(agreement)
    summed = [s for parts in by.values() if (s := combine(parts)) is not None]
    summed.sort(key=lambda a: semver.Version.parse(a.against), reverse=True)
    summed.sort(key=lambda a: (-a.devices, -a.compared))  # stable: ties stay newest first
    return tuple(summed)


def _progress(
    members: Sequence[DeviceReport],
    model: str,
    channel: str,
    target: ChannelTarget,
    stale: set[str],
) -> ChannelProgress:
    """The progress of one channel over the reports that follow it."""
    version, percent = target.version, target.percent
    cohort = on_target = 0
    failed: list[tuple[str, str]] = []
    pending: list[tuple[str, str | None]] = []
    stale_members: list[str] = []
    compared: list[Agreement] = []
    for report in members:
        if not in_cohort(report.device, model, version, percent):
            continue
        cohort += 1
        if report.device in stale:
            stale_members.append(report.device)
        state = report.models[model]
        if state.shadow is not None and state.shadow.version == version:
            compared.append(state.shadow)
        if state.serving is not None and state.serving.version == version:
            on_target += 1
            continue
        why = _failure(state, version)
        if why is not None:
            failed.append((report.device, why))
        else:
            sync = report.sync
            pending.append((report.device, sync.reason if sync.result == "failed" else None))
    return ChannelProgress(
        model, channel, version, percent, subscribed=len(members), cohort=cohort,
        on_target=on_target, failed=tuple(sorted(failed)), pending=tuple(sorted(pending)),
        stale=tuple(sorted(stale_members)),
        lowest_draw=min((cohort_draw(r.device, model, version) for r in members), default=None),
        hold=target.hold, comparisons=_comparisons(compared),
    )  # fmt: skip


def _stale(
    reports: Iterable[DeviceReport], now: datetime, stale_after_s: float
) -> list[StaleDevice]:
    found = []
    for report in reports:
        age = (now - report.reported).total_seconds()
        if age > stale_after_s:
            found.append(StaleDevice(report.device, report.reported, age))
    return sorted(found, key=lambda s: (-s.age_s, s.device))


def channel_progress(
    reports: Iterable[DeviceReport],
    model: str,
    channel: str,
    version: str,
    percent: float | None,
    *,
    now: datetime | None = None,
    stale_after_s: float = DEFAULT_STALE_AFTER_S,
) -> ChannelProgress:
    """The rollout of ``version`` at ``percent`` on ``model``'s ``channel``, as the
    devices report it (one report per device: the newest, see :func:`latest`).

    Args:
        reports: device reports (read with :mod:`fleet.reports`).
        model: the model.
        channel: the channel.
        version: the channel's target version.
        percent: its rollout percent (None or 100: every device).
        now: the time staleness is measured against (default: the current time).
        stale_after_s: a report older than this is stale.
    """
    now = now or datetime.now(UTC)
    devices = latest(reports).values()
    members = [r for r in devices if (m := r.models.get(model)) and m.channel == channel]
    stale = {s.device for s in _stale(members, now, stale_after_s)}
    return _progress(members, model, channel, ChannelTarget(version, percent), stale)


def summarize(
    reports: Iterable[DeviceReport],
    channels: Mapping[str, Mapping[str, ChannelTarget]],
    *,
    now: datetime | None = None,
    stale_after_s: float = DEFAULT_STALE_AFTER_S,
) -> FleetSummary:
    """The fleet in one pass: versions per model, every channel's progress, staleness.

    Args:
        reports: device reports (duplicates of a device: the newest counts).
        channels: per model, per channel, the declared target (empty when no repository
            was read: then there is no rollout progress, only what devices run).
        now: the time staleness is measured against (default: the current time).
        stale_after_s: a report older than this is stale.
    """
    now = now or datetime.now(UTC)
    devices = latest(reports)
    versions: dict[str, dict[str | None, int]] = defaultdict(lambda: defaultdict(int))
    following: dict[tuple[str, str], list[DeviceReport]] = defaultdict(list)
    approved: dict[tuple[str, str], Counter[tuple[str, ...] | None]] = defaultdict(Counter)
    trust_stale, stopped = [], []
    for report in devices.values():
        if report.trust.stale:
            trust_stale.append(report.device)
        if not report.daemon.running:
            stopped.append(report.device)
        for name, state in report.models.items():
            serving = state.serving
            versions[name][serving.version if serving else None] += 1
            following[(name, state.channel)].append(report)
            if serving is not None and serving.provenance is not None:
                who = serving.provenance.approvers
                approved[(name, serving.version)][None if who is None else tuple(who)] += 1
    stale = _stale(devices.values(), now, stale_after_s)
    stale_ids = {s.device for s in stale}
    progress = []
    for name in sorted(set(versions) & set(channels)):
        for channel, target in sorted(channels[name].items()):
            members = following.get((name, channel), [])
            progress.append(_progress(members, name, channel, target, stale_ids))
    undeclared = sorted(
        (model, channel, len(members))
        for (model, channel), members in following.items()
        if channel not in channels.get(model, {}) and channels
    )
    return FleetSummary(
        devices=len(devices),
        versions={m: dict(sorted(v.items(), key=_by_version)) for m, v in sorted(versions.items())},
        channels=progress,
        undeclared=undeclared,
        stale=stale,
        trust_stale=sorted(trust_stale),
        stopped=sorted(stopped),
        approvers=_approvers(approved),
    )
