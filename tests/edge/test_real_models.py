"""Real third-party models served over the Open Inference Protocol: PaddleOCR's text
direction classifier and text detector (from ``rapidocr-onnxruntime``) and Silero VAD
(``silero-vad``: an ``If`` on the sample rate, an int64 scalar input, a recurrent
state), each answer compared with a direct ONNX Runtime session of the same file.

Both ways a device builds engines are served: shared weights (``prepack="off"``:
sessions over memory-mapped tensors, ``edge_sync.engine.weights``) and private prepacked
sessions (``prepack="on"``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton  # type: ignore[import-untyped]
from tritonclient.utils import InferenceServerException  # type: ignore[import-untyped]

from edge_sync.engine.host import InProcessHost
from edge_sync.serve.app import create_app
from tests.edge.real_models import REAL_MODELS, real_model_path
from tests.edge.test_conformance import loopback_server, serve_file

pytestmark = pytest.mark.integration

CLS_OUT = "save_infer_model/scale_0.tmp_1"
DET_OUT = "sigmoid_0.tmp_0"


class Served:
    """The real models on one host, behind a real server, and the clients to it."""

    def __init__(self, host: InProcessHost, address: str) -> None:
        self.host = host
        self.http = httpx.Client(base_url=f"http://{address}", timeout=30)
        self.triton = triton.InferenceServerClient(address, network_timeout=30)

    def close(self) -> None:
        self.http.close()
        self.triton.close()

    def infer(self, model: str, arrays: dict[str, np.ndarray], *, binary: bool) -> Any:
        """Ask ``model`` through tritonclient; the result."""
        inputs = []
        for name, array in arrays.items():
            datatype = {"float32": "FP32", "int64": "INT64"}[array.dtype.name]
            tensor = triton.InferInput(name, list(array.shape), datatype)
            inputs.append(tensor.set_data_from_numpy(array, binary_data=binary))
        outputs = [
            triton.InferRequestedOutput(o["name"], binary_data=binary)
            for o in self.triton.get_model_metadata(model)["outputs"]
        ]
        return self.triton.infer(model, inputs, outputs=outputs)


@pytest.fixture(scope="module", params=["off", "on"], ids=["shared", "prepacked"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    host = InProcessHost(prepack=request.param)
    for name in REAL_MODELS:
        serve_file(host, name, "1", real_model_path(name))
    app = create_app(host, list(REAL_MODELS), dict, "1")
    with loopback_server(app) as address:
        served = Served(host, address)
        try:
            yield served
        finally:
            served.close()


@pytest.fixture(scope="module")
def reference(served: Served) -> dict[str, Any]:
    """A plain ONNX Runtime session of each real model file, at the graph optimization
    level of the served engines (none for shared weights, all for private sessions:
    fused and unfused kernels differ in the last float32 bits)."""
    options = ort.SessionOptions()
    if served.host.prepack == "off":
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return {name: ort.InferenceSession(str(real_model_path(name)), options) for name in REAL_MODELS}


def _direct(session: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def test_the_host_builds_them_the_way_asked(served: Served) -> None:
    shared = served.host.prepack == "off"
    for name in REAL_MODELS:
        engine = served.host.current(name)
        assert engine is not None
        assert getattr(engine, "shared", None) is shared


def test_metadata_of_real_models(served: Served) -> None:
    tc = served.triton
    assert tc.get_model_metadata("det")["inputs"] == [
        {"name": "x", "datatype": "FP32", "shape": [-1, 3, -1, -1]}
    ]
    assert tc.get_model_metadata("det")["outputs"] == [
        {"name": DET_OUT, "datatype": "FP32", "shape": [-1, 1, -1, -1]}
    ]
    assert tc.get_model_metadata("cls")["outputs"] == [
        {"name": CLS_OUT, "datatype": "FP32", "shape": [-1, 2]}
    ]
    silero = tc.get_model_metadata("silero")
    assert silero["inputs"] == [
        {"name": "input", "datatype": "FP32", "shape": [-1, -1]},
        {"name": "state", "datatype": "FP32", "shape": [2, -1, 128]},
        {"name": "sr", "datatype": "INT64", "shape": []},
    ]
    assert [o["name"] for o in silero["outputs"]] == ["output", "stateN"]
    config = tc.get_model_config("silero")
    assert config["input"][2] == {"name": "sr", "dims": [], "data_type": "TYPE_INT64"}
    assert all(tc.is_model_ready(name) for name in REAL_MODELS)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize(
    ("model", "shape", "output"),
    [("det", (1, 3, 64, 64), DET_OUT), ("cls", (1, 3, 48, 192), CLS_OUT),
     ("cls", (3, 3, 48, 192), CLS_OUT)],
)  # fmt: skip
def test_ocr_models_answer_as_onnxruntime_does(
    served: Served,
    reference: dict[str, Any],
    model: str,
    shape: tuple[int, ...],
    output: str,
    *,
    binary: bool,
) -> None:
    rng = np.random.default_rng(sum(shape))
    x = ((rng.random(shape, dtype=np.float32) - 0.5) / 0.5).astype(np.float32)
    want = _direct(reference[model], {"x": x})[output]
    result = served.infer(model, {"x": x}, binary=binary)
    got = result.as_numpy(output)
    assert got.shape == want.shape == (shape[0], *((1, 64, 64) if model == "det" else (2,)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert result.get_response()["model_name"] == model


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_silero_keeps_its_state_through_the_server(
    served: Served, reference: dict[str, Any], *, binary: bool
) -> None:
    rng = np.random.default_rng(7)
    t = np.arange(512, dtype=np.float32) / 16000
    state = np.zeros((2, 1, 128), np.float32)
    probabilities = []
    for step in range(4):  # silence, then a loud tone with noise: the state carries over
        chunk = (0.5 * np.sin(2 * np.pi * 440 * (t + step * 0.032)) * (step > 0)
                 + 0.01 * rng.standard_normal(512)).astype(np.float32)[None, :]  # fmt: skip
        sr = np.array(16000, dtype=np.int64)
        result = served.infer("silero", {"input": chunk, "state": state, "sr": sr}, binary=binary)
        # the same state into both (the served one): no drift between optimization levels
        want = _direct(reference["silero"], {"input": chunk, "state": state, "sr": sr})
        np.testing.assert_allclose(result.as_numpy("output"), want["output"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(result.as_numpy("stateN"), want["stateN"], rtol=1e-5, atol=1e-6)
        state = result.as_numpy("stateN")
        probabilities.append(float(result.as_numpy("output")[0, 0]))
    assert state.shape == (2, 1, 128)
    assert np.abs(state).max() > 0
    assert all(0.0 <= p <= 1.0 for p in probabilities)


def test_silero_scalar_sample_rate_as_raw_json(served: Served, reference: dict[str, Any]) -> None:
    """The int64 scalar as a bare value or a flat list of one; 8 kHz takes the If's other
    branch; a sample rate of the wrong type is the request's fault."""
    chunk = np.linspace(-0.3, 0.3, 256, dtype=np.float32)[None, :]
    state = np.zeros((2, 1, 128), np.float32)
    want = _direct(reference["silero"], {"input": chunk, "state": state,
                                         "sr": np.array(8000, np.int64)})  # fmt: skip

    def request(sr: dict[str, Any]) -> httpx.Response:
        doc = {"inputs": [
            {"name": "input", "shape": [1, 256], "datatype": "FP32", "data": chunk.tolist()},
            {"name": "state", "shape": [2, 1, 128], "datatype": "FP32",
             "data": state.reshape(-1).tolist()},
            {"name": "sr", **sr},
        ]}  # fmt: skip
        return served.http.post("/v2/models/silero/infer", content=json.dumps(doc))

    for sr in ({"shape": [], "datatype": "INT64", "data": 8000},
               {"shape": [], "datatype": "INT64", "data": [8000]}):  # fmt: skip
        response = request(sr)
        assert response.status_code == 200, response.text
        outputs = {o["name"]: o for o in response.json()["outputs"]}
        assert outputs["output"]["shape"] == [1, 1]
        got = np.array(outputs["output"]["data"], np.float32).reshape(1, 1)
        np.testing.assert_allclose(got, want["output"], rtol=1e-5, atol=1e-6)
        got_state = np.array(outputs["stateN"]["data"], np.float32).reshape(2, 1, 128)
        np.testing.assert_allclose(got_state, want["stateN"], rtol=1e-5, atol=1e-6)
    wrong_type = request({"shape": [], "datatype": "FP32", "data": 8000.0})
    assert wrong_type.status_code == 400
    assert "the model takes INT64" in wrong_type.json()["error"]


def test_shapes_real_models_cannot_take_are_400(served: Served) -> None:
    x = np.zeros((1, 4, 32, 32), np.float32)
    with pytest.raises(InferenceServerException) as refused:
        served.infer("det", {"x": x}, binary=True)
    assert refused.value.status() == "400"
    assert "does not fit the model's [-1, 3, -1, -1]" in refused.value.message()
    state = np.zeros((2, 1, 64), np.float32)
    feeds: dict[str, np.ndarray] = {"input": np.zeros((1, 512), np.float32), "state": state,
             "sr": np.array(16000, np.int64)}  # fmt: skip
    with pytest.raises(InferenceServerException) as refused:
        served.infer("silero", feeds, binary=True)
    assert refused.value.status() == "400"
    assert "does not fit the model's [2, -1, 128]" in refused.value.message()


def test_a_size_the_detector_cannot_compute_is_the_engines_fault(served: Served) -> None:
    """33x33 fits the metadata ([-1, 3, -1, -1]) but not the graph (its FPN adds maps of
    3 and 4 rows): ONNX Runtime fails with FAIL, not INVALID_ARGUMENT, so by the
    server's rule it is a 500, which the health gate counts against the version."""
    with pytest.raises(InferenceServerException) as refused:
        served.infer("det", {"x": np.zeros((1, 3, 33, 33), np.float32)}, binary=True)
    assert refused.value.status() == "500"
    assert refused.value.message().startswith("inference failed: [ONNXRuntimeError] : 1 : FAIL")
