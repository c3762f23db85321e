"""The hand-off between the updater and the serving layer (stable API).

The updater gets verified bytes onto the device and decides what should run; an
:class:`EngineHost` turns a verified file into a runnable :class:`Engine`, proves it
with :func:`self_test` (the signed golden cases within their tolerances, then warm-up
runs), and swaps it in.  The in-process host here runs ONNX Runtime sessions; the
serving layer answers requests from :meth:`EngineHost.current`, which always returns
a whole engine (the swap is one reference assignment under a lock), and releases an
old engine only when the requests that hold it are done.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import json
import mmap
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from edge_sync import tensorrt
from edge_sync.weights import WeightError, Weights, split_model
from registry.atomic import write_atomic
from registry.errors import RegistryError

if TYPE_CHECKING:
    import numpy.typing as npt

    from registry.schema import Target

__all__ = [
    "DATATYPES",
    "NUMPY_DTYPES",
    "Engine",
    "EngineClosedError",
    "EngineError",
    "EngineHost",
    "GoldenCase",
    "InProcessHost",
    "LoadRequest",
    "OrtEngine",
    "SelfTestError",
    "self_test",
]

WARMUP_RUNS: Final = 3
PREPACK_RUNS: Final = 5
"""Timed runs per variant when a host measures whether prepacking pays for a model."""
LRU_K: Final = 2
"""Request times kept per engine for eviction (LRU-2: one burst does not make an
engine valuable)."""
PREPACK_GAIN: Final = 1.25
"""How much faster prepacked runs must be to give up sharing weights between versions."""
DATATYPES: Final = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(int8)": "INT8",
    "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
    "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}  # fmt: skip
"""ONNX Runtime's tensor types as the Open Inference Protocol names them."""
NUMPY_DTYPES: Final = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
    "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "FP32": "float32", "FP64": "float64", "BYTES": "object",
}  # fmt: skip
"""The numpy dtype of each protocol datatype."""
_OPTIMIZATION: Final = {"disable": 0, "basic": 1, "extended": 2, "all": 99}


class EngineError(RegistryError):
    """An engine could not be built from a verified file (and another try would not
    change that: the version is rejected)."""


class SelfTestError(EngineError):
    """An engine built, but failed its self-test."""


@dataclass(frozen=True)
class LoadRequest:
    """What to build: a verified file and the settings it runs with.

    Attributes:
        model, version: which model version.
        path: the verified file (a blob).
        sha256: its digest.
        kind: ``artifact`` (ONNX, optimized at load) or ``engine`` (a prebuilt engine:
            for ONNX Runtime an ONNX graph optimized offline, loaded as is).
        target: the device target whose settings apply (None: ONNX Runtime on CPU).
    """

    model: str
    version: str
    path: Path
    sha256: str
    kind: str = "artifact"
    target: Target | None = None


@dataclass(frozen=True)
class GoldenCase:
    """A signed golden case, read: inputs, expected outputs and tolerances."""

    name: str
    inputs: Mapping[str, Any]
    outputs: Mapping[str, Any]
    rtol: float
    atol: float


@runtime_checkable
class Engine(Protocol):
    """A runnable model version."""

    model: str
    version: str
    sha256: str

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """Run once; the named outputs (all by default) by name."""
        ...  # pragma: no cover - protocol

    def close(self) -> None:
        """Release what the engine holds."""
        ...  # pragma: no cover - protocol


class EngineHost(Protocol):
    """Builds engines and holds the one each model serves."""

    def build(self, request: LoadRequest) -> Engine:
        """An engine for ``request`` (not yet serving).

        Raises:
            EngineError: the file cannot run here (unsupported engine or provider,
                an invalid graph).
        """
        ...  # pragma: no cover - protocol

    def swap(self, model: str, engine: Engine) -> Engine | None:
        """Serve ``engine`` for ``model`` from now on; the engine it replaces."""
        ...  # pragma: no cover - protocol

    def current(self, model: str) -> Engine | None:
        """The engine serving ``model``, if any."""
        ...  # pragma: no cover - protocol

    def drop(self, model: str) -> Engine | None:
        """Stop serving ``model``; the engine that served it."""
        ...  # pragma: no cover - protocol

    def retire(self, engine: Engine) -> None:
        """Release ``engine`` once nothing uses it."""
        ...  # pragma: no cover - protocol

    def lease(
        self, model: str, version: str | None = None
    ) -> contextlib.AbstractContextManager[Engine]:
        """Hold the engine a request runs on (the serving one, or a loaded ``version``)
        until the request is done.

        Raises:
            LookupError: nothing serves ``model``, or ``version`` is not loaded.
        """
        ...  # pragma: no cover - protocol

    def versions(self, model: str) -> list[str]:
        """The loaded versions of ``model`` that answer requests, serving one first."""
        ...  # pragma: no cover - protocol


class OrtEngine:
    """One ONNX Runtime session.

    Built one of two ways (chosen by :class:`InProcessHost`):

    * **shared weights** (``share=True``, CPU only): the graph without its large
      tensors, which come from memory maps of the verified file, or from ``base`` (the
      version this one replaces) where their bytes are equal (``edge_sync.weights``).
      Graph optimizations and prepacking are off: both would make private copies.
    * **private**: the file as ONNX Runtime loads it, optimized at the target's level
      (a prebuilt engine as it is), with prepacking.
    """

    def __init__(
        self,
        request: LoadRequest,
        *,
        intra_op_threads: int = 1,
        share: bool = False,
        base: OrtEngine | None = None,
        engine_cache: Path | None = None,
    ) -> None:
        """Create the session for ``request``.

        Args:
            request: what to load.
            intra_op_threads: ONNX Runtime threads for this session.
            share: build a shared-weight session (CPU only; see the class doc).
            base: the engine to share unchanged weights with.
            engine_cache: where TensorRT engines built here are cached
                (``edge_sync.tensorrt``; None: a ``trt-cache`` folder beside the blob).

        Raises:
            EngineError: not an ONNX model ONNX Runtime can load, or a provider (or
                TensorRT) this device lacks.
        """
        import onnxruntime as ort

        self.model, self.version, self.sha256 = request.model, request.version, request.sha256
        self.request = request
        target = request.target
        engine_kind = getattr(target, "engine", "onnxruntime")
        available = ort.get_available_providers()
        providers: list[Any]
        if engine_kind == "tensorrt":
            precision = getattr(target, "precision", "fp16")
            reason = tensorrt.unavailable(available, precision)
            if reason is not None or request.kind != "artifact":
                raise EngineError(
                    f"{request.model} {request.version}: target "
                    f"{getattr(target, 'name', '?')!r} needs TensorRT: "
                    f"{reason or 'it builds its engine on the device, from the ONNX file'}"
                )
            cache = engine_cache or request.path.parent.parent / "trt-cache"
            providers = tensorrt.provider_options(
                precision, getattr(target, "workspace", 1024), cache, request.sha256
            )
        else:
            providers = list(getattr(target, "providers", None) or ["CPUExecutionProvider"])
            missing = [p for p in providers if p not in available]
            if missing:
                raise EngineError(
                    f"{request.model} {request.version}: provider(s) {', '.join(missing)} "
                    f"are not available here ({', '.join(available)})"
                )
        self.providers = providers
        self.intra_op_threads = intra_op_threads
        self.shared = share and providers == ["CPUExecutionProvider"]
        self._live: _Live | None = None
        self.evicted = False
        """Unloaded to keep within the memory budget: the next run loads it again."""
        self.run_s: float | None = None
        """Seconds a run takes, averaged over recent runs (None before the first)."""
        self.on_reload: Callable[[OrtEngine], None] | None = None
        self._reload_lock = threading.Lock()
        try:
            self.size_bytes = request.path.stat().st_size
        except OSError:
            self.size_bytes = 0
        self._live = self._open(base)
        session = self._live.session
        self.inputs = [(i.name, i.type, list(i.shape)) for i in session.get_inputs()]
        self.outputs = [(o.name, o.type, list(o.shape)) for o in session.get_outputs()]
        self.output_names = [o.name for o in session.get_outputs()]

    def _open(self, base: OrtEngine | None) -> _Live:
        """A session for the request, and the weights it runs on (see the class doc).

        Raises:
            EngineError: ONNX Runtime cannot load it.
            OSError: its file cannot be read now (out of file handles, memory: a retry
                may succeed, so this is no reason to reject the version).
        """
        import onnxruntime as ort

        request = self.request
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = self.intra_op_threads
        options.inter_op_num_threads = 1
        source: str | bytes = str(request.path)
        weights: Weights | None = None
        if self.shared:
            try:
                source, weights = self._split(options, base)
            except WeightError:
                self.shared = False  # a file this cannot split loads whole, privately
        if self.shared:
            level = "disable"
            options.add_session_config_entry("session.disable_prepacking", "1")
        elif request.kind == "engine":
            level = "disable"  # optimized offline, by CI
        else:
            level = getattr(request.target, "optimization", "all")
        options.graph_optimization_level = ort.GraphOptimizationLevel(
            {0: 0, 1: 1, 2: 2, 99: 99}[_OPTIMIZATION[level]]
        )
        try:
            return _Live(ort.InferenceSession(source, options, providers=self.providers), weights)
        except Exception as e:  # noqa: BLE001 - ORT's pybind errors share no other base
            raise EngineError(
                f"{request.model} {request.version}: ONNX Runtime cannot load it "
                f"({type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''})"
            ) from None

    def unload(self) -> None:
        """Free the session to keep within a memory budget; the next run loads it again
        (from the verified blob the request names)."""
        with self._reload_lock:
            if self._live is not None:
                self._live = None  # a run in progress keeps its own reference
                self.evicted = True

    @property
    def loaded(self) -> bool:
        """Whether the session is in memory (not evicted nor released)."""
        return self._live is not None

    @property
    def weights(self) -> Weights | None:
        """The weights the session runs on (shared-weight sessions; None otherwise)."""
        live = self._live
        return live.weights if live is not None else None

    def _split(self, options: Any, base: OrtEngine | None) -> tuple[bytes, Weights]:
        """The graph to load and its large tensors, added to ``options`` (shared with
        ``base`` where equal).

        Raises:
            WeightError: the file cannot be split (it is loaded whole instead).
            OSError: it cannot be read.
        """
        path = self.request.path
        with path.open("rb") as fh:
            if not os.fstat(fh.fileno()).st_size:
                raise WeightError("the file is empty")
            with mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as view:
                graph = split_model(view, path.name)
        base_weights = base.weights if base is not None and base.shared else None
        weights = Weights.load(path, graph.tensors, base_weights, self.sha256)
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(path.parent)
        )
        for name, held in weights.values.items():
            options.add_initializer(name, held.value)
        return graph.graph, weights

    @property
    def memory_bytes(self) -> int:
        """Weight bytes this engine holds that the engine it replaced did not (the
        file's size for a private session, a lower bound: ONNX Runtime's copies)."""
        if self.weights is not None:
            return self.weights.own_bytes
        try:
            return self.request.path.stat().st_size
        except OSError:
            return 0

    def sample_inputs(self) -> dict[str, npt.NDArray[Any]]:
        """Zeros of every input's shape (symbolic dimensions as 1): warm-up data for a
        version without golden cases."""
        import numpy as np

        arrays = {}
        for name, kind, shape in self.inputs:
            dims = [d if isinstance(d, int) and d >= 0 else 1 for d in shape]
            dtype = NUMPY_DTYPES.get(DATATYPES.get(kind, "FP32"), "float32")
            arrays[name] = np.zeros(dims, dtype=dtype) if dtype != "object" else np.full(dims, "")
        return arrays

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> dict[str, npt.NDArray[Any]]:
        """Run once (thread-safe: ONNX Runtime sessions allow concurrent runs).

        Raises:
            EngineClosedError: the engine was released.
        """
        live = self._live  # held for the run: its weights stay mapped until it returns
        if live is None:
            live = self._reload()
        names = list(outputs) if outputs is not None else self.output_names
        start = time.perf_counter()
        values = live.session.run(names, dict(inputs))
        took = time.perf_counter() - start
        # a moving average of recent runs (the serving layer runs short ones inline)
        self.run_s = took if self.run_s is None else self.run_s * 0.9 + took * 0.1
        return dict(zip(names, values, strict=True))

    def _reload(self) -> _Live:
        """The session again, after an eviction (one thread loads it; the others wait).

        Raises:
            EngineClosedError: the engine was released, not evicted.
        """
        with self._reload_lock:
            if self._live is not None:
                return self._live
            if not self.evicted:
                raise EngineClosedError(f"{self.model} {self.version} was released")
            self._live = live = self._open(None)
            self.evicted = False
        if self.on_reload is not None:
            self.on_reload(self)
        return live

    def close(self) -> None:
        """Drop the session and the weights only it used (ONNX Runtime frees the
        session when the last reference goes; a mapping closes with its last array)."""
        self.detach()

    def detach(self) -> object:
        """Release the engine, and return what it held, for the caller to free where
        it likes (destroying a large session takes milliseconds)."""
        with self._reload_lock:
            live, self._live = self._live, None  # a run in progress keeps its own reference
            self.evicted = False
        return live


@dataclass(frozen=True)
class _Live:
    """A loaded session and the weights it runs on: one reference, so that whoever
    holds the session (a run in progress) holds its memory-mapped weights too."""

    session: Any
    weights: Weights | None


class EngineClosedError(EngineError):
    """A run on an engine that was already released (a host bug: engines are released
    only when no request holds them)."""


def _footprint(engine: Engine) -> int:
    """What an engine adds to the memory budget: its own weight bytes (shared ones are
    counted where they were first loaded), else its file's size."""
    weights = getattr(engine, "weights", None)
    if weights is not None:
        return int(weights.own_bytes)
    return int(getattr(engine, "size_bytes", 0))


def _best_run_ms(engine: Engine, sample: Mapping[str, Any]) -> float:
    """The fastest of :data:`PREPACK_RUNS` runs of ``sample``, after one warm-up run."""
    engine.run(sample)
    best = float("inf")
    for _ in range(PREPACK_RUNS):
        start = time.perf_counter()
        engine.run(sample)
        best = min(best, time.perf_counter() - start)
    return round(best * 1000, 3)


def _read_decisions(path: Path | None) -> dict[str, dict[str, float | bool]]:
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
        str(model): {str(k): v for k, v in d.items() if isinstance(v, (bool, int, float))}
        for model, d in doc.items()
        if isinstance(d, dict) and isinstance(d.get("prepack"), bool)
    }


@functools.cache
def _libc() -> Any:
    """The C library (looked up once: ``find_library`` runs ``ldconfig``)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _trim_heap() -> None:
    """Give freed heap memory back to the system (glibc keeps it for reuse otherwise,
    and a long-lived daemon that swaps engines would grow)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:  # glibc
        trim(0)


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


@dataclass
class CacheStats:
    """Per model: requests that found the engine loaded, that had to load it again,
    and how often it was evicted."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0


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
        self.prepack_decisions: dict[str, dict[str, float | bool]] = _read_decisions(decisions)
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
            base=base if isinstance(base, OrtEngine) else None,
            engine_cache=self.engine_cache,
        )

    def _share(self, request: LoadRequest) -> bool:
        if self.prepack != "auto":
            return self.prepack == "off"
        decided = self.prepack_decisions.get(request.model)
        return decided is None or not decided["prepack"]  # shared until measured

    def tune(self, model: str) -> dict[str, float | bool] | None:
        """With ``prepack: auto``, measure once per model whether prepacking pays: time
        the serving (shared-weight) engine and a private, prepacked one of the same
        version on zeros shaped like the inputs; prepacking wins when it is over
        :data:`PREPACK_GAIN` times faster (it costs a private copy of every weight, and
        sharing on every later swap).  A winning private engine is swapped in at once.
        The decision is kept (``decisions``) across restarts.

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
        if busy or not isinstance(serving, OrtEngine) or not serving.shared or not serving.loaded:
            return None
        try:
            private = OrtEngine(serving.request, intra_op_threads=self.intra_op_threads)
        except EngineError:
            return self._decided(model, {"prepack": False})
        try:
            sample = serving.sample_inputs()
            with self.lease(model) as measured:  # not evicted nor released while timed
                timings = {"shared_ms": _best_run_ms(measured, sample),
                           "prepacked_ms": _best_run_ms(private, sample)}  # fmt: skip
        except Exception:  # noqa: BLE001 - zeros may not be valid input: keep sharing
            private.close()
            return self._decided(model, {"prepack": False})
        won = timings["shared_ms"] > timings["prepacked_ms"] * PREPACK_GAIN
        if won:
            old = self.swap(model, private)
            if old is not None:
                self.retire(old)
        else:
            private.close()
            _trim_heap()
        return self._decided(model, {"prepack": won, **timings})

    def _decided(self, model: str, decision: dict[str, float | bool]) -> dict[str, float | bool]:
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
            resident = [h for h in self._loaded.values() if getattr(h.engine, "loaded", True)]
            total = sum(_footprint(h.engine) for h in resident)
            victims = sorted(
                (h for h in self._serving.values()
                 if h.engine is not keep and h.engine.model != keep.model
                 and getattr(h.engine, "loaded", False)),
                key=lambda h: h.value(now, self.half_life_s),
            )  # fmt: skip
            self._over_budget = False
            for held in victims:
                if total <= self.memory_budget:
                    break
                unload = getattr(held.engine, "unload", None)
                if held.leases or unload is None:
                    self._over_budget = True  # busy now: looked at again when its lease ends
                    continue
                unload()
                total -= _footprint(held.engine)
                self._stats(held.engine.model).evictions += 1
                evicted = True
        if evicted:
            _trim_heap()

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
            if getattr(held.engine, "loaded", True):
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
        detach = getattr(held.engine, "detach", None)
        if detach is None:
            held.engine.close()
            return
        freed = [detach()]  # released at once; freed in a thread

        def free() -> None:
            freed.clear()
            _trim_heap()

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
            weights = getattr(engine, "weights", None)
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


def self_test(
    engine: Engine, cases: Sequence[GoldenCase], *, warmup_runs: int = WARMUP_RUNS
) -> dict[str, float]:
    """Prove ``engine`` before it serves: every golden case within its tolerances,
    then ``warmup_runs`` runs (of the first case's inputs, or of zeros shaped like the
    inputs when the version has no golden case).

    Returns:
        Milliseconds spent in ``goldens`` and ``warmup``.

    Raises:
        SelfTestError: a case fails to run or an output is out of tolerance (the
            message names the case, the output and the largest error).
    """
    timings: dict[str, float] = {}
    if cases:
        from registry.goldens import compare
    start = time.perf_counter()
    for case in cases:
        wanted = list(case.outputs)
        try:
            got = engine.run(case.inputs, wanted)
        except Exception as e:  # noqa: BLE001 - ORT raises many types for bad inputs
            first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            raise SelfTestError(f"golden case {case.name!r}: the model fails: {first}") from None
        for name in wanted:
            result = compare(case.outputs[name], got[name], case.rtol, case.atol)
            if not result.ok:
                detail = result.reason or (
                    f"{result.bad} of {result.total} values out of tolerance "
                    f"(max abs error {result.max_abs_error:.3g}, rtol {case.rtol:g}, "
                    f"atol {case.atol:g})"
                )
                raise SelfTestError(f"golden case {case.name!r}, output {name!r}: {detail}")
    timings["goldens"] = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    sample = getattr(engine, "sample_inputs", None)
    warm: Mapping[str, Any] | None = (
        cases[0].inputs if cases else (sample() if callable(sample) else None)
    )
    for _ in range(warmup_runs if warm is not None else 0):
        assert warm is not None  # noqa: S101 - for the type checker
        try:
            engine.run(warm)
        except Exception as e:  # noqa: BLE001 - ORT raises many types for bad inputs
            first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            raise SelfTestError(f"warm-up run fails: {first}") from None
    timings["warmup"] = (time.perf_counter() - start) * 1000
    return timings
