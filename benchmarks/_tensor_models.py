"""Chain models for the tensor-update benchmark (``benchmarks.edge_update``).

A chain model is ``input [batch, 16] -> MatMul 16 x W -> Relu -> (MatMul W x W ->
Relu) x layers -> MatMul W x 4 -> output [batch, 4]``, float32, inline initializers: a
real ONNX file that ONNX Runtime runs, whose size is nearly all its ``layers`` square
weight tensors (each ``4 W^2`` bytes, cut out as tensors: ``registry.tensors``).

Version ``1.0.0`` is written once with ``onnx.helper``; each later version is that
file copied with the raw bytes of some layers perturbed in place (a fine-tune that
leaves every other byte, the graph included, as it was).  So the changed bytes are
exactly those layers' tensors, and the skeleton is the same in every version.
"""

from __future__ import annotations

import math
import mmap
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

__all__ = ["ChainSpec", "changed_layers", "write_base", "write_inputs", "write_variant"]

_IN: Final = 16
_OUT: Final = 4
_NOISE: Final = 0.05  # relative to a layer's init scale, as modelreg.examples does


@dataclass(frozen=True)
class ChainSpec:
    """A chain model's shape: ``layers`` square ``width`` x ``width`` float32 layers."""

    width: int
    layers: int

    @property
    def layer_bytes(self) -> int:
        """Bytes of one square layer's weights (one tensor)."""
        return 4 * self.width * self.width

    @property
    def label(self) -> str:
        """``100 MB``, ``1.08 GB``: the weight bytes, for tables."""
        total = self.layer_bytes * self.layers
        return f"{total / 1e9:.2f} GB" if total >= 1e9 else f"{total / 1e6:.0f} MB"


def _layer(spec: ChainSpec, index: int) -> Any:
    """Layer ``index``'s weights in version 1.0.0 (He init, keyed by width and index)."""
    rng = np.random.default_rng([7, spec.width, index])
    w = rng.standard_normal((spec.width, spec.width), dtype=np.float32)
    w *= np.float32(math.sqrt(2.0 / spec.width))
    return w


def _edge(rows: int, cols: int, key: int) -> Any:
    w = np.random.default_rng([8, rows, cols, key]).standard_normal((rows, cols), np.float32)
    w *= np.float32(math.sqrt(2.0 / rows))
    return w


def write_base(path: Path, spec: ChainSpec) -> None:
    """Write version 1.0.0 of the chain model ``spec`` to ``path``."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(_edge(_IN, spec.width, 0), "in.weight")]
    nodes = [helper.make_node("MatMul", ["input", "in.weight"], ["h0"]),
             helper.make_node("Relu", ["h0"], ["a0"])]  # fmt: skip
    for i in range(spec.layers):
        inits.append(numpy_helper.from_array(_layer(spec, i), f"layer{i}.weight"))
        nodes.append(helper.make_node("MatMul", [f"a{i}", f"layer{i}.weight"], [f"h{i + 1}"]))
        nodes.append(helper.make_node("Relu", [f"h{i + 1}"], [f"a{i + 1}"]))
    inits.append(numpy_helper.from_array(_edge(spec.width, _OUT, 1), "out.weight"))
    nodes.append(helper.make_node("MatMul", [f"a{spec.layers}", "out.weight"], ["output"]))
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", _IN])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", _OUT])],
        initializer=inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    del inits
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString(deterministic=True))
    del model, graph


def changed_layers(spec: ChainSpec, share: float) -> list[int]:
    """The layers a fine-tune changing ``share`` of the weight bytes perturbs: the
    nearest whole number of layers (at least one), spread evenly over the chain."""
    count = min(spec.layers, max(1, round(share * spec.layers)))
    return sorted({round(i * (spec.layers - 1) / max(count - 1, 1)) for i in range(count)})


def write_variant(base: Path, path: Path, spec: ChainSpec, layers: list[int], key: int) -> int:
    """Copy the 1.0.0 file ``base`` to ``path`` with ``layers`` perturbed in place
    (noise keyed by ``key``, so two versions differ); returns the bytes changed."""
    from registry.tensors import split

    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(base, path)
    with path.open("r+b") as fh, mmap.mmap(fh.fileno(), 0) as view:
        pieces = {p.name: p for p in split(view).pieces}
        changed = 0
        for i in layers:
            piece = pieces[f"layer{i}.weight"]
            w = np.frombuffer(view, np.float32, spec.width * spec.width, piece.offset)
            noise = np.random.default_rng([9, spec.width, i, key]).standard_normal(
                w.shape, np.float32
            )
            noise *= np.float32(_NOISE * math.sqrt(2.0 / spec.width))
            view[piece.offset : piece.offset + piece.length] = (w + noise).tobytes()
            del w
            changed += piece.length
        view.flush()
    return changed


def write_inputs(path: Path, cases: int = 2) -> None:
    """Golden inputs of a chain model (``input`` float32 ``[cases, 16]``)."""
    rng = np.random.default_rng(0)
    with path.open("wb") as fh:
        np.savez(fh, input=rng.standard_normal((cases, _IN), dtype=np.float32))
