"""OIP v2 over gRPC, through ``tritonclient.grpc`` on loopback: health, metadata, the
repository index, inference with raw and typed contents in every datatype, errors with
the right status, the version that computed each answer (under swaps too), and one
core shared with REST (same budget, same metrics by protocol, same health recording)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tgrpc  # type: ignore[import-untyped]
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException  # type: ignore[import-untyped]

from edge_sync.engine.base import LoadRequest
from edge_sync.engine.host import InProcessHost
from edge_sync.serve.codec import ServeLimits
from edge_sync.serve.core import Inference
from edge_sync.serve.grpc_server import GrpcServer
from edge_sync.serve.metrics import Metrics
from edge_sync.serve.recorder import Recorder
from modelreg.examples import build_model, run_onnxruntime
from tests.edge.test_conformance import (
    DATATYPES,
    NUMPY,
    samples,
    serve_datatype_models,
    serve_file,
)

pytestmark = pytest.mark.integration

_TYPED = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}  # fmt: skip


class _Served:
    def __init__(self, host: InProcessHost, core: Inference, address: str) -> None:
        self.host, self.core, self.address = host, core, address


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> Iterator[_Served]:
    host = InProcessHost(prepack="on")
    made = serve_datatype_models(host, tmp_path_factory.mktemp("grpc-models"))
    serve_file(host, "mlp", "1.0.0", example_models / "mlp/1.0.0.onnx")
    serve_file(host, "mlp", "1.1.0", example_models / "mlp/1.1.0.onnx")
    core = Inference(
        host, [*made, "mlp", "later"], Metrics(host), Recorder(),
        ServeLimits(max_body_bytes=1 << 20),
    )  # fmt: skip
    server = GrpcServer(core, "9.9", "127.0.0.1:0")
    address = server.start()
    try:
        yield _Served(host, core, address)
    finally:
        server.stop(0)


@pytest.fixture(scope="module")
def client(served: _Served) -> Iterator[Any]:
    with tgrpc.InferenceServerClient(served.address) as triton:
        yield triton


def _input(name: str, array: np.ndarray, datatype: str) -> Any:
    tensor = tgrpc.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype == np.object_:
        assert [v.decode() for v in got.reshape(-1)] == list(want.reshape(-1))
    else:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_health_metadata_and_the_repository_index(client: Any) -> None:
    assert client.is_server_live()
    assert not client.is_server_ready()  # "later" is subscribed and not loaded yet
    meta = client.get_server_metadata(as_json=True)
    assert (meta["name"], meta["version"]) == ("modelreg", "9.9")
    assert client.is_model_ready("mlp")
    assert client.is_model_ready("mlp", "1.0.0")
    assert not client.is_model_ready("later")
    with pytest.raises(InferenceServerException, match=r"no loaded version '9\.0\.0'") as e:
        client.is_model_ready("mlp", "9.0.0")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    model = client.get_model_metadata("mlp", as_json=True)
    assert model["name"] == "mlp"
    assert set(model["versions"]) == {"1.0.0", "1.1.0"}
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "16"]}]
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {"name": "mlp", "version": "1.1.0", "state": "READY"} in index
    assert {"name": "later", "state": "UNAVAILABLE", "reason": "not installed yet"} in index


@pytest.mark.parametrize("datatype", DATATYPES)
def test_every_datatype_round_trips_as_raw_contents(client: Any, datatype: str) -> None:
    x = samples(datatype)
    result = client.infer(f"id_{datatype.lower()}", [_input("x", x, datatype)], request_id="r7")
    _equal(result.as_numpy("y"), x)
    response = result.get_response()
    assert (response.model_version, response.id) == ("1", "r7")
    assert response.outputs[0].datatype == datatype


def _typed_request(model: str, name: str, array: np.ndarray, datatype: str) -> Any:
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
    values = [v.encode() if datatype == "BYTES" else v for v in array.reshape(-1).tolist()]
    getattr(tensor.contents, _TYPED[datatype]).extend(values)
    return request


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "FP16"])
def test_every_datatype_round_trips_as_typed_contents(client: Any, datatype: str) -> None:
    x = samples(datatype)
    stub = client._client_stub
    response = stub.ModelInfer(_typed_request(f"id_{datatype.lower()}", "x", x, datatype))
    got = tgrpc.InferResult(response).as_numpy("y")
    _equal(got, x)


@pytest.mark.parametrize(
    ("build", "code", "says"),
    [
        pytest.param(lambda: _typed_request("nope", "x", np.ones(2, np.float32), "FP32"), "NOT_FOUND", "unknown model 'nope'", id="unknown model"),
        pytest.param(lambda: _typed_request("later", "x", np.ones(2, np.float32), "FP32"), "UNAVAILABLE", "not loaded yet", id="not loaded yet"),
        pytest.param(lambda: _typed_request("id_fp32", "x", np.ones((2, 3), np.int32), "INT32"), "INVALID_ARGUMENT", "datatype 'INT32', the model takes FP32", id="wrong datatype"),
        pytest.param(lambda: _typed_request("id_fp32", "z", np.ones((2, 3), np.float32), "FP32"), "INVALID_ARGUMENT", "unknown input 'z'", id="unknown input"),
        pytest.param(lambda: _typed_request("id_fp16", "x", np.ones((2, 3), np.float16), "FP32"), "INVALID_ARGUMENT", "datatype 'FP32', the model takes FP16", id="FP16 needs raw contents"),
        pytest.param(lambda: _typed_request("id_int8", "x", np.full((2, 3), 300), "INT8"), "INVALID_ARGUMENT", "input 'x': data is not INT8", id="out of range for INT8"),
        pytest.param(lambda: _typed_request("mlp", "input", np.ones((3, 15), np.float32), "FP32"), "INVALID_ARGUMENT", "does not fit the model's [-1, 16]", id="wrong shape"),
        pytest.param(lambda: _typed_request("mlp", "input", np.ones((100, 16), np.float32), "FP32"), "RESOURCE_EXHAUSTED", "batch of 100, over this model's 64", id="over the batch cap"),
    ],
)  # fmt: skip
def test_bad_requests_get_the_right_status(client: Any, build: Any, code: str, says: str) -> None:
    with pytest.raises(grpc.RpcError) as e:
        client._client_stub.ModelInfer(build())
    assert e.value.code().name == code
    assert says in e.value.details()


def test_raw_and_typed_contents_and_message_caps(client: Any) -> None:
    stub = client._client_stub
    request = _typed_request("id_fp32", "x", np.ones((2, 3), np.float32), "FP32")
    request.raw_input_contents.append(np.ones((2, 3), np.float32).tobytes())
    with pytest.raises(grpc.RpcError, match="both contents and raw contents"):
        stub.ModelInfer(request)
    request = service_pb2.ModelInferRequest(model_name="id_fp32")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 3])
    request.raw_input_contents.append(b"\x00" * 20)
    with pytest.raises(grpc.RpcError, match="data is not FP32") as e:
        stub.ModelInfer(request)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    big = np.zeros((64, 16), np.float32)  # a message over the server's 1 MiB cap
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="input", datatype="FP32", shape=[64, 16])
    request.raw_input_contents.append(big.tobytes() * 300)
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(request)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_answers_match_rest_and_name_the_version_that_computed_them(
    client: Any, served: _Served
) -> None:
    x = np.random.default_rng(0).standard_normal((3, 16), dtype=np.float32)
    for version in ("1.0.0", "1.1.0"):
        result = client.infer("mlp", [_input("input", x, "FP32")], model_version=version)
        assert result.get_response().model_version == version
        want = run_onnxruntime(build_model("mlp", version).SerializeToString(), {"input": x})
        np.testing.assert_allclose(result.as_numpy("probs"), want["probs"], rtol=1e-6)
    latest = client.infer("mlp", [_input("input", x, "FP32")])
    assert latest.get_response().model_version == "1.1.0"
    # counted by protocol, and recorded for the health gate like REST's answers
    text = served.core.metrics.text().decode()
    assert (
        'modelreg_requests_total{model="mlp",outcome="ok",protocol="grpc",version="1.1.0"}' in text
    )
    with pytest.raises(grpc.RpcError):
        client._client_stub.ModelInfer(
            _typed_request("mlp", "input", np.ones((3, 15), np.float32), "FP32")
        )
    text = served.core.metrics.text().decode()
    assert (
        'modelreg_requests_total{model="mlp",outcome="http_400",protocol="grpc",version=""}' in text
    )
    recorder = served.core.recorder
    assert recorder is not None
    window = recorder.window("mlp", "1.1.0", 0.0, time.monotonic() + 1)
    assert window.requests >= 1
    assert window.errors == 0
    assert window.latencies
    assert window.latencies[-1][0] == 3 * 16  # sized by its decoded inputs


def test_a_swap_under_load_fails_no_request(
    served: _Served, example_models: Path, tmp_path: Path
) -> None:
    """Clients hammer mlp while versions are swapped in and out: every call answers,
    and each answer is the one its named version computes."""
    x = np.random.default_rng(1).standard_normal((2, 16), dtype=np.float32)
    want = {v: run_onnxruntime(build_model("mlp", v).SerializeToString(), {"input": x})["probs"]
            for v in ("1.0.0", "1.1.0")}  # fmt: skip
    failures: list[BaseException] = []
    seen: set[str] = set()
    stop = threading.Event()

    def hammer() -> None:
        with tgrpc.InferenceServerClient(served.address) as mine:
            while not stop.is_set():
                try:
                    result = mine.infer("mlp", [_input("input", x, "FP32")])
                    version = result.get_response().model_version
                    np.testing.assert_allclose(result.as_numpy("probs"), want[version], rtol=1e-6)
                    seen.add(version)
                except BaseException as e:  # noqa: BLE001 - every failure is the finding
                    failures.append(e)
                    return

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for i in range(6):
            version = ("1.0.0", "1.1.0")[i % 2]
            path = example_models / f"mlp/{version}.onnx"
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            served.host.swap("mlp", served.host.build(LoadRequest("mlp", version, path, digest)))
            threading.Event().wait(0.15)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not failures, failures[:1]
    assert seen == {"1.0.0", "1.1.0"}


def test_the_committed_stubs_are_what_protoc_makes_of_the_proto(tmp_path: Path) -> None:
    """``make proto`` regenerates them; a .proto edited without it fails here."""
    root = Path(__file__).resolve().parents[2]
    proto = "edge_sync/serve/proto/oip_v2.proto"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", proto],
        cwd=root, check=True,
    )  # fmt: skip
    for suffix in ("_pb2.py", "_pb2.pyi"):
        made = tmp_path / proto.replace(".proto", suffix)
        committed = root / proto.replace(".proto", suffix)
        assert made.read_bytes() == committed.read_bytes(), f"{committed.name}: run make proto"


def test_typed_values_are_only_taken_from_their_datatype_field(client: Any) -> None:
    request = _typed_request("id_int32", "x", samples("INT32"), "INT32")
    request.inputs[0].contents.fp32_contents.extend([1.0])
    with pytest.raises(grpc.RpcError, match="INT32 values go in int_contents, not fp32_contents"):
        client._client_stub.ModelInfer(request)
    assert NUMPY["INT32"] is np.int32


def test_the_load_generator_speaks_grpc_too(served: _Served) -> None:
    """``modelreg.loadgen`` with a grpc:// URL: the serving benchmark's gRPC runs."""
    import json

    from modelreg.loadgen import run_load

    x = np.random.default_rng(2).standard_normal((2, 16), dtype=np.float32)
    body = json.dumps({"inputs": [{"name": "input", "shape": [2, 16], "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}]}).encode()  # fmt: skip
    want = run_onnxruntime(build_model("mlp", "1.1.0").SerializeToString(), {"input": x})["probs"]

    def check(doc: Any) -> str | None:
        got = np.asarray(doc["outputs"][0]["data"], np.float32).reshape(2, 4)
        return None if np.allclose(got, want, rtol=1e-5, atol=1e-6) else "not its answer"

    result = run_load(f"grpc://{served.address}/mlp", body, concurrency=40, count=200, check=check)
    assert (result.requests, result.failed) == (200, 0), result.failures
    assert result.version_counts() == {"1.1.0": 200}
    bad = run_load(f"grpc://{served.address}/nope", body, concurrency=2, count=4)
    assert bad.failures == {"gRPC NOT_FOUND: unknown model 'nope'": 4}


class _Context:
    """A servicer context whose deadline has passed."""

    def __init__(self) -> None:
        self.aborted: tuple[Any, str] | None = None

    def time_remaining(self) -> float:
        return -0.1

    def set_trailing_metadata(self, _: Any) -> None:
        return None

    def abort(self, code: Any, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.RpcError(details)


def test_a_call_past_its_deadline_is_not_run_nor_counted_against_the_version(
    served: _Served,
) -> None:
    from edge_sync.serve.grpc_server import GrpcServer
    from edge_sync.serve.proto import oip_v2_pb2 as pb

    server = GrpcServer(served.core, "9.9", "127.0.0.1:0")  # not started: its calls only
    request = pb.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(np.ones((1, 16), np.float32).tobytes())
    recorder = served.core.recorder
    assert recorder is not None
    before = recorder.window("mlp", "1.1.0", 0.0, time.monotonic() + 1).requests
    context = _Context()
    with pytest.raises(grpc.RpcError):
        server.model_infer(request, context)
    assert context.aborted is not None
    assert context.aborted[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert recorder.window("mlp", "1.1.0", 0.0, time.monotonic() + 1).requests == before


def _live(address: str, channel_id: int) -> Any:
    """ServerLive over a channel of its own (a connection each): the answer, or the
    status code it failed with."""
    from edge_sync.serve.proto import oip_v2_pb2 as pb

    channel = grpc.insecure_channel(address, options=[("grpc.channel_id", channel_id)])
    call = channel.unary_unary(
        "/inference.GRPCInferenceService/ServerLive",
        request_serializer=pb.ServerLiveRequest.SerializeToString,
        response_deserializer=pb.ServerLiveResponse.FromString,
    )
    try:
        return channel, call(pb.ServerLiveRequest(), timeout=5).live
    except grpc.RpcError as e:
        return channel, e.code()


def test_connections_over_the_cap_are_refused_and_a_silent_one_is_closed(
    served: _Served,
) -> None:
    """A client that opens connections and sends nothing holds none for long, and
    cannot hold more than the cap (REST's serve.limits.max_connections)."""
    import socket

    from edge_sync.serve.grpc_server import GrpcServer

    server = GrpcServer(served.core, "9.9", "127.0.0.1:0", max_connections=2,
                        handshake_timeout_s=0.5)  # fmt: skip
    address = server.start()
    try:
        host, port = address.rsplit(":", 1)
        silent = socket.create_connection((host, int(port)))  # no HTTP/2 preface, ever
        silent.settimeout(10)
        started = time.monotonic()
        while silent.recv(4096):  # the server's settings, then the close ...
            pass
        assert time.monotonic() - started < 5  # ... once its handshake time ran out
        silent.close()
        opened = [_live(address, i) for i in range(4)]
        assert [answer for _, answer in opened] == [
            True, True, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE,
        ]  # fmt: skip
        for channel, _ in opened:
            channel.close()
    finally:
        server.stop(0)


def test_typed_contents_are_charged_before_anything_is_made_of_them(served: _Served) -> None:
    """A 2 MB message of a million empty BYTES elements: refused over the request's cap
    before a million Python objects exist (measured: the peak of what Python allocated
    while the call was served)."""
    import tracemalloc

    from edge_sync.serve.grpc_server import GrpcServer

    core = Inference(served.host, ["id_bytes"], Metrics(),
                     limits=ServeLimits(max_body_bytes=8 << 20, max_request_bytes=16 << 20))  # fmt: skip
    server = GrpcServer(core, "9.9", "127.0.0.1:0")
    address = server.start()
    request = service_pb2.ModelInferRequest(model_name="id_bytes")
    tensor = request.inputs.add(name="x", datatype="BYTES", shape=[1000, 1000])
    tensor.contents.bytes_contents.extend([b""] * 1_000_000)
    try:
        with tgrpc.InferenceServerClient(address) as client:
            tracemalloc.start()
            with pytest.raises(grpc.RpcError) as e:
                client._client_stub.ModelInfer(request)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
    finally:
        server.stop(0)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
    assert peak < 10 << 20, peak  # 6 MB here; 18 MB when the list was made first
