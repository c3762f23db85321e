"""The result of a semantic model diff: plain frozen data.

Built by :mod:`pipelines.diff._stage`, rendered by :mod:`pipelines.diff._report`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipelines.diff._drift import GoldenDrift

ModelInput = Path | bytes
Verdict = Literal[
    "breaking I/O change",
    "compatible I/O change",
    "graph change",
    "weights only",
    "metadata only",
    "identical",
]


@dataclass(frozen=True)
class ModelInfo:
    """Facts about one side of the diff.

    Attributes:
        file_bytes: size of the ONNX file (without external data).
        sha256: hex digest of the ONNX file.
        ir_version: ONNX IR version.
        opsets: (domain, version) pairs sorted by domain; ``ai.onnx`` for the default.
        producer: producer name and version as the exporter wrote them.
        nodes: nodes of the main graph.
        initializers: initializer tensors of the main graph.
        parameters: elements in all initializers.
        weight_bytes: bytes of all initializers (decoded).
        data_bytes: size of the external data files the graph names (0: none), so
            that a model stored with external data is not shown as a few KB.
    """

    file_bytes: int
    sha256: str
    ir_version: int
    opsets: tuple[tuple[str, int], ...]
    producer: str
    nodes: int
    initializers: int
    parameters: int
    weight_bytes: int
    data_bytes: int = 0


@dataclass(frozen=True)
class OpsetChange:
    """An opset import added, removed or moved to another version."""

    domain: str
    old: int | None
    new: int | None


Side = Literal["input", "output"]
SignatureKind = Literal[
    "removed", "added", "dtype", "rank", "fixed-dim", "dim-narrowed", "dim-relaxed", "dim-renamed"
]


@dataclass(frozen=True)
class SignatureChange:
    """One change of one input or output.

    Attributes:
        side: ``input`` or ``output``.
        tensor: the tensor name.
        kind: what changed.
        breaking: whether callers written against the old version can break.
        old: the old tensor as ``dtype[dims]``, None when added.
        new: the new tensor as ``dtype[dims]``, None when removed.
        detail: the change in words, e.g. ``dim 2: 28 → 32``.
    """

    side: Side
    tensor: str
    kind: SignatureKind
    breaking: bool
    old: str | None
    new: str | None
    detail: str


@dataclass(frozen=True)
class NodeChange:
    """A node added, removed or changed in place (same name, other wiring or attributes).

    A node whose op type changed under the same name counts as removed and added, so
    that per op type ``old - removed + added == new`` always holds.
    """

    kind: Literal["added", "removed", "changed"]
    node: str
    op_type: str
    detail: str = ""


@dataclass(frozen=True)
class OpCount:
    """Nodes of one op type on both sides, and how many were added, removed, changed."""

    op_type: str
    old: int
    new: int
    added: int
    removed: int
    changed: int


@dataclass(frozen=True)
class GraphDiff:
    """Node-level changes of the main graph."""

    ops: tuple[OpCount, ...]
    nodes: tuple[NodeChange, ...]

    @property
    def changed(self) -> bool:
        """Whether any node was added, removed or changed."""
        return bool(self.nodes)


@dataclass(frozen=True)
class TensorInfo:
    """An initializer's type, shape and decoded size."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class TensorChange:
    """An initializer with the same name, dtype and shape but other values.

    Attributes:
        max_abs: largest absolute element change; None for non-numeric tensors.
        rel_l2: ``||new - old|| / ||old||``; None when non-numeric or ``old`` is zero.
    """

    tensor: TensorInfo
    max_abs: float | None
    rel_l2: float | None


@dataclass(frozen=True)
class TensorReshape:
    """An initializer kept by name whose shape or dtype changed."""

    old: TensorInfo
    new: TensorInfo


@dataclass(frozen=True)
class WeightsDiff:
    """Initializer changes, matched by name."""

    changed: tuple[TensorChange, ...]
    added: tuple[TensorInfo, ...]
    removed: tuple[TensorInfo, ...]
    reshaped: tuple[TensorReshape, ...]
    unchanged: int
    unchanged_bytes: int

    @property
    def changed_bytes(self) -> int:
        """Decoded bytes of the changed tensors."""
        return sum(c.tensor.nbytes for c in self.changed)

    @property
    def layout_changed(self) -> bool:
        """Whether tensors were added, removed or reshaped (not just new values)."""
        return bool(self.added or self.removed or self.reshaped)


@dataclass(frozen=True)
class MetricDelta:
    """One metric of the two manifests; a side is None when it does not report it."""

    name: str
    old: float | None
    new: float | None

    @property
    def delta(self) -> float | None:
        """``new - old``, when both sides report the metric."""
        return None if self.old is None or self.new is None else self.new - self.old

    @property
    def relative(self) -> float | None:
        """``(new - old) / |old|``, when defined."""
        delta = self.delta
        return None if delta is None or not self.old else delta / abs(self.old)


@dataclass(frozen=True)
class ModelDiff:
    """Everything that differs between two model versions.

    Attributes:
        name: the model name ("" when not known).
        old_label: how the old side is called in reports (its version).
        new_label: how the new side is called in reports.
    """

    name: str
    old_label: str
    new_label: str
    old: ModelInfo
    new: ModelInfo
    opsets: tuple[OpsetChange, ...]
    signature: tuple[SignatureChange, ...]
    graph: GraphDiff
    weights: WeightsDiff
    metrics: tuple[MetricDelta, ...]
    drift: GoldenDrift | None

    @property
    def breaking(self) -> bool:
        """Whether any I/O signature change can break callers."""
        return any(c.breaking for c in self.signature)

    @property
    def verdict(self) -> Verdict:
        """The most significant kind of change, for the summary line."""
        if self.breaking:
            return "breaking I/O change"
        if self.signature:
            return "compatible I/O change"
        if (
            self.graph.changed
            or self.opsets
            or self.old.ir_version != self.new.ir_version
            or self.weights.layout_changed
        ):
            return "graph change"
        if self.weights.changed:
            return "weights only"
        return "identical" if self.old.sha256 == self.new.sha256 else "metadata only"


@dataclass(frozen=True)
class BaseDiff:
    """The diffs of every version whose manifest changed against a git ref.

    Attributes:
        base: the git ref compared against.
        diffs: one diff per changed version against its parent, by model then file.
        without_parent: (model, version) of changed versions that declare no parent.
    """

    base: str
    diffs: tuple[ModelDiff, ...]
    without_parent: tuple[tuple[str, str], ...]


__all__ = [
    "BaseDiff",
    "GraphDiff",
    "MetricDelta",
    "ModelDiff",
    "ModelInfo",
    "ModelInput",
    "NodeChange",
    "OpCount",
    "OpsetChange",
    "Side",
    "SignatureChange",
    "SignatureKind",
    "TensorChange",
    "TensorInfo",
    "TensorReshape",
    "Verdict",
    "WeightsDiff",
]
