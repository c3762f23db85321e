"""What serving an inference request is, whatever protocol carried it (REST in
``edge_sync.serve.app``, gRPC in ``edge_sync.serve.grpc_server``): which engine answers
it, the run with its failure judged, and what the answer counts for (``/metrics`` and
the health gate's recorder).

The protocols only read requests and write answers around these; so both hold the same
leases (a swap never releases an engine under a request), share one budget of decoded
bytes in flight and one pool of run slots, and judge a failed run alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from edge_sync.engine.heap import keep_heap_small
from edge_sync.errors import RefusedError
from edge_sync.serve.admission import Budget, Slots
from edge_sync.serve.batching import Batcher, BatchPolicy, Ran, batchable
from edge_sync.serve.codec import ServeLimits

if TYPE_CHECKING:
    from edge_sync.engine.base import Engine, EngineHost
    from edge_sync.serve.metrics import Metrics
    from edge_sync.serve.recorder import Recorder
    from edge_sync.serve.shadow import ShadowRunner

__all__ = ["INLINE_RUN_S", "Inference", "Work"]

INLINE_RUN_S: Final = 0.0005
"""An engine whose typical run takes at most this long may run where the request was
read (REST: on the event loop); a slower one in a worker thread."""


@dataclass
class Work:
    """What one inference request cost, for the health gate: its decoded input
    elements (the size no encoding, compression or padding of the request changes) and
    the engine's run (no upload, queue or encoding time a client could stretch; see
    :func:`run_clock`)."""

    units: int | None = None
    run_s: float | None = None


class Inference:
    """Serving over one host and its subscribed models, for every protocol."""

    def __init__(  # noqa: PLR0917 - built once per server
        self,
        host: EngineHost,
        models: list[str],
        metrics: Metrics,
        recorder: Recorder | None = None,
        limits: ServeLimits | None = None,
        batching: Mapping[str, BatchPolicy] | None = None,
        shadow: ShadowRunner | None = None,
    ) -> None:
        """Serve ``models`` from ``host`` (``batching``: the models whose requests are
        batched, and how: ``edge_sync.serve.batching``; ``shadow``: where answers are
        offered for a shadow comparison, ``edge_sync.serve.shadow``)."""
        self.host, self.models, self.metrics, self.recorder = host, models, metrics, recorder
        self.shadow = shadow
        self.batching = dict(batching or {})
        self._batchers: dict[str, Batcher] = {}
        self._batchers_lock = threading.Lock()
        self.bound(limits or ServeLimits())

    def batched(self, model: str) -> bool:
        """Whether ``model``'s requests may wait for a batch (never run on an event
        loop then)."""
        return model in self.batching

    def close(self) -> None:
        """Stop the batch runners (what they hold queued runs first)."""
        with self._batchers_lock:
            batchers, self._batchers = list(self._batchers.values()), {}
        for batcher in batchers:
            batcher.close()

    def _batcher(self, engine: Engine) -> Batcher | None:
        """The batcher of ``engine``'s model, started on first use; None when its
        requests are not batched (not configured, or a model that cannot be)."""
        policy = self.batching.get(engine.model)
        if policy is None or not batchable(engine):
            return None
        with self._batchers_lock:
            batcher = self._batchers.get(engine.model)
            if batcher is None:
                batcher = self._batchers[engine.model] = Batcher(
                    engine.model, policy, run_clock, max_waiting=self.limits.max_queued,
                    observe=self.metrics.batch, depth=self.metrics.queue_depth,
                )  # fmt: skip
        return batcher

    def bound(self, limits: ServeLimits) -> None:
        """Serve within ``limits`` (before the first request)."""
        self.limits = limits
        self.budget = Budget(limits.inflight_bytes)
        self.slots = Slots(limits.max_concurrent, limits.max_queued, limits.queue_timeout_s)
        keep_heap_small()  # what a burst allocated is given back, not kept

    @contextlib.contextmanager
    def engine(self, name: str, wanted: str | None = None) -> Iterator[Engine]:
        """The engine serving ``name`` (``wanted``: that loaded version), held until
        the request is done: a swap never releases it under a request.

        Raises:
            RefusedError: unknown model (404), not loaded yet (503), no such version
                loaded (404).
        """
        if name not in self.models:
            raise RefusedError(404, f"unknown model {name!r}")
        try:
            lease = self.host.lease(name, wanted)
            engine = lease.__enter__()
        except LookupError:
            if wanted is None or self.host.current(name) is None:
                raise RefusedError(503, f"model {name!r} is not loaded yet") from None
            raise RefusedError(404, f"model {name!r} has no loaded version {wanted!r}") from None
        try:
            yield engine
        finally:
            lease.__exit__(None, None, None)

    def ready(self) -> bool:
        """Whether every subscribed model is served."""
        return all(self.host.current(m) is not None for m in self.models)

    def index(self, ready: bool) -> list[tuple[str, str, str, str]]:
        """The repository index (Triton's): (model, version, state, reason) for each
        loaded version of each subscribed model; with ``ready``, only what answers
        requests (else a model with none is listed as unavailable)."""
        found = []
        for name in self.models:
            versions = self.host.versions(name) if self.host.current(name) else []
            found += [(name, v, "READY", "") for v in versions]
            if not versions and not ready:
                found.append((name, "", "UNAVAILABLE", "not installed yet"))
        return found

    def run(
        self, engine: Engine, inputs: dict[str, Any], wanted: list[str] | None, work: Work
    ) -> dict[str, Any]:
        """Run the request's inputs on ``engine`` (``work`` gets its units and run
        time).

        Raises:
            RefusedError: the run failed: 400 when it is the request's fault (ONNX
                Runtime's InvalidArgument, or every other loaded version fails on it
                too), else 500.
        """
        work.units = sum(int(a.size) for a in inputs.values())
        batcher = self._batcher(engine)
        queued = batcher.submit(engine, inputs, wanted) if batcher is not None else None
        if queued is not None:
            try:
                results, work.run_s = queued.result()
            except Exception as e:  # noqa: BLE001 - ORT raises many types for bad inputs
                raise self._judged(engine, inputs, wanted, e) from None
        else:
            clock = run_clock(engine)
            ran = clock()
            try:
                results = engine.run(inputs, wanted)
            except Exception as e:  # noqa: BLE001 - ORT raises many types for bad inputs
                raise self._judged(engine, inputs, wanted, e) from None
            work.run_s = clock() - ran
        if self.shadow is not None:  # a batch's run time is not the request's own
            run_s = work.run_s if queued is None else None
            self.shadow.offer(engine, inputs, wanted, results, run_s)
        return results

    def submit(
        self, engine: Engine, inputs: dict[str, Any], wanted: list[str] | None, work: Work
    ) -> Future[Ran] | None:
        """Queue a request to a batched model for its batch (:meth:`collect` waits for
        it from an event loop); None when it runs alone (:meth:`run`, within the run
        slots as any other request).

        Raises:
            RefusedError: too many requests wait for a batch (503).
        """
        batcher = self._batcher(engine)
        if batcher is None:
            return None
        work.units = sum(int(a.size) for a in inputs.values())
        return batcher.submit(engine, inputs, wanted)

    async def collect(
        self,
        engine: Engine,
        inputs: dict[str, Any],
        wanted: list[str] | None,
        queued: Future[Ran],
        work: Work,
    ) -> dict[str, Any]:
        """A queued request's outputs, awaited without holding a thread.

        Raises:
            RefusedError: see :meth:`run`.
        """
        try:
            results, run_s = await asyncio.wrap_future(queued)
        except Exception as e:  # noqa: BLE001 - ORT raises many types for bad inputs
            raise await asyncio.to_thread(self._judged, engine, inputs, wanted, e) from None
        work.run_s = run_s
        if self.shadow is not None:  # a batch's run time is not the request's own
            self.shadow.offer(engine, inputs, wanted, results, None)
        return results

    def _judged(
        self, engine: Engine, inputs: dict[str, Any], wanted: list[str] | None, error: Exception
    ) -> RefusedError:
        """A failed run as the refusal it is: the request's fault (400) when ONNX
        Runtime says the input is invalid or every other loaded version fails on it too,
        else the version's (500)."""
        first = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
        theirs = type(error).__name__ == "InvalidArgument" or self._fails_everywhere(
            engine, inputs, wanted
        )
        return RefusedError(400 if theirs else 500, f"inference failed: {first}", engine.version)

    def _fails_everywhere(self, engine: Engine, inputs: Any, wanted: list[str] | None) -> bool:
        """Whether every other loaded version of ``engine``'s model fails on the request
        too (False when none is loaded).

        A run can fail on valid-looking inputs (symbolic sizes that do not broadcast:
        ONNX Runtime's ``Fail``); counted as the version's server error, any client
        told of a swap could fail its health gate.  During the gate the previous
        version is still loaded: a request it fails on as well says nothing about the
        new one.  A request that fails costs a run per version.
        """
        compared = 0
        for version in self.host.versions(engine.model):
            if version == engine.version:
                continue
            try:
                with self.host.lease(engine.model, version) as other:
                    compared += 1
                    other.run(inputs, wanted)
            except LookupError:
                continue  # released meanwhile: nothing compared
            except Exception:  # noqa: BLE001, S112 - any failure: it fails there too
                continue
            return False  # another version answers it: this one's fault
        return compared > 0

    def settle(  # noqa: PLR0917 - one call per protocol
        self, name: str, version: str, status: int, seconds: float, work: Work, protocol: str
    ) -> None:
        """Count an answer: at ``/metrics`` (by ``protocol``), and for the health gate
        when a version computed it (``status``: the HTTP status it amounts to; a
        request's fault is never the version's)."""
        if name not in self.models:  # unknown names are not label values
            return
        outcome = "ok" if status == 200 else f"http_{status}"
        self.metrics.request(name, version, outcome, seconds, protocol)
        if self.recorder is not None and version and (status == 200 or status >= 500):
            # the gate compares the engine's run by request size, never the time a
            # client took to send its request (edge_sync.decide.health)
            self.recorder.record(name, version, error=status >= 500,
                                 seconds=work.run_s if work.run_s is not None else seconds,
                                 units=work.units)  # fmt: skip


def run_clock(engine: Engine) -> Callable[[], float]:
    """How an engine's run is timed for the health gate: the CPU time of this thread
    when ONNX Runtime computes on it alone (the CPU provider with one intra-op thread,
    the default), which a flood of other requests competing for the CPU does not
    stretch; else the wall clock (a GPU, or a pool of threads)."""
    on_this_thread = engine.providers == ["CPUExecutionProvider"] and engine.intra_op_threads == 1
    return time.thread_time if on_this_thread else time.perf_counter


def quick(engine: Engine) -> bool:
    """Whether ``engine`` answers fast enough to run where its request was read
    (handing a request to a worker thread costs more than a small model's run:
    measured with ``benchmarks/serving.py``, 396 against 282 us of server CPU per
    request)."""
    run_s = engine.run_s
    return run_s is not None and run_s <= INLINE_RUN_S and engine.loaded
