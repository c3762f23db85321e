"""``modelreg diff``: what changed between two versions, for a reviewer (stable API).

:func:`diff_models` compares two ONNX models (and optionally their manifests and goldens)
into a :class:`ModelDiff`; :func:`diff_versions` does it for two declared versions and
:func:`diff_against_base` for every version a branch changed.  Comparisons live in
``_compare``, golden output drift in ``_drift``, rendering (Markdown, JSON, the GitHub
step summary) in ``_report``, the result types in ``_types``.
"""

from __future__ import annotations

from pipelines.diff._compare import (
    compare_tensors,
    diff_metrics,
    diff_nodes,
    diff_opsets,
    diff_signature,
    diff_weights,
)
from pipelines.diff._drift import GoldenDrift, OutputDrift, SkippedCase
from pipelines.diff._report import (
    JSON_FORMAT,
    MarkdownLimits,
    append_step_summary,
    base_json,
    base_markdown,
    summary,
    to_json,
    to_markdown,
)
from pipelines.diff._stage import changed_versions, diff_against_base, diff_models, diff_versions
from pipelines.diff._types import (
    BaseDiff,
    GraphDiff,
    MetricDelta,
    ModelDiff,
    ModelInfo,
    ModelInput,
    NodeChange,
    OpCount,
    OpsetChange,
    Side,
    SignatureChange,
    SignatureKind,
    TensorChange,
    TensorInfo,
    TensorReshape,
    Verdict,
    WeightsDiff,
)

__all__ = [
    "JSON_FORMAT",
    "BaseDiff",
    "GoldenDrift",
    "GraphDiff",
    "MarkdownLimits",
    "MetricDelta",
    "ModelDiff",
    "ModelInfo",
    "ModelInput",
    "NodeChange",
    "OpCount",
    "OpsetChange",
    "OutputDrift",
    "Side",
    "SignatureChange",
    "SignatureKind",
    "SkippedCase",
    "TensorChange",
    "TensorInfo",
    "TensorReshape",
    "Verdict",
    "WeightsDiff",
    "append_step_summary",
    "base_json",
    "base_markdown",
    "changed_versions",
    "compare_tensors",
    "diff_against_base",
    "diff_metrics",
    "diff_models",
    "diff_nodes",
    "diff_opsets",
    "diff_signature",
    "diff_versions",
    "diff_weights",
    "summary",
    "to_json",
    "to_markdown",
]
