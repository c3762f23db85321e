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

The plan picks the cheapest verified way to the version's bytes: a blob already held
(``cached``); a chain of signed deltas from a version held locally when their total is
smaller than the full file (``delta``); else the full artifact (``full``), or the
prebuilt engine for the chosen target when its engine is not one the device builds
itself (``engine``; TensorRT plans).  ONNX Runtime targets always take the artifact,
which later deltas apply to.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from edge_sync import clock
from edge_sync.clock import now_iso
from edge_sync.config import EdgeConfig
from edge_sync.decide.health import BASELINE_WINDOWS, GatePolicy, Verdict, judge
from edge_sync.decide.restarts import after_stop, rejection_reason
from edge_sync.engine.base import Engine, EngineHost, LoadRequest, SetupHost
from edge_sync.engine.selftest import GoldenArrays, self_test
from edge_sync.errors import EngineError, SourceError, StoppedError
from edge_sync.serve.recorder import Recorder
from edge_sync.state.models import (
    Attempt,
    DeviceState,
    GateRecord,
    Installed,
    ModelState,
    Rejected,
    SyncInfo,
    UpdateRecord,
    reason_text,
)
from edge_sync.state.store import StateDir
from edge_sync.sync.external import collect_views, model_view, obtain_data
from edge_sync.sync.limits import TrustLimits
from edge_sync.sync.trust import (
    DeviceTrust,
    SignedTarget,
    expect_facts,
    freshness,
    last_channels,
    trusted_targets,
)
from edge_sync.sync.watcher import Watcher, watcher_for
from registry.cohort import in_cohort
from registry.errors import RegistryError
from signing.errors import FileSetError, SigningError, VerificationError
from signing.target_names import artifact_path, delta_path, golden_path, version_path
from signing.tuf_facts import ChannelEntry, ChannelsDoc, TargetKind, check_channels_successor
from signing.version_doc import VersionDoc

if TYPE_CHECKING:
    from registry.schema import Target

__all__ = ["STAGES", "StoppedError", "SyncReport", "Updater", "in_cohort"]

STAGES: Final = (
    "detect", "verify_metadata", "plan", "fetch", "verify_bytes", "apply_delta", "build",
    "self_test", "swap", "commit",
)  # fmt: skip
DESCRIPTIONS_DIR: Final = "descriptions"
"""Signed descriptions of installed versions, kept to rebuild engines offline."""
GATE_CHECK_S: Final = 0.25
"""How often an open health gate is judged (errors fail it before its window ends)."""
MAX_DELTA_CHAIN: Final = 16
"""Most deltas applied in a row (each is a full decode of the model)."""


Observer = Callable[[str, str], None]
"""Called with (stage, "start" | "end") around every stage (metrics, crash tests)."""


class _Stages:
    """Milliseconds per stage of one update."""

    def __init__(
        self,
        start: Mapping[str, float] | None = None,
        observer: Observer | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self.ms: dict[str, float] = dict(start or {})
        self.observer = observer
        self.should_stop = should_stop

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        if self.should_stop is not None and self.should_stop():
            raise StoppedError(f"stopped before {stage}")
        if self.observer is not None:
            self.observer(stage, "start")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.ms[stage] = round(self.ms.get(stage, 0.0) + (time.perf_counter() - t0) * 1000, 3)
        if self.observer is not None:
            self.observer(stage, "end")


@dataclass(frozen=True)
class _OpenGate:
    """A version swapped in and watched: the engine it replaced stays loaded."""

    model: str
    version: str
    new: Engine
    old: Engine
    before: ModelState
    installed: Installed
    signed: str
    swapped: float
    """When its current window opened (the swap, or a retry)."""
    baseline_until: float = 0.0
    """When the swap happened: the previous version's answers before it are the baseline."""
    retried: bool = False
    """Its first window failed on latency alone: this is its second (``health.judge``)."""


class _RejectedError(Exception):
    """The version cannot be installed on this device: reject it (no backoff)."""


@dataclass
class SyncReport:
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


@dataclass(frozen=True)
class _Plan:
    method: Literal["cached", "delta", "full", "engine"]
    kind: Literal["artifact", "engine"]
    sha256: str
    target_path: str
    chain: tuple[tuple[str, str, SignedTarget], ...] = ()  # (version, from, delta info), base first
    base_sha256: str | None = None


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
    ) -> None:
        """Update the models of ``config`` in ``state``, serving through ``host``.

        The caller holds the state dir's lock.  ``observer`` hears every stage start
        and end; ``should_stop`` is asked at every stage boundary and between the chunks
        of a download (a stopping daemon ends its sync there).
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
        self.gate = gate if gate is not None and gate.window_s > 0 and recorder else None
        self.recorder = recorder
        self.settled: dict[str, UpdateRecord] = {}
        """The gates the last :meth:`sync` closed before it began (see :meth:`check_gates`)."""
        self.gates: dict[str, _OpenGate] = {}
        self._failed: dict[str, tuple[_OpenGate, str, float]] = {}
        self._retries: list[tuple[str, str]] = []
        self._gate_lock = threading.RLock()
        """Per model, the health gate watching its newest install (see :meth:`check_gates`)."""

    def _load(self) -> DeviceState:
        """The committed state (a corrupt one recovered: see ``StateDir.load_or_recover``)."""
        return self.state.load_or_recover(lambda: last_channels(self.state.root))

    # --- start-up ------------------------------------------------------------------------

    def resume(self, *, unclean: bool = False) -> dict[str, str]:
        """Serve what the state file names, with no network: each model's current
        version, else its previous or last known good one whose blob still verifies.

        A version whose health gate was open, or that was being loaded, when the daemon
        stopped is decided by :func:`edge_sync.decide.restarts.after_stop`: its gate opens
        again (what it replaced loaded to fall back to) and an unclean stop (``unclean``:
        killed, crashed, out of memory, a power cut) is counted; the second unclean stop
        during the same version's gate or load rejects it, and what it replaced is
        served.  The count is committed before any engine is loaded, so a version that
        kills the daemon while it loads at start-up is counted too.

        Returns:
            What could not be resumed, by model (a corrupt blob, an engine that fails).
        """
        loaded = self._load()
        state = self._ungated(self._rebuilt(loaded), unclean=unclean)
        if state != loaded:
            self.state.commit(state)  # counted before anything loads (see above)
        self.state.blobs.clear_tmp()
        problems: dict[str, str] = {}
        changed = False
        for name, held in state.models.items():
            model = held
            for installed in (held.serving, held.previous, held.last_known_good):
                if installed is None:
                    continue
                if not self.state.blobs.verify(installed.sha256):
                    # A rotten file is never served, nor taken as a cached copy later.
                    self.state.blobs.discard(installed.sha256)
                    problems[name] = f"blob of {installed.version} is missing or corrupt"
                    continue
                try:
                    engine = self.host.build(self._request(name, installed))
                except (EngineError, OSError) as e:
                    problems[name] = str(e)
                    continue
                old = self.host.swap(name, engine)
                if old is not None:
                    self.host.retire(old)
                if installed is not model.serving:
                    model = model.model_copy(update={"serving": installed})
                    state = state.with_model(name, model)
                    changed = True
                problems.pop(name, None)
                break
        if changed:
            self.state.commit(state)
        self._reopen_gates(state)
        return problems

    def _ungated(self, state: DeviceState, *, unclean: bool) -> DeviceState:
        """``state`` with each open gate and attempt settled for a start-up (see
        :meth:`resume` and :mod:`edge_sync.decide.restarts`)."""
        for name, held in state.models.items():
            model, attempt, gate = held, held.attempt, held.gate
            if attempt is not None:
                decision, stops = after_stop("attempt", attempt.unclean_stops, unclean=unclean)
                if decision == "reject":
                    reason = rejection_reason("attempt", stops)
                    model = _rejected(model, attempt.version, attempt.sha256, attempt.signed,
                                      reason).model_copy(update={"attempt": None})  # fmt: skip
                else:
                    model = model.model_copy(
                        update={"attempt": attempt.model_copy(update={"unclean_stops": stops})}
                    )
            if gate is not None:
                decision, stops = after_stop(
                    "gate", gate.unclean_stops, unclean=unclean, gated=self.gate is not None
                )
                if decision == "stand":  # no gate configured any more: the version stands
                    model = model.model_copy(
                        update={"gate": None, "last_known_good": model.serving}
                    )
                elif decision == "reopen":  # opened again once engines are loaded
                    model = model.model_copy(
                        update={"gate": gate.model_copy(update={"unclean_stops": stops})}
                    )
                else:
                    reason = rejection_reason("gate", stops)
                    model = _rejected(model, gate.version, gate.sha256, gate.signed, reason)
                    model = model.model_copy(update={
                        "serving": gate.restore_serving, "previous": gate.restore_previous,
                        "last_known_good": gate.restore_last_known_good, "gate": None})  # fmt: skip
            state = state.with_model(name, model)
        return state

    def _reopen_gates(self, state: DeviceState) -> None:
        """Watch again, after a clean restart, each version whose gate was open; the
        version it replaced is loaded to fall back to (without it the version stands)."""
        if self.gate is None:
            return
        for name, model in state.models.items():
            gate, serving = model.gate, self.host.current(name)
            if gate is None or serving is None or serving.sha256 != gate.sha256:
                continue
            fallback = gate.restore_serving
            old = None
            if fallback is not None and self.state.blobs.verify(fallback.sha256):
                with contextlib.suppress(EngineError, OSError):
                    old = self.host.build(self._request(name, fallback))
            if old is None or model.serving is None:
                continue
            before = model.model_copy(update={
                "serving": gate.restore_serving, "previous": gate.restore_previous,
                "last_known_good": gate.restore_last_known_good, "gate": None})  # fmt: skip
            now = time.monotonic()  # no baseline: the recorder starts empty
            self.gates[name] = _OpenGate(name, gate.version, serving, old, before,
                                         model.serving, gate.signed, now, now)  # fmt: skip

    def _rebuilt(self, state: DeviceState) -> DeviceState:
        """``state`` with what each subscribed model served filled in from the device's
        own verified records, when the state file was lost (a fresh one names nothing):
        the last verified channels document says the version, the trusted targets
        metadata its digest, and a blob of that digest is served if it still verifies.
        """
        if state.channels is None:
            return state
        try:
            channels = ChannelsDoc.model_validate(state.channels)
        except ValueError:
            return state
        found = trusted_targets(self.state.root)
        for sub in self.config.models:
            model = state.models.get(sub.name)
            if model is not None and model.serving is not None:
                continue
            entry = channels.models.get(sub.name, {}).get(sub.channel)
            sha256 = found.get(artifact_path(sub.name, entry.version)) if entry else None
            if entry is None or sha256 is None or not self.state.blobs.verify(sha256):
                continue
            installed = Installed(version=entry.version, sha256=sha256, artifact_sha256=sha256)
            base = model or ModelState(channel=sub.channel)
            state = state.with_model(sub.name, base.model_copy(update={"serving": installed}))
        return state

    def _request(self, name: str, installed: Installed) -> LoadRequest:
        target = None
        # The target's settings are in the signed description, kept beside the blob.
        desc = self.state.root / DESCRIPTIONS_DIR / f"{name}-{installed.version}.json"
        if installed.target and desc.is_file():
            try:
                doc = VersionDoc.from_bytes(desc.read_bytes())
                target = next((t for t in doc.targets if t.name == installed.target), None)
            except ValueError:
                target = None
        path = self.state.blobs.path(installed.sha256)
        if installed.external:  # the .onnx with its data files beside it
            path = model_view(self.state.root, self.state.blobs, installed.sha256,
                              installed.external)  # fmt: skip
        return LoadRequest(name, installed.version, path, installed.sha256, installed.kind, target)

    # --- one sync ------------------------------------------------------------------------

    def sync(self) -> SyncReport:
        """Run one sync (see the module doc); never raises for a remote's failures.

        Open health gates are judged first (:attr:`settled` says what closed), so that a
        new version replaces a judged one where it can.
        """
        self.settled = self.check_gates()
        state = self._load()
        stages = _Stages(observer=self.observer, should_stop=self.should_stop)
        try:
            with stages("detect"):
                head = self.watcher.sync()
        except SourceError as e:
            self._stop_if_stopping(e)
            return self._device_failure(state, f"repository: {e}")
        pending = any(
            (m.last_update is not None and m.last_update.result == "failed")
            for m in state.models.values()
        )
        if (
            not head.changed
            and state.sync.commit == head.commit
            and state.sync.result == "current"
            and not pending
            and set(state.models) >= {s.name for s in self.config.models}
            and all(
                m.serving is None or self._serves(name, m.serving.sha256)
                for name, m in state.models.items()
            )
            and not self._trust_expired()
        ):
            # Nothing new: the idle poll leaves state.json alone (flash wears), and
            # notes the check in sync.json, which a power cut may lose harmlessly.
            self.state.note_sync(SyncInfo(
                last_checked=now_iso(), result="current", commit=head.commit))  # fmt: skip
            return SyncReport("current")
        try:
            with stages("verify_metadata"):
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
        except (SigningError, ValueError) as e:
            self._stop_if_stopping(e)
            said = str(e) if str(e).startswith("trust metadata") else f"trust metadata: {e}"
            return self._device_failure(state, said, commit=head.commit)
        report = SyncReport("current")
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

            record, model = self._update(
                trust, channels, sub.name, sub.channel, model, stages, commit
            )
            state = state.with_model(sub.name, model)
            if record is not None:
                report.updates[sub.name] = record
                if record.result == "installed":
                    report.result = "updated" if report.result != "failed" else "failed"
                elif record.result == "failed":
                    report.result = "failed"
                    failed = failed or f"{sub.name}: {record.reason}"
        state = state.model_copy(
            update={
                "device": self.config.device.id,
                "channels": accepted,
                "sync": SyncInfo(
                    last_checked=now_iso(),
                    result="failed" if report.result == "failed" else "current",
                    reason=failed,
                    commit=head.commit,
                ),
            }
        )
        unsaved = self._commit_quietly(state)
        self._collect(resumable=report.result == "failed")
        if unsaved is not None:
            report.result, failed = "failed", failed or unsaved
        report.reason = failed
        return report

    def _collect(self, *, resumable: bool) -> None:
        """Remove what nothing needs: blobs the committed state does not name and no
        loaded engine maps, descriptions of versions it does not name, temporary files,
        and partial downloads (unless a failed sync may resume them)."""
        committed = self._load()
        mapped = getattr(self.host, "mapped_blobs", None)
        pinned = mapped() if callable(mapped) else set()
        self.state.blobs.collect(committed.referenced_blobs() | pinned)
        collect_views(self.state.root, committed.referenced_blobs() | pinned)
        self._collect_descriptions(committed)
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

    def _stop_if_stopping(self, error: Exception, then: Callable[[], None] | None = None) -> None:
        """A poll or a metadata download cut by a stopping daemon is no failure of the
        source: end the sync as at a stage boundary, recording nothing but what ``then``
        commits first (kept as it was if that write fails: a restart counts it as clean).

        Raises:
            StoppedError: the daemon is stopping.
        """
        if self.should_stop is not None and self.should_stop():
            if then is not None:
                with contextlib.suppress(OSError):
                    then()
            raise StoppedError(f"stopped during the sync ({error})") from error

    def _device_failure(
        self, state: DeviceState, reason: str, commit: str | None = None
    ) -> SyncReport:
        reason = reason_text(reason)
        state = state.model_copy(update={"sync": SyncInfo(
            last_checked=now_iso(), result="failed", reason=reason,
            commit=commit or state.sync.commit)})  # fmt: skip
        self._commit_quietly(state)
        return SyncReport("failed", reason)

    def _commit_quietly(self, state: DeviceState) -> str | None:
        """Commit ``state``; why not, when the disk refuses (the old state stays, and
        the device keeps serving: a full disk is a failed sync, not a crash)."""
        try:
            self.state.commit(state)
        except OSError as e:
            return f"state not saved: {e.strerror or e}"
        return None

    def _update(  # noqa: PLR0917 - one private call site
        self,
        trust: DeviceTrust,
        channels: ChannelsDoc,
        name: str,
        channel: str,
        model: ModelState,
        sync_stages: _Stages,
        commit: Callable[[ModelState], None],
    ) -> tuple[UpdateRecord | None, ModelState]:
        """Bring one model to its channel's version; (the update record, new state)."""
        entry = channels.models.get(name, {}).get(channel)
        if entry is None:
            return None, model  # nothing assigned: keep serving what we serve
        version = entry.version
        if not in_cohort(self.config.device.id, name, version, entry.percent):
            return None, model
        if (
            model.serving is not None
            and model.serving.version == version
            and self._serves(name, model.serving.sha256)
        ):
            return None, model
        stages = _Stages(sync_stages.ms, self.observer, self.should_stop)
        fetched_before = trust.bytes_downloaded
        plan: _Plan | None = None
        signed_key = ""
        try:
            with stages("plan"):
                why = trust.deprecation(name, version)
                if why is not None:
                    # CI never assigns a deprecated version (validation refuses it): a
                    # signing mistake or a compromise.  Never install it, keep serving.
                    return self._refuse_deprecated(model, version, why)
                art = trust.target_info(artifact_path(name, version))
                # the facts signed with it, before any way to its bytes (a held blob too)
                expect_facts(art, model=name, version=version, kind="artifact")
                doc, doc_sha = self._description(trust, name, version)
                signed_key = hashlib.sha256(f"{art.sha256}:{doc_sha}".encode()).hexdigest()
                if any(r.version == version and r.signed == signed_key for r in model.rejected):
                    return None, model  # rejected before, and nothing signed changed since
                target = self._target(doc)
                plan = self._plan(trust, name, version, art, model, target)
            path, method = self._obtain(trust, name, version, plan, stages)
            path, method, external = self._external_data(
                trust, (name, version), doc, art, (path, method, plan), stages=stages
            )
            plan = _Plan(method, plan.kind, plan.sha256, plan.target_path)
            installed = Installed(
                version=version,
                sha256=plan.sha256,
                artifact_sha256=art.sha256 if plan.kind == "artifact" else None,
                target=target.name if target is not None else None,
                kind=plan.kind,
                external=external,
            )
            self._keep_description(name, version, doc)
            model, attempt = self._attempt(model, installed, signed_key, commit)
            engine = self._build_and_test(
                trust, LoadRequest(name, version, path, plan.sha256, plan.kind, target), doc, stages
            )
            with stages("swap"):
                old, carried = self._swap_in(name, engine)

            def installed_record() -> UpdateRecord:
                return UpdateRecord(
                    result="installed", version=version, method=_said(plan.method),
                    bytes_fetched=trust.bytes_downloaded - fetched_before, finished=now_iso(),
                    stages_ms=stages.ms,
                )  # fmt: skip

            with stages("commit"):
                before = carried.before if carried is not None else model
                model = self._commit_install(
                    model, installed, installed_record(), (old, engine), commit,
                    before=before, signed=signed_key, stops=attempt.unclean_stops,
                )  # fmt: skip
            if old is not None:
                now = time.monotonic()
                self._watch_or_retire(_OpenGate(
                    name, version, engine, old, before, installed, signed_key, now, now
                ))  # fmt: skip
            record = installed_record()
        except (_RejectedError, EngineError, ValueError) as e:
            # ValueError: signed data that cannot be used here (a bad case name)
            reason = _one_line(e)
            rejected = [*model.rejected, Rejected(
                version=version, sha256=plan.sha256 if plan else "", signed=signed_key,
                reason=reason, at=now_iso())][-32:]  # fmt: skip
            model = model.model_copy(update={"rejected": rejected})
            record = UpdateRecord(
                result="rejected", version=version, method=_said(plan.method) if plan else None,
                bytes_fetched=trust.bytes_downloaded - fetched_before, reason=reason,
                finished=now_iso(), stages_ms=stages.ms,
            )  # fmt: skip
        except (RegistryError, OSError) as e:
            # a download cut by the stop is resumed, not failed; the attempt is taken
            # back (a clean stop blames no version)
            self._stop_if_stopping(e, then=lambda: commit(model))
            record = UpdateRecord(
                result="failed", version=version, method=_said(plan.method) if plan else None,
                bytes_fetched=trust.bytes_downloaded - fetched_before, reason=_one_line(e),
                finished=now_iso(), stages_ms=stages.ms,
            )  # fmt: skip
        finally:
            shutil.rmtree(self._work(name), ignore_errors=True)
        return record, model.model_copy(update={"last_update": record})

    def _attempt(
        self,
        model: ModelState,
        installed: Installed,
        signed: str,
        commit: Callable[[ModelState], None],
    ) -> tuple[ModelState, Attempt]:
        """Record, fsynced, that ``installed`` is about to be loaded (a version that kills
        the daemon now is counted at the next start: :mod:`edge_sync.decide.restarts`); the
        model without the record (what a refusal or failure commits) and the record."""
        prior = model.attempt
        same = prior is not None and (prior.version, prior.signed) == (installed.version, signed)
        attempt = Attempt(
            version=installed.version, signed=signed, sha256=installed.sha256,
            started=now_iso(), unclean_stops=prior.unclean_stops if prior and same else 0,
        )  # fmt: skip
        model = model.model_copy(update={"attempt": None})
        commit(model.model_copy(update={"attempt": attempt}))
        return model, attempt

    def _refuse_deprecated(
        self, model: ModelState, version: str, why: str
    ) -> tuple[UpdateRecord | None, ModelState]:
        signed = hashlib.sha256(f"deprecated:{why}".encode()).hexdigest()
        if any(r.version == version and r.signed == signed for r in model.rejected):
            return None, model  # said once: not again at every poll
        reason = reason_text(f"version {version} is deprecated ({why}); not installed")
        refused = Rejected(version=version, sha256="", signed=signed, reason=reason, at=now_iso())
        rejected = [*model.rejected, refused][-32:]
        record = UpdateRecord(result="rejected", version=version, reason=reason, finished=now_iso())
        return record, model.model_copy(update={"rejected": rejected, "last_update": record})

    def _external_data(
        self,
        trust: DeviceTrust,
        which: tuple[str, str],
        doc: VersionDoc | None,
        art: SignedTarget,
        obtained: tuple[Path, Literal["cached", "delta", "full", "engine"], _Plan],
        *,
        stages: _Stages,
    ) -> tuple[Path, Literal["cached", "delta", "full", "engine"], dict[str, str]]:
        """The version's ONNX external data files in the blob store, verified, and the
        file to load: the ``.onnx`` in a view beside them (``edge_sync.sync.external``)."""
        path, method, plan = obtained
        if plan.kind != "artifact":  # a prebuilt engine is one self-contained file
            return path, method, {}
        name, version = which
        external, data_method = obtain_data(
            trust, self.state.blobs, name, version, doc, art.facts.parent,
            self._work(name), self.state.partials, stages,
        )  # fmt: skip
        if not external:
            return path, method, {}
        view = model_view(self.state.root, self.state.blobs, plan.sha256, external)
        return view, _worst(method, data_method), external

    # --- health gates ---------------------------------------------------------------------

    def next_gate_s(self) -> float | None:
        """Seconds until an open gate should be judged again (None: no gate is open)."""
        if self.gate is None or not self.gates:
            return None
        return GATE_CHECK_S

    def check_gates(self) -> dict[str, UpdateRecord]:
        """Judge every open gate (:func:`edge_sync.decide.health.judge`): a passed one retires
        the previous engine and makes the version last known good; a failed one swaps
        the previous engine back (one reference assignment: no request fails), rejects
        the version with the gate's reason, and commits the state.

        Returns:
            The update record of each model whose gate closed: ``installed`` (passed;
            its reason says what the gate saw) or ``rejected`` (rolled back).
        """
        if self.gate is None or self.recorder is None:
            return {}
        self.watch_gates()  # failures are swapped back first, as the watcher thread does
        with self._gate_lock:
            failed, self._failed = self._failed, {}
            open_gates = list(self.gates.items())
        rolled = {name: self._commit_rollback(name, *f) for name, f in failed.items()}
        for name, gate in open_gates:
            verdict = self._judge(gate)
            if verdict.decision == "pass":
                self._close_gate(name, passed=True)
                rolled[name] = UpdateRecord(
                    result="installed", version=gate.version, reason=verdict.reason,
                    finished=now_iso(),
                )  # fmt: skip
        return rolled

    def watch_gates(self) -> list[str]:
        """Swap back, at once, every gated version that fails its gate (thread-safe: the
        daemon's watcher thread calls it, so that a sync with a long download does not
        keep a failing version serving); the state is committed by :meth:`check_gates`
        on the daemon's thread.  A gate failing on latency alone for the first time opens
        a second window instead (:meth:`take_retries` says which).

        Returns:
            The models swapped back.
        """
        if self.gate is None or self.recorder is None:
            return []
        swapped: list[str] = []
        with self._gate_lock:
            for name, gate in list(self.gates.items()):
                verdict = self._judge(gate)
                if verdict.decision == "retry":
                    # a latency-only failure: one more window before it is a verdict
                    self.gates[name] = replace(gate, swapped=time.monotonic(), retried=True)
                    self._retries.append((name, verdict.reason))
                    continue
                if verdict.decision != "fail":
                    continue
                del self.gates[name]
                start = time.perf_counter()
                self.host.swap(name, gate.old)
                self.host.retire(gate.new)
                ms = round((time.perf_counter() - start) * 1000, 3)
                self._failed[name] = (gate, verdict.reason, ms)
                swapped.append(name)
        return swapped

    def take_retries(self) -> list[tuple[str, str]]:
        """(model, reason) of each gate given a second window since the last call (a
        latency-only failure: ``edge_sync.decide.health.judge``), for the daemon's log."""
        with self._gate_lock:
            retries, self._retries = self._retries, []
        return retries

    def _judge(self, gate: _OpenGate) -> Verdict:
        assert self.gate is not None  # noqa: S101 - callers check
        assert self.recorder is not None  # noqa: S101
        now = time.monotonic()
        new = self.recorder.window(gate.model, gate.version, gate.swapped, now + 1)
        # the baseline: the previous version's answers in the windows before the swap
        until = gate.baseline_until or gate.swapped
        since = until - self.gate.window_s * BASELINE_WINDOWS
        before = self.recorder.window(gate.model, gate.old.version, since, until)
        return judge(self.gate, new, before, now - gate.swapped, retried=gate.retried)

    def _swap_in(self, name: str, engine: Engine) -> tuple[Engine | None, _OpenGate | None]:
        """Serve ``engine``; the engine to fall back to, and the gate it carries over.

        A gate still open (not judged at this sync's start) is carried: the version it
        watched is replaced unjudged, and the engine it would fall back to stays the
        fallback."""
        with self._gate_lock:  # the watcher thread swaps engines too
            carried = self.gates.pop(name, None)
            old = self.host.swap(name, engine)
        if carried is None:
            return old, None
        if old is not None and old is not carried.old:
            self.host.retire(old)
        return carried.old, carried

    def _commit_install(
        self,
        model: ModelState,
        installed: Installed,
        record: UpdateRecord,
        engines: tuple[Engine | None, Engine],
        commit: Callable[[ModelState], None],
        *,
        before: ModelState,
        signed: str,
        stops: int = 0,
    ) -> ModelState:
        """Commit ``installed`` as the version served (``engines``: the old and the new
        one, already swapped: swapped back when the commit fails); with a health gate,
        the gate is kept in the state with what to serve again (a daemon that dies
        while it watches does not trust the version: :meth:`resume`)."""
        old, new = engines
        gate = None
        if self.gate is not None and old is not None:
            gate = GateRecord(
                version=installed.version, sha256=installed.sha256, signed=signed,
                opened=now_iso(), restore_serving=before.serving,
                restore_previous=before.previous,
                restore_last_known_good=before.last_known_good, unclean_stops=stops,
            )  # fmt: skip
        committed = model.model_copy(
            update={
                "serving": installed,
                "previous": model.serving or model.previous,
                # known good once its health gate passed
                "last_known_good": model.last_known_good if gate else installed,
                "last_update": record,
                "gate": gate,
                "attempt": None,
            }
        )
        try:
            commit(committed)  # from here a restart serves the new version
        except BaseException:
            # Not committed: serve what the state names, not what it does not.
            self._swap_back(new.model, old, new)
            raise
        return committed

    def _watch_or_retire(self, gate: _OpenGate) -> None:
        """Open a health gate on the swap (the old engine stays loaded), or with no gate
        configured release the old engine once drained."""
        if self.gate is not None:
            with self._gate_lock:
                self.gates[gate.model] = gate
        else:
            self.host.retire(gate.old)

    def _close_gate(self, name: str, *, passed: bool = True) -> None:
        with self._gate_lock:
            gate = self.gates.pop(name, None)
        if gate is None:
            return
        self.host.retire(gate.old)
        if self.recorder is not None:
            self.recorder.forget(name, gate.old.version)
        if passed:
            state = self._load()
            model = state.models.get(name)
            if model is not None and model.serving == gate.installed:
                held = model.model_copy(update={"last_known_good": gate.installed, "gate": None})
                self._commit_quietly(state.with_model(name, held))

    def _commit_rollback(
        self, name: str, gate: _OpenGate, reason: str, swap_ms: float
    ) -> UpdateRecord:
        """Commit a rollback :meth:`watch_gates` made: what the gated version replaced is
        served again, and the version is rejected (only rejected, when a newer install
        replaced it since)."""
        record = UpdateRecord(
            result="rejected", version=gate.version, reason=reason_text(reason),
            finished=now_iso(), stages_ms={"swap": swap_ms},
        )  # fmt: skip
        state = self._load()
        model = state.models.get(name, gate.before)
        rejected = [*model.rejected, Rejected(
            version=gate.version, sha256=gate.installed.sha256, signed=gate.signed,
            reason=record.reason or reason, at=now_iso())][-32:]  # fmt: skip
        update: dict[str, object] = {"rejected": rejected, "last_update": record}
        if model.serving == gate.installed:
            update |= {
                "serving": gate.before.serving,
                "previous": gate.before.previous,
                "last_known_good": gate.before.last_known_good,
                "gate": None,
            }
        self._commit_quietly(state.with_model(name, model.model_copy(update=update)))
        return record

    # --- the stages ----------------------------------------------------------------------

    def _build_and_test(
        self, trust: DeviceTrust, request: LoadRequest, doc: VersionDoc | None, stages: _Stages
    ) -> Engine:
        """An engine for ``request`` that passed its self-test (not yet serving).

        Raises:
            EngineError: it cannot be built here, or it failed its self-test.
        """
        with stages("build"):
            engine = self.host.build(request)
        try:
            with stages("self_test"):
                cases = self._goldens(trust, request.model, request.version, doc)
                # in every session setup this host may switch the version to: one
                # verdict on every device of the target (registry.sessions)
                host = self.host if isinstance(self.host, SetupHost) else None
                self_test(engine, cases, host=host)
        except BaseException:
            engine.close()
            raise
        return engine

    def _description(
        self, trust: DeviceTrust, name: str, version: str
    ) -> tuple[VersionDoc | None, str]:
        """The signed description of a version (None for releases made before
        descriptions were published), and its digest ("" when absent)."""
        path = version_path(name, version)
        try:
            info = trust.target_info(path)
        except FileSetError:
            return None, ""
        fetched = trust.fetch(path, self._work(name), model=name, version=version, kind="version")
        try:
            return VersionDoc.from_bytes(fetched.read_bytes()), info.sha256
        except ValueError as e:
            raise _RejectedError(f"{path}: not a version description ({_one_line(e)})") from None

    def _target(self, doc: VersionDoc | None) -> Target | None:
        if doc is None or not doc.targets:
            return None
        target = doc.target_for(dict(self.config.device.labels))
        if target is None:
            labels = ", ".join(f"{k}={v}" for k, v in sorted(self.config.device.labels.items()))
            raise _RejectedError(
                f"no target of {doc.model} {doc.version} matches this device's labels "
                f"({labels or 'none'})"
            )
        return target

    def _plan(  # noqa: PLR0917 - one private call site
        self,
        trust: DeviceTrust,
        name: str,
        version: str,
        art: SignedTarget,
        model: ModelState,
        target: Target | None,
    ) -> _Plan:
        """The cheapest verified way to the version's bytes (see the module doc)."""
        blobs = self.state.blobs
        apath = artifact_path(name, version)
        # A TensorRT target builds its engine on the device from the ONNX artifact
        # (engines are specific to the GPU and TensorRT version: edge_sync.engine.tensorrt).
        if self._held(art.sha256):
            return _Plan("cached", "artifact", art.sha256, apath)
        held = {
            i.version: i.artifact_sha256
            for i in (model.serving, model.previous, model.last_known_good)
            if i is not None and i.artifact_sha256 and blobs.has(i.artifact_sha256)
        }
        chain: list[tuple[str, str, SignedTarget]] = []
        current, total = version, 0
        while current not in held and len(chain) < MAX_DELTA_CHAIN:
            parent = trust.target_info(artifact_path(name, current)).facts.parent
            if parent is None:
                break
            try:
                delta = trust.target_info(delta_path(name, current, parent))
            except FileSetError:
                break
            chain.append((current, parent, delta))
            total += delta.length
            current = parent
        base = held.get(current)
        if chain and base is not None and total < art.length:
            return _Plan("delta", "artifact", art.sha256, apath, tuple(reversed(chain)), base)
        return _Plan("full", "artifact", art.sha256, apath)

    def _held(self, sha256: str) -> bool:
        """Whether the blob is held and still hashes to its name (a rotten one is
        discarded, and fetched again)."""
        blobs = self.state.blobs
        if not blobs.has(sha256):
            return False
        if blobs.verify(sha256):
            return True
        blobs.discard(sha256)
        return False

    def _serves(self, name: str, sha256: str) -> bool:
        """Whether the host serves ``name`` from the blob ``sha256`` (a start-up that
        could not build it serves nothing, or an older version)."""
        engine = self.host.current(name)
        return engine is not None and engine.sha256 == sha256

    def _swap_back(self, name: str, old: Engine | None, new: Engine) -> None:
        if old is not None:
            self.host.swap(name, old)
        else:
            self.host.drop(name)
        self.host.retire(new)  # requests already on it finish first

    def _work(self, name: str) -> Path:
        return self.state.blobs.tmp / f"update-{name}"

    def _obtain(
        self, trust: DeviceTrust, name: str, version: str, plan: _Plan, stages: _Stages
    ) -> tuple[Path, Literal["cached", "delta", "full", "engine"]]:
        """The plan's file in the blob store, verified; and the method that made it (a
        failed delta falls back to the full file)."""
        blobs = self.state.blobs
        if plan.method == "cached":
            return blobs.path(plan.sha256), "cached"
        work = self._work(name)
        work.mkdir(parents=True, exist_ok=True)
        if plan.method == "delta":
            try:
                return self._apply_chain(trust, name, plan, stages), "delta"
            except (VerificationError, RegistryError, OSError):
                # A bad delta (or a remote serving garbage for it): the full file decides.
                plan = _Plan("full", "artifact", plan.sha256, plan.target_path)
        kind: TargetKind = "engine" if plan.kind == "engine" else "artifact"
        with stages("fetch"):
            # DeviceTrust verifies length and SHA-256 while fetching (verify_bytes is
            # folded in: the bytes are hashed as they arrive).
            fetched = trust.fetch(
                plan.target_path, work, model=name, version=version, kind=kind,
                partial_dir=self.state.partials,
            )  # fmt: skip
        with stages("verify_bytes"):
            return blobs.adopt(fetched, plan.sha256), plan.method

    def _apply_chain(self, trust: DeviceTrust, name: str, plan: _Plan, stages: _Stages) -> Path:
        from registry.delta import decode

        blobs = self.state.blobs
        assert plan.base_sha256 is not None  # noqa: S101 - a delta plan has a base
        base = blobs.path(plan.base_sha256)
        work = self._work(name)
        result = base
        for version, parent, delta in plan.chain:
            with stages("fetch"):
                fetched = trust.fetch(
                    delta.path, work, model=name, version=version, kind="delta",
                    partial_dir=self.state.partials,
                )  # fmt: skip
            if delta.facts.base != parent:
                raise VerificationError(f"signed as a delta from {delta.facts.base}", delta.path)
            want = trust.target_info(artifact_path(name, version)).sha256
            out = work / f"{want}.onnx"
            with stages("apply_delta"):
                decode(result, fetched, out, expected_sha256=want)
            with stages("verify_bytes"):
                result = blobs.adopt(out, want)
        return result

    def _collect_descriptions(self, state: DeviceState) -> None:
        """Remove kept descriptions of versions the state no longer names."""
        folder = self.state.root / DESCRIPTIONS_DIR
        if not folder.is_dir():
            return
        keep = {
            f"{name}-{installed.version}.json"
            for name, model in state.models.items()
            for installed in (model.serving, model.previous, model.last_known_good)
            if installed is not None
        }
        for path in folder.iterdir():
            if path.name not in keep:
                path.unlink(missing_ok=True)

    def _keep_description(self, name: str, version: str, doc: VersionDoc | None) -> None:
        if doc is None:
            return
        folder = self.state.root / DESCRIPTIONS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        from registry.atomic import write_atomic

        write_atomic(folder / f"{name}-{version}.json", doc.to_bytes(), mode=0o644)

    def _goldens(
        self, trust: DeviceTrust, name: str, version: str, doc: VersionDoc | None
    ) -> list[GoldenArrays]:
        """The signed golden cases of a version, read within caps."""
        if doc is None or not doc.goldens:
            return []
        from registry.goldens import read_npz

        cases = []
        work = self._work(name)
        for case in doc.goldens:
            arrays = {}
            for side in ("inputs", "outputs"):
                path = getattr(case, side)
                expected = golden_path(name, version, case.name, side)
                if path != expected:
                    raise _RejectedError(
                        f"golden case {case.name!r}: {side} at {path}, not {expected}"
                    )
                fetched = trust.fetch(path, work, model=name, version=version, kind="golden")
                try:
                    arrays[side] = read_npz(fetched, path)
                except RegistryError as e:
                    raise _RejectedError(f"golden case {case.name!r}: {e}") from None
            cases.append(
                GoldenArrays(case.name, arrays["inputs"], arrays["outputs"], case.rtol, case.atol)
            )
        return cases


def _worst(
    method: Literal["cached", "delta", "full", "engine"],
    data: Literal["cached", "delta", "full"] | None,
) -> Literal["cached", "delta", "full", "engine"]:
    """How a version with external data came: the costliest way any of its files did."""
    order = ("cached", "delta", "full")
    if data is None or method == "engine":
        return method
    return method if order.index(method) >= order.index(data) else data


def _said(method: str) -> Literal["delta", "full", "cached"]:
    """The method as status reports it (docs/reference/status.md: a prebuilt engine is full)."""
    return "full" if method == "engine" else method  # type: ignore[return-value]


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return reason_text(text[0] if text else type(error).__name__)


def _rejected(model: ModelState, version: str, sha256: str, signed: str, reason: str) -> ModelState:
    """``model`` with ``version`` rejected for ``reason`` (its last update says so)."""
    reason = reason_text(reason)
    record = UpdateRecord(result="rejected", version=version, reason=reason, finished=now_iso())
    rejected = [*model.rejected, Rejected(version=version, sha256=sha256, signed=signed,
                reason=reason, at=now_iso())][-32:]  # fmt: skip
    return model.model_copy(update={"rejected": rejected, "last_update": record})


def _attempting(model: ModelState, entry: ChannelEntry | None) -> ModelState:
    """``model`` without an attempt at a version its channel no longer assigns (its
    count of unclean stops is about that version only)."""
    if model.attempt is None or (entry is not None and model.attempt.version == entry.version):
        return model
    return model.model_copy(update={"attempt": None})
