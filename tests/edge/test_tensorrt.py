"""TensorRT targets (``edge_sync.engine.tensorrt``): the engine cache's key, the reasons a
device cannot run one, and, on a machine with a GPU and ONNX Runtime's TensorRT
provider, an engine built once, cached, and answering like the CPU."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edge_sync.engine import tensorrt
from edge_sync.engine.base import LoadRequest
from edge_sync.engine.ort import OrtEngine
from edge_sync.errors import EngineError
from registry.schema import TensorRTTarget
from tests.edge import models

HAS_TRT = tensorrt.TRT_PROVIDER in ort.get_available_providers()


def _target(precision: str = "fp16") -> TensorRTTarget:
    return TensorRTTarget.model_validate({"name": "gpu", "engine": "tensorrt",
                                          "precision": precision})  # fmt: skip


def test_the_cache_key_names_the_onnx_digest_tensorrt_and_the_gpu() -> None:
    key = tensorrt.cache_key("ab" * 32, "10.3.0", "NVIDIA H200 (141GB)/x")
    assert key == f"{'ab' * 32}-trt10.3.0-NVIDIA-H200-141GB-x"
    others = {
        tensorrt.cache_key("cd" * 32, "10.3.0", "NVIDIA H200"),
        tensorrt.cache_key("ab" * 32, "10.4.0", "NVIDIA H200"),
        tensorrt.cache_key("ab" * 32, "10.3.0", "NVIDIA L4"),
    }
    assert len(others) == 3  # any change builds again
    assert "/" not in tensorrt.cache_key("ab" * 32, "../../x", "../..")


def test_the_providers_put_tensorrt_first_with_its_keyed_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tensorrt, "gpu_name", lambda: "Test GPU")
    monkeypatch.setattr(tensorrt, "trt_version", lambda: "10.0")
    providers = tensorrt.provider_options("fp16", 512, tmp_path, "ef" * 32)
    name, options = providers[0]
    assert name == tensorrt.TRT_PROVIDER
    assert providers[1:] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    folder = tmp_path / f"{'ef' * 32}-trt10.0-Test-GPU"
    assert folder.is_dir()
    assert options["trt_engine_cache_path"] == str(folder)
    assert options["trt_fp16_enable"] is True
    assert options["trt_max_workspace_size"] == 512 << 20


def test_why_a_device_cannot_run_a_tensorrt_target() -> None:
    assert "no TensorrtExecutionProvider" in (tensorrt.unavailable(["CPUExecutionProvider"],
                                                                   "fp16") or "")  # fmt: skip
    assert "calibration" in (tensorrt.unavailable([tensorrt.TRT_PROVIDER], "int8") or "")
    assert tensorrt.unavailable([tensorrt.TRT_PROVIDER], "fp16") is None


@pytest.mark.skipif(HAS_TRT, reason="this machine has TensorRT: the GPU test covers it")
def test_without_tensorrt_the_engine_is_refused_not_run_on_the_cpu(tmp_path: Path) -> None:
    path = models.save(models.mlp(), tmp_path / "m.onnx")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    request = LoadRequest("mlp", "1.0.0", path, digest, target=_target())
    with pytest.raises(EngineError, match="target 'gpu' needs TensorRT"):
        OrtEngine(request, engine_cache=tmp_path / "cache")


@pytest.mark.skipif(not HAS_TRT, reason="needs onnxruntime-gpu with TensorRT and an NVIDIA GPU")
def test_a_tensorrt_engine_is_built_once_cached_and_answers_like_the_cpu(tmp_path: Path) -> None:
    path = models.save(models.mlp(), tmp_path / "blobs" / "m.onnx")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    request = LoadRequest("mlp", "1.0.0", path, digest, target=_target())
    cache = tmp_path / "cache"
    start = time.perf_counter()
    first = OrtEngine(request, engine_cache=cache)
    x = models.sample()
    got = first.run({"x": x})["y"]
    cold = time.perf_counter() - start
    (folder,) = cache.iterdir()
    assert folder.name.startswith(digest)
    assert any(folder.iterdir())  # the engine was written
    start = time.perf_counter()
    again = OrtEngine(request, engine_cache=cache)
    again.run({"x": x})
    warm = time.perf_counter() - start
    want = OrtEngine(LoadRequest("mlp", "1.0.0", path, digest)).run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)  # fp16
    print(f"TensorRT engine: built in {cold:.2f} s, loaded from the cache in {warm:.2f} s")
