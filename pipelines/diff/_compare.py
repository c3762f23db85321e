"""The comparisons of a semantic model diff: pure functions, no I/O.

Signature changes follow variance: an input may accept more than before (a fixed dim
made symbolic is compatible) but not less, while an output may promise more than before
(a symbolic dim made fixed is compatible) but not less.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from pipelines.diff._types import (
    GraphDiff,
    MetricDelta,
    NodeChange,
    OpCount,
    OpsetChange,
    Side,
    SignatureChange,
    SignatureKind,
    TensorChange,
    TensorInfo,
    TensorReshape,
    WeightsDiff,
)
from registry.schema import ModelVersion, TensorSpec


def diff_opsets(
    old: Sequence[tuple[str, int]], new: Sequence[tuple[str, int]]
) -> tuple[OpsetChange, ...]:
    """Opset imports that differ, by domain."""
    before, after = dict(old), dict(new)
    return tuple(
        OpsetChange(d, before.get(d), after.get(d))
        for d in sorted(before.keys() | after.keys())
        if before.get(d) != after.get(d)
    )


def _shown(spec: TensorSpec) -> str:
    return f"{spec.dtype}[{','.join('?' if d is None else str(d) for d in spec.shape)}]"


def _dim_changes(side: Side, old: TensorSpec, new: TensorSpec) -> list[SignatureChange]:
    by_kind: dict[SignatureKind, list[str]] = defaultdict(list)
    for i, (a, b) in enumerate(zip(old.shape, new.shape, strict=True)):
        if a == b:
            continue
        text = f"dim {i}: {'?' if a is None else a} → {'?' if b is None else b}"
        if isinstance(a, int) and isinstance(b, int):
            by_kind["fixed-dim"].append(text)
        elif isinstance(a, int):
            by_kind["dim-relaxed"].append(text)
        elif isinstance(b, int):
            by_kind["dim-narrowed"].append(text)
        else:
            by_kind["dim-renamed"].append(text)
    # An input that accepts fewer shapes, or an output that promises fewer, breaks
    # someone: relaxing is safe only on the input side, narrowing only on the output.
    breaking: dict[SignatureKind, bool] = {
        "fixed-dim": True,
        "dim-relaxed": side == "output",
        "dim-narrowed": side == "input",
        "dim-renamed": False,
    }
    return [
        SignatureChange(
            side, new.name, kind, breaking[kind], _shown(old), _shown(new), ", ".join(texts)
        )
        for kind, texts in by_kind.items()
    ]


def _tensor_changes(
    side: Side, name: str, a: TensorSpec | None, b: TensorSpec | None
) -> list[SignatureChange]:
    def change(kind: SignatureKind, detail: str, *, breaking: bool = True) -> SignatureChange:
        old = None if a is None else _shown(a)
        new = None if b is None else _shown(b)
        return SignatureChange(side, name, kind, breaking, old, new, detail)

    if a is None:
        # ONNX has no optional graph inputs: a new input is one every caller must send.
        if side == "input":
            return [change("added", "new required input")]
        return [change("added", "new output", breaking=False)]
    if b is None:
        return [
            change(
                "removed",
                "callers' feeds are rejected" if side == "input" else "no longer produced",
            )
        ]
    changes: list[SignatureChange] = []
    if a.dtype != b.dtype:
        changes.append(change("dtype", f"{a.dtype} → {b.dtype}"))
    if len(a.shape) != len(b.shape):
        changes.append(change("rank", f"rank {len(a.shape)} → {len(b.shape)}"))
    else:
        changes.extend(_dim_changes(side, a, b))
    return changes


def diff_signature(
    old_inputs: Sequence[TensorSpec],
    old_outputs: Sequence[TensorSpec],
    new_inputs: Sequence[TensorSpec],
    new_outputs: Sequence[TensorSpec],
) -> tuple[SignatureChange, ...]:
    """Classify every I/O change as breaking or compatible (inputs first, then by name)."""
    changes: list[SignatureChange] = []
    sides: tuple[tuple[Side, Sequence[TensorSpec], Sequence[TensorSpec]], ...] = (
        ("input", old_inputs, new_inputs),
        ("output", old_outputs, new_outputs),
    )
    for side, olds, news in sides:
        before = {t.name: t for t in olds}
        after = {t.name: t for t in news}
        for name in sorted(before.keys() | after.keys()):
            changes.extend(_tensor_changes(side, name, before.get(name), after.get(name)))
    return tuple(changes)


def _op(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _label(node: onnx.NodeProto) -> str:
    return node.name or f"{_op(node)} → {', '.join(node.output)}"


def _keys(nodes: Sequence[onnx.NodeProto]) -> list[tuple[str, ...]]:
    # Exporters usually name nodes uniquely; where they don't, a node is what it
    # computes from what, so the structure is the identity.
    names = Counter(n.name for n in nodes if n.name)
    return [
        ("name", n.name)
        if n.name and names[n.name] == 1
        else ("op", _op(n), *n.input, "->", *n.output)
        for n in nodes
    ]


def _attributes(node: onnx.NodeProto) -> dict[str, bytes]:
    return {a.name: a.SerializeToString(deterministic=True) for a in node.attribute}


def _node_detail(a: onnx.NodeProto, b: onnx.NodeProto) -> str:
    parts: list[str] = []
    if list(a.input) != list(b.input):
        parts.append(f"inputs {', '.join(a.input)} → {', '.join(b.input)}")
    if list(a.output) != list(b.output):
        parts.append(f"outputs {', '.join(a.output)} → {', '.join(b.output)}")
    attrs_a, attrs_b = _attributes(a), _attributes(b)
    names = sorted(k for k in attrs_a.keys() | attrs_b.keys() if attrs_a.get(k) != attrs_b.get(k))
    if names:
        parts.append(f"attributes {', '.join(names)}")
    return "; ".join(parts)


def diff_nodes(old: Sequence[onnx.NodeProto], new: Sequence[onnx.NodeProto]) -> GraphDiff:
    """Match nodes by unique name, else by structure, and count changes per op type."""
    pending: dict[tuple[str, ...], list[onnx.NodeProto]] = defaultdict(list)
    for key, node in zip(_keys(old), old, strict=True):
        pending[key].append(node)
    changes: list[NodeChange] = []
    for key, b in zip(_keys(new), new, strict=True):
        if not pending.get(key):
            changes.append(NodeChange("added", _label(b), _op(b)))
            continue
        a = pending[key].pop(0)
        if _op(a) != _op(b):
            detail = f"was {_op(a)}"
            changes.append(NodeChange("removed", _label(a), _op(a), f"now {_op(b)}"))
            changes.append(NodeChange("added", _label(b), _op(b), detail))
        elif detail := _node_detail(a, b):
            changes.append(NodeChange("changed", _label(b), _op(b), detail))
    changes.extend(
        NodeChange("removed", _label(a), _op(a)) for nodes in pending.values() for a in nodes
    )
    counts_old = Counter(_op(n) for n in old)
    counts_new = Counter(_op(n) for n in new)
    per_kind = Counter((c.op_type, c.kind) for c in changes)
    ops = tuple(
        OpCount(
            op,
            counts_old[op],
            counts_new[op],
            per_kind[op, "added"],
            per_kind[op, "removed"],
            per_kind[op, "changed"],
        )
        for op in sorted(counts_old.keys() | counts_new.keys())
    )
    order = {"removed": 0, "added": 1, "changed": 2}
    changes.sort(key=lambda c: (order[c.kind], c.op_type, c.node))
    return GraphDiff(ops, tuple(changes))


def _tensor_info(name: str, array: Any) -> TensorInfo:
    return TensorInfo(name, str(array.dtype), tuple(int(d) for d in array.shape), int(array.nbytes))


def compare_tensors(name: str, old: Any, new: Any) -> TensorChange | None:
    """The change of a same-shape, same-dtype tensor; None when the values are equal."""
    if np.array_equal(old, new, equal_nan=old.dtype.kind in "fc"):
        return None
    info = _tensor_info(name, new)
    if old.dtype.kind not in "biufc":
        return TensorChange(info, None, None)
    a = old.astype(np.float64)
    b = new.astype(np.float64)
    diff = b - a
    max_abs = float(np.max(np.abs(diff)))
    norm = float(np.linalg.norm(a))
    return TensorChange(info, max_abs, float(np.linalg.norm(diff)) / norm if norm else None)


def diff_weights(old: dict[str, Any], new: dict[str, Any]) -> WeightsDiff:
    """Compare initializers by name (arrays keyed by initializer name)."""
    changed: list[TensorChange] = []
    reshaped: list[TensorReshape] = []
    unchanged = unchanged_bytes = 0
    for name in sorted(old.keys() & new.keys()):
        a, b = old[name], new[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            reshaped.append(TensorReshape(_tensor_info(name, a), _tensor_info(name, b)))
        elif (change := compare_tensors(name, a, b)) is not None:
            changed.append(change)
        else:
            unchanged += 1
            unchanged_bytes += int(b.nbytes)
    return WeightsDiff(
        changed=tuple(changed),
        added=tuple(_tensor_info(n, new[n]) for n in sorted(new.keys() - old.keys())),
        removed=tuple(_tensor_info(n, old[n]) for n in sorted(old.keys() - new.keys())),
        reshaped=tuple(reshaped),
        unchanged=unchanged,
        unchanged_bytes=unchanged_bytes,
    )


def diff_metrics(old: ModelVersion | None, new: ModelVersion | None) -> tuple[MetricDelta, ...]:
    """Every metric either manifest reports, by name."""
    before = old.spec.metrics if old is not None else {}
    after = new.spec.metrics if new is not None else {}
    return tuple(
        MetricDelta(k, before.get(k), after.get(k)) for k in sorted(before.keys() | after.keys())
    )


__all__ = [
    "compare_tensors",
    "diff_metrics",
    "diff_nodes",
    "diff_opsets",
    "diff_signature",
    "diff_weights",
]
