"""Shared-weight sessions (``edge_sync.engine.weights``): the split graph loads and computes
what the whole file computes, unchanged tensors are shared with the version replaced,
and a file that is not a model is refused with a typed error."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from edge_sync.engine.base import LoadRequest
from edge_sync.engine.ort import OrtEngine
from edge_sync.engine.weights import MAP_AT_LEAST, split_model
from edge_sync.errors import EngineError, WeightError
from registry.onnx_wire import encode_varint
from tests.edge import models


def _request(path: Path, version: str = "1.0.0") -> LoadRequest:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return LoadRequest("mlp", version, path, digest)


def _plain(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


def test_the_split_finds_every_large_initializer_where_onnx_reads_it(tmp_path: Path) -> None:
    path = models.save(models.mlp(), tmp_path / "m.onnx")
    data = path.read_bytes()
    graph = split_model(data)
    parsed = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    large = {n for n, a in parsed.items() if a.nbytes >= MAP_AT_LEAST}
    assert {t.name for t in graph.tensors} == large == {f"w{i}" for i in range(models.LAYERS)}
    for t in graph.tensors:
        raw = np.frombuffer(data[t.offset : t.offset + t.length], dtype=t.dtype)
        np.testing.assert_array_equal(raw.reshape(t.dims), parsed[t.name])
    # the graph itself is small and names its weights as external data in the file
    assert len(graph.graph) < 10_000
    stripped = onnx.load_from_string(graph.graph)
    external = {t.name for t in stripped.graph.initializer if t.data_location == 1}
    assert external == large


def test_a_shared_session_answers_as_the_whole_file_does(tmp_path: Path) -> None:
    path = models.save(models.mlp(), tmp_path / "m.onnx")
    engine = OrtEngine(_request(path), share=True)
    x = models.sample()
    np.testing.assert_allclose(engine.run({"x": x})["y"], _plain(path, x), rtol=1e-5, atol=1e-5)
    assert engine.weights is not None
    assert engine.weights.own_bytes == models.LAYERS * models.WIDTH**2 * 4


def test_a_fine_tune_shares_its_unchanged_layers_with_the_version_it_replaces(
    tmp_path: Path,
) -> None:
    v1 = models.save(models.mlp(), tmp_path / "a" / "v1.onnx")
    v2 = models.save(models.mlp(changed=(2,)), tmp_path / "b" / "v2.onnx")
    old = OrtEngine(_request(v1), share=True)
    new = OrtEngine(_request(v2, "1.1.0"), share=True, base=old)
    assert new.weights is not None
    assert old.weights is not None
    layer = models.WIDTH**2 * 4
    assert (new.weights.own_bytes, new.weights.shared_bytes) == (layer, 3 * layer)
    for name in ("w0", "w1", "w3"):  # the same values, not copies
        assert new.weights.values[name] is old.weights.values[name]
    assert new.weights.values["w2"] is not old.weights.values["w2"]
    x = models.sample()
    np.testing.assert_allclose(new.run({"x": x})["y"], _plain(v2, x), rtol=1e-5, atol=1e-5)
    # the old engine released: the new one keeps computing on what it shared
    old.close()
    np.testing.assert_allclose(new.run({"x": x})["y"], _plain(v2, x), rtol=1e-5, atol=1e-5)


def test_constant_nodes_are_shared_like_initializers(tmp_path: Path) -> None:
    weight = np.arange(128 * 256, dtype=np.float32).reshape(128, 256) / 1e4
    node = helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(weight, "c"))
    graph = helper.make_graph(
        [node, helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 128])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 256])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = models.save(model, tmp_path / "c.onnx")
    split = split_model(path.read_bytes())
    assert [t.name for t in split.tensors] == ["w"]
    engine = OrtEngine(_request(path), share=True)
    x = np.ones((1, 128), np.float32)
    np.testing.assert_allclose(engine.run({"x": x})["y"], x @ weight, rtol=1e-5)


@pytest.mark.parametrize(
    "garbage",
    [b"", b"\xff" * 64, b"\x3a\xff\xff\xff\xff\x0f"],  # no graph; bad wire type; overlong
    ids=["empty", "bad-wire", "overlong"],
)
def test_a_file_that_is_not_a_model_is_a_typed_error(tmp_path: Path, garbage: bytes) -> None:
    with pytest.raises(WeightError):
        split_model(garbage)
    path = tmp_path / "bad.onnx"
    path.write_bytes(garbage)
    with pytest.raises(EngineError, match="cannot"):
        OrtEngine(_request(path), share=True)


def test_a_truncated_model_is_refused_not_mapped_past_its_end(tmp_path: Path) -> None:
    path = models.save(models.mlp(), tmp_path / "m.onnx")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(EngineError):
        OrtEngine(_request(path), share=True)


def test_one_mapping_and_one_file_handle_per_engine(tmp_path: Path) -> None:
    path = models.save(models.mlp(), tmp_path / "m.onnx")
    before = len(list(Path("/proc/self/fd").iterdir()))
    engines = [OrtEngine(_request(path), share=True) for _ in range(3)]
    assert len(list(Path("/proc/self/fd").iterdir())) - before <= 3  # not one per tensor
    maps = Path("/proc/self/maps").read_text().count(str(path))
    assert maps == 3
    del engines


def test_a_negative_dimension_is_not_mapped(tmp_path: Path) -> None:
    """int64 dims: -1 is a huge unsigned varint; the split leaves such a tensor in the
    graph (ONNX Runtime judges it) instead of wrapping a size."""
    model = models.mlp()
    model.graph.initializer[0].dims[0] = -1
    path = tmp_path / "neg.onnx"
    path.write_bytes(model.SerializeToString())
    split = split_model(path.read_bytes())
    assert "w0" not in {t.name for t in split.tensors}
    with pytest.raises(EngineError):
        OrtEngine(_request(path), share=True)


def test_typed_data_is_left_in_the_graph_and_answers_the_same(tmp_path: Path) -> None:
    model = models.mlp()
    weight = numpy_helper.to_array(model.graph.initializer[0])
    typed = helper.make_tensor("w0", onnx.TensorProto.FLOAT, weight.shape, weight.ravel().tolist())
    model.graph.initializer[0].CopyFrom(typed)  # float_data, not raw_data
    path = models.save(model, tmp_path / "typed.onnx")
    names = {t.name for t in split_model(path.read_bytes()).tensors}
    assert "w0" not in names
    assert "w1" in names
    x = models.sample()
    got = OrtEngine(_request(path), share=True).run({"x": x})["y"]
    np.testing.assert_allclose(got, _plain(path, x), rtol=1e-5, atol=1e-5)


def test_a_constant_whose_tensor_field_repeats_is_left_to_onnx_runtime(tmp_path: Path) -> None:
    """protobuf merges a repeated message field (dims joined); a reader that kept one
    copy would give the shared session another shape than the private one."""
    weight = np.ones((128, 128), np.float32)
    node = helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(weight, "c"))
    graph = helper.make_graph(
        [node, helper.make_node("Identity", ["w"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8

    def field(number: int, payload: bytes) -> bytes:  # a length-delimited field
        return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload

    extra = numpy_helper.from_array(np.ones((1,), np.float32), "c").SerializeToString()
    constant, identity = model.graph.node
    doubled = constant.attribute[0].SerializeToString() + field(5, extra)  # "t" twice
    bare = onnx.NodeProto()
    bare.CopyFrom(constant)
    del bare.attribute[:]
    node = bare.SerializeToString() + field(5, doubled)
    rest = onnx.GraphProto()
    rest.CopyFrom(model.graph)
    del rest.node[:]
    graph_bytes = field(1, node) + field(1, identity.SerializeToString()) + rest.SerializeToString()
    outer = onnx.ModelProto()
    outer.CopyFrom(model)
    outer.ClearField("graph")
    path = tmp_path / "dup.onnx"
    path.write_bytes(outer.SerializeToString() + field(7, graph_bytes))
    assert list(onnx.load(str(path)).graph.node[0].attribute[0].t.dims) == [128, 128, 1]
    assert "w" not in {t.name for t in split_model(path.read_bytes()).tensors}


def test_a_run_in_progress_keeps_its_weights_when_the_engine_is_unloaded(
    tmp_path: Path,
) -> None:
    """unload() and close() drop the engine's reference to its session and weights; a
    run that started holds its own, so the memory it reads stays mapped (a run on
    unmapped weights crashed the process)."""
    import subprocess
    import sys

    slow = models.save(models.slowed(models.mlp(width=512), 400), tmp_path / "slow.onnx")
    script = f"""
import gc, hashlib, threading, numpy as np
from pathlib import Path
from edge_sync.engine.base import LoadRequest
from edge_sync.engine.ort import OrtEngine
path = Path({str(slow)!r})
engine = OrtEngine(LoadRequest("m", "1", path, hashlib.sha256(path.read_bytes()).hexdigest()),
                   share=True)
x = {{"x": np.ones((8, 512), np.float32)}}
want = engine.run(x)["y"]
out = []
t = threading.Thread(target=lambda: out.append(engine.run(x)["y"]))
t.start()
engine.unload()
gc.collect()
t.join()
assert np.allclose(out[0], want)
print("ok")
"""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr[-2000:]
