"""The Open Inference Protocol v2 on a device (a first step of the serving issue):
``modelreg edge run`` serves what it installed on ``serve.listen``, on real HTTP on
loopback, and every answer names the version that computed it."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.edge.conftest import EdgeRig

pytestmark = pytest.mark.integration


def _call(base: str, path: str, body: object | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    method = "POST" if data else "GET"
    request = urllib.request.Request(f"{base}{path}", data=data, method=method)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def _wait_listen(config: Path) -> str:
    from edge_sync.config import load_edge_config
    from edge_sync.daemon import status_document

    edge = load_edge_config(config)
    deadline = time.monotonic() + 60
    while True:
        status = status_document(edge)
        serving = status["models"]["mlp"]["serving"]
        if status["daemon"]["listen"] and serving:
            return f"http://{status['daemon']['listen']}"
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


def _grpc_round_trip(config: Path, x: np.ndarray, expected: np.ndarray, digest: str) -> None:
    """The same model over gRPC (``serve.grpc_listen``), through Triton's gRPC client."""
    import tritonclient.grpc as tgrpc  # type: ignore[import-untyped]

    from edge_sync.config import load_edge_config
    from edge_sync.daemon import status_document

    where = status_document(load_edge_config(config))["daemon"]["grpc_listen"]
    assert where.startswith("127.0.0.1:")
    assert not where.endswith(":0")
    with tgrpc.InferenceServerClient(where) as client:
        assert client.is_server_ready()
        tensor = tgrpc.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("mlp", [tensor], request_id="g1")
        response = result.get_response()
        assert (response.model_name, response.model_version, response.id) == ("mlp", "1.0.0", "g1")
        # the signed artifact whose engine answered (issue 28, point 4)
        assert response.parameters["model_sha256"].string_param == digest
        np.testing.assert_allclose(result.as_numpy("probs"), expected, rtol=1e-4, atol=1e-5)


def test_a_device_answers_the_open_inference_protocol(rig: EdgeRig) -> None:
    config = rig.config(
        repository={"url": str(rig.root), "poll_interval": "1h"},
        serve={"listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0"},
    )
    with config.with_suffix(".log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "modelreg", "edge", "run", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        base = _wait_listen(config)
        assert base.startswith("http://127.0.0.1:")
        assert not base.endswith(":0")  # port 0 resolved, and written to status
        assert _call(base, "/v2/health/live") == (200, {"live": True})
        assert _call(base, "/v2/health/ready") == (200, {"ready": True})
        code, meta = _call(base, "/v2/models/mlp")
        assert code == 200
        assert meta["versions"] == ["1.0.0"]
        assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]
        with np.load(rig.models / "mlp/1.0.0.inputs.npz") as held:
            x = held["input"]
        with np.load(rig.models / "mlp/1.0.0.outputs.npz") as held:
            expected = held["probs"]
        request = {"id": "r1", "inputs": [{"name": "input", "shape": list(x.shape),
                                           "datatype": "FP32", "data": x.reshape(-1).tolist()}]}  # fmt: skip
        code, answer = _call(base, "/v2/models/mlp/infer", request)
        assert code == 200, answer
        assert (answer["model_name"], answer["model_version"], answer["id"]) == (
            "mlp", "1.0.0", "r1",
        )  # fmt: skip
        # every answer names the SHA-256 of the signed artifact whose engine computed it
        served = hashlib.sha256((rig.models / "mlp/1.0.0.onnx").read_bytes()).hexdigest()
        assert answer["parameters"] == {"model_sha256": served}
        (out,) = answer["outputs"]
        got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        assert _call(base, "/v2/models/mlp/versions/1.0.0/infer", request)[0] == 200
        # errors are one JSON line with a fitting status
        assert _call(base, "/v2/models/nope")[0] == 404
        assert _call(base, "/v2/models/mlp/versions/9.9.9/infer", request)[0] == 404
        bad = {"inputs": [dict(request["inputs"][0], shape=[3, 16])]}  # type: ignore[arg-type]
        code, answer = _call(base, "/v2/models/mlp/infer", bad)
        assert code == 400
        assert "values for shape [3, 16]" in answer["error"]
        wrong = {"inputs": [dict(request["inputs"][0], datatype="INT64")]}  # type: ignore[arg-type]
        assert _call(base, "/v2/models/mlp/infer", wrong)[0] == 400
        _binary_round_trip(base, x, expected, served)
        _grpc_round_trip(config, x, expected, served)
        code, config_doc = _call(base, "/v2/models/mlp/config")
        assert code == 200
        assert config_doc["input"] == [
            {"name": "input", "dims": [-1, 16], "data_type": "TYPE_FP32"}
        ]
        assert config_doc["backend"] == "onnxruntime"
        code, index = _call(base, "/v2/repository/index", {})
        assert (code, index) == (
            200, [{"name": "mlp", "version": "1.0.0", "state": "READY", "reason": ""}]
        )  # fmt: skip
        before = _call(base, "/status")[1]["sync"]["last_checked"]
        assert _call(base, "/v2/repository/sync", {}) == (200, {"sync": "requested"})
        deadline = time.monotonic() + 30  # the poll interval is an hour: only the request
        while _call(base, "/status")[1]["sync"]["last_checked"] == before:
            assert time.monotonic() < deadline, "no sync followed the request"
            time.sleep(0.1)
        code, status = _call(base, "/status")
        assert code == 200
        assert status["models"]["mlp"]["serving"]["version"] == "1.0.0"
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as response:  # noqa: S310
            assert response.headers["Content-Type"].startswith("text/plain")
            text = response.read().decode()
        samples = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line and not line.startswith("#")
        }
        ok = 'modelreg_requests_total{model="mlp",outcome="ok",protocol="rest",version="1.0.0"}'
        assert samples[ok] == 3.0  # JSON, JSON by version, binary
        rest_400 = (
            'modelreg_requests_total{model="mlp",outcome="http_400",protocol="rest",version=""}'
        )
        assert samples[rest_400] == 3.0
        grpc_ok = (
            'modelreg_requests_total{model="mlp",outcome="ok",protocol="grpc",version="1.0.0"}'
        )
        assert samples[grpc_ok] == 1.0
        assert samples['modelreg_request_seconds_count{model="mlp"}'] == 8.0
        assert samples['modelreg_updates_total{model="mlp",result="installed"}'] == 1.0
        assert samples['modelreg_swaps_total{model="mlp"}'] == 1.0
        assert samples['modelreg_update_stage_seconds_count{stage="fetch"}'] == 1.0
        assert samples["modelreg_process_resident_memory_bytes"] > 0
        # the sync's health: when it last went well, and how long trust holds
        assert time.time() - 600 < samples["modelreg_last_successful_sync_timestamp_seconds"]
        assert samples['modelreg_trust_expiry_timestamp_seconds{role="timestamp"}'] > time.time()
        assert samples['modelreg_trust_expiry_timestamp_seconds{role="root"}'] > time.time()
        assert not any(k.startswith("modelreg_sync_failures_total") for k in samples)
        assert all(
            name.startswith("modelreg_")
            for name in (line.split("{")[0].split(" ")[0] for line in text.splitlines())
            if name and not name.startswith("#")
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def _binary_round_trip(base: str, x: Any, expected: Any, digest: str) -> None:
    """The binary tensor data extension, both ways: raw float32 after a JSON header."""
    header = json.dumps({
        "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "probs", "parameters": {"binary_data": True}}],
    }).encode()  # fmt: skip
    body = header + x.astype("<f4").tobytes()
    request = urllib.request.Request(  # noqa: S310 - loopback
        f"{base}/v2/models/mlp/infer", data=body, method="POST",
        headers={"Inference-Header-Content-Length": str(len(header)),
                 "Content-Type": "application/octet-stream"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
        split = int(response.headers["Inference-Header-Content-Length"])
        assert response.headers["x-model-sha256"] == digest
        raw = response.read()
    answer = json.loads(raw[:split])
    assert answer["parameters"] == {"model_sha256": digest}
    (out,) = answer["outputs"]
    assert "data" not in out
    size = out["parameters"]["binary_data_size"]
    got = np.frombuffer(raw[split : split + size], dtype="<f4").reshape(out["shape"])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # a size that does not fit the shape is one error line
    short = header.replace(
        f'"binary_data_size": {x.nbytes}'.encode(), f'"binary_data_size": {x.nbytes - 4}'.encode()
    )
    request = urllib.request.Request(  # noqa: S310 - loopback
        f"{base}/v2/models/mlp/infer", data=short + x.astype("<f4").tobytes()[:-4],
        method="POST", headers={"Inference-Header-Content-Length": str(len(short))},
    )  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30).close()  # noqa: S310 - loopback
    with refused.value as error:
        assert error.code == 400
        assert "data is not FP32" in json.loads(error.read())["error"]


@pytest.mark.parametrize("remote_sync", [False, True])
def test_a_sync_is_asked_for_from_this_machine_unless_configured(remote_sync: bool) -> None:
    import asyncio

    import httpx

    from edge_sync.engine.host import InProcessHost
    from edge_sync.serve.app import create_app

    asked: list[bool] = []
    app = create_app(InProcessHost(), [], dict, "t", request_sync=lambda: asked.append(True),
                     remote_sync=remote_sync)  # fmt: skip

    async def ask(client: str) -> int:
        transport = httpx.ASGITransport(app=app, client=(client, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://device") as http:
            return (await http.post("/v2/repository/sync")).status_code

    assert asyncio.run(ask("127.0.0.1")) == 200
    assert asyncio.run(ask("10.1.2.3")) == (200 if remote_sync else 403)
    assert len(asked) == (2 if remote_sync else 1)
