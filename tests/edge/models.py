"""Small ONNX models the engine tests build themselves: an MLP whose layers are large
enough to be memory-mapped (so versions share weights), a fine-tune of it that changes
one layer, and a slow twin that computes the same answer with much more work (a
version that passes its goldens and fails a latency gate)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTH = 256
"""Layer width: a 256 x 256 float32 layer is 256 KiB, over edge_sync.engine.weights.MAP_AT_LEAST."""
LAYERS = 4


def mlp(
    seed: int = 0, *, changed: tuple[int, ...] = (), slow: int = 0, width: int = WIDTH
) -> onnx.ModelProto:
    """An MLP ``x[batch, WIDTH] -> y[batch, WIDTH]`` (Relu between layers).

    Args:
        seed: the weights' seed.
        changed: layers whose weights differ (a fine-tune of the ``seed`` model).
        slow: extra ``width x width`` matrix products per run whose result is added
            times zero: same answer, more time.
        width: the layer width (``WIDTH`` unless a test needs more memory).
    """
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    current = "x"
    for layer in range(LAYERS):
        weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        if layer in changed:
            weight = weight * np.float32(1.01)
        bias = np.full((width,), 0.01 * layer, np.float32)
        inits += [numpy_helper.from_array(weight, f"w{layer}"),
                  numpy_helper.from_array(bias, f"b{layer}")]  # fmt: skip
        nodes += [helper.make_node("MatMul", [current, f"w{layer}"], [f"m{layer}"]),
                  helper.make_node("Add", [f"m{layer}", f"b{layer}"], [f"a{layer}"])]  # fmt: skip
        current = f"a{layer}"
        if layer < LAYERS - 1:
            nodes.append(helper.make_node("Relu", [current], [f"r{layer}"]))
            current = f"r{layer}"
    if slow:
        burn = numpy_helper.from_array(np.eye(width, dtype=np.float32), "burn")
        zero = numpy_helper.from_array(np.zeros((1,), np.float32), "zero")
        inits += [burn, zero]
        work = "x"
        for i in range(slow):
            nodes.append(helper.make_node("MatMul", [work, "burn"], [f"s{i}"]))
            work = f"s{i}"
        nodes += [helper.make_node("Mul", [work, "zero"], ["nothing"]),
                  helper.make_node("Add", [current, "nothing"], ["y"])]  # fmt: skip
    else:
        nodes.append(helper.make_node("Identity", [current], ["y"]))
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def save(model: onnx.ModelProto, path: Path) -> Path:
    """Write ``model`` to ``path`` (inline weights); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def sample(batch: int = 2, seed: int = 1, width: int = WIDTH) -> np.ndarray:
    """An input batch for :func:`mlp`."""
    return np.random.default_rng(seed).standard_normal((batch, width)).astype(np.float32)


def slowed(model: onnx.ModelProto, matmuls: int, width: int = 512) -> onnx.ModelProto:
    """``model`` with the same inputs, outputs and answers, and ``matmuls`` extra
    ``width x width`` matrix products per run (their result is added times zero)."""
    slow = onnx.ModelProto()
    slow.CopyFrom(model)
    graph = slow.graph
    x, y = graph.input[0].name, graph.output[0].name
    features = graph.input[0].type.tensor_type.shape.dim[-1].dim_value
    for node in graph.node:
        node.output[:] = [f"{y}_fast" if o == y else o for o in node.output]
    rng = np.random.default_rng(7)
    graph.initializer.extend([
        numpy_helper.from_array(rng.standard_normal((features, width)).astype(np.float32) / 8,
                                "slow_in"),
        numpy_helper.from_array(np.eye(width, dtype=np.float32), "slow_burn"),
        numpy_helper.from_array(np.zeros((1,), np.float32), "slow_zero"),
        numpy_helper.from_array(np.array([1], np.int64), "slow_axes"),
    ])  # fmt: skip
    work = "slow_0"
    graph.node.append(helper.make_node("MatMul", [x, "slow_in"], [work]))
    for i in range(matmuls):
        graph.node.append(helper.make_node("MatMul", [work, "slow_burn"], [f"slow_{i + 1}"]))
        work = f"slow_{i + 1}"
    graph.node.extend([
        helper.make_node("ReduceSum", [work, "slow_axes"], ["slow_sum"], keepdims=1),
        helper.make_node("Mul", ["slow_sum", "slow_zero"], ["slow_nothing"]),
        helper.make_node("Add", [f"{y}_fast", "slow_nothing"], [y]),
    ])  # fmt: skip
    return slow


def disagreeing(model: onnx.ModelProto, threshold: float = 0.8416) -> onnx.ModelProto:
    """``model`` (a classifier: its first input ``[batch, features]``, its first output
    class scores ``[batch, classes]``) answering with its classes rotated by one on the
    rows whose first feature is over ``threshold``: another top class there, the same
    answer elsewhere (0.8416: a fifth of standard normal inputs)."""
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    graph = changed.graph
    x, y = graph.input[0].name, graph.output[0].name
    classes = graph.output[0].type.tensor_type.shape.dim[-1].dim_value
    for node in graph.node:
        node.output[:] = [f"{y}_same" if o == y else o for o in node.output]
    graph.initializer.extend([
        numpy_helper.from_array(np.array([0], np.int64), "rot_start"),
        numpy_helper.from_array(np.array([1], np.int64), "rot_end"),
        numpy_helper.from_array(np.array([1], np.int64), "rot_axes"),
        numpy_helper.from_array(np.array(threshold, np.float32), "rot_threshold"),
        numpy_helper.from_array(np.roll(np.arange(classes), 1).astype(np.int64), "rot_order"),
    ])  # fmt: skip
    graph.node.extend([
        helper.make_node("Slice", [x, "rot_start", "rot_end", "rot_axes"], ["rot_first"]),
        helper.make_node("Greater", ["rot_first", "rot_threshold"], ["rot_where"]),
        helper.make_node("Gather", [f"{y}_same", "rot_order"], ["rot_rolled"], axis=1),
        helper.make_node("Where", ["rot_where", "rot_rolled", f"{y}_same"], [y]),
    ])  # fmt: skip
    return changed


def nudged(model: onnx.ModelProto, scale: float = 1.001) -> onnx.ModelProto:
    """``model`` with every float weight scaled by ``scale``: a faithful fine-tune (the
    same top class but for near ties, answers within a fraction of a percent)."""
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    for i, tensor in enumerate(changed.graph.initializer):
        array = numpy_helper.to_array(tensor)
        if array.dtype == np.float32:
            scaled = (array * np.float32(scale)).astype(np.float32)
            changed.graph.initializer[i].CopyFrom(numpy_helper.from_array(scaled, tensor.name))
    return changed
