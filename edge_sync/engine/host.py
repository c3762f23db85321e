"""The engine manager on the device: :class:`InProcessHost` holds, per model, the engine
that serves it and any others still loaded (the version it replaced while requests
drain or a health gate watches), shares unchanged weights between versions, decides
prepacking per model by measurement, and keeps engines within a memory budget.

The measurement decides only how fast a version runs, never whether it is accepted:
the self-test runs the goldens in every session setup the host may switch a version
to (:meth:`InProcessHost.build_in`, ``registry.sessions``), so every device of a
target gives a version the same verdict whatever it measured.

* :meth:`InProcessHost.swap` is one reference assignment under a lock;
* :meth:`InProcessHost.lease` hands a request the engine it runs on and holds it:
  :meth:`InProcessHost.retire` releases an engine only when its last lease ends, so a
  swap never breaks a request in flight;
* over ``memory_budget``, the least valuable idle engine of another model (LRU-K over
  request times, then decayed request heat) is unloaded and loaded again on its next
  request.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from edge_sync.engine.base import CacheStats, Engine, LoadRequest, PrepackDecision
from edge_sync.engine.heap import trim_heap
from edge_sync.engine.ort import OrtEngine
from edge_sync.errors import EngineError
from registry.atomic import write_atomic
from registry.errors import one_line
from registry.sessions import SessionSetup

__all__ = ["LRU_K", "PREPACK_GAIN", "PREPACK_RUNS", "InProcessHost"]

PREPACK_RUNS: Final = 5
"""Timed runs per variant when a host measures whether prepacking pays for a model."""
LRU_K: Final = 2
"""Request times kept per engine for eviction (LRU-2: one burst does not make an
engine valuable)."""
AGREE_RTOL: Final = 1e-3
AGREE_ATOL: Final = 1e-4
PREPACK_GAIN: Final = 1.25
"""How much faster prepacked runs must be to give up sharing weights between versions."""


def _agree(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two engines' answers are the same within :data:`AGREE_RTOL` and
    :data:`AGREE_ATOL` (graph optimizations reorder float arithmetic, no more)."""
    import numpy as np

    if a.keys() != b.keys():
        return False
    for name, value in a.items():
        x, y = np.asarray(value), np.asarray(b[name])
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.dtype.kind in "fc":
            if not np.allclose(x, y, rtol=AGREE_RTOL, atol=AGREE_ATOL, equal_nan=True):
                return False
        elif not np.array_equal(x, y):
            return False
    return True


def _best_run_ms(engine: Engine, sample: Mapping[str, Any]) -> float:
    """The fastest of :data:`PREPACK_RUNS` runs of ``sample``, after one warm-up run."""
    engine.run(sample)
    best = float("inf")
    for _ in range(PREPACK_RUNS):
        start = time.perf_counter()
        engine.run(sample)
        best = min(best, time.perf_counter() - start)
    return round(best * 1000, 3)


def _read_decisions(path: Path | None) -> dict[str, PrepackDecision]:
    """Decisions kept by an earlier run (none when absent or unreadable)."""
    if path is None:
        return {}
    try:
        doc = json.loads(path.read_bytes()[: 1 << 20])
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {
        str(model): {str(k): v for k, v in d.items() if isinstance(v, (bool, int, float, str))}
        for model, d in doc.items()
        if isinstance(d, dict) and isinstance(d.get("prepack"), bool)
    }


@dataclass(eq=False)
class _Held:
    """An engine the host has loaded: requests in flight on it, whether it was retired
    (released when the last request ends), and how it was used (for eviction)."""

    engine: Engine
    leases: int = 0
    retired: bool = False
    accesses: deque[float] = field(default_factory=lambda: deque(maxlen=LRU_K))
    heat: float = 0.0
    heat_at: float = 0.0

    def touch(self, now: float, half_life_s: float) -> None:
        """Count a request: its time, and one more unit of heat (decayed to now)."""
        self.heat = self.heat_now(now, half_life_s) + 1.0
        self.heat_at = now
        self.accesses.append(now)

    def heat_now(self, now: float, half_life_s: float) -> float:
        """Requests, each weighing half as much every ``half_life_s``."""
        return self.heat * 0.5 ** ((now - self.heat_at) / half_life_s) if self.heat else 0.0

    def value(self, now: float, half_life_s: float) -> tuple[float, float]:
        """How much keeping it is worth (LRU-K): the time of its K-th latest request
        (never asked K times: least), then its heat."""
        kth = self.accesses[0] if len(self.accesses) == LRU_K else float("-inf")
        return kth, self.heat_now(now, half_life_s)


class InProcessHost:
    """The engine manager: engines in this process, per model one serving engine and
    any others still loaded (a candidate, the version it replaced while requests drain
    or a health gate watches).

    * :meth:`swap` is one reference assignment under a lock;
    * :meth:`lease` hands a request the engine it runs on (the serving one, or a named
      loaded version) and holds it: :meth:`retire` releases an engine only when its
      last lease ends, so a swap never breaks a request in flight;
    * :meth:`build` shares unchanged weights with the engine it will replace, on CPU,
      unless prepacking pays for the model (``prepack``: ``auto`` shares at first and
      :meth:`tune` measures each model once, in the background; ``on`` never shares;
      ``off`` always does).
    """

    def __init__(
        self,
        intra_op_threads: int = 1,
        prepack: str = "auto",
        *,
        memory_budget: int | None = None,
        half_life_s: float = 300.0,
        decisions: Path | None = None,
        engine_cache: Path | None = None,
        log_severity: int = 3,
    ) -> None:
        """A host with no engines.

        Args:
            intra_op_threads: ONNX Runtime threads per session.
            prepack: ``auto``, ``on`` or ``off`` (see the class doc).
            memory_budget: the most bytes of engines kept loaded (None: no limit);
                beyond it the least valuable idle engine of another model is unloaded
                (LRU-K over request times, then decayed request heat) and loaded again
                on its next request.
            half_life_s: how fast request heat decays.
            decisions: where :meth:`tune`'s decisions are kept (None: in memory).
            engine_cache: where TensorRT engines built on this device are cached.
            log_severity: the least severe ONNX Runtime message a session logs
                (0 verbose ... 4 fatal; ``serve.onnxruntime_log``).
        """
        if prepack not in ("auto", "on", "off"):
            raise ValueError(f"prepack must be auto, on or off, not {prepack!r}")
        self.intra_op_threads = intra_op_threads
        self.prepack = prepack
        self.memory_budget = memory_budget
        self.half_life_s = half_life_s
        self.cache: dict[str, CacheStats] = {}
        """Hits, misses and evictions per model."""
        self.decisions = decisions
        self.engine_cache = engine_cache
        self.log_severity = log_severity
        self.prepack_decisions: dict[str, PrepackDecision] = _read_decisions(decisions)
        """Per model: whether prepacking won, and the milliseconds per run measured."""
        self._serving: dict[str, _Held] = {}
        self._loaded: dict[int, _Held] = {}
        self._lock = threading.Lock()
        self._over_budget = False

    # --- building --------------------------------------------------------------------

    def build(self, request: LoadRequest) -> Engine:
        """An ONNX Runtime engine for ``request``: a candidate, which no request reaches
        until :meth:`swap` serves it."""
        share = self._share(request)
        base = self.current(request.model)
        return OrtEngine(
            request,
            intra_op_threads=self.intra_op_threads,
            share=share,
            base=base,
            engine_cache=self.engine_cache,
            log_severity=self.log_severity,
        )

    def build_in(self, request: LoadRequest, setup: SessionSetup) -> Engine:
        """An engine for ``request`` in ``setup``, held by nobody (the self-test runs
        the goldens in it and closes it).

        Raises:
            EngineError: it cannot be built in that setup here.
        """
        return OrtEngine(
            request,
            intra_op_threads=self.intra_op_threads,
            share=setup.shared,
            engine_cache=self.engine_cache,
            log_severity=self.log_severity,
        )

    def _share(self, request: LoadRequest) -> bool:
        if self.prepack != "auto":
            return self.prepack == "off"
        decided = self.prepack_decisions.get(request.model)
        return decided is None or not decided["prepack"]  # shared until measured

    def tune(self, model: str) -> PrepackDecision | None:
        """With ``prepack: auto``, measure once per model whether prepacking pays: time
        the serving (shared-weight) engine and a private, prepacked one of the same
        version on zeros shaped like the inputs; prepacking wins when it is over
        :data:`PREPACK_GAIN` times faster (it costs a private copy of every weight, and
        sharing on every later swap).  A winning private engine is swapped in at once.
        The decision is kept (``decisions``) across restarts.  A measurement that
        fails (the private engine does not build, the model does not run on zeros)
        keeps sharing, and says why in the decision's ``error``.

        Returns:
            The decision made now, or None (already decided, not auto, nothing serving,
            or another engine of the model still loaded: a swap in progress).
        """
        if self.prepack != "auto" or model in self.prepack_decisions:
            return None
        with self._lock:
            held = self._serving.get(model)
            busy = any(h is not held and h.engine.model == model for h in self._loaded.values())
        serving = held.engine if held is not None else None
        if busy or serving is None or not serving.shared or not serving.loaded:
            return None
        try:
            private = OrtEngine(
                serving.request,
                intra_op_threads=self.intra_op_threads,
                log_severity=self.log_severity,
            )
        except EngineError as e:
            return self._decided(model, {"prepack": False, "error": one_line(str(e), 300)})
        try:
            sample = serving.sample_inputs()
            with self.lease(model) as measured:  # not evicted nor released while timed
                timings = {"shared_ms": _best_run_ms(measured, sample),
                           "prepacked_ms": _best_run_ms(private, sample)}  # fmt: skip
                agree = _agree(measured.run(sample), private.run(sample))
        except Exception as e:  # noqa: BLE001 - zeros may not be valid input: keep sharing
            private.close()
            error = one_line(str(e), 300) or type(e).__name__
            return self._decided(model, {
                "prepack": False,
                "error": f"the model does not run on zeros shaped like its inputs: {error}",
            })  # fmt: skip
        # the private engine runs other (fused) kernels: the self-test checked the
        # goldens in both setups before the version was accepted; this check on zeros
        # still guards a version accepted by an older daemon, which checked only one
        won = agree and timings["shared_ms"] > timings["prepacked_ms"] * PREPACK_GAIN
        if won:
            old = self.swap(model, private)
            if old is not None:
                self.retire(old)
        else:
            private.close()
            trim_heap()
        return self._decided(model, {"prepack": won, **timings})

    def _decided(self, model: str, decision: PrepackDecision) -> PrepackDecision:
        self.prepack_decisions[model] = decision
        if self.decisions is not None:
            with contextlib.suppress(OSError):  # measured again after a restart: harmless
                write_atomic(self.decisions, json.dumps(self.prepack_decisions).encode())
        return decision

    # --- serving ---------------------------------------------------------------------

    def swap(self, model: str, engine: Engine) -> Engine | None:
        """Serve ``engine`` for ``model``; returns the engine it replaced (still loaded:
        it answers for its version until :meth:`retire`)."""
        with self._lock:
            held = self._loaded.setdefault(id(engine), _Held(engine))
            held.retired = False
            old = self._serving.get(model)
            self._serving[model] = held
            if old is not None and not held.accesses:  # the model's standing carries over
                held.accesses.extend(old.accesses)
                held.heat, held.heat_at = old.heat, old.heat_at
        if isinstance(engine, OrtEngine):
            engine.on_reload = self._reloaded
        self._enforce_budget(keep=engine)
        return old.engine if old is not None else None

    def _reloaded(self, engine: OrtEngine) -> None:
        self._enforce_budget(keep=engine)

    def _enforce_budget(self, keep: Engine) -> None:
        """Unload idle engines of other models, least valuable first, until the loaded
        ones fit the budget (the engine just loaded is kept even when alone it does not:
        a request waits for it)."""
        if self.memory_budget is None:
            return
        now = time.monotonic()
        evicted = False
        with self._lock:  # a lease taken after this sees the engine unloaded: a miss
            resident = [h for h in self._loaded.values() if h.engine.loaded]
            total = sum(h.engine.memory_bytes for h in resident)
            victims = sorted(
                (h for h in self._serving.values()
                 if h.engine is not keep and h.engine.model != keep.model
                 and h.engine.loaded),
                key=lambda h: h.value(now, self.half_life_s),
            )  # fmt: skip
            self._over_budget = False
            for held in victims:
                if total <= self.memory_budget:
                    break
                if held.leases:
                    self._over_budget = True  # busy now: looked at again when its lease ends
                    continue
                held.engine.unload()
                total -= held.engine.memory_bytes
                self._stats(held.engine.model).evictions += 1
                evicted = True
        if evicted:
            trim_heap()

    def _stats(self, model: str) -> CacheStats:
        return self.cache.setdefault(model, CacheStats())

    def current(self, model: str) -> Engine | None:
        """The engine serving ``model``."""
        with self._lock:
            held = self._serving.get(model)
            return held.engine if held is not None else None

    @contextlib.contextmanager
    def lease(self, model: str, version: str | None = None) -> Iterator[Engine]:
        """The engine a request runs on, held until the request is done.

        Args:
            model: the model.
            version: a loaded version (None: the serving one).

        Raises:
            LookupError: nothing serves ``model``, or ``version`` is not loaded.
        """
        with self._lock:
            held = self._find(model, version)
            if held is None:
                raise LookupError(model if version is None else f"{model} {version}")
            held.leases += 1
            held.touch(time.monotonic(), self.half_life_s)
            stats = self._stats(model)
            if held.engine.loaded:
                stats.hits += 1
            else:
                stats.misses += 1  # its run loads it again
        try:
            yield held.engine
        finally:
            with self._lock:
                held.leases -= 1
                release = held.retired and held.leases == 0
                recheck = self._over_budget and held.leases == 0
            if release:
                self._release(held)
            if recheck:
                self._enforce_budget(keep=held.engine)

    def _find(self, model: str, version: str | None) -> _Held | None:
        serving = self._serving.get(model)
        if version is None or (serving is not None and serving.engine.version == version):
            return serving
        for held in self._loaded.values():
            e = held.engine
            if e.model == model and e.version == version and not held.retired:
                return held
        return None

    def versions(self, model: str) -> list[str]:
        """The loaded versions of ``model`` that answer requests, serving one first."""
        with self._lock:
            serving = self._serving.get(model)
            found = [serving.engine.version] if serving is not None else []
            for held in self._loaded.values():
                e = held.engine
                if e.model == model and not held.retired and e.version not in found:
                    found.append(e.version)
        return found

    def drop(self, model: str) -> Engine | None:
        """Stop serving ``model``; returns the engine that served it (still loaded)."""
        with self._lock:
            held = self._serving.pop(model, None)
        return held.engine if held is not None else None

    def retire(self, engine: Engine) -> None:
        """Release ``engine`` once the requests that hold it are done."""
        with self._lock:
            held = self._loaded.get(id(engine))
            if held is None:
                held = _Held(engine)
            if any(h is held for h in self._serving.values()):
                return  # serving again (swapped back): not ours to release
            held.retired = True
            release = held.leases == 0
        if release:
            self._release(held)

    def _release(self, held: _Held) -> None:
        """Release a drained engine, off the caller's thread (the last request on it
        may be answered on the server's event loop; freeing a large session takes
        milliseconds)."""
        with self._lock:
            self._loaded.pop(id(held.engine), None)
        freed = [held.engine.detach()]  # released at once; freed in a thread

        def free() -> None:
            freed.clear()
            trim_heap()

        threading.Thread(target=free, name="engine-release", daemon=True).start()

    def in_flight(self, engine: Engine) -> int:
        """Requests running on ``engine`` now."""
        with self._lock:
            held = self._loaded.get(id(engine))
            return held.leases if held is not None else 0

    def mapped_blobs(self) -> set[str]:
        """The blobs loaded engines map (their own, and those they share with an older
        version): a blob store keeps them while they are mapped."""
        with self._lock:
            engines = [h.engine for h in self._loaded.values()]
        found: set[str] = set()
        for engine in engines:
            weights = engine.weights
            if weights is not None:
                found |= weights.blobs()
        return found

    def loaded(self) -> list[Engine]:
        """Every engine loaded now (serving, candidates, draining)."""
        with self._lock:
            return [h.engine for h in self._loaded.values()]

    def models(self) -> dict[str, Engine]:
        """A snapshot of what serves each model."""
        with self._lock:
            return {m: h.engine for m, h in self._serving.items()}
