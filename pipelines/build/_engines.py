"""Build stage "engines": what each target runs, built where this runner can build it.

* ``onnxruntime`` targets: the model as ONNX Runtime optimizes it at the target's
  level, saved (``SessionOptions.optimized_model_filepath``) as
  ``<target>.ort.onnx`` and loaded once more to prove it works.  Built here only when
  every execution provider the target names is available on this runner: fused
  kernels are provider-specific, so a CPU-optimized graph is no engine for CUDA.
* ``tensorrt`` targets: a serialized engine ``<target>.plan``, only where ``tensorrt``
  imports and a GPU is present.  Engines are specific to the GPU and TensorRT version,
  so devices build their own (docs/reference/daemon.md); here it proves the graph builds.

A target this runner cannot build is recorded as "built on device", not as a failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from pipelines.errors import ArtifactError
from pipelines.onnx import load_session, ort_errors
from registry.atomic import replace_file, write_atomic
from registry.errors import one_line
from registry.schema import OnnxRuntimeTarget, Target, TensorRTTarget
from signing.hashing import sha256_file
from signing.target_names import engine_file_name

EngineStatus = Literal["built", "built on device", "failed"]
BUILT: Final = "built"
ON_DEVICE: Final = "built on device"
FAILED: Final = "failed"

_ORT_LEVELS: Final = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


@dataclass(frozen=True, slots=True)
class EngineResult:
    """The outcome for one target.

    Attributes:
        target: the target's name.
        engine: ``onnxruntime`` or ``tensorrt``.
        status: "built", "built on device" (this runner can't) or "failed".
        path: the engine file (repository-relative when inside it), when built.
        sha256: its digest, when built.
        size: its size in bytes, when built.
        ms: time spent on this target.
        detail: the settings used (optimization, providers, precision...).
        reason: why it was not built here, or why it failed.
    """

    target: str
    engine: str
    status: EngineStatus
    path: str | None = None
    sha256: str | None = None
    size: int | None = None
    ms: float = 0.0
    detail: dict[str, Any] | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """This result as JSON data."""
        return {
            "target": self.target,
            "engine": self.engine,
            "status": self.status,
            "path": self.path,
            "sha256": self.sha256,
            "size": self.size,
            "ms": self.ms,
            **(self.detail or {}),
            "reason": self.reason,
        }


def build_engines(
    model: Path, display: str, targets: list[Target], out_dir: Path, root: Path
) -> list[EngineResult]:
    """Build every target's engine that this runner can build, into ``out_dir``.

    Args:
        model: the verified ONNX artifact.
        display: its name in messages.
        targets: the version's ``spec.targets``.
        out_dir: the version's build folder (created if missing).
        root: the repository root (engine paths are recorded relative to it).

    Returns:
        One result per target, in order; failures have status "failed" and a reason.

    Raises:
        OSError: ``out_dir`` cannot be written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[EngineResult] = []
    for target in targets:
        start = time.perf_counter_ns()
        # The name publish reads the engine back under (and devices fetch it by).
        out = out_dir / engine_file_name(target.name, target.engine)
        if isinstance(target, OnnxRuntimeTarget):
            result = _onnxruntime(model, display, target, out)
        else:
            result = _tensorrt(model, target, out)
        path = result.path
        if path is not None:
            with contextlib.suppress(ValueError):
                path = Path(path).relative_to(root).as_posix()
        ms = round((time.perf_counter_ns() - start) / 1e6, 3)
        results.append(dataclasses.replace(result, path=path, ms=ms))
    return results


def _done(target: Target, detail: dict[str, Any], out: Path) -> EngineResult:
    return EngineResult(
        target.name, target.engine, BUILT, str(out), sha256_file(out), out.stat().st_size,
        detail=detail,
    )  # fmt: skip


def _onnxruntime(model: Path, display: str, target: OnnxRuntimeTarget, out: Path) -> EngineResult:
    import onnxruntime as ort

    detail: dict[str, Any] = {
        "optimization": target.optimization,
        "providers": list(target.providers),
    }
    available = set(ort.get_available_providers())
    missing = [p for p in target.providers if p not in available]
    if missing:
        return EngineResult(
            target.name, target.engine, ON_DEVICE, detail=detail,
            reason=f"{', '.join(missing)} not available on this runner",
        )  # fmt: skip
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, _ORT_LEVELS[target.optimization]
    )
    tmp = out.with_name(f".{out.name}.tmp")
    options.optimized_model_filepath = str(tmp)
    try:
        ort.InferenceSession(str(model), sess_options=options, providers=list(target.providers))
        replace_file(tmp, out)  # ORT wrote it; durable before it takes the final name
        # Verify before pointing at it: the saved graph must load on its own.
        load_session(out, display, list(target.providers))
    except ort_errors() as e:
        return _failed(target, detail, f"ONNX Runtime: {one_line(str(e))}", tmp)
    except ArtifactError as e:
        return _failed(target, detail, f"the optimized model does not load: {e}", out)
    return _done(target, detail, out)


def _failed(target: Target, detail: dict[str, Any], reason: str, leftover: Path) -> EngineResult:
    leftover.unlink(missing_ok=True)
    return EngineResult(target.name, target.engine, FAILED, detail=detail, reason=reason)


def _tensorrt(model: Path, target: TensorRTTarget, out: Path) -> EngineResult:
    detail: dict[str, Any] = {"precision": target.precision, "workspace_mib": target.workspace}

    def on_device(reason: str) -> EngineResult:
        return EngineResult(target.name, target.engine, ON_DEVICE, detail=detail, reason=reason)

    try:
        # Imported by name: TensorRT ships no type information and is absent on most runners.
        trt = importlib.import_module("tensorrt")
    except ImportError:
        return on_device("tensorrt is not installed on this runner")
    if target.precision == "int8":
        return on_device("int8 needs calibration data, which only the device has")
    logger = trt.Logger(trt.Logger.ERROR)
    try:
        builder = trt.Builder(logger)
    except (TypeError, RuntimeError):  # pybind11 returns nullptr without a CUDA device
        return on_device("no CUDA GPU on this runner")
    try:
        plan = _trt_plan(trt, builder, logger, model, target)
    except _TrtError as e:
        return _failed(target, detail, f"TensorRT: {e}", out)
    write_atomic(out, plan)
    detail["tensorrt"] = str(trt.__version__)
    return _done(target, detail, out)


class _TrtError(Exception):
    """TensorRT could not build the engine (message is one line)."""


def _trt_plan(trt: Any, builder: Any, logger: Any, model: Path, target: TensorRTTarget) -> bytes:
    network = builder.create_network(0)  # TensorRT 10: networks are always explicit-batch
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(model)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise _TrtError(one_line("; ".join(errors) or "the ONNX parser failed"))
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, target.workspace << 20)
    if target.precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    dynamic = False
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        shape = list(tensor.shape)
        if any(d < 0 for d in shape):
            # CI only proves the graph builds; devices size profiles for their own traffic.
            fixed = [1 if d < 0 else d for d in shape]
            profile.set_shape(tensor.name, fixed, fixed, fixed)
            dynamic = True
    if dynamic:
        config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise _TrtError("the builder returned no engine (see the TensorRT log)")
    return bytes(plan)
