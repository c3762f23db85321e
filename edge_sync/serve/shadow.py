"""Shadow comparison (docs/guide/behaviour.md): a sampled share of a new version's answered
requests run again on the version it replaced, off the request path, their answers
compared (``edge_sync.decide.shadow``).

The request path only *offers* a request (:meth:`ShadowRunner.offer`): after its answer
is computed, a draw decides whether it is sampled, and a sampled request is put in a
small queue without waiting (a full queue, a spent CPU budget or too many bytes
queued drop it, counted).  Nothing the client waits for is ever held by the shadow: no
run slot, no lock a request takes, no part of its byte budget.

One thread runs the comparisons.  Its CPU time is held within ``max_cpu_share`` of the
device's (the cores the daemon may run on) by a budget refilled at that rate: a sample
that finds it spent is dropped before it is queued or run, and under load, when the
thread falls behind, its queue fills and samples are dropped first.  The thread keeps
the ordinary priority on purpose: one at the lowest (``SCHED_IDLE``, nice 19) that holds
Python's GIL while the CPU is busy keeps every request thread waiting for it (a priority
inversion measured in ``benchmarks/shadow.py``: 0.74x the throughput at 16 in flight).
The previous engine is leased for each run, so a gate that closes meanwhile never
releases it under the comparison.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from edge_sync.decide.shadow import Pair, ShadowPolicy, ShadowStats
from edge_sync.serve.core import run_clock

if TYPE_CHECKING:
    from edge_sync.engine.base import Engine, EngineHost
    from registry.agreement import Agreement

__all__ = ["MAX_OBJECTS", "MAX_QUEUED", "MAX_QUEUED_BYTES", "ShadowRunner"]

MAX_QUEUED: Final = 256
"""Sampled requests waiting for a comparison; more are dropped."""
GATHER_S: Final = 0.2
"""The comparison thread wakes for a sample, waits this long, and compares what came
meanwhile at once: one wake-up and one pass over the sums for many samples.  What a
burst costs besides its samples (the thread's wake-up, its turns at the GIL, the caches
the previous engine takes from the request threads) is paid once per burst: at a 5 %
sample of 3,400 requests/s, 20 ms made bursts of three and 123 us of CPU per comparison,
200 ms bursts of about 35 and 46 us (``benchmarks/shadow.py``)."""
MAX_QUEUED_BYTES: Final = 32 << 20
"""Bytes of inputs and outputs the waiting comparisons may hold; more are dropped."""
MAX_OBJECTS: Final = 4096
"""Elements of a BYTES tensor a sample may hold (sizing more would cost the request)."""
BURST_S: Final = 0.25
"""The CPU budget holds at most this many seconds of its rate (a burst after a quiet
spell)."""


class _Tally:
    """A count the request path adds to without a lock: ``next`` on an
    ``itertools.count`` is one call into C, which the GIL does not split."""

    def __init__(self) -> None:
        self._count = itertools.count()
        self._reads = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        next(self._count)

    def value(self) -> int:
        """The count (a read takes one from the counter: it is paid back)."""
        with self._lock:
            found = next(self._count) - self._reads
            self._reads += 1
            return found


@dataclass
class _Comparison:
    """One model's running comparison."""

    new: Engine
    old: Engine
    policy: ShadowPolicy
    stats: ShadowStats = field(default_factory=ShadowStats)
    """Its sums; a burst's are summed apart and merged in under ``lock``."""
    dropped: _Tally = field(default_factory=_Tally)
    """Sampled requests not compared (counted without ``lock``: a request never waits)."""
    until: float | None = None
    """After the gate passed: when the comparison ends (monotonic)."""
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _Sample:
    model: str
    new: Engine
    inputs: dict[str, Any]
    wanted: list[str] | None
    outputs: dict[str, Any]
    run_s: float | None
    size: int


def _copied(arrays: dict[str, Any]) -> dict[str, Any]:
    return {name: a.copy() if hasattr(a, "copy") else a for name, a in arrays.items()}


def _nbytes(arrays: dict[str, Any]) -> int:
    """The bytes ``arrays`` hold: an array of Python objects (BYTES tensors) by the
    lengths of its strings too, not only its pointers; over ``MAX_QUEUED_BYTES``
    (never queued) as soon as that is plain, without looking at each string."""
    size = 0
    for a in arrays.values():
        size += int(getattr(a, "nbytes", 0))
        if getattr(getattr(a, "dtype", None), "kind", "") == "O":
            if a.size > MAX_OBJECTS:
                return MAX_QUEUED_BYTES + 1
            size += sum(len(v) if isinstance(v, (bytes, str)) else 64 for v in a.flat)
    return size


def _usable_cpus() -> int:
    """The cores this process may run on (its affinity), else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ShadowRunner:
    """The device's shadow comparisons: opened and closed with the health gates
    (``edge_sync.sync.gates``), offered requests by the serving layer."""

    def __init__(
        self, host: EngineHost, *, cpus: int | None = None, seed: int | None = None
    ) -> None:
        """Compare on ``host``'s engines; ``cpus``: the device's cores (the CPU
        budget's base)."""
        self.host = host
        self.cpus = cpus or _usable_cpus()
        self._active: dict[str, _Comparison] = {}
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Sample | None] = queue.SimpleQueue()
        self._waiting = 0
        """Samples queued, not yet taken by the comparison thread (at most MAX_QUEUED:
        an offer reserves its place)."""
        self._queued_bytes = 0
        """Bytes of the samples queued or being compared (at most MAX_QUEUED_BYTES)."""
        self._random = random.Random(seed)  # noqa: S311 - a sample, not a secret
        self._budget = 0.0
        self._refilled = time.monotonic()
        self._thread: threading.Thread | None = None
        self._last: dict[str, Agreement] = {}
        self._offers = threading.Lock()
        """Guards the queue's bytes and the CPU budget; a request that finds it taken
        drops its sample rather than wait."""
        self.cpu_s = 0.0
        """CPU seconds the comparisons took (their thread's)."""

    # --- the gates' side ----------------------------------------------------------------

    def begin(self, model: str, new: Engine, old: Engine, policy: ShadowPolicy) -> None:
        """Compare ``new``'s answers for ``model`` with ``old``'s from now on (a
        comparison already running for the model is replaced)."""
        with self._lock:
            self._active[model] = _Comparison(new, old, policy)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="shadow", daemon=True)
                self._thread.start()

    def end(self, model: str, *, after_s: float = 0.0) -> Agreement | None:
        """Stop comparing ``model`` (``after_s`` > 0: in that many seconds, the gate
        having passed); the comparison's sums, None when none runs."""
        with self._lock:
            found = self._active.get(model)
            if found is None:
                return None
            if after_s > 0:
                found.until = time.monotonic() + after_s
            else:
                del self._active[model]
        report = self._report(found, running=after_s > 0)
        if after_s <= 0:
            self._last[model] = report
        return report

    def expired(self, *, end: str | None = None) -> list[tuple[str, Engine, Agreement]]:
        """The comparisons whose time after their gate ran out (and ``end``'s, running
        after its gate: a new install replaces what it compares), ended now: (model,
        the previous engine to release, the sums)."""
        now = time.monotonic()
        ended: list[tuple[str, Engine, Agreement]] = []
        with self._lock:
            for model, found in list(self._active.items()):
                if found.until is not None and (found.until <= now or model == end):
                    del self._active[model]
                    ended.append((model, found.old, self._report(found, running=False)))
        for model, _, report in ended:
            self._last[model] = report
        return ended

    def running(self) -> list[str]:
        """The models compared now (in their gate or after it)."""
        with self._lock:
            return list(self._active)

    def lingering(self) -> bool:
        """Whether a comparison runs on after its gate (:meth:`expired` ends it)."""
        with self._lock:
            return any(c.until is not None for c in self._active.values())

    def current(self, model: str) -> Agreement | None:
        """The running sums of ``model``'s comparison (None: none runs)."""
        with self._lock:
            found = self._active.get(model)
        return self._report(found, running=True) if found is not None else None

    def latest(self, model: str) -> Agreement | None:
        """The running comparison's sums, else the last one's (None: none ran)."""
        return self.current(model) or self._last.get(model)

    def policy(self, model: str) -> ShadowPolicy | None:
        """The policy of ``model``'s running comparison."""
        with self._lock:
            found = self._active.get(model)
        return found.policy if found is not None else None

    @staticmethod
    def _report(found: _Comparison, *, running: bool) -> Agreement:
        with found.lock:
            found.stats.dropped = found.dropped.value()
            return found.stats.report(found.new.version, found.old.version, running=running)

    # --- the request path -------------------------------------------------------------

    def offer(
        self,
        engine: Engine,
        inputs: dict[str, Any],
        wanted: list[str] | None,
        outputs: dict[str, Any],
        run_s: float | None,
    ) -> None:
        """A request ``engine`` answered: sampled (by its model's policy) into the
        comparison queue, or not; never waits.  ``run_s``: its run time on ``engine``
        (None: unknown, a request run in a batch: its outputs are compared, not its
        time)."""
        found = self._active.get(engine.model)  # a dict read: no lock on the request path
        if found is None or found.new is not engine:
            return
        if self._random.random() >= found.policy.sample:
            return
        size = _nbytes(inputs) + _nbytes(outputs)
        if size > MAX_QUEUED_BYTES or not self._offers.acquire(blocking=False):
            found.dropped.add()  # another request offers right now: never wait for it
            return
        try:  # a place in the queue and its bytes are reserved; the copies made after
            taken = (
                self._waiting < MAX_QUEUED
                and self._queued_bytes + size <= MAX_QUEUED_BYTES
                and self._refill(found.policy) > 0
            )
            if taken:
                self._waiting += 1
                self._queued_bytes += size
        finally:
            self._offers.release()
        if not taken:
            found.dropped.add()
            return
        # the request's own arrays may be views of a buffer the server reuses (and their
        # dict is emptied once answered), its outputs views of a whole batch's: the
        # sample holds copies of its own
        sample = _Sample(
            engine.model, engine, _copied(inputs), wanted, _copied(outputs), run_s, size
        )
        self._queue.put(sample)  # unbounded: the reservation bounds it

    def _refill(self, policy: ShadowPolicy) -> float:
        """The CPU budget left now (CPU seconds), refilled at ``max_cpu_share`` of the
        device's cores since the last look."""
        now = time.monotonic()
        rate = policy.max_cpu_share * self.cpus
        self._budget = min(self._budget + (now - self._refilled) * rate, rate * BURST_S)
        self._refilled = now
        return self._budget

    # --- the comparison thread --------------------------------------------------------

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            time.sleep(GATHER_S)  # one wake-up for the samples of a moment
            burst = [first]
            stopping = False
            while len(burst) < MAX_QUEUED:
                try:
                    sample = self._queue.get_nowait()
                except queue.Empty:
                    break
                if sample is None:
                    stopping = True
                    break
                burst.append(sample)
            with self._offers:  # their places are free; their bytes once compared
                self._waiting -= len(burst)
            with contextlib.suppress(Exception):  # a comparison never stops the thread
                self._compare(burst)
            with self._offers:  # the burst's arrays are let go now
                self._queued_bytes -= sum(s.size for s in burst)
            del burst, first
            if stopping:
                return

    def _compare(self, burst: list[_Sample]) -> None:
        """Run each sample of ``burst`` on its model's previous engine, and add the
        answers to the comparison, as long as the budget lasts (a sample past it is
        dropped: a spent budget costs nothing more)."""
        for model in {s.model for s in burst}:
            found = self._active.get(model)
            if found is None:
                continue  # the gate closed meanwhile
            samples = [s for s in burst if s.model == model and s.new is found.new]
            with self._offers:
                budget = self._refill(found.policy)
            if budget <= 0:
                for _ in samples:
                    found.dropped.add()
                continue
            cpu = time.thread_time()
            try:
                self._compare_model(found, samples, budget, cpu)
            except Exception:  # noqa: BLE001 - a comparison's bug loses its samples only
                for _ in samples:
                    found.dropped.add()
            finally:  # what it took is paid for, whatever happened
                spent = time.thread_time() - cpu
                with self._offers:
                    self.cpu_s += spent
                    self._budget -= spent

    def _compare_model(
        self, found: _Comparison, samples: list[_Sample], budget: float, cpu: float
    ) -> None:
        """:meth:`_compare` for one model's samples (``cpu``: the thread's CPU time when
        it began)."""
        try:
            lease = self.host.lease(found.new.model, found.old.version)
            old = lease.__enter__()
        except LookupError:  # released meanwhile
            for _ in samples:
                found.dropped.add()
            return
        pairs: list[Pair] = []
        try:
            clock = run_clock(old)  # as the new version's run was timed
            for sample in samples:
                # a positive budget runs one comparison at least (it may overdraw by
                # that much: the next refills pay it back)
                if pairs and time.thread_time() - cpu >= budget:
                    found.dropped.add()
                    continue
                ran = clock()
                try:
                    answer = old.run(sample.inputs, sample.wanted)
                except Exception:  # noqa: BLE001 - the previous version fails on it
                    answer = {}
                pairs.append((sample.outputs, answer, sample.run_s, clock() - ran))
        finally:
            lease.__exit__(None, None, None)
        burst_sums = ShadowStats()  # summed without the lock: readers never wait on it
        burst_sums.add_many(pairs)
        with found.lock:
            found.stats.merge(burst_sums)

    def close(self) -> None:
        """Stop the comparison thread (what waits is dropped)."""
        with self._lock:
            self._active.clear()
            thread, self._thread = self._thread, None
        if thread is not None:
            with contextlib.suppress(queue.Empty):
                while True:
                    self._queue.get_nowait()
            self._queue.put(None)
            thread.join(timeout=5)
        with self._offers:  # a sample an offer made meanwhile is dropped with the rest
            self._queue = queue.SimpleQueue()
            self._waiting = self._queued_bytes = 0
