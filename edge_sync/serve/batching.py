"""Dynamic batching (``serve.batching``, or a model's own in ``models``): concurrent
requests to one model stacked into one run and split again, as Triton's dynamic batcher
and MLServer's adaptive batching do.

A request joins a batch only with requests that hold the **same engine** (one version:
a batch never spans a swap, so every answer still names the version that computed it),
the same datatypes and shapes past the first dimension, and the same outputs asked for;
anything else waits for a batch of its own kind.  The first request of a batch waits at
most ``max_queue_delay`` for others, and a batch holds at most ``max_batch_size`` rows.
Only models whose every input and output leaves its first dimension open are batched; a
request whose inputs disagree on their first dimension runs alone.

A batch that fails, or whose outputs do not split by rows, is run again request by
request, so a bad request fails alone.  Each request is charged its share of the run's
time (by rows) for the health gate.  ``runners`` threads per model form and run
batches: while one runs a batch, another gathers the next.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edge_sync.errors import RefusedError

if TYPE_CHECKING:
    from edge_sync.engine.base import Engine

__all__ = ["BatchPolicy", "Batcher", "batchable"]

Ran = tuple[dict[str, Any], float]
"""A request's outputs and its share of the run's seconds."""


@dataclass(frozen=True)
class BatchPolicy:
    """How a model's requests are batched (``serve.batching``)."""

    max_batch_size: int = 8
    max_queue_delay_s: float = 0.002


def batchable(engine: Engine) -> bool:
    """Whether ``engine``'s model leaves the first dimension of every input and output
    open (a batch of any size fits it)."""

    def open_first(shape: list[Any]) -> bool:
        return bool(shape) and not (isinstance(shape[0], int) and shape[0] >= 0)

    declared = [s for _, _, s in engine.inputs] + [s for _, _, s in engine.outputs]
    return bool(declared) and all(open_first(list(s)) for s in declared)


@dataclass
class _Item:
    engine: Engine
    inputs: dict[str, Any]
    wanted: list[str] | None
    rows: int
    arrived: float
    future: Future[Ran] = field(default_factory=Future)


class Batcher:
    """One model's batch queue and the threads that run its batches."""

    def __init__(
        self,
        model: str,
        policy: BatchPolicy,
        clock: Callable[[Engine], Callable[[], float]],
        *,
        runners: int = 2,
        max_waiting: int = 256,
        observe: Callable[[str, int, int], None] | None = None,
        depth: Callable[[str, int], None] | None = None,
    ) -> None:
        """Start the runners.

        Args:
            model: the model's name (for ``observe`` and ``depth``).
            policy: the batch bounds.
            clock: how an engine's run is timed (``edge_sync.serve.core.run_clock``).
            runners: threads forming and running batches.
            max_waiting: requests that may wait for a batch at once (503 beyond:
                ``serve.limits.max_queued``).
            observe: told (model, requests, rows) of every batch run.
            depth: told (model, requests waiting) whenever that changes.
        """
        self.model, self.policy, self.clock = model, policy, clock
        self.max_waiting = max_waiting
        self._observe, self._depth = observe, depth
        self._lock = threading.Condition()
        self._queues: dict[Hashable, deque[_Item]] = {}
        self._forming: set[Hashable] = set()
        self._waiting = 0
        self._closed = False
        self._threads = [
            threading.Thread(target=self._run, name=f"batch-{model}-{i}", daemon=True)
            for i in range(runners)
        ]
        for thread in self._threads:
            thread.start()

    def submit(
        self, engine: Engine, inputs: dict[str, Any], wanted: list[str] | None
    ) -> Future[Ran] | None:
        """Queue a request; the future of its outputs (None: it cannot join a batch,
        run it alone: inputs that disagree on their first dimension, or more rows than
        a batch holds).

        Raises:
            RefusedError: ``max_waiting`` requests wait already (503, retry after 1 s).
        """
        rows = {a.shape[0] if a.ndim else -1 for a in inputs.values()}
        if len(rows) != 1:
            return None
        (count,) = rows
        if not 0 < count <= self.policy.max_batch_size:
            return None
        key = (
            id(engine),
            tuple(sorted((n, a.dtype.str, a.shape[1:]) for n, a in inputs.items())),
            tuple(wanted) if wanted is not None else None,
        )
        item = _Item(engine, inputs, wanted, count, time.monotonic())
        with self._lock:
            if self._closed:
                return None
            if self._waiting >= self.max_waiting:
                raise RefusedError(
                    503, f"{self._waiting} requests wait for a batch of {self.model}; retry later",
                    retry_after=1,
                )  # fmt: skip
            self._queues.setdefault(key, deque()).append(item)
            self._waiting += 1
            self._lock.notify_all()
        self._told_depth()
        return item.future

    def close(self) -> None:
        """Stop the runners (requests still queued are run first)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        for thread in self._threads:
            thread.join(timeout=30)

    # --- the runners ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch = self._next()
            if batch is None:
                return
            self._told_depth()
            self._execute(batch)

    def _next(self) -> list[_Item] | None:
        """The next batch: the oldest kind of request no other runner is gathering,
        once it is full or its first request has waited ``max_queue_delay``."""
        policy = self.policy
        with self._lock:
            while True:
                free = [k for k, q in self._queues.items() if q and k not in self._forming]
                if free:
                    break
                if self._closed and not any(self._queues.values()):
                    return None
                self._lock.wait()
            key = min(free, key=lambda k: self._queues[k][0].arrived)
            queue = self._queues[key]
            self._forming.add(key)
            try:
                deadline = queue[0].arrived + policy.max_queue_delay_s
                while not self._closed and sum(i.rows for i in queue) < policy.max_batch_size:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._lock.wait(left)
                batch, rows = [], 0
                while queue and rows + queue[0].rows <= policy.max_batch_size:
                    item = queue.popleft()
                    batch.append(item)
                    rows += item.rows
                if not queue:
                    del self._queues[key]
                self._waiting -= len(batch)
            finally:
                self._forming.discard(key)
                self._lock.notify_all()
        return batch

    def _execute(self, batch: list[_Item]) -> None:
        """Run ``batch`` as one; alone each, when that fails or does not split."""
        import numpy as np

        engine = batch[0].engine
        total = sum(i.rows for i in batch)
        if self._observe is not None:
            self._observe(self.model, len(batch), total)
        if len(batch) > 1:
            stacked = {
                name: np.concatenate([i.inputs[name] for i in batch]) for name in batch[0].inputs
            }
            clock = self.clock(engine)
            started = clock()
            try:
                results = engine.run(stacked, batch[0].wanted)
            except Exception:  # noqa: BLE001 - each request alone says whose it is
                results = None
            seconds = clock() - started
            del stacked
            if results is not None and _splits(results, total):
                at = 0
                for item in batch:
                    share = {n: np.asarray(v)[at : at + item.rows] for n, v in results.items()}
                    at += item.rows
                    item.future.set_result((share, seconds * item.rows / total))
                return
        for item in batch:
            _alone(item, self.clock)

    def _told_depth(self) -> None:
        if self._depth is not None:
            self._depth(self.model, self._waiting)


def _splits(results: Mapping[str, Any], rows: int) -> bool:
    """Whether every output has ``rows`` rows (a batch's answers split by row)."""
    import numpy as np

    return all(np.ndim(v) >= 1 and np.shape(v)[0] == rows for v in results.values())


def _alone(item: _Item, clock: Callable[[Engine], Callable[[], float]]) -> None:
    """Run one request by itself, its outcome (or exception) in its future."""
    timer = clock(item.engine)
    started = timer()
    try:
        results = item.engine.run(item.inputs, item.wanted)
    except Exception as e:  # noqa: BLE001 - handed to the request, which judges it
        item.future.set_exception(e)
        return
    item.future.set_result((results, timer() - started))
