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

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from registry.errors import RegistryError

if TYPE_CHECKING:
    import numpy.typing as npt

    from registry.schema import Target

__all__ = [
    "DATATYPES",
    "NUMPY_DTYPES",
    "Engine",
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


class OrtEngine:
    """One ONNX Runtime session."""

    def __init__(self, request: LoadRequest, *, intra_op_threads: int = 1) -> None:
        """Create the session for ``request``.

        Raises:
            EngineError: not an ONNX model ONNX Runtime can load, or a provider this
                device lacks.
        """
        import onnxruntime as ort

        self.model, self.version, self.sha256 = request.model, request.version, request.sha256
        target = request.target
        engine_kind = getattr(target, "engine", "onnxruntime")
        if engine_kind != "onnxruntime":
            raise EngineError(
                f"{request.model} {request.version}: target {getattr(target, 'name', '?')!r} "
                f"needs {engine_kind}, which this device's engine host does not run"
            )
        providers = list(getattr(target, "providers", None) or ["CPUExecutionProvider"])
        missing = [p for p in providers if p not in ort.get_available_providers()]
        if missing:
            raise EngineError(
                f"{request.model} {request.version}: provider(s) {', '.join(missing)} are not "
                f"available here ({', '.join(ort.get_available_providers())})"
            )
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = intra_op_threads
        level = "disable" if request.kind == "engine" else getattr(target, "optimization", "all")
        options.graph_optimization_level = ort.GraphOptimizationLevel(
            {0: 0, 1: 1, 2: 2, 99: 99}[_OPTIMIZATION[level]]
        )
        try:
            self._session = ort.InferenceSession(str(request.path), options, providers=providers)
        except Exception as e:  # noqa: BLE001 - ORT's pybind errors share no other base
            raise EngineError(
                f"{request.model} {request.version}: ONNX Runtime cannot load it "
                f"({type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''})"
            ) from None
        self.inputs = [(i.name, i.type, list(i.shape)) for i in self._session.get_inputs()]
        self.outputs = [(o.name, o.type, list(o.shape)) for o in self._session.get_outputs()]
        self.output_names = [o.name for o in self._session.get_outputs()]

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
        """Run once (thread-safe: ONNX Runtime sessions allow concurrent runs)."""
        names = list(outputs) if outputs is not None else self.output_names
        values = self._session.run(names, dict(inputs))
        return dict(zip(names, values, strict=True))

    def close(self) -> None:
        """Drop the session (ONNX Runtime frees it when the last reference goes)."""
        self._session = None


@dataclass
class InProcessHost:
    """Engines in this process: one serving engine per model, swapped atomically."""

    intra_op_threads: int = 1
    _serving: dict[str, Engine] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def build(self, request: LoadRequest) -> Engine:
        """An ONNX Runtime engine for ``request``."""
        return OrtEngine(request, intra_op_threads=self.intra_op_threads)

    def swap(self, model: str, engine: Engine) -> Engine | None:
        """Serve ``engine`` for ``model``; returns the engine it replaced."""
        with self._lock:
            old = self._serving.get(model)
            self._serving[model] = engine
        return old

    def current(self, model: str) -> Engine | None:
        """The engine serving ``model``."""
        with self._lock:
            return self._serving.get(model)

    def drop(self, model: str) -> Engine | None:
        """Stop serving ``model``; returns the engine that served it."""
        with self._lock:
            return self._serving.pop(model, None)

    def retire(self, engine: Engine) -> None:
        """Release ``engine`` (requests that hold a reference finish on it first)."""
        engine.close()

    def models(self) -> dict[str, Engine]:
        """A snapshot of what serves each model."""
        with self._lock:
            return dict(self._serving)


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
