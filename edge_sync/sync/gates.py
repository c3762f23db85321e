"""The health gates of one device (docs/reference/daemon.md): each version swapped in is watched,
the engine it replaced kept loaded, until :func:`edge_sync.decide.health.judge` passes or
fails it.

Two threads act on the gates: the daemon's loop (:meth:`Gates.check`, between syncs and
at the start of each) and its watcher thread (:meth:`Gates.watch`, every
:data:`GATE_CHECK_S`, so that a version failing its gate is swapped back even while a
long download runs).  One lock, :attr:`Gates.lock`, guards the open gates and every
engine swap of a gated model: the watcher thread only swaps back and notes the
failure; the loop commits it (:meth:`Gates.check`), so the state file has one writer.

What closing a gate does to the state is decided in :mod:`edge_sync.decide.gate_state`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

from edge_sync.clock import now_iso
from edge_sync.decide.gate_state import baseline_span, kept, rolled_back
from edge_sync.decide.health import BASELINE_WINDOWS, GatePolicy, Verdict, judge
from edge_sync.decide.shadow import ShadowPolicy, check
from edge_sync.engine.base import Engine, EngineHost
from edge_sync.serve.recorder import Recorder
from edge_sync.serve.shadow import ShadowRunner
from edge_sync.state.models import (
    DeviceState,
    GateRecord,
    Installed,
    ModelState,
    Rejected,
    UpdateRecord,
    reason_text,
)
from edge_sync.state.store import StateDir
from edge_sync.sync.trust import last_channels
from registry.agreement import Agreement

if TYPE_CHECKING:
    from edge_sync.config import Subscription
    from registry.schema import Shadow
    from signing.tuf_facts import ChannelsDoc

__all__ = [
    "GATE_CHECK_S",
    "SHADOW_SAVE_S",
    "Gates",
    "OpenGate",
    "commit_quietly",
    "load_state",
    "shadow_policy",
]

GATE_CHECK_S: Final = 0.25
"""How often an open health gate is judged (errors fail it before its window ends)."""
SHADOW_SAVE_S: Final = 5.0
"""How often a running shadow comparison's sums are committed (``edge status`` and the
device's reports read them from the state)."""


def shadow_policy(sub: Subscription, channels: ChannelsDoc | None) -> ShadowPolicy | None:
    """The shadow comparison a model's new versions get: its own ``shadow`` in
    ``edge.yaml`` (``false``: none), else its channel's, as the signed channels document
    declares it (None: none)."""
    spec: Shadow | None
    if sub.shadow is False:
        return None
    if sub.shadow is not None:
        spec = sub.shadow
    else:
        entry = channels.models.get(sub.name, {}).get(sub.channel) if channels else None
        spec = entry.shadow if entry is not None else None
    if spec is None:
        return None
    return ShadowPolicy(
        sample=spec.sample, max_cpu_share=spec.max_cpu_share, after_s=spec.after,
        min_agreement=spec.min_agreement, max_output_drift=spec.max_output_drift,
        min_compared=spec.min_compared,
    )  # fmt: skip


@dataclass(frozen=True)
class OpenGate:
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
    shadow: ShadowPolicy | None = None
    """Its answers are compared with the previous version's (``edge_sync.serve.shadow``)."""


def load_state(state: StateDir) -> DeviceState:
    """The committed state (a corrupt one recovered: see ``StateDir.load_or_recover``)."""
    return state.load_or_recover(lambda: last_channels(state.root))


def commit_quietly(state: StateDir, document: DeviceState) -> str | None:
    """Commit ``document``; why not, when the disk refuses (the old state stays, and
    the device keeps serving: a full disk is a failed sync, not a crash)."""
    try:
        state.commit(document)
    except OSError as e:
        return f"state not saved: {e.strerror or e}"
    return None


class Gates:
    """The open health gates, by model, and what closing them commits."""

    def __init__(
        self,
        policy: GatePolicy | None,
        recorder: Recorder | None,
        host: EngineHost,
        state: StateDir,
        shadow: ShadowRunner | None = None,
    ) -> None:
        """Watch swaps with ``policy`` on what ``recorder`` saw; without either (or with
        a window of 0) no gate opens and the replaced engine is released at once.
        ``shadow`` runs the comparisons of gates that ask for one."""
        self.policy = policy if policy is not None and policy.window_s > 0 and recorder else None
        self.recorder = recorder
        self.host = host
        self.state = state
        self.shadow = shadow if self.policy is not None else None
        self._saved: dict[str, tuple[float, int]] = {}
        """Per model: when its running comparison's sums were last committed, and how
        many requests they counted."""
        self.open: dict[str, OpenGate] = {}
        """Per model, the gate watching its newest install."""
        self.lock = threading.RLock()
        """Held around the open gates and every swap of a gated model."""
        self._failed: dict[str, tuple[OpenGate, str, float, Agreement | None]] = {}
        self._ended: dict[str, Agreement] = {}
        """Comparisons an install ended, their sums committed by the next
        :meth:`check` (after the sync's own commit, which would overwrite them)."""
        self._retries: list[tuple[str, str]] = []

    @property
    def enabled(self) -> bool:
        """Whether a swap opens a gate."""
        return self.policy is not None

    def next_check_s(self) -> float | None:
        """Seconds until an open gate should be judged again, or a comparison after its
        gate looked at (None: neither)."""
        if self.policy is None:
            return None
        if self.open or (self.shadow is not None and self.shadow.lingering()):
            return GATE_CHECK_S
        return None

    # --- opening ------------------------------------------------------------------------

    def swap_in(self, name: str, engine: Engine) -> tuple[Engine | None, OpenGate | None]:
        """Serve ``engine``; the engine to fall back to, and the gate it carries over.

        A gate still open (not judged at this sync's start) is carried: the version it
        watched is replaced unjudged, and the engine it would fall back to stays the
        fallback."""
        with self.lock:  # the watcher thread swaps engines too
            carried = self.open.pop(name, None)
            old = self.host.swap(name, engine)
        if self.shadow is not None:
            # a comparison running on after its gate passed: the new install ends it
            for model, previous, sums in self.shadow.expired(end=name):
                self._release(model, previous)
                self._ended[model] = sums
            # the carried gate's: the version it compared is no longer served
            if carried is not None and (last := self.shadow.end(name)) is not None:
                self._ended[name] = last
        if carried is None:
            return old, None
        if old is not None and old is not carried.old:
            self.host.retire(old)
        return carried.old, carried

    def record(
        self,
        installed: Installed,
        signed: str,
        before: ModelState,
        stops: int,
        *,
        confirmed: bool = True,
    ) -> GateRecord | None:
        """The gate kept in the state for a version about to be committed (a daemon that
        dies while it watches does not trust the version); None with no health gate,
        unless the version is not ``confirmed`` in every session setup yet (then a
        restart must know what to serve again too)."""
        if self.policy is None and confirmed:
            return None
        return GateRecord(
            version=installed.version, sha256=installed.sha256, signed=signed,
            opened=now_iso(), restore_serving=before.serving,
            restore_previous=before.previous,
            restore_last_known_good=before.last_known_good, unclean_stops=stops,
            confirmed=confirmed,
        )  # fmt: skip

    def watch_or_retire(self, gate: OpenGate) -> None:
        """Open ``gate`` on a swap (its old engine stays loaded), or with no gate
        configured release the old engine once drained."""
        if self.policy is not None:
            with self.lock:
                self.open[gate.model] = gate
            if self.shadow is not None and gate.shadow is not None:
                self.shadow.begin(gate.model, gate.new, gate.old, gate.shadow)
        else:
            self.host.retire(gate.old)

    # --- judging ------------------------------------------------------------------------

    def check(self) -> dict[str, UpdateRecord]:
        """Judge every open gate: a passed one retires the previous engine and makes the
        version last known good; a failed one swaps the previous engine back (one
        reference assignment: no request fails), rejects the version with the gate's
        reason, and commits the state.

        Returns:
            The update record of each model whose gate closed: ``installed`` (passed;
            its reason says what the gate saw) or ``rejected`` (rolled back).
        """
        if self.policy is None or self.recorder is None:
            return {}
        self.watch()  # failures are swapped back first, as the watcher thread does
        with self.lock:
            failed = dict(self._failed)
            open_gates = list(self.open.items())
        rolled: dict[str, UpdateRecord] = {}
        for name, found in failed.items():
            rolled[name] = self._commit_rollback(name, *found)
            with self.lock:  # dropped once committed: an error before keeps it for the next
                if self._failed.get(name) is found:
                    del self._failed[name]
        for name, gate in open_gates:
            verdict = self._judge(gate)
            if verdict.decision == "pass":
                self.close(name, passed=True)
                rolled[name] = UpdateRecord(
                    result="installed", version=gate.version, reason=verdict.reason,
                    finished=now_iso(),
                )  # fmt: skip
        self._shadow_upkeep()
        return rolled

    def _shadow_upkeep(self) -> None:
        """End the comparisons whose time after their gate ran out (their previous
        engine released, their sums committed), and commit the running ones' sums every
        :data:`SHADOW_SAVE_S`."""
        if self.shadow is None:
            return
        for name, previous, sums in self.shadow.expired():
            self._release(name, previous)
            self._save_shadow(name, sums)
        ended, self._ended = self._ended, {}
        for name, sums in ended.items():
            if self.shadow.current(name) is None:  # else a new comparison is saved below
                self._save_shadow(name, sums)
        now = time.monotonic()
        for name in self.shadow.running():  # in a gate, or after it
            running = self.shadow.current(name)
            when, counted = self._saved.get(name, (0.0, -1))
            if running is not None and running.compared != counted and now - when >= SHADOW_SAVE_S:
                self._saved[name] = (now, running.compared)
                self._save_shadow(name, running)

    def _save_shadow(self, name: str, sums: Agreement) -> None:
        """Commit ``sums`` as ``name``'s shadow comparison."""
        state = load_state(self.state)
        model = state.models.get(name)
        if model is not None:
            commit_quietly(
                self.state, state.with_model(name, model.model_copy(update={"shadow": sums}))
            )

    def _release(self, name: str, engine: Engine) -> None:
        """Release a previous engine nothing compares with any longer."""
        self.host.retire(engine)
        if self.recorder is not None:
            self.recorder.forget(name, engine.version)

    def watch(self) -> list[str]:
        """Swap back, at once, every gated version that fails its gate (thread-safe);
        the state is committed by :meth:`check` on the daemon's thread.  A gate failing
        on latency alone for the first time opens a second window instead
        (:meth:`take_retries` says which).

        Returns:
            The models swapped back.
        """
        if self.policy is None or self.recorder is None:
            return []
        swapped: list[str] = []
        with self.lock:
            for name, gate in list(self.open.items()):
                verdict = self._judge(gate)
                if verdict.decision == "retry":
                    # a latency-only failure: one more window before it is a verdict
                    self.open[name] = replace(gate, swapped=time.monotonic(), retried=True)
                    self._retries.append((name, verdict.reason))
                elif verdict.decision == "fail":
                    swapped.append(self._swap_back(name, gate, verdict.reason))
        return swapped

    def take_retries(self) -> list[tuple[str, str]]:
        """(model, reason) of each gate given a second window since the last call (a
        latency-only failure: ``edge_sync.decide.health.judge``), for the daemon's log."""
        with self.lock:
            retries, self._retries = self._retries, []
        return retries

    def _judge(self, gate: OpenGate) -> Verdict:
        assert self.policy is not None  # noqa: S101 - callers check
        assert self.recorder is not None  # noqa: S101
        now = time.monotonic()
        new = self.recorder.window(gate.model, gate.version, gate.swapped, now + 1)
        since, until = baseline_span(
            gate.swapped, gate.baseline_until, self.policy.window_s, BASELINE_WINDOWS
        )
        before = self.recorder.window(gate.model, gate.old.version, since, until)
        compared = None
        if self.shadow is not None and gate.shadow is not None:
            compared = check(gate.shadow, self.shadow.current(gate.model))
        return judge(
            self.policy, new, before, now - gate.swapped, retried=gate.retried, shadow=compared
        )

    def _swap_back(self, name: str, gate: OpenGate, reason: str) -> str:
        """Serve the engine ``gate`` replaced again (the lock is held)."""
        del self.open[name]
        start = time.perf_counter()
        self.host.swap(name, gate.old)
        self.host.retire(gate.new)
        ms = round((time.perf_counter() - start) * 1000, 3)
        sums = self.shadow.end(name) if self.shadow is not None else None
        self._failed[name] = (gate, reason, ms, sums)
        return name

    # --- closing ------------------------------------------------------------------------

    def close(self, name: str, *, passed: bool = True) -> None:
        """Close ``name``'s gate: its old engine is released; ``passed`` commits the
        version as last known good."""
        with self.lock:
            gate = self.open.pop(name, None)
        if gate is None:
            return
        after = gate.shadow.after_s if gate.shadow is not None and passed else 0.0
        sums = self.shadow.end(name, after_s=after) if self.shadow is not None else None
        if sums is None or after <= 0:
            self._release(name, gate.old)  # else the comparison releases it when it ends
        self._saved.pop(name, None)
        if passed:
            state = load_state(self.state)
            model = state.models.get(name)
            held = kept(model, gate.installed) if model is not None else None
            if held is not None:
                update = {"shadow": sums} if sums is not None else {}
                commit_quietly(self.state, state.with_model(name, held.model_copy(update=update)))

    def _commit_rollback(
        self, name: str, gate: OpenGate, reason: str, swap_ms: float, sums: Agreement | None
    ) -> UpdateRecord:
        """Commit a rollback :meth:`watch` made: what the gated version replaced is
        served again, and the version is rejected (only rejected, when a newer install
        replaced it since)."""
        record = UpdateRecord(
            result="rejected", version=gate.version, reason=reason_text(reason),
            finished=now_iso(), stages_ms={"swap": swap_ms},
        )  # fmt: skip
        state = load_state(self.state)
        model = state.models.get(name, gate.before)
        rejection = Rejected(
            version=gate.version, sha256=gate.installed.sha256, signed=gate.signed,
            reason=record.reason or reason, at=now_iso(),
        )  # fmt: skip
        after = rolled_back(model, gate.before, gate.installed, rejection, record)
        if sums is not None:
            after = after.model_copy(update={"shadow": sums})
        commit_quietly(self.state, state.with_model(name, after))
        return record
