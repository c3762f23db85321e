"""``modelreg edge run``: the device's loop, and ``modelreg edge status``.

The daemon takes the state dir's lock, serves what the state file names (no network
needed), syncs (at once while a model has nothing to serve, else after a random part of
one poll interval, so a fleet that restarts together does not poll together), then every
poll interval with jitter; SIGHUP syncs at once, SIGTERM (or SIGINT) stops it cleanly
(a last report, exit 0).  After a failed sync the next try comes after
min(poll_interval, 5 s), doubling up to ``max_backoff``; a rejected version is no failure.
With systemd it reports readiness and status through ``NOTIFY_SOCKET`` (``Type=notify``)
and feeds its watchdog from the loop (``edge_sync._systemd``).
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, Final

from edge_sync import clock
from edge_sync._systemd import Watchdog, systemd_unit
from edge_sync._systemd import notify as _notify
from edge_sync.clock import now_iso
from edge_sync.config import EdgeConfig
from edge_sync.decide.health import GatePolicy
from edge_sync.decide.schedule import backoff_delay, next_delay
from edge_sync.engine.base import EngineHost, PrepackDecision
from edge_sync.engine.host import InProcessHost
from edge_sync.errors import EngineError, StoppedError
from edge_sync.serve.listeners import Listeners
from edge_sync.serve.recorder import Recorder
from edge_sync.serve.shadow import ShadowRunner
from edge_sync.state.device_key import DeviceKey
from edge_sync.state.models import DaemonInfo, UpdateRecord, reason_text
from edge_sync.state.status import (
    EngineStatus,
    LiveStatus,
    OpenGateStatus,
    build_status,
    served_status,
)
from edge_sync.state.store import StateDir
from edge_sync.sync.gates import GATE_CHECK_S
from edge_sync.sync.limits import TrustLimits
from edge_sync.sync.report import LAST_REPORT_S, Reporter
from edge_sync.sync.trust import DeviceTrust, Freshness, freshness, trust_expiries
from edge_sync.sync.updater import SyncOutcome, Updater
from registry.about import modelreg_version
from registry.agreement import Agreement
from registry.device_report import StatusDocument
from signing.errors import VerificationError

__all__ = [
    "Daemon",
    "device_status",
    "provision",
    "status_document",
    "systemd_unit",
]

ENGINE_CACHE_DIR: Final = "engines"
"""In the state dir: TensorRT engines built on this device (``edge_sync.engine.tensorrt``)."""
TUNING_FILE: Final = "tuning.json"
"""In the state dir: per model, whether prepacking paid when measured (``serve.prepack``)."""


class _Wakeup:
    """A self-pipe the loop sleeps on: signals (through ``signal.set_wakeup_fd``) and
    other threads wake it by writing a byte.  Signal handlers only set flags: taking a
    lock there (``threading.Event.set``) can deadlock with the main thread inside the
    same lock."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        for fd in (self.read_fd, self.write_fd):  # not inherited: os.pipe's default
            os.set_blocking(fd, False)

    def poke(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self.write_fd, b"\0")

    def sleep(self, seconds: float) -> None:
        """Wait up to ``seconds``, or until poked."""
        # poll(), not select(): select() refuses descriptors past 1024 (a process that
        # holds many files, or runs many daemons, as the fleet benchmark does).
        poller = select.poll()
        poller.register(self.read_fd, select.POLLIN)
        with contextlib.suppress(InterruptedError):
            poller.poll(max(seconds, 0) * 1000)
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self.read_fd, 4096):
                pass

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass
class Daemon:
    """The device's loop over one config."""

    config: EdgeConfig
    host: EngineHost | None = None
    """Where engines run (default: in this process, with ``serve``'s settings)."""
    limits: TrustLimits | None = None
    on_sync: Callable[[SyncOutcome], None] | None = None
    serving: bool = True
    """Answer the Open Inference Protocol on ``serve.listen`` (``edge_sync.serve.app``)."""
    _sync_now: bool = False
    _stopping: bool = False
    _updater: Updater | None = None
    _wakeup: _Wakeup | None = None
    _reporter: Reporter | None = None
    _watchdog: Watchdog | None = None
    _shadow: ShadowRunner | None = None

    def request_sync(self) -> None:
        """Sync now (what SIGHUP does)."""
        self._sync_now = True
        if self._wakeup is not None:
            self._wakeup.poke()

    def stop(self) -> None:
        """Stop at the next stage boundary (what SIGTERM does); a download in progress
        stops at its next chunk and is kept for the next start."""
        self._stopping = True
        if self._wakeup is not None:
            self._wakeup.poke()

    @property
    def stopping(self) -> bool:
        """Whether a stop was asked for."""
        return self._stopping

    def _signals(self, wakeup: _Wakeup) -> None:
        def on_hup(_sig: int, _frame: FrameType | None) -> None:
            self._sync_now = True  # a flag only: see _Wakeup

        def on_term(_sig: int, _frame: FrameType | None) -> None:
            self._stopping = True

        signal.set_wakeup_fd(wakeup.write_fd, warn_on_full_buffer=False)
        signal.signal(signal.SIGHUP, on_hup)
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)

    def _loop(self, updater: Updater, wakeup: _Wakeup, server: _Server | None) -> None:
        """Sync, wait (poll with jitter, or back off), again, until stopped."""
        rng = random.Random()  # noqa: S311 - jitter, not secrecy
        failures = 0
        repo = self.config.repository
        self._wait(updater, wakeup, server, self._first_delay(rng))
        while not self._stopping:
            self._sync_now = False
            report = _guarded(updater)
            self._closed_gates(updater.settled, server)  # judged before it was cut too
            if report is None:
                break  # cut by the stop: not a failure, nothing to count
            self._alive()
            if server is not None:
                server.metrics.sync(report.result == "failed", report.failure)
                for model, record in report.updates.items():
                    server.metrics.update(model, record)
            if self.on_sync is not None:
                self.on_sync(report)
            self._report_changes()
            self._tune(updater)
            if report.result == "failed":
                failures += 1
                delay = backoff_delay(failures, repo.poll_interval, repo.max_backoff)
            else:
                failures = 0
                delay = next_delay(repo.poll_interval, repo.jitter, rng)
            _notify(f"STATUS=last sync: {report.result}")
            self._wait(updater, wakeup, server, delay)

    def _first_delay(self, rng: random.Random) -> float:
        """The wait before the first sync: none while a subscribed model has nothing to
        serve, else a random part of one poll interval (a fleet that restarts together,
        after a power cut, must not poll together)."""
        repo, host = self.config.repository, self.host
        if repo.jitter == 0 or host is None:
            return 0.0
        if any(host.current(sub.name) is None for sub in self.config.models):
            return 0.0
        return rng.uniform(0, repo.poll_interval)

    def _wait(
        self, updater: Updater, wakeup: _Wakeup, server: _Server | None, delay: float
    ) -> None:
        """Wait ``delay`` seconds, or until stopped or asked to sync, closing health
        gates when due and telling systemd's watchdog the loop is alive."""
        deadline = time.monotonic() + delay
        while not (self._stopping or self._sync_now):
            self._alive()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            gate_in = updater.next_gate_s()
            watchdog = self._watchdog.wait_s if self._watchdog is not None else left
            wakeup.sleep(min(left, watchdog, left if gate_in is None else gate_in))
            try:
                closed = updater.check_gates()
            except Exception as e:  # noqa: BLE001 - a gate's bug must not stop serving
                print(f"modelreg edge: health gates: {type(e).__name__}: {e}",
                      file=sys.stderr, flush=True)  # fmt: skip
                continue
            self._closed_gates(closed, server)
            if closed:
                self._report_changes()

    def _alive(self) -> bool:
        """Ping systemd's watchdog; whether a stop was asked for.  The updater asks it at
        every stage boundary and download chunk: a sync making progress keeps the
        watchdog fed, one stuck does not."""
        if self._watchdog is not None:
            self._watchdog.ping()
        return self._stopping

    def _report_changes(self) -> None:
        """Let the reporter look at the state (it sends only what changed)."""
        if self._reporter is not None:
            self._reporter.poke()

    def _watch_gates(self, updater: Updater) -> None:
        """Swap back a version failing its health gate as soon as it fails, even while
        a sync runs (its state is committed by the loop: :meth:`Updater.check_gates`)."""
        while not self._stopping:
            time.sleep(GATE_CHECK_S)
            if not updater.gates:
                continue
            try:
                for model in updater.watch_gates():
                    print(f"modelreg edge: {model}: failed its health gate: swapped back",
                          file=sys.stderr)  # fmt: skip
                    if self._wakeup is not None:
                        self._wakeup.poke()  # the loop commits it now
                for model, reason in updater.take_retries():
                    print(f"modelreg edge: {model}: {reason}; watched one more window",
                          file=sys.stderr)  # fmt: skip
            except Exception as e:  # noqa: BLE001 - a watcher bug must not stop serving
                print(f"modelreg edge: health gate watcher: {type(e).__name__}: {e}",
                      file=sys.stderr)  # fmt: skip

    @staticmethod
    def _closed_gates(closed: dict[str, UpdateRecord], server: _Server | None) -> None:
        """Say what each health gate that closed decided (and count rollbacks)."""
        for model, record in closed.items():
            done = "rolled back" if record.result == "rejected" else "kept"
            print(f"modelreg edge: {model}: {record.version} {done}: {record.reason}",
                  file=sys.stderr)  # fmt: skip
            if server is not None and record.result == "rejected":
                server.metrics.update(model, record)
                server.metrics.rollbacks.labels(model).inc()

    def _live(self) -> LiveStatus:
        """What only the running daemon knows, added to ``/status``: the engines loaded
        per model (versions, requests in flight, weight bytes own and shared), open
        health gates, and the prepacking decisions."""
        host, updater = self.host, self._updater
        engines: dict[str, list[EngineStatus]] = {}
        prepack: dict[str, PrepackDecision] = {}
        if host is not None:
            for engine in host.loaded():
                serving = host.current(engine.model) is engine
                engines.setdefault(engine.model, []).append(
                    EngineStatus.of(engine, serving=serving, in_flight=host.in_flight(engine))
                )
            prepack = dict(host.prepack_decisions)
        open_gates = list(updater.gates.items()) if updater is not None else []  # one copy
        gates = {
            name: OpenGateStatus(version=g.version, previous=g.old.version,
                                 open_s=round(time.monotonic() - g.swapped, 3))
            for name, g in open_gates
        }  # fmt: skip
        shadow: dict[str, Agreement] = {}
        if self._shadow is not None:
            for sub in self.config.models:
                running = self._shadow.current(sub.name)
                if running is not None:
                    shadow[sub.name] = running
        return LiveStatus(engines=engines, gates=gates, prepack=prepack, shadow=shadow)

    def _tune(self, updater: Updater) -> None:
        """Measure, once per model, whether prepacking pays (``serve.prepack: auto``),
        while no health gate watches it (a tuning swap would confuse the gate)."""
        host = self.host
        if host is None:
            return
        for sub in self.config.models:
            if sub.name in updater.gates or self._stopping or self._sync_now:
                continue
            try:
                decision = host.tune(sub.name)
            except (EngineError, OSError) as e:
                print(f"modelreg edge: {sub.name}: not tuned: {reason_text(str(e))}",
                      file=sys.stderr)  # fmt: skip
                continue
            if decision is not None and "error" in decision:
                print(f"modelreg edge: {sub.name}: prepacking not measured, keeps shared "
                      f"weights: {decision['error']}", file=sys.stderr)  # fmt: skip
            elif decision is not None:
                how = "prepacked (private weights)" if decision["prepack"] else "shared weights"
                print(f"modelreg edge: {sub.name}: runs with {how}: {decision}", file=sys.stderr)

    def _start(self, state: StateDir, listen: str | None) -> tuple[Updater, _Server | None]:
        """Everything before the loop: the trust root, the engine host, the listeners,
        the announcement, the updater resumed from the state (serving what it names),
        the gate watcher and the reporter."""
        provision(self.config, state)
        if self.host is None:
            self.host = _make_host(self.config, state)
        recorder = Recorder()
        shadow = self._shadow = ShadowRunner(self.host) if self.serving else None
        server = (
            _Server(self.config, self.host, self.request_sync, recorder, self._live, shadow=shadow)
            if self.serving
            else None
        )
        # an announcement left behind: the last daemon did not stop cleanly
        unclean = state.daemon_info() is not None
        if server is not None:
            server.metrics.watch_trust(lambda: trust_expiries(state.root))
            listen = server.start()
        grpc_listen = server.grpc_address if server is not None else None
        state.announce(DaemonInfo(pid=os.getpid(), listen=listen, grpc_listen=grpc_listen,
                                  started=now_iso()))  # fmt: skip
        gate = self.config.serve.health_gate
        updater = self._updater = Updater(
            self.config,
            state,
            self.host,
            limits=self.limits,
            should_stop=self._alive,
            gate=GatePolicy(
                gate.window, gate.min_requests, gate.max_error_rate, gate.max_latency_ratio
            ),
            recorder=recorder if server is not None else None,
            shadow=shadow,
        )
        problems = updater.resume(unclean=unclean)
        watcher = threading.Thread(
            target=self._watch_gates, args=(updater,), name="gate-watch", daemon=True
        )
        watcher.start()
        for model, problem in problems.items():
            said = reason_text(problem)
            print(f"modelreg edge: {model}: not served at start: {said}", file=sys.stderr)
        if self.config.report is not None:
            # its own thread: a slow sink never holds up a sync or a request
            self._reporter = Reporter(
                self.config, lambda: device_status(self.config), modelreg_version(),
                key=DeviceKey.load_or_create(self.config.state_path),
            )  # fmt: skip
            self._reporter.start()
        return updater, server

    def _stop_cleanly(self, server: _Server | None) -> None:
        """A clean stop: the listeners closed, and the fleet told (its last report says
        stopped, rather than running until the report goes stale)."""
        if server is not None:
            server.stop()
        if self._shadow is not None:
            self._shadow.close()
        reporter, self._reporter = self._reporter, None
        if reporter is not None:
            reporter.stop(LAST_REPORT_S, last=True)

    def run(self, *, install_signals: bool = True, listen: str | None = None) -> int:
        """Run until stopped; the exit code (0 on a clean stop).

        Raises:
            LockedError: another daemon holds the state dir.
            KeyMaterialError: the trust root cannot be provisioned.
        """
        state = StateDir(self.config.state_path)
        state.lock()
        wakeup = self._wakeup = _Wakeup()
        self._watchdog = Watchdog()
        clean = False
        try:
            if install_signals:
                self._signals(wakeup)
            updater, server = self._start(state, listen)
            _notify("READY=1\nSTATUS=serving what the state names; syncing")
            self._loop(updater, wakeup, server)
            _notify("STOPPING=1")
            self._stop_cleanly(server)
            clean = True
            return 0
        finally:
            if self._reporter is not None:
                self._reporter.stop()
                self._reporter = None
            if install_signals:
                with contextlib.suppress(ValueError):
                    signal.set_wakeup_fd(-1)
            self._wakeup = None
            wakeup.close()
            # a daemon that dies of an error leaves its announcement, as a killed one
            # does: the next start counts it against a version on trial
            # (edge_sync.decide.restarts), and an earlier unclean stop's stays counted
            state.unlock(forget=clean)


def _make_host(config: EdgeConfig, state: StateDir) -> InProcessHost:
    """The engine host the config describes, with ONNX Runtime's own log routed through
    the daemon's (before any session logs)."""
    from edge_sync.engine.ortlog import ort_severity, route_onnxruntime_log

    serve = config.serve
    route_onnxruntime_log(serve.onnxruntime_log)
    return InProcessHost(
        intra_op_threads=serve.threads,
        prepack=serve.prepack,
        memory_budget=serve.memory_budget,
        decisions=state.root / TUNING_FILE,
        engine_cache=state.root / ENGINE_CACHE_DIR,
        log_severity=ort_severity(serve.onnxruntime_log),
    )


class _Server(Listeners):
    """The daemon's listeners (``edge_sync.serve.listeners``), serving its status."""

    def __init__(
        self,
        config: EdgeConfig,
        host: EngineHost,
        request_sync: Callable[[], None],
        recorder: Recorder | None = None,
        live: Callable[[], LiveStatus] | None = None,
        *,
        shadow: ShadowRunner | None = None,
    ) -> None:
        def status() -> dict[str, Any]:
            doc = device_status(config)
            served = served_status(doc, live()) if live is not None else doc
            return served.model_dump(mode="json")

        super().__init__(config.serve, config.models, host, status, modelreg_version(),
                         request_sync=request_sync, recorder=recorder,
                         shadow=shadow)  # fmt: skip


def _guarded(updater: Updater) -> SyncOutcome | None:
    """One sync; an unexpected error is a failed sync (with backoff), not a stopped
    device: what it serves stays served.  The error is written to stderr for the log.
    None when the daemon's stop cut it (what it committed stays; no failure counted)."""
    try:
        return updater.sync()
    except StoppedError:
        return None
    except Exception as e:  # noqa: BLE001 - the daemon outlives its bugs
        reason = reason_text(f"internal error: {type(e).__name__}: {e}")
        print(f"modelreg edge: {reason}", file=sys.stderr, flush=True)
        return SyncOutcome("failed", reason, failure="internal")


def provision(config: EdgeConfig, state: StateDir) -> None:
    """Install the configured trust root on first run (a no-op once it is there), and
    make the device's own key (``edge_sync.state.device_key``) if it has none.

    Raises:
        KeyMaterialError: the root file cannot be read, or the device key is unusable.
        VerificationError: it is not a root signed by its own keys.
        ValueError: the device already trusts another root.
    """
    DeviceKey.load_or_create(state.root)
    from signing.errors import KeyMaterialError

    try:
        data = config.root_path.read_bytes()
    except OSError as e:
        raise KeyMaterialError(
            f"{config.root_path}: cannot read the trust root ({e.strerror})"
        ) from None
    DeviceTrust.provision(state.root, data)


def device_status(config: EdgeConfig) -> StatusDocument:
    """The device's status document (docs/reference/status.md), read from the state dir
    whether the daemon runs or not (``edge_sync.state.status``).

    Raises:
        StateError: the state file is corrupt.
    """
    state_dir = StateDir(config.state_path)
    running = state_dir.locked_by_other()
    announced = state_dir.daemon_info() if running else None
    state = state_dir.load()
    try:
        fresh = freshness(state_dir.root, clock.now())
    except VerificationError:
        fresh = Freshness(None, ())
    return build_status(
        config.device.id,
        {sub.name: sub.channel for sub in config.models},
        state,
        running=running,
        announced=announced,
        trust=fresh,
        sync=state_dir.last_sync(state),
    )


def status_document(config: EdgeConfig) -> dict[str, Any]:
    """``edge status --json``: :func:`device_status` as JSON data.

    Raises:
        StateError: the state file is corrupt.
    """
    return device_status(config).model_dump(mode="json")
