"""Swaps of real third-party models (PP-OCR's detector, whose weights are ``Constant``
nodes; silero-vad, whose weights live in the branches of an ``If`` node and which takes
an int64 scalar and a recurrent state): a fine-tune that changes one tensor shares the
rest, and requests running across the swap get the answer of the version they ran on."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from edge_sync.engine.base import LoadRequest
from edge_sync.engine.host import InProcessHost
from edge_sync.engine.ort import OrtEngine
from registry.tensors import split
from tests.edge.real_models import real_model_path


def _tensors(graph: onnx.GraphProto, *, nested: bool) -> list[onnx.TensorProto]:
    """The float weights of ``graph``: initializers and Constant values, and with
    ``nested`` only those inside its subgraphs (an If node's branches)."""
    found: list[onnx.TensorProto] = [] if nested else list(graph.initializer)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR and not nested:
                found.append(attribute.t)
            elif attribute.type == onnx.AttributeProto.GRAPH:
                found.extend(_tensors(attribute.g, nested=False))
    return [t for t in found if t.data_type == onnx.TensorProto.FLOAT and t.dims]


def _fine_tune(source: Path, out: Path, *, nested: bool) -> int:
    """Write ``source`` with its largest top-level weight (``nested``: every weight in
    its subgraphs but the largest) scaled by 1.01; the bytes changed."""
    model = onnx.load(str(source))
    tensors = _tensors(model.graph, nested=nested)
    largest = max(tensors, key=lambda t: int(np.prod(t.dims)))
    tensors = [t for t in tensors if t is not largest] if nested else [largest]
    changed = 0
    for tensor in tensors:
        values = (numpy_helper.to_array(tensor) * np.float32(1.01)).astype(np.float32)
        tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
        changed += values.nbytes
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out))
    return changed


def _inputs(name: str) -> dict[str, Any]:
    rng = np.random.default_rng(3)
    if name == "det":
        return {"x": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)}
    return {
        "input": rng.standard_normal((1, 512)).astype(np.float32) * 0.1,
        "state": np.zeros((2, 1, 128), np.float32),
        "sr": np.array(16000, np.int64),
    }


def _plain(path: Path, feeds: dict[str, Any]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in session.run(None, feeds)]


def _request(path: Path, name: str, version: str) -> LoadRequest:
    return LoadRequest(name, version, path, hashlib.sha256(path.read_bytes()).hexdigest())


@pytest.mark.parametrize("name", ["det", "silero"])
def test_a_real_model_swaps_under_requests_sharing_what_did_not_change(
    name: str, tmp_path: Path
) -> None:
    v1 = real_model_path(name)
    v2 = tmp_path / name / "v2.onnx"
    changed = _fine_tune(v1, v2, nested=name == "silero")
    feeds = _inputs(name)
    expected = {"1": _plain(v1, feeds), "2": _plain(v2, feeds)}
    assert not np.allclose(expected["1"][0], expected["2"][0])  # the versions differ
    host = InProcessHost(prepack="off")
    host.swap(name, host.build(_request(v1, name, "1")))
    errors: list[BaseException] = []
    stop = threading.Event()

    def client(check: Callable[[Any], None]) -> None:
        while not stop.is_set():
            try:
                with host.lease(name) as engine:
                    check(engine)
            except BaseException as e:  # noqa: BLE001 - collected for the assertion
                errors.append(e)
                return

    def check(engine: Any) -> None:
        got = engine.run(feeds)
        for want, (_, value) in zip(expected[engine.version], got.items(), strict=True):
            np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-5)

    threads = [threading.Thread(target=client, args=(check,)) for _ in range(4)]
    for t in threads:
        t.start()
    for i in range(6):
        old = host.swap(name, host.build(_request(v2 if i % 2 == 0 else v1, name, str(2 - i % 2))))
        assert old is not None
        host.retire(old)
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    final = host.current(name)
    assert isinstance(final, OrtEngine)
    assert final.weights is not None
    # the tensors a device holds by digest (Constant nodes in det, an If node's
    # branches in silero): the last build shares each one the fine-tune left alone
    before, after = v1.read_bytes(), v2.read_bytes()
    cut = {p.name: before[p.offset : p.offset + p.length] for p in split(before).pieces}
    kept = sum(
        p.length
        for p in split(after).pieces
        if after[p.offset : p.offset + p.length] == cut[p.name]
    )
    assert kept > 0
    assert final.weights.shared_bytes == kept
    assert final.weights.own_bytes == sum(len(b) for b in cut.values()) - kept
    if name == "det":  # one tensor changed, all of it cut
        assert final.weights.own_bytes == changed
