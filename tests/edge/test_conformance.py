"""The device's Open Inference Protocol v2 server against the protocol, request by request.

The app runs in this process under a real uvicorn server on 127.0.0.1; raw cases are
written by hand and sent with httpx, the rest with ``tritonclient.http``, Triton's own
client.
The engines are real ONNX Runtime sessions from :class:`~edge_sync.engine.host.InProcessHost`:
the example models, and for the datatypes they lack, Identity and Cast graphs made here
with ``onnx.helper``.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.http as triton  # type: ignore[import-untyped]
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException  # type: ignore[import-untyped]

from edge_sync.engine.base import LoadRequest
from edge_sync.engine.host import InProcessHost
from edge_sync.serve.app import MAX_BODY_BYTES, create_app

pytestmark = pytest.mark.integration

ONNX_TYPES = {
    "BOOL": TensorProto.BOOL, "UINT8": TensorProto.UINT8, "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32, "UINT64": TensorProto.UINT64, "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16, "INT32": TensorProto.INT32, "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16, "FP32": TensorProto.FLOAT, "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}  # fmt: skip
DATATYPES = list(ONNX_TYPES)
NUMPY: dict[str, Any] = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    "BYTES": np.object_,
}  # fmt: skip


def samples(datatype: str) -> np.ndarray:
    """A [2, 3] array of ``datatype`` reaching its type's extremes."""
    if datatype == "BYTES":
        values: list[Any] = ["héllo", "", '[[{"quoted\\', "ünïcödé ✓", "x" * 40, " "]
        return np.array(values, dtype=np.object_).reshape(2, 3)
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    dtype = np.dtype(NUMPY[datatype])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[info.min, info.max, 0], [1, info.max - 1, info.min // 2]], dtype)
    info_f = np.finfo(dtype)
    return np.array([[info_f.max, info_f.min, 0.5], [-2.25, info_f.tiny, 1.0]], dtype)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any]) -> bytes:
    graph = helper.make_graph(nodes, "conformance", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def identity_model(datatype: str) -> bytes:
    """``x`` -> ``y`` unchanged, both ``datatype`` of shape [n, m]."""
    t = ONNX_TYPES[datatype]
    return _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", t, ["n", "m"])],
        [helper.make_tensor_value_info("y", t, ["n", "m"])],
    )


def cast_model() -> bytes:
    """FP64 ``x`` [n] -> one output per datatype (its name, lowercased), each a Cast."""
    return _model(
        [helper.make_node("Cast", ["x"], [d.lower()], to=t) for d, t in ONNX_TYPES.items()],
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["n"])],
        [helper.make_tensor_value_info(d.lower(), t, ["n"]) for d, t in ONNX_TYPES.items()],
    )


def two_inputs_model() -> bytes:
    """``a`` + ``b`` (FP32 [2]) -> ``sum``; ``a`` * ``b`` -> ``product``."""
    spec = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("a", "b")]
    return _model(
        [helper.make_node("Add", ["a", "b"], ["sum"]),
         helper.make_node("Mul", ["a", "b"], ["product"])],
        spec,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("sum", "product")],
    )  # fmt: skip


def serve_file(host: InProcessHost, name: str, version: str, path: Path) -> None:
    """Build ``path`` as ``name`` ``version`` on ``host`` and serve it."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    host.swap(name, host.build(LoadRequest(name, version, path, digest)))


def serve_datatype_models(host: InProcessHost, folder: Path) -> list[str]:
    """Serve an Identity model per datatype (``id_<datatype>``), the Cast model and the
    two-input model on ``host`` (version "1"); their names."""
    made = {f"id_{d.lower()}": identity_model(d) for d in DATATYPES}
    made |= {"cast": cast_model(), "pair": two_inputs_model()}
    for name, data in made.items():
        (folder / f"{name}.onnx").write_bytes(data)
        serve_file(host, name, "1", folder / f"{name}.onnx")
    return list(made)


@contextlib.contextmanager
def loopback_server(app: Any) -> Iterator[str]:
    """``app`` under a real uvicorn server on 127.0.0.1 (a free port); its host:port."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                       lifespan="off", access_log=False)
    )  # fmt: skip
    thread = threading.Thread(target=server.run, name="oip-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "uvicorn did not start"
        assert time.monotonic() < deadline, "uvicorn did not start in time"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> Any:
    """The server over the example models (mlp 1.0.0 and 1.1.0 loaded, 1.1.0 serving),
    an Identity model per datatype, the Cast model, a two-input model, and ``later``,
    subscribed but not loaded yet."""
    host = InProcessHost(prepack="on")
    made = serve_datatype_models(host, tmp_path_factory.mktemp("oip-models"))
    serve_file(host, "mlp", "1.0.0", example_models / "mlp/1.0.0.onnx")
    old = host.current("mlp")
    serve_file(host, "mlp", "1.1.0", example_models / "mlp/1.1.0.onnx")
    assert old is not None
    assert old.version == "1.0.0"  # still loaded: answers /versions/1.0.0
    serve_file(host, "cnn", "1.0.0", example_models / "cnn/1.0.0.onnx")
    models = [*made, "mlp", "cnn", "later"]
    return create_app(host, models, lambda: {"device": "test"}, "9.9")


@pytest.fixture(scope="module")
def address(app: Any) -> Iterator[str]:
    """Where the server listens (host:port on 127.0.0.1)."""
    with loopback_server(app) as where:
        yield where


@pytest.fixture(scope="module")
def client(address: str) -> Iterator[httpx.Client]:
    """Raw HTTP to the server."""
    with httpx.Client(base_url=f"http://{address}", timeout=30) as raw:
        yield raw


@pytest.fixture(scope="module")
def triton_client(address: str) -> Iterator[triton.InferenceServerClient]:
    """Triton's own HTTP client to the server."""
    tc = triton.InferenceServerClient(address, network_timeout=30)
    try:
        yield tc
    finally:
        tc.close()


def _json_input(
    name: str, array: np.ndarray, datatype: str, *, nested: bool = False
) -> dict[str, Any]:
    data = array.tolist() if nested else array.reshape(-1).tolist()
    return {"name": name, "shape": list(array.shape), "datatype": datatype, "data": data}


def _infer(client: httpx.Client, model: str, doc: object, **kw: Any) -> tuple[int, Any]:
    response = client.post(f"/v2/models/{model}/infer", content=json.dumps(doc), **kw)
    return response.status_code, response.json()


def _refused(client: httpx.Client, model: str, doc: object, code: int = 400) -> str:
    got, answer = _infer(client, model, doc)
    assert got == code, answer
    assert list(answer) == ["error"]
    assert answer["error"]
    return str(answer["error"])


def _equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype == np.object_:
        assert [v.decode() if isinstance(v, bytes) else v for v in got.reshape(-1)] == list(
            want.reshape(-1)
        )
    else:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


# --- raw HTTP ------------------------------------------------------------------------


def test_server_and_model_metadata(client: httpx.Client) -> None:
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").status_code == 503  # "later" is not loaded
    assert client.get("/v2").json() == {
        "name": "modelreg", "version": "9.9", "extensions": ["binary_tensor_data"],
    }  # fmt: skip
    meta = client.get("/v2/models/mlp").json()
    assert meta == {
        "name": "mlp",
        "versions": ["1.1.0", "1.0.0"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}],
        "outputs": [{"name": "probs", "datatype": "FP32", "shape": [-1, 4]}],
    }
    assert client.get("/v2/models/mlp/versions/1.0.0").json()["name"] == "mlp"
    cast = client.get("/v2/models/cast").json()
    assert [o["datatype"] for o in cast["outputs"]] == DATATYPES
    assert {o["name"]: o["shape"] for o in cast["outputs"]}["bytes"] == [-1]
    assert client.get("/v2/models/id_bytes").json()["inputs"] == [
        {"name": "x", "datatype": "BYTES", "shape": [-1, -1]}
    ]
    config = client.get("/v2/models/id_bytes/config").json()
    assert config["input"] == [{"name": "x", "dims": [-1, -1], "data_type": "TYPE_STRING"}]
    assert (config["platform"], config["max_batch_size"]) == ("onnxruntime_onnx", 0)
    assert client.get("/v2/models/mlp/versions/1.0.0/ready").json() == {
        "name": "mlp", "ready": True,
    }  # fmt: skip


@pytest.mark.parametrize(
    "path",
    ["/v2/models/nope", "/v2/models/nope/ready", "/v2/models/nope/config",
     "/v2/models/mlp/versions/9.9.9", "/v2/models/mlp/versions/9.9.9/ready",
     "/v2/models/mlp/versions/9.9.9/config", "/v2/no/such/route"],
)  # fmt: skip
def test_unknown_models_versions_and_routes_are_404_json(client: httpx.Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404
    assert list(response.json()) == ["error"]


def test_unknown_model_or_version_inference_is_404(client: httpx.Client) -> None:
    doc = {"inputs": [_json_input("input", np.zeros((1, 16), np.float32), "FP32")]}
    assert client.post("/v2/models/nope/infer", json=doc).status_code == 404
    assert client.post("/v2/models/mlp/versions/9.9.9/infer", json=doc).status_code == 404
    assert client.post("/v2/models/later/infer", json=doc).status_code == 503
    response = client.get("/v2/models/mlp/infer")
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert list(response.json()) == ["error"]


def test_a_named_version_answers_and_says_so(client: httpx.Client, example_models: Path) -> None:
    for version in ("1.0.0", "1.1.0"):
        with np.load(example_models / f"mlp/{version}.inputs.npz") as held:
            x = held["input"]
        with np.load(example_models / f"mlp/{version}.outputs.npz") as held:
            want = held["probs"]
        doc = {"id": f"r-{version}", "inputs": [_json_input("input", x, "FP32")]}
        response = client.post(f"/v2/models/mlp/versions/{version}/infer", json=doc)
        answer = response.json()
        assert (answer["model_version"], answer["id"]) == (version, f"r-{version}")
        assert response.headers["x-model-version"] == version
        (out,) = answer["outputs"]
        assert (out["name"], out["datatype"], out["shape"]) == ("probs", "FP32", list(want.shape))
        got = np.array(out["data"], np.float32).reshape(out["shape"])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_every_datatype_round_trips_as_json(
    client: httpx.Client, datatype: str, *, nested: bool
) -> None:
    x = samples(datatype)
    code, answer = _infer(
        client, f"id_{datatype.lower()}", {"inputs": [_json_input("x", x, datatype, nested=nested)]}
    )
    assert code == 200, answer
    (out,) = answer["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("y", datatype, [2, 3])
    assert isinstance(out["data"], list)
    assert len(out["data"]) == 6  # flat, row-major
    _equal(np.array(out["data"], dtype=NUMPY[datatype]).reshape(out["shape"]), x)


def _binary_body(
    inputs: list[tuple[str, np.ndarray, str]], outputs: dict[str, bool] | None = None, **top: Any
) -> tuple[bytes, dict[str, str]]:
    """A binary-data request, written by hand (little-endian data after the header)."""
    tensors, tail = [], b""
    for name, array, datatype in inputs:
        if datatype == "BYTES":
            raw = b"".join(
                len(v.encode()).to_bytes(4, "little") + v.encode() for v in array.reshape(-1)
            )
        else:
            raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        tensors.append({"name": name, "shape": list(array.shape), "datatype": datatype,
                        "parameters": {"binary_data_size": len(raw)}})  # fmt: skip
        tail += raw
    doc: dict[str, Any] = {"inputs": tensors, **top}
    if outputs is not None:
        doc["outputs"] = [{"name": n, "parameters": {"binary_data": b}} for n, b in outputs.items()]
    header = json.dumps(doc).encode()
    return header + tail, {"Inference-Header-Content-Length": str(len(header))}


def _binary_answer(response: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The JSON header and each output, read from a binary-data response by hand."""
    split = int(response.headers["inference-header-content-length"])
    assert response.headers["content-type"] == "application/octet-stream"
    body = response.content
    answer, pos, arrays = json.loads(body[:split]), split, {}
    for out in answer["outputs"]:
        if "data" in out:
            continue
        size = out["parameters"]["binary_data_size"]
        raw = body[pos : pos + size]
        pos += size
        if out["datatype"] == "BYTES":
            items, at = [], 0
            while at < len(raw):
                n = int.from_bytes(raw[at : at + 4], "little")
                items.append(raw[at + 4 : at + 4 + n].decode())
                at += 4 + n
            arrays[out["name"]] = np.array(items, dtype=object).reshape(out["shape"])
        else:
            dtype = np.dtype(NUMPY[out["datatype"]]).newbyteorder("<")
            arrays[out["name"]] = np.frombuffer(raw, dtype).astype(dtype.newbyteorder("="))
            arrays[out["name"]] = arrays[out["name"]].reshape(out["shape"])
    assert pos == len(body)
    return answer, arrays


@pytest.mark.parametrize("datatype", DATATYPES)
def test_every_datatype_round_trips_as_binary_data(client: httpx.Client, datatype: str) -> None:
    x = samples(datatype)
    body, headers = _binary_body([("x", x, datatype)], {"y": True})
    response = client.post(f"/v2/models/id_{datatype.lower()}/infer", content=body,
                           headers=headers)  # fmt: skip
    assert response.status_code == 200, response.content[:300]
    answer, arrays = _binary_answer(response)
    assert answer["outputs"][0]["datatype"] == datatype
    _equal(arrays["y"], x)
    # binary in, JSON out: the request's binary_data false wins over binary_data_output
    body, headers = _binary_body(
        [("x", x, datatype)], {"y": False}, parameters={"binary_data_output": True}
    )
    response = client.post(f"/v2/models/id_{datatype.lower()}/infer", content=body,
                           headers=headers)  # fmt: skip
    assert response.headers["content-type"] == "application/json"
    (out,) = response.json()["outputs"]
    _equal(np.array(out["data"], dtype=NUMPY[datatype]).reshape(2, 3), x)


def test_every_output_datatype_from_one_request(client: httpx.Client) -> None:
    x = np.array([0.0, 1.0, 2.0, 255.0])
    outputs = {d.lower(): d in ("FP16", "BOOL", "BYTES", "UINT64") for d in DATATYPES}
    body, headers = _binary_body([("x", x, "FP64")], outputs)
    response = client.post("/v2/models/cast/infer", content=body, headers=headers)
    assert response.status_code == 200, response.content[:300]
    answer, arrays = _binary_answer(response)
    assert [o["datatype"] for o in answer["outputs"]] == DATATYPES
    for out in answer["outputs"]:
        datatype = out["datatype"]
        got = arrays.get(out["name"])
        if got is None:
            assert "parameters" not in out
            got = np.array(out["data"], dtype=NUMPY[datatype])
        if datatype == "BYTES":
            assert [float(v) for v in got] == x.tolist()
        else:
            _equal(got, x.astype(NUMPY[datatype]))
    # no outputs named and binary_data_output: every output as binary data
    body, headers = _binary_body([("x", x, "FP64")], parameters={"binary_data_output": True})
    answer, arrays = _binary_answer(client.post("/v2/models/cast/infer", content=body,
                                                headers=headers))  # fmt: skip
    assert sorted(arrays) == sorted(d.lower() for d in DATATYPES)
    # outputs named: only those come back, in the order asked
    doc = {"inputs": [_json_input("x", x, "FP64")], "outputs": [{"name": "int8"}, {"name": "bool"}]}
    code, answer = _infer(client, "cast", doc)
    assert code == 200
    assert [o["name"] for o in answer["outputs"]] == ["int8", "bool"]
    assert answer["outputs"][1]["data"] == [False, True, True, True]


def test_nan_and_infinity_go_both_ways(client: httpx.Client) -> None:
    x = '{"name":"x","shape":[1,3],"datatype":"FP32","data":[NaN,Infinity,-Infinity]}'
    body = '{"inputs":[' + x + "]}"
    response = client.post("/v2/models/id_fp32/infer", content=body)
    assert response.status_code == 200, response.text
    assert '"data":[NaN,Infinity,-Infinity]' in response.text  # as Triton writes them
    got = np.array(json.loads(response.text)["outputs"][0]["data"], np.float32)
    assert np.isnan(got[0])
    assert list(got[1:]) == [np.inf, -np.inf]


def test_scalars_and_empty_tensors(client: httpx.Client) -> None:
    empty = {"inputs": [{"name": "x", "shape": [0, 3], "datatype": "INT32", "data": []}]}
    code, answer = _infer(client, "id_int32", empty)
    assert code == 200, answer
    assert (answer["outputs"][0]["shape"], answer["outputs"][0]["data"]) == ([0, 3], [])
    nested_empty = {"inputs": [dict(empty["inputs"][0], shape=[2, 0], data=[[], []])]}
    assert _infer(client, "id_int32", nested_empty)[0] == 200


@pytest.mark.parametrize(
    ("shape", "data", "message"),
    [
        ([2, 3], [[1, 2], [3, 4], [5, 6]], "nested data of shape [3, 2] for shape [2, 3]"),
        ([2, 3], [[1, 2, 3], [4, 5]], "uneven"),
        ([2, 3], [[1, 2, 3], [4, 5, [6]]], "uneven"),
        ([2, 2], [[1, [2]], [3, 4]], "uneven"),
        ([2, 3], [[[1, 2, 3], [4, 5, 6]]], "nested data of shape [1, 2, 3] for shape [2, 3]"),
        ([2, 3], [1, 2, 3, 4, 5], "5 values for shape [2, 3]"),
        ([2, 3], [1, 2, 3, 4, 5, 6, 7], "7 values for shape [2, 3]"),
        ([2, 3], 7, "nested data of shape [] for shape [2, 3]"),
        ([1, 1], [[None]], "null"),
        ([1, 2], [{"a": 1}, 2], "dict"),
    ],
)
def test_data_must_hold_the_declared_shape(
    client: httpx.Client, shape: list[int], data: Any, message: str
) -> None:
    doc = {"inputs": [{"name": "x", "shape": shape, "datatype": "INT32", "data": data}]}
    assert message in _refused(client, "id_int32", doc)


@pytest.mark.parametrize(
    ("datatype", "values", "message"),
    [
        ("INT32", [1.5], "float"),
        ("INT32", [True], "bool"),
        ("INT8", [128], "out of bounds"),
        ("UINT8", [-1], "out of bounds"),
        ("UINT64", [2**64], "too large"),
        ("INT64", [2**63], "too large"),
        ("BOOL", [1], "int"),
        ("BOOL", ["true"], "str"),
        ("FP32", ["1.5"], "str"),
        ("FP32", [False], "bool"),
        ("FP16", [70000.0], "out of the range of FP16"),
        ("FP32", [1e39], "out of the range of FP32"),
        ("FP64", [10**400], "too large"),
        ("BYTES", [5], "int"),
        ("BYTES", [None], "null"),
        ("BYTES", ["\ud800"], "not UTF-8 text"),
    ],
)
def test_values_of_the_wrong_kind_or_range_are_400(
    client: httpx.Client, datatype: str, values: list[Any], message: str
) -> None:
    doc = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": datatype, "data": values}]}
    error = _refused(client, f"id_{datatype.lower()}", doc)
    assert f"data is not {datatype}" in error
    assert message in error


@pytest.mark.parametrize(
    ("model", "doc", "message"),
    [
        ("mlp", {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP64",
                             "data": [0.0] * 16}]}, "datatype 'FP64', the model takes FP32"),
        ("mlp", {"inputs": [{"name": "input", "shape": [1, 15], "datatype": "FP32",
                             "data": [0.0] * 15}]}, "shape [1, 15] does not fit the model's [-1, 16]"),
        ("mlp", {"inputs": [{"name": "input", "shape": [16], "datatype": "FP32",
                             "data": [0.0] * 16}]}, "shape [16] does not fit"),
        ("mlp", {"inputs": [{"name": "input", "shape": [1, -16], "datatype": "FP32",
                             "data": [0.0] * 16}]}, "shape must be a list of sizes"),
        ("mlp", {"inputs": [{"name": "input", "shape": [1, True], "datatype": "FP32",
                             "data": [0.0]}]}, "shape must be a list of sizes"),
        ("mlp", {"inputs": [{"name": "input", "shape": "1,16", "datatype": "FP32",
                             "data": [0.0] * 16}]}, "shape must be a list of sizes"),
        ("mlp", {"inputs": [{"name": "image", "shape": [1, 16], "datatype": "FP32",
                             "data": [0.0] * 16}]}, "unknown input 'image'"),
        ("mlp", {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32"}]},
         "give data or binary_data_size"),
        ("mlp", {"inputs": []}, "missing input(s) ['input']"),
        ("mlp", {"input": []}, "needs an 'inputs' list"),
        ("mlp", [1, 2], "needs an 'inputs' list"),
        ("pair", {"inputs": [{"name": "a", "shape": [2], "datatype": "FP32", "data": [1, 2]}]},
         "missing input(s) ['b']"),
        ("pair", {"inputs": [{"name": "a", "shape": [2], "datatype": "FP32", "data": [1, 2]}] * 2},
         "input 'a' is given twice"),
        ("id_fp32", {"id": 7, "inputs": []}, "'id' must be a string"),
        ("id_fp32", {"inputs": [1]}, "each input is an object"),
        ("id_fp32", {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}],
                     "parameters": []}, "parameters must be an object"),
    ],
)  # fmt: skip
def test_requests_that_do_not_fit_the_model_are_400(
    client: httpx.Client, model: str, doc: Any, message: str
) -> None:
    assert message in _refused(client, model, doc)


@pytest.mark.parametrize(
    ("outputs", "parameters", "message"),
    [
        ([{"name": "nope"}], {}, "unknown output(s) ['nope']"),
        ([{"name": "sum"}, {"name": "sum"}], {}, "asked for twice"),
        ({"name": "sum"}, {}, "'outputs' is a list"),
        ([{"parameters": {}}], {}, "'outputs' is a list"),
        ([{"name": "sum", "parameters": {"binary_data": "yes"}}], {}, "binary_data must be"),
        ([{"name": "sum", "parameters": {"classification": 1}}], {}, "not supported"),
        ([{"name": "sum", "parameters": {"shared_memory_region": "r"}}], {}, "not supported"),
        (None, {"binary_data_output": 1}, "binary_data_output must be"),
    ],
)
def test_bad_output_requests_are_400(
    client: httpx.Client, outputs: Any, parameters: dict[str, Any], message: str
) -> None:
    a = {"name": "a", "shape": [2], "datatype": "FP32", "data": [1, 2]}
    doc: dict[str, Any] = {"inputs": [a, dict(a, name="b")], "parameters": parameters}
    if outputs is not None:
        doc["outputs"] = outputs
    assert message in _refused(client, "pair", doc)


def test_one_of_two_outputs(client: httpx.Client) -> None:
    a = {"name": "a", "shape": [2], "datatype": "FP32", "data": [2, 3]}
    doc = {"inputs": [a, dict(a, name="b")], "outputs": [{"name": "product"}]}
    code, answer = _infer(client, "pair", doc)
    assert code == 200
    assert answer["outputs"] == [
        {"name": "product", "shape": [2], "datatype": "FP32", "data": [4.0, 9.0]}
    ]


def _post_binary(
    client: httpx.Client, model: str, header: dict[str, Any], tail: bytes, **kw: Any
) -> Any:
    raw = json.dumps(header).encode()
    headers = {"Inference-Header-Content-Length": str(len(raw)), **kw}
    return client.post(f"/v2/models/{model}/infer", content=raw + tail, headers=headers)


@pytest.mark.parametrize(
    ("datatype", "size", "tail", "message"),
    [
        ("FP32", 8, b"\0" * 8, "8 bytes for 6 values of FP32"),
        ("FP32", 24, b"\0" * 20, "binary data past the body's end"),
        ("FP32", 24, b"\0" * 28, "4 bytes of binary data no input names"),
        ("BOOL", 6, b"\x00\x01\x02\x00\x00\x00", "BOOL data must be 6 bytes of 0 or 1"),
        ("BYTES", 3, b"\x05\x00\x00", "length is cut"),
        ("BYTES", 9, b"\x09\x00\x00\x00abcde", "runs past its data"),
        ("BYTES", 29, b"".join(b"\x01\x00\x00\x00" + bytes([c]) for c in b"abcdef")[:29],
         "runs past its data"),
        ("BYTES", 30, b"\x01\x00\x00\x00\xff" + b"\x01\x00\x00\x00a" * 5, "not UTF-8"),
        ("BYTES", 28, b"\x00\x00\x00\x00" * 7, "28 bytes of BYTES data for 6 elements"),
    ],
)  # fmt: skip
def test_binary_data_that_does_not_fit_is_400(
    client: httpx.Client, datatype: str, size: int, tail: bytes, message: str
) -> None:
    header = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": datatype,
                          "parameters": {"binary_data_size": size}}]}  # fmt: skip
    response = _post_binary(client, f"id_{datatype.lower()}", header, tail)
    assert response.status_code == 400
    assert message in response.json()["error"]


def test_binary_framing_errors_are_400(client: httpx.Client) -> None:
    x = {"name": "x", "shape": [1, 1], "datatype": "FP32"}
    for header_length in ("abc", "-1", "99999", "²", "0x1", "1 2"):
        response = client.post(
            "/v2/models/id_fp32/infer", content=b"{}",
            headers={b"Inference-Header-Content-Length": header_length.encode("latin-1")},
        )  # fmt: skip
        assert response.status_code == 400
        assert "is not a length in the body" in response.json()["error"]
    both = {"inputs": [dict(x, data=[1.0], parameters={"binary_data_size": 4})]}
    response = _post_binary(client, "id_fp32", both, b"\0" * 4)
    assert "give data or binary_data_size" in response.json()["error"]
    for bad in (-4, "4", 4.0, True):
        doc = {"inputs": [dict(x, parameters={"binary_data_size": bad})]}
        assert "binary_data_size is not a size" in _post_binary(client, "id_fp32", doc, b"").text
    shm = {"inputs": [dict(x, parameters={"shared_memory_region": "r"})]}
    assert "shared memory" in _post_binary(client, "id_fp32", shm, b"").json()["error"]
    response = client.post("/v2/models/id_fp32/infer", content=b"\xff\xfe{")
    assert response.status_code == 400
    assert response.json() == {"error": "the request's JSON header is not JSON"}


def test_element_count_over_the_cap_is_413_before_any_data(client: httpx.Client) -> None:
    doc = {"inputs": [{"name": "x", "shape": [1 << 12, 1 << 12, 2], "datatype": "FP32",
                       "data": []}]}  # fmt: skip
    assert "over 16777216" in _refused(client, "id_fp32", doc, 413)
    huge = {"inputs": [{"name": "x", "shape": [2**62, 2**62], "datatype": "FP32", "data": []}]}
    assert "over 16777216" in _refused(client, "id_fp32", huge, 413)  # no wrap-around


def test_bodies_over_the_cap_are_413(client: httpx.Client) -> None:
    big = b" " * (MAX_BODY_BYTES + 1)
    response = client.post("/v2/models/id_fp32/infer", content=big)
    assert response.status_code == 413
    assert response.json() == {"error": f"request body over {MAX_BODY_BYTES} bytes"}

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
        for _ in range(65):
            yield b" " * (1 << 20)

    response = client.post("/v2/models/id_fp32/infer", content=chunks())
    assert response.status_code == 413


def test_a_declared_length_over_the_cap_is_refused_unread() -> None:
    """A real server answers from the Content-Length header alone, before the body."""
    app = create_app(InProcessHost(), ["m"], dict, "1")
    with loopback_server(app) as address:
        host, port = address.split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(
                b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: %d\r\n\r\n" % (MAX_BODY_BYTES * 4)
            )
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
    assert reply.startswith(b"HTTP/1.1 413 ")
    assert reply.rstrip().endswith(b'{"error":"request body over 67108864 bytes"}')


@pytest.mark.parametrize("where", ["data", "parameters", "top"])
def test_deep_json_is_400_without_recursion(client: httpx.Client, where: str) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    if where == "data":
        body = '{"inputs":[{"name":"x","shape":[1,1],"datatype":"FP32","data":' + deep + "}]}"
    elif where == "parameters":
        body = '{"inputs":[],"parameters":{"a":' + deep.replace("[", '{"a":', 1000) + "}}"
    else:
        body = deep
    response = client.post("/v2/models/id_fp32/infer", content=body)
    assert response.status_code == 400
    assert response.json() == {"error": "the request's JSON nests deeper than 40 levels"}
    unclosed = client.post("/v2/models/id_fp32/infer", content="[" * 1_000_000)
    assert "nests deeper" in unclosed.json()["error"]


def test_brackets_inside_strings_are_not_nesting(client: httpx.Client) -> None:
    text = '[[[{{{\\"' * 2000  # escaped quotes do not end the string
    x = np.array([[text, "]]]}}}"]], dtype=object)
    code, answer = _infer(client, "id_bytes", {"inputs": [_json_input("x", x, "BYTES")]})
    assert code == 200, answer
    assert answer["outputs"][0]["data"] == [text, "]]]}}}"]


def test_nested_data_up_to_the_depth_cap(client: httpx.Client) -> None:
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    doc = {"inputs": [_json_input("x", x, "INT32", nested=True)], "outputs": [{"name": "y"}]}
    code, answer = _infer(client, "id_int32", doc)
    assert (code, answer["outputs"][0]["data"]) == (200, list(range(6)))


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compressed_requests_are_inflated(client: httpx.Client, coding: str) -> None:
    x = samples("FP64")
    body, headers = _binary_body([("x", x, "FP64")], {"y": True})
    packed = gzip.compress(body) if coding == "gzip" else zlib.compress(body)
    response = client.post("/v2/models/id_fp64/infer", content=packed,
                           headers={**headers, "Content-Encoding": coding})  # fmt: skip
    assert response.status_code == 200, response.text
    _equal(_binary_answer(response)[1]["y"], x)
    response = client.post("/v2/models/id_fp64/infer", content=packed[:-6],
                           headers={**headers, "Content-Encoding": coding})  # fmt: skip
    assert response.status_code == 400
    assert f"not one whole {coding} stream" in response.json()["error"]


def test_compression_bombs_and_unknown_codings(client: httpx.Client) -> None:
    bomb = gzip.compress(b" " * (MAX_BODY_BYTES + 1), compresslevel=1)
    assert len(bomb) < MAX_BODY_BYTES // 100
    response = client.post("/v2/models/id_fp32/infer", content=bomb,
                           headers={"Content-Encoding": "gzip"})  # fmt: skip
    assert response.status_code == 413
    assert "inflated" in response.json()["error"]
    response = client.post("/v2/models/id_fp32/infer", content=b"{}",
                           headers={"Content-Encoding": "br"})  # fmt: skip
    assert response.status_code == 415
    response = client.post("/v2/models/id_fp32/infer", content=b"not gzip",
                           headers={"Content-Encoding": "gzip"})  # fmt: skip
    assert response.status_code == 400


def test_a_server_bug_is_one_json_line_too() -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("a bug")

    app = create_app(InProcessHost(), ["m"], broken, "1")
    with loopback_server(app) as where:
        response = httpx.get(f"http://{where}/status")
        assert response.status_code == 500
        assert response.json() == {"error": "internal error: RuntimeError"}
        # uvicorn closes the connection of a request that raised; the server goes on
        assert httpx.get(f"http://{where}/v2/health/live").json() == {"live": True}


def test_repository_index(client: httpx.Client) -> None:
    index = client.post("/v2/repository/index").json()
    by_name = {(e["name"], e["version"]): e["state"] for e in index}
    assert by_name[("mlp", "1.1.0")] == by_name[("mlp", "1.0.0")] == "READY"
    assert by_name[("later", "")] == "UNAVAILABLE"
    ready = client.post("/v2/repository/index", json={"ready": True}).json()
    assert {e["state"] for e in ready} == {"READY"}
    assert len(ready) == len(index) - 1
    assert client.post("/v2/repository/index", json={"ready": 1}).status_code == 400
    assert client.post("/v2/repository/index", content=b"[[").status_code == 400


# --- tritonclient.http on a real server ----------------------------------------------


def test_tritonclient_reads_health_metadata_config_and_index(
    triton_client: triton.InferenceServerClient,
) -> None:
    tc = triton_client
    assert tc.is_server_live()
    assert not tc.is_server_ready()  # "later" is not loaded yet
    assert tc.get_server_metadata()["extensions"] == ["binary_tensor_data"]
    assert [tc.is_model_ready("mlp"), tc.is_model_ready("mlp", "1.0.0")] == [True, True]
    assert [tc.is_model_ready("mlp", "3.0.0"), tc.is_model_ready("nope")] == [False, False]
    meta = tc.get_model_metadata("cnn")
    assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 28, 28]}]
    assert tc.get_model_metadata("mlp", "1.0.0")["versions"] == ["1.1.0", "1.0.0"]
    config = tc.get_model_config("cast")
    assert [o["data_type"] for o in config["output"]][-3:] == ["TYPE_FP32", "TYPE_FP64",
                                                               "TYPE_STRING"]  # fmt: skip
    index = tc.get_model_repository_index()
    assert {"name": "cnn", "version": "1.0.0", "state": "READY", "reason": ""} in index
    with pytest.raises(InferenceServerException) as refused:
        tc.get_model_metadata("nope")
    assert refused.value.status() == "404"
    with pytest.raises(InferenceServerException) as refused:
        tc.get_model_config("mlp", "3.0.0")
    assert refused.value.status() == "404"


def _triton_infer(
    tc: triton.InferenceServerClient,
    model: str,
    arrays: dict[str, tuple[np.ndarray, str]],
    *,
    binary_in: bool,
    binary_out: bool | None,
    **kw: Any,
) -> Any:
    inputs = []
    for name, (array, datatype) in arrays.items():
        tensor = triton.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary_in)
        inputs.append(tensor)
    outputs = None
    if binary_out is not None:
        names = [o["name"] for o in tc.get_model_metadata(model)["outputs"]]
        outputs = [triton.InferRequestedOutput(n, binary_data=binary_out) for n in names]
    return tc.infer(model, inputs, outputs=outputs, **kw)


@pytest.mark.parametrize(
    ("binary_in", "binary_out"),
    [(True, True), (False, False), (True, False), (False, True), (True, None)],
    ids=["binary", "json", "binary-in", "binary-out", "binary_data_output"],
)
def test_tritonclient_every_datatype(
    triton_client: triton.InferenceServerClient, *, binary_in: bool, binary_out: bool | None
) -> None:
    for datatype in DATATYPES:
        x = samples(datatype)
        if datatype == "BYTES" and binary_in:
            x = np.array([s.encode() for s in x.reshape(-1)], dtype=object).reshape(2, 3)
        result = _triton_infer(triton_client, f"id_{datatype.lower()}", {"x": (x, datatype)},
                               binary_in=binary_in, binary_out=binary_out)  # fmt: skip
        got = result.as_numpy("y")
        assert ("data" not in result.get_output("y")) == (binary_out is not False)
        want = samples(datatype)
        _equal(got, want)


def test_tritonclient_cast_outputs_and_request_compression(
    triton_client: triton.InferenceServerClient,
) -> None:
    x = np.array([0.0, 1.0, 2.0, 255.0])
    for coding in (None, "gzip", "deflate"):
        result = _triton_infer(triton_client, "cast", {"x": (x, "FP64")}, binary_in=True,
                               binary_out=None, request_compression_algorithm=coding)  # fmt: skip
        for datatype in DATATYPES:
            got = result.as_numpy(datatype.lower())
            if datatype == "BYTES":
                assert [float(v) for v in got] == x.tolist()
            else:
                _equal(got, x.astype(NUMPY[datatype]))


def test_tritonclient_example_models_match_their_goldens(
    triton_client: triton.InferenceServerClient, example_models: Path
) -> None:
    for model, name, out in (("mlp", "input", "probs"), ("cnn", "image", "logits")):
        version = "1.1.0" if model == "mlp" else "1.0.0"
        with np.load(example_models / f"{model}/{version}.inputs.npz") as held:
            x = held[name]
        with np.load(example_models / f"{model}/{version}.outputs.npz") as held:
            want = held[out]
        for binary in (True, False):
            result = _triton_infer(triton_client, model, {name: (x, "FP32")},
                                   binary_in=binary, binary_out=binary, request_id="g1")  # fmt: skip
            response = result.get_response()
            assert (response["model_version"], response["id"]) == (version, "g1")
            np.testing.assert_allclose(result.as_numpy(out), want, rtol=1e-5, atol=1e-6)
    with np.load(example_models / "mlp/1.0.0.inputs.npz") as held:
        x = held["input"]
    with np.load(example_models / "mlp/1.0.0.outputs.npz") as held:
        want = held["probs"]
    result = _triton_infer(triton_client, "mlp", {"input": (x, "FP32")}, binary_in=True,
                           binary_out=True, model_version="1.0.0")  # fmt: skip
    np.testing.assert_allclose(result.as_numpy("probs"), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "case",
    [
        ("mlp", {"input": (np.zeros((2, 15), np.float32), "FP32")}, {}, "400",
         "does not fit the model's [-1, 16]"),
        ("mlp", {"input": (np.zeros((2, 16), np.float64), "FP64")}, {}, "400",
         "the model takes FP32"),
        ("mlp", {"input": (np.zeros((2, 16), np.int32), "INT32")}, {}, "400",
         "the model takes FP32"),
        ("mlp", {"input": (np.zeros((1, 16, 1), np.float32), "FP32")}, {}, "400",
         "does not fit"),
        ("mlp", {"image": (np.zeros((1, 16), np.float32), "FP32")}, {}, "400",
         "unknown input 'image'"),
        ("pair", {"a": (np.zeros(2, np.float32), "FP32")}, {}, "400", "missing input(s) ['b']"),
        ("nope", {"x": (np.zeros(2, np.float32), "FP32")}, {}, "404", "unknown model 'nope'"),
        ("mlp", {"input": (np.zeros((1, 16), np.float32), "FP32")}, {"model_version": "7"},
         "404", "no loaded version '7'"),
        ("later", {"x": (np.zeros(2, np.float32), "FP32")}, {}, "503", "not loaded yet"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_errors(
    triton_client: triton.InferenceServerClient, case: tuple[Any, ...], *, binary: bool
) -> None:
    model, arrays, kw, status, message = case
    with pytest.raises(InferenceServerException) as refused:
        _triton_infer(triton_client, model, arrays, binary_in=binary, binary_out=binary, **kw)
    assert refused.value.status() == status
    assert message in refused.value.message()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_oversized_requests_are_413(
    triton_client: triton.InferenceServerClient, *, binary: bool
) -> None:
    # few values, over the body cap: 64 MiB + 16 KiB of float32, or 65 strings of 1 MiB
    if binary:
        model, x, datatype = "id_fp32", np.full((4097, 4096), 0.5, np.float32), "FP32"
    else:
        model, x, datatype = "id_bytes", np.full((1, 65), "a" * (1 << 20), object), "BYTES"
    with pytest.raises(InferenceServerException) as refused:
        _triton_infer(triton_client, model, {"x": (x, datatype)}, binary_in=binary,
                      binary_out=binary)  # fmt: skip
    assert refused.value.status() == "413"
    assert refused.value.message() == f"request body over {MAX_BODY_BYTES} bytes"
