"""The hand-off between the updater and the serving layer (stable API).

The updater gets verified bytes onto the device and decides what should run; an
:class:`EngineHost` turns a verified file into a runnable :class:`Engine`, proves it
with :func:`self_test` (the signed golden cases within their tolerances, in every
session setup the device may run the version in, then warm-up runs), and swaps it in.
The in-process host here runs ONNX Runtime sessions; the serving layer answers
requests from :meth:`EngineHost.current`, which always returns a whole engine (the
swap is one reference assignment under a lock), and releases an old engine only when
the requests that hold it are done.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import mmap
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from edge_sync.engine import tensorrt
from edge_sync.engine.weights import Weights, external_tensors, split_model
from edge_sync.errors import EngineClosedError, EngineError, SelfTestError, WeightError
from registry.sessions import PREPACKED, SHARED, SessionSetup, session_setups

if TYPE_CHECKING:
    import numpy.typing as npt

    from registry.schema import Target

__all__ = [
    "DATATYPES",
    "NUMPY_DTYPES",
    "Engine",
    "EngineHost",
    "GoldenCase",
    "LoadRequest",
    "OrtEngine",
    "SetupHost",
    "check_goldens",
    "self_test",
    "trim_heap",
]

WARMUP_RUNS: Final = 3
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


@runtime_checkable
class SetupHost(Protocol):
    """A host that can build an engine in a given session setup (the self-test runs the
    goldens in every setup a device may switch to: ``registry.sessions``)."""

    def build_in(self, request: LoadRequest, setup: SessionSetup) -> Engine:
        """An engine for ``request`` in ``setup`` (not serving, not held by the host).

        Raises:
            EngineError: it cannot be built in that setup here.
        """
        ...  # pragma: no cover - protocol


class OrtEngine:
    """One ONNX Runtime session, in one of the setups of ``registry.sessions``
    (chosen by :class:`InProcessHost`; :attr:`setup` says which):

    * **shared weights** (``share=True``, CPU only): the graph without its large
      tensors, which come from memory maps of the verified file, or from ``base`` (the
      version this one replaces) where their bytes are equal (``edge_sync.engine.weights``).
      Graph optimizations and prepacking are off: both would make private copies.
    * **prepacked** (private): the file as ONNX Runtime loads it, optimized at the
      target's level (a prebuilt engine as it is), with prepacking.
    """

    def __init__(
        self,
        request: LoadRequest,
        *,
        intra_op_threads: int = 1,
        share: bool = False,
        base: OrtEngine | None = None,
        engine_cache: Path | None = None,
        log_severity: int = 3,
    ) -> None:
        """Create the session for ``request``.

        Args:
            request: what to load.
            intra_op_threads: ONNX Runtime threads for this session.
            share: build a shared-weight session (CPU only; see the class doc).
            base: the engine to share unchanged weights with.
            engine_cache: where TensorRT engines built here are cached
                (``edge_sync.engine.tensorrt``; None: a ``trt-cache`` folder beside the blob).
            log_severity: the least severe of ONNX Runtime's messages this session
                logs (0 verbose ... 4 fatal; ``edge_sync.engine.ortlog`` routes them).

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
        self.log_severity = log_severity
        setups = session_setups(target, request.kind)
        self.setup: SessionSetup = next(
            (s for s in setups if s.name == (SHARED if share else PREPACKED)), setups[-1]
        )
        """The session setup this engine runs in (``registry.sessions``)."""
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
        options.log_severity_level = self.log_severity
        options.intra_op_num_threads = self.intra_op_threads
        options.inter_op_num_threads = 1
        # no arena: it never shrinks, so one large request kept its peak for good (the
        # CNN at batch 21,399: +1.75 GiB 10 s later); small runs cost the same without
        options.enable_cpu_mem_arena = False
        source: str | bytes = str(request.path)
        weights: Weights | None = None
        if self.shared:
            try:
                source, weights = self._split(options, base)
            except WeightError:  # a file this cannot split loads whole, privately
                setups = session_setups(request.target, request.kind)
                self.setup = setups[-1]
        self.setup.configure(options)
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
    def shared(self) -> bool:
        """Whether this is a shared-weight session (see the class doc)."""
        return self.setup.shared

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
                # the file's own external data, not what the split just made external
                external = external_tensors(view)
        base_weights = base.weights if base is not None and base.shared else None
        weights = Weights.load(path, graph.tensors, base_weights, self.sha256)
        # ONNX external data (a model over 2 GB): each data file beside the .onnx (the
        # updater's view of verified blobs, hard links) is memory-mapped the same way,
        # never read.  Its values name the .onnx's blob: pinning that keeps the view,
        # whose links keep the data files, for a reload after eviction.
        for file, tensors in external.items():
            weights.merge(Weights.load(path.parent / file, tensors, base_weights, self.sha256))
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


@functools.cache
def _libc() -> Any:
    """The C library (looked up once: ``find_library`` runs ``ldconfig``)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def trim_heap() -> None:
    """Give freed heap memory back to the system (glibc keeps it for reuse otherwise,
    and a long-lived daemon that swaps engines would grow)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:  # glibc
        trim(0)


MMAP_THRESHOLD: Final = 4 << 20
"""Blocks this large are mapped on their own, and unmapped when freed."""
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3


def keep_heap_small() -> bool:
    """Make glibc give large freed blocks back at once; whether it could be told.

    glibc raises its mmap threshold each time a mapped block is freed (up to 32 MiB),
    so the next blocks that large come from a worker thread's heap, whose free top
    ``malloc_trim`` never returns: four gzip bombs left +130 MiB held for good.  A
    fixed threshold (which turns the raising off) keeps them mapped; large runs pay
    page faults, small requests nothing.
    """
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:  # not glibc
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        and mallopt(_M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD)
    )


def check_goldens(engine: Engine, cases: Sequence[GoldenCase], setup: str | None = None) -> None:
    """Every golden case of ``cases`` on ``engine``, within its tolerances.

    Args:
        engine: the engine to run them on.
        cases: the signed golden cases.
        setup: the session setup's label, named in a failure (``registry.sessions``).

    Raises:
        SelfTestError: a case fails to run or an output is out of tolerance (the
            message names the case, the output, the setup and the largest error).
    """
    from registry.goldens import compare

    where = f" in the {setup} session" if setup else ""
    for case in cases:
        wanted = list(case.outputs)
        try:
            got = engine.run(case.inputs, wanted)
        except Exception as e:  # noqa: BLE001 - ORT raises many types for bad inputs
            first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            raise SelfTestError(
                f"golden case {case.name!r}{where}: the model fails: {first}"
            ) from None
        for name in wanted:
            result = compare(case.outputs[name], got[name], case.rtol, case.atol)
            if not result.ok:
                detail = result.reason or (
                    f"{result.bad} of {result.total} values out of tolerance "
                    f"(max abs error {result.max_abs_error:.3g}, rtol {case.rtol:g}, "
                    f"atol {case.atol:g})"
                )
                raise SelfTestError(f"golden case {case.name!r}, output {name!r}{where}: {detail}")


def self_test(
    engine: Engine,
    cases: Sequence[GoldenCase],
    *,
    warmup_runs: int = WARMUP_RUNS,
    host: SetupHost | None = None,
) -> dict[str, float]:
    """Prove ``engine`` before it serves: every golden case within its tolerances in
    every session setup the device may run the version in, then ``warmup_runs`` runs
    (of the first case's inputs, or of zeros shaped like the inputs when the version
    has no golden case).

    The setups are ``registry.sessions.session_setups`` of the engine's request, in
    that order: ``engine`` answers for its own setup, and ``host`` builds an engine in
    each other one for the goldens and releases it at once.  So the verdict is the
    same on every device of the target, whatever setup (``serve.prepack``, a timing
    measurement) the device runs.

    Args:
        engine: the candidate.
        cases: its signed golden cases.
        warmup_runs: runs after the goldens.
        host: what builds engines in the other setups (None, or an engine that names
            no setup: only ``engine`` is checked).

    Returns:
        Milliseconds spent in ``goldens`` and ``warmup``.

    Raises:
        SelfTestError: a case fails to run or an output is out of tolerance (the
            message names the case, the output, the setup and the largest error).
        EngineError: the version cannot be built in another setup.
    """
    timings: dict[str, float] = {}
    start = time.perf_counter()
    own: SessionSetup | None = getattr(engine, "setup", None)
    request: LoadRequest | None = getattr(engine, "request", None)
    if not cases or own is None or request is None or host is None:
        check_goldens(engine, cases, own.label if own is not None else None)
    else:
        for setup in session_setups(request.target, request.kind):
            if setup == own:
                check_goldens(engine, cases, setup.label)
                continue
            other = host.build_in(request, setup)
            try:
                check_goldens(other, cases, setup.label)
            finally:
                other.close()
                trim_heap()  # a private copy of every weight: given back now
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
