"""One sync of the device: detect, verify, plan, fetch, verify bytes, apply, build,
self-test, swap, commit (docs/reference/daemon.md, "The loop").

:class:`Updater` is what the daemon calls once per poll.  Every file it acts on is a
TUF target verified by :class:`~edge_sync.sync.trust.DeviceTrust`; the watcher's source (the
git checkout, or the metadata mirrored to the artifact remote) carries only the
metadata.  A failure at any stage keeps what the device serves and is recorded
(``state.json``: ``sync`` for device-wide failures, the model's ``last_update``
otherwise).  A version that verified and then failed its self-test, or cannot run on
this device, is *rejected*: recorded with its reason and not tried again until its
signed description or artifact changes.

One sync reads top down: this module detects (:mod:`edge_sync.sync.watcher`), verifies
the metadata (:mod:`edge_sync.sync.trust`) and hands each model to
:class:`~edge_sync.sync.install.Installer`, which plans (the pure
:func:`edge_sync.decide.plan.plan_update`: cached, delta chain, full or engine),
fetches, builds, self-tests and swaps through the health gates
(:class:`~edge_sync.sync.gates.Gates`).  None of them calls back up.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal

from edge_sync import clock
from edge_sync.clock import now_iso
from edge_sync.config import EdgeConfig
from edge_sync.decide.health import GatePolicy
from edge_sync.engine.base import EngineHost
from edge_sync.errors import SourceError, StoppedError
from edge_sync.serve.recorder import Recorder
from edge_sync.serve.shadow import ShadowRunner
from edge_sync.state.models import (
    DeviceState,
    ModelState,
    SyncInfo,
    UpdateRecord,
    reason_text,
)
from edge_sync.state.store import StateDir
from edge_sync.sync.external import collect_views
from edge_sync.sync.gates import Gates, OpenGate, commit_quietly, load_state
from edge_sync.sync.install import Installer, Observer, Stages, stop_if_stopping
from edge_sync.sync.limits import TrustLimits
from edge_sync.sync.startup import resume
from edge_sync.sync.trust import DeviceTrust, freshness
from edge_sync.sync.watcher import Head, Watcher, watcher_for
from registry.cohort import in_cohort
from signing.errors import SigningError, VerificationError
from signing.tuf_facts import ChannelEntry, ChannelsDoc, check_channels_successor

__all__ = ["STAGES", "StoppedError", "SyncOutcome", "Updater", "in_cohort"]

STAGES: Final = (
    "detect", "verify_metadata", "plan", "fetch", "verify_bytes", "apply_delta", "layout",
    "build", "self_test", "swap", "commit", "confirm",
)  # fmt: skip


FailureKind = Literal["repository", "trust", "model", "internal"]


@dataclass
class SyncOutcome:
    """What one sync did.

    Attributes:
        result: ``current`` (nothing new), ``updated`` (something installed) or
            ``failed`` (a device-wide or a model's failure: back off).
        reason: why it failed (device-wide failures).
        updates: the update record of each model that changed this sync.
    """

    result: Literal["current", "updated", "failed"]
    reason: str | None = None
    updates: dict[str, UpdateRecord] = field(default_factory=dict)
    failure: FailureKind | None = None
    """What failed, in a word (``/metrics`` counts sync failures by it): the
    ``repository`` (the source of metadata), ``trust`` (its verification), a ``model``'s
    update, or ``internal`` (a bug the daemon outlived)."""

    def add(self, name: str, record: UpdateRecord) -> str | None:
        """Count one model's record; the reason when it failed."""
        self.updates[name] = record
        if record.result == "installed":
            self.result = "updated" if self.result != "failed" else "failed"
        elif record.result == "failed":
            self.result = "failed"
            self.failure = self.failure or "model"
            return f"{name}: {record.reason}"
        return None


class Updater:
    """Brings one device's models to what their channels assign, safely."""

    def __init__(
        self,
        config: EdgeConfig,
        state: StateDir,
        host: EngineHost,
        *,
        limits: TrustLimits | None = None,
        watcher: Watcher | None = None,
        observer: Observer | None = None,
        should_stop: Callable[[], bool] | None = None,
        gate: GatePolicy | None = None,
        recorder: Recorder | None = None,
        shadow: ShadowRunner | None = None,
    ) -> None:
        """Update the models of ``config`` in ``state``, serving through ``host``.

        The caller holds the state dir's lock.  ``observer`` hears every stage start
        and end; ``should_stop`` is asked at every stage boundary and between the chunks
        of a download (a stopping daemon ends its sync there).  ``gate`` watches each
        swap on what ``recorder`` saw (see :mod:`edge_sync.sync.gates`), and ``shadow``
        runs the comparisons a gate asks for (``edge_sync.serve.shadow``).
        """
        self.observer = observer
        self.should_stop = should_stop
        self.config = config
        self.state = state
        self.host = host
        self.limits = limits or TrustLimits()
        self.watcher = watcher or watcher_for(
            config, state.root, state.checkout, limits=self.limits, cancelled=should_stop
        )
        self.health = Gates(gate, recorder, host, state, shadow)
        self.installer = Installer(config, state, host, self.health, observer=observer,
                                   should_stop=should_stop)  # fmt: skip
        self.settled: dict[str, UpdateRecord] = {}
        """The gates the last :meth:`sync` closed before it began (see :meth:`check_gates`)."""

    # --- the health gates, for the daemon (edge_sync.sync.gates) ------------------------

    @property
    def gates(self) -> dict[str, OpenGate]:
        """Per model, the health gate watching its newest install."""
        return self.health.open

    def next_gate_s(self) -> float | None:
        """Seconds until an open gate should be judged again (None: no gate is open)."""
        return self.health.next_check_s()

    def check_gates(self) -> dict[str, UpdateRecord]:
        """Judge and close the open gates, committing what closed (``Gates.check``)."""
        return self.health.check()

    def watch_gates(self) -> list[str]:
        """Swap back failing versions at once (the daemon's watcher thread: ``Gates.watch``)."""
        return self.health.watch()

    def take_retries(self) -> list[tuple[str, str]]:
        """(model, reason) of each gate given a second window (``Gates.take_retries``)."""
        return self.health.take_retries()

    # --- start-up (edge_sync.sync.startup) -------------------------------------------

    def resume(self, *, unclean: bool = False) -> dict[str, str]:
        """Serve what the state file names, with no network (see
        :func:`edge_sync.sync.startup.resume`; ``unclean``: the daemon's last stop was).

        Returns:
            What could not be resumed, by model (a corrupt blob, an engine that fails).
        """
        return resume(self.config, self.state, self.installer, self.health, unclean=unclean)

    # --- one sync ------------------------------------------------------------------------

    def sync(self) -> SyncOutcome:
        """Run one sync (see the module doc); never raises for a remote's failures.

        Open health gates are judged first (:attr:`settled` says what closed), so that a
        new version replaces a judged one where it can.
        """
        self.settled = self.check_gates()
        state = load_state(self.state)
        stages = Stages(observer=self.observer, should_stop=self.should_stop)
        try:
            with stages("detect"):
                head = self.watcher.sync()
        except SourceError as e:
            stop_if_stopping(self.should_stop, e)
            return self._device_failure(state, f"repository: {e}", kind="repository")
        if self._idle(state, head):
            # Nothing new: the idle poll leaves state.json alone (flash wears), and
            # notes the check in sync.json, which a power cut may lose harmlessly.
            self.state.note_sync(SyncInfo(
                last_checked=now_iso(), result="current", commit=head.commit))  # fmt: skip
            return SyncOutcome("current")
        try:
            with stages("verify_metadata"):
                trust, channels = self._verified(state, head)
        except (SigningError, ValueError) as e:
            stop_if_stopping(self.should_stop, e)
            said = str(e) if str(e).startswith("trust metadata") else f"trust metadata: {e}"
            return self._device_failure(state, said, commit=head.commit, kind="trust")
        return self._update_all(state, head, trust, channels, stages)

    def _idle(self, state: DeviceState, head: Head) -> bool:
        """Whether nothing changed since the last sync that found all current (and every
        model serves what the state names, and trust has not expired)."""
        pending = any(
            (m.last_update is not None and m.last_update.result == "failed")
            or m.attempt is not None  # a version to load again (decide.restarts)
            for m in state.models.values()
        )
        return (
            not head.changed
            and state.sync.commit == head.commit
            and state.sync.result == "current"
            and not pending
            and set(state.models) >= {s.name for s in self.config.models}
            and all(
                m.serving is None or self.installer.serves(name, m.serving.sha256)
                for name, m in state.models.items()
            )
            and not self._trust_expired()
        )

    def _verified(self, state: DeviceState, head: Head) -> tuple[DeviceTrust, ChannelsDoc]:
        """The refreshed trust metadata and its channels document, a successor of the
        last one accepted."""
        trust = DeviceTrust(
            self.state.root,
            None,
            self.config.artifacts.url,
            metadata=self.watcher.metadata,
            prefetched=head.prefetched,
            limits=self.limits,
            cancelled=self.should_stop,
        )
        trust.refresh()
        channels = trust.channels()
        if state.channels is not None:
            check_channels_successor(ChannelsDoc.model_validate(state.channels), channels)
        return trust, channels

    def _update_all(
        self,
        state: DeviceState,
        head: Head,
        trust: DeviceTrust,
        channels: ChannelsDoc,
        stages: Stages,
    ) -> SyncOutcome:
        """Bring every subscribed model to its channel's version, then commit the sync."""
        outcome = SyncOutcome("current")
        failed: str | None = None
        accepted = channels.model_dump(mode="json")
        for sub in self.config.models:
            model = state.models.get(sub.name) or ModelState(channel=sub.channel)
            if model.channel != sub.channel:
                model = model.model_copy(update={"channel": sub.channel})
            model = _attempting(model, channels.models.get(sub.name, {}).get(sub.channel))

            def commit(installed: ModelState, name: str = sub.name) -> None:
                nonlocal state
                state = state.with_model(name, installed).model_copy(update={"channels": accepted})
                self.state.commit(state)

            record, model = self.installer.update(trust, channels, sub.name, model, stages, commit)
            state = state.with_model(sub.name, model)
            if record is not None:
                why = outcome.add(sub.name, record)
                failed = failed or why
        sync = SyncInfo(last_checked=now_iso(), reason=failed, commit=head.commit,
                        result="failed" if outcome.result == "failed" else "current")  # fmt: skip
        state = state.model_copy(
            update={"device": self.config.device.id, "channels": accepted, "sync": sync}
        )
        unsaved = commit_quietly(self.state, state)
        self._collect(resumable=outcome.result == "failed")
        if unsaved is not None:
            outcome.result, failed = "failed", failed or unsaved
        outcome.reason = failed
        return outcome

    def _collect(self, *, resumable: bool) -> None:
        """Remove what nothing needs: blobs the committed state does not name and no
        loaded engine maps, descriptions of versions it does not name, temporary files,
        and partial downloads (unless a failed sync may resume them)."""
        committed = load_state(self.state)
        try:
            pinned = self.host.mapped_blobs() | self.installer.kept_blobs(committed)
        except OSError:  # a held version's layout unreadable: which blobs it maps is unknown
            pinned = None
        if pinned is not None:
            self.state.blobs.collect(committed.referenced_blobs() | pinned)
            collect_views(self.state.root, committed.referenced_blobs() | pinned)
        self.installer.collect_descriptions(committed)
        self.state.blobs.clear_tmp()
        if not resumable:
            shutil.rmtree(self.state.partials, ignore_errors=True)

    def _trust_expired(self) -> bool:
        """Whether any trusted role has expired, or no timestamp is held yet (then an
        idle poll verifies again, and reports the freeze instead of "current").

        Every role counts: a timestamp key alone can keep the timestamp fresh over a
        snapshot or targets past their own bound (see ``trust.expired_roles``).
        """
        try:
            return freshness(self.state.root, clock.now()).stale is not False
        except VerificationError:
            return True  # unreadable: verify

    def _device_failure(
        self,
        state: DeviceState,
        reason: str,
        commit: str | None = None,
        *,
        kind: FailureKind = "trust",
    ) -> SyncOutcome:
        """Record a failure of the whole sync (the models keep what they serve)."""
        reason = reason_text(reason)
        state = state.model_copy(update={"sync": SyncInfo(
            last_checked=now_iso(), result="failed", reason=reason,
            commit=commit or state.sync.commit)})  # fmt: skip
        commit_quietly(self.state, state)
        return SyncOutcome("failed", reason, failure=kind)


def _attempting(model: ModelState, entry: ChannelEntry | None) -> ModelState:
    """``model`` without an attempt at a version its channel no longer assigns (its
    count of unclean stops is about that version only)."""
    if model.attempt is None or (entry is not None and model.attempt.version == entry.version):
        return model
    return model.model_copy(update={"attempt": None})
