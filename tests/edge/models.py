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
