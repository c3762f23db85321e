"""TensorRT on the device (docs/reference/daemon.md): a ``tensorrt`` target runs the verified ONNX
artifact through ONNX Runtime's TensorRT execution provider, which builds the engine on
this GPU and caches it.

Engines are specific to the GPU and to the TensorRT version, so a device builds its own
(a plan CI built elsewhere would not load here); the cache folder is keyed by (the ONNX
file's SHA-256, the TensorRT version, the GPU's name), so a driver or hardware change
builds again instead of loading a stale engine, and a restart loads the engine it built
instead of spending minutes building it again.

Without ``onnxruntime-gpu`` built with TensorRT (or without a GPU) :func:`unavailable`
says why, and the version is rejected with that reason: it is never run on the CPU in
its place, since its goldens and speed were judged for TensorRT.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Final

__all__ = ["TRT_PROVIDER", "cache_key", "gpu_name", "provider_options", "trt_version",
           "unavailable"]  # fmt: skip

TRT_PROVIDER: Final = "TensorrtExecutionProvider"
_DISTRIBUTIONS: Final = ("tensorrt", "tensorrt-libs", "tensorrt-cu12", "tensorrt-cu13")


def unavailable(available_providers: list[str], precision: str) -> str | None:
    """Why a TensorRT target cannot run here (None: it can).

    Args:
        available_providers: ``onnxruntime.get_available_providers()``.
        precision: the target's precision.
    """
    if TRT_PROVIDER not in available_providers:
        return (
            "this device's ONNX Runtime has no TensorrtExecutionProvider (install "
            "onnxruntime-gpu built with TensorRT, on a machine with an NVIDIA GPU)"
        )
    if precision == "int8":
        return "int8 needs a calibration table, which no release publishes yet"
    return None


@functools.cache
def trt_version() -> str:
    """The installed TensorRT's version ("unknown" when no distribution says)."""
    for name in _DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


@functools.cache
def gpu_name() -> str:
    """The first GPU's name, as ``nvidia-smi`` reports it ("unknown-gpu" without one;
    asked once per process: it starts a program)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "unknown-gpu"
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "unknown-gpu"
    first = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
    return first or "unknown-gpu"


def cache_key(onnx_sha256: str, version: str, gpu: str) -> str:
    """The cache folder's name for an engine: ONNX digest, TensorRT version, GPU."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", gpu).strip("-")[:64] or "gpu"
    ver = re.sub(r"[^A-Za-z0-9._-]+", "-", version)[:32]
    return f"{onnx_sha256}-trt{ver}-{slug}"


def provider_options(
    precision: str, workspace_mib: int, cache_root: Path, onnx_sha256: str
) -> list[Any]:
    """The execution providers for a TensorRT target: TensorRT (engine cache in its
    keyed folder under ``cache_root``), then CUDA and the CPU for what TensorRT does
    not take."""
    folder = cache_root / cache_key(onnx_sha256, trt_version(), gpu_name())
    folder.mkdir(parents=True, exist_ok=True)
    options = {
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(folder),
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": str(folder),
        "trt_fp16_enable": precision == "fp16",
        "trt_max_workspace_size": workspace_mib << 20,
    }
    return [(TRT_PROVIDER, options), "CUDAExecutionProvider", "CPUExecutionProvider"]
