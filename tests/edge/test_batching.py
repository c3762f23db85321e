"""Dynamic batching (issue 26): concurrent requests stacked into one run and split
again; answers equal the unbatched answers; different shapes, datatypes and outputs
batch apart; a batch never spans two engines (a swap); a bad request fails alone; the
batches are visible at /metrics; REST and gRPC both batch."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_sync.config import batching_of
from edge_sync.engine.base import LoadRequest
from edge_sync.engine.host import InProcessHost
from edge_sync.serve.batching import Batcher, BatchPolicy, batchable
from edge_sync.serve.core import Inference, Work, run_clock
from edge_sync.serve.metrics import Metrics
from registry.errors import ManifestError
from tests.edge.test_conformance import identity_model, serve_file, two_inputs_model

pytestmark = pytest.mark.integration


def _together(calls: list[Any]) -> list[Any]:
    """Run the calls at once (each in a thread, released together); their results."""
    results: list[Any] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def one(i: int) -> None:
        start.wait()
        try:
            results[i] = calls[i]()
        except Exception as e:  # noqa: BLE001 - compared by the test
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> InProcessHost:
    folder = tmp_path_factory.mktemp("batched")
    host = InProcessHost()
    serve_file(host, "mlp", "1.0.0", example_models / "mlp/1.0.0.onnx")
    (folder / "id.onnx").write_bytes(identity_model("FP32"))
    serve_file(host, "id", "1", folder / "id.onnx")
    (folder / "pair.onnx").write_bytes(two_inputs_model())
    serve_file(host, "pair", "1", folder / "pair.onnx")
    return host


@pytest.fixture
def core(host: InProcessHost) -> Iterator[Inference]:
    policy = BatchPolicy(max_batch_size=16, max_queue_delay_s=0.05)
    served = Inference(
        host, ["mlp", "id", "pair"], Metrics(host), batching={"mlp": policy, "id": policy}
    )
    try:
        yield served
    finally:
        served.close()


def _run(
    core: Inference, model: str, inputs: dict[str, Any], wanted: list[str] | None = None
) -> Any:
    with core.engine(model) as engine:
        return core.run(engine, inputs, wanted, Work())


def _samples(core: Inference, name: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in core.metrics.text().decode().splitlines()
        if line.startswith(name)
    }


def test_batched_answers_equal_unbatched_answers(core: Inference, host: InProcessHost) -> None:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1 + i % 3, 16), dtype=np.float32) for i in range(12)]
    got = _together([lambda x=x: _run(core, "mlp", {"input": x}) for x in xs])
    engine = host.current("mlp")
    assert engine is not None
    for x, answer in zip(xs, got, strict=True):
        assert not isinstance(answer, Exception), answer
        alone = engine.run({"input": x}, None)
        assert answer["probs"].shape == (x.shape[0], 4)
        np.testing.assert_allclose(answer["probs"], alone["probs"], rtol=1e-5, atol=1e-6)
    rows = _samples(core, "modelreg_batch_requests")
    count, total = (
        rows['modelreg_batch_requests_count{model="mlp"}'],
        rows['modelreg_batch_requests_sum{model="mlp"}'],
    )
    assert total == 12  # every request went through the batcher
    assert count < 12  # and some ran together
    assert (
        _samples(core, "modelreg_batch_queue_depth")['modelreg_batch_queue_depth{model="mlp"}'] == 0
    )


def test_requests_of_other_shapes_and_outputs_batch_apart(core: Inference) -> None:
    a = [np.full((1, 3), i, np.float32) for i in range(4)]
    b = [np.full((2, 5), i, np.float32) for i in range(4)]
    got = _together([lambda x=x: _run(core, "id", {"x": x}) for x in a + b])
    for x, answer in zip(a + b, got, strict=True):
        np.testing.assert_array_equal(answer["y"], x)  # each its own rows back
    # two kinds, each batched apart: at least two runs, never one mixing the shapes
    rows = _samples(core, "modelreg_batch_rows")
    assert rows['modelreg_batch_rows_sum{model="id"}'] == 4 + 8
    assert rows['modelreg_batch_rows_count{model="id"}'] >= 2


def test_a_model_that_fixes_its_batch_is_never_batched(
    core: Inference, host: InProcessHost
) -> None:
    engine = host.current("pair")
    assert engine is not None
    assert not batchable(engine)  # its inputs are [2]
    core.batching["pair"] = BatchPolicy()
    a, b = np.ones(2, np.float32), np.full(2, 2.0, np.float32)
    answers = _together([lambda: _run(core, "pair", {"a": a, "b": b})] * 3)
    for answer in answers:
        np.testing.assert_array_equal(answer["sum"], a + b)
    assert "modelreg_batch_rows_count" not in core.metrics.text().decode()
    mlp = host.current("mlp")
    assert mlp is not None
    assert batchable(mlp)


class _Fake:
    """An engine that says which version computed each row, and fails on a NaN."""

    def __init__(self, version: str) -> None:
        self.model, self.version = "fake", version
        self.request = LoadRequest("fake", version, Path("fake.onnx"), "0" * 64)
        self.inputs = [("x", "tensor(float)", ["n", 2])]
        self.outputs = [("y", "tensor(float)", ["n", 2])]
        self.providers, self.intra_op_threads = ["CPUExecutionProvider"], 1
        self.runs: list[int] = []

    def run(self, inputs: dict[str, Any], wanted: list[str] | None) -> dict[str, Any]:
        x = inputs["x"]
        self.runs.append(x.shape[0])
        if np.isnan(x).any():
            raise ValueError("a NaN")
        return {"y": x + float(self.version)}


def test_a_batch_never_spans_two_engines_and_a_bad_request_fails_alone() -> None:
    old: Any = _Fake("1")
    new: Any = _Fake("2")
    seen: list[tuple[int, int]] = []
    batcher = Batcher("fake", BatchPolicy(8, 0.05), run_clock,
                      observe=lambda _m, n, rows: seen.append((n, rows)))  # fmt: skip
    try:
        xs = [np.full((1, 2), i, np.float32) for i in range(6)]
        xs[3] = np.full((1, 2), np.nan, np.float32)
        engines = [old, new] * 3
        futures = _together(
            [
                lambda e=e, x=x: batcher.submit(e, {"x": x}, None)
                for e, x in zip(engines, xs, strict=True)
            ]
        )
        for engine, x, future in zip(engines, xs, futures, strict=True):
            if np.isnan(x).any():
                with pytest.raises(ValueError, match="a NaN"):
                    future.result(timeout=30)
                continue
            y, seconds = future.result(timeout=30)
            np.testing.assert_array_equal(y["y"], x + float(engine.version))  # its engine's
            assert seconds >= 0
        assert max(old.runs) > 1  # old's three requests ran as one batch ...
        assert sum(new.runs) == 3 + 3  # ... new's failed batch ran again one by one
        assert sum(n for n, _ in seen) == 6
    finally:
        batcher.close()


def test_requests_that_cannot_join_a_batch_run_alone() -> None:
    batcher = Batcher("fake", BatchPolicy(4, 0.01), run_clock)
    try:
        engine: Any = _Fake("1")
        assert batcher.submit(engine, {"x": np.zeros((5, 2), np.float32)}, None) is None  # > 4 rows
        uneven = {"x": np.zeros((2, 2), np.float32), "z": np.zeros((3, 2), np.float32)}
        assert batcher.submit(engine, uneven, None) is None
        assert (
            batcher.submit(engine, {"x": np.float32(1.0) * np.ones(())}, None) is None
        )  # a scalar
    finally:
        batcher.close()


def test_batching_is_configured_per_model_over_the_default(tmp_path: Path) -> None:
    from edge_sync.config import load_edge_config

    text = """\
apiVersion: modelreg/v1
kind: EdgeConfig
device: {id: d1}
repository: {url: /srv/fleet.git}
trust: {root: 1.root.json}
artifacts: {url: /srv/artifacts}
state_dir: state
models:
  - {name: a, channel: c}
  - {name: b, channel: c, batching: off}
  - {name: c, channel: c, batching: {max_batch_size: 32, max_queue_delay: 5ms}}
serve:
  batching: {max_batch_size: 4, max_queue_delay: 1ms}
"""
    path = tmp_path / "edge.yaml"
    path.write_text(text)
    config = load_edge_config(path)
    found = batching_of(config.serve, config.models)
    assert {n: (c.max_batch_size, c.max_queue_delay) for n, c in found.items()} == {
        "a": (4, 0.001), "c": (32, 0.005),
    }  # fmt: skip
    path.write_text(
        text.replace("serve:\n  batching: {max_batch_size: 4, max_queue_delay: 1ms}", "serve: {}")
    )
    assert set(load_edge_config(path).batching()) == {"c"}
    path.write_text(text.replace("max_batch_size: 4,", "max_batch_size: 1,"))
    with pytest.raises(
        ManifestError, match=r"edge.yaml:13:30: serve.batching.max_batch_size: must be >= 2"
    ):
        load_edge_config(path)


def test_rest_and_grpc_requests_batch_together(core: Inference, host: InProcessHost) -> None:
    """Clients of both protocols at once: their requests share batches, and each
    answer is what the engine computes for that request alone."""
    import tritonclient.grpc as tgrpc  # type: ignore[import-untyped]
    import tritonclient.http as thttp  # type: ignore[import-untyped]

    from edge_sync.serve.app import create_rest_app
    from edge_sync.serve.grpc_server import GrpcServer
    from tests.edge.test_conformance import loopback_server

    engine = host.current("mlp")
    assert engine is not None
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((1 + i % 2, 16), dtype=np.float32) for i in range(16)]
    grpc_server = GrpcServer(core, "t", "127.0.0.1:0")
    grpc_address = grpc_server.start()
    try:
        with loopback_server(create_rest_app(core, dict, "t")) as rest_address:

            def over_rest(x: np.ndarray) -> Any:
                with thttp.InferenceServerClient(rest_address) as client:
                    tensor = thttp.InferInput("input", list(x.shape), "FP32")
                    tensor.set_data_from_numpy(x, binary_data=True)
                    return client.infer("mlp", [tensor]).as_numpy("probs")

            def over_grpc(x: np.ndarray) -> Any:
                with tgrpc.InferenceServerClient(grpc_address) as client:
                    tensor = tgrpc.InferInput("input", list(x.shape), "FP32")
                    tensor.set_data_from_numpy(x)
                    return client.infer("mlp", [tensor]).as_numpy("probs")

            calls = [
                (lambda x=x, f=(over_rest if i % 2 else over_grpc): f(x)) for i, x in enumerate(xs)
            ]
            got = _together(calls)
    finally:
        grpc_server.stop(0)
    for x, answer in zip(xs, got, strict=True):
        assert not isinstance(answer, Exception), answer
        np.testing.assert_allclose(
            answer, engine.run({"input": x}, None)["probs"], rtol=1e-5, atol=1e-6
        )
    batches = _samples(core, "modelreg_batch_requests")
    assert batches['modelreg_batch_requests_sum{model="mlp"}'] == 16
    assert batches['modelreg_batch_requests_count{model="mlp"}'] < 16
    text = core.metrics.text().decode()
    assert 'outcome="ok",protocol="grpc"' in text
    assert 'outcome="ok",protocol="rest"' in text


class _Held(_Fake):
    """A fake engine whose runs wait until released."""

    def __init__(self) -> None:
        super().__init__("1")
        self.release = threading.Event()

    def run(self, inputs: dict[str, Any], wanted: list[str] | None) -> dict[str, Any]:
        assert self.release.wait(30)
        return super().run(inputs, wanted)


def test_requests_waiting_for_a_batch_are_capped() -> None:
    """A client flooding a batched model whose runs are slow gets 503 with Retry-After
    once serve.limits.max_queued requests wait (never an unbounded queue); what waited
    is answered once the runs go on."""
    from edge_sync.errors import RefusedError

    engine: Any = _Held()
    batcher = Batcher("fake", BatchPolicy(1, 0.001), run_clock, runners=1, max_waiting=2)
    try:
        first = batcher.submit(engine, {"x": np.zeros((1, 2), np.float32)}, None)
        deadline = time.monotonic() + 10
        while not engine.runs and time.monotonic() < deadline:  # the runner holds it
            time.sleep(0.01)
        waiting = [batcher.submit(engine, {"x": np.full((1, 2), i, np.float32)}, None)
                   for i in (1, 2)]  # fmt: skip
        with pytest.raises(RefusedError, match="2 requests wait for a batch") as e:
            batcher.submit(engine, {"x": np.zeros((1, 2), np.float32)}, None)
        assert (e.value.status, e.value.retry_after) == (503, 1)
        engine.release.set()
        assert first is not None
        first.result(timeout=30)
        for i, future in zip((1, 2), waiting, strict=True):
            assert future is not None
            np.testing.assert_array_equal(
                future.result(timeout=30)[0]["y"], np.full((1, 2), i + 1.0)
            )
    finally:
        engine.release.set()
        batcher.close()


def test_a_request_too_large_for_a_batch_is_answered_alone_over_rest(
    core: Inference, host: InProcessHost
) -> None:
    """Over REST, a request to a batched model that cannot join a batch (more rows
    than one holds) runs alone, within the run slots, and is answered as any other."""
    import httpx

    from edge_sync.serve.app import create_rest_app
    from tests.edge.test_conformance import loopback_server

    x = np.random.default_rng(9).standard_normal((20, 16), dtype=np.float32)  # > 16 rows
    body = {"inputs": [{"name": "input", "shape": [20, 16], "datatype": "FP32",
                        "data": x.reshape(-1).tolist()}]}  # fmt: skip
    with loopback_server(create_rest_app(core, dict, "t")) as address:
        response = httpx.post(f"http://{address}/v2/models/mlp/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    engine = host.current("mlp")
    assert engine is not None
    got = np.asarray(response.json()["outputs"][0]["data"], np.float32).reshape(20, 4)
    np.testing.assert_allclose(got, engine.run({"input": x}, None)["probs"], rtol=1e-5, atol=1e-6)
    assert "modelreg_batch_rows_count" not in core.metrics.text().decode()
