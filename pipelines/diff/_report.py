"""Render a semantic model diff: the pull request comment (markdown) and JSON.

Output is deterministic: the same diff always renders to the same text, rows in a fixed
order, and every number of a kind formatted the same way (sizes in binary units,
measurements with 3 significant digits, metrics with 4, percentages with 2 decimals),
so golden files and PR comments only change when the models do.

Every value that comes from a model or a manifest (names, producer, doc strings, opset
domains, versions, tool messages) is data, not markup: it reaches the markdown only
through :func:`registry.render.md_text` or :func:`registry.render.md_code`, so a model
cannot write headings, links, images, HTML or a fake approval into the PR comment.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pipelines.diff._drift import GoldenDrift
from pipelines.diff._types import BaseDiff, ModelDiff, TensorInfo, WeightsDiff
from pipelines.errors import PipelineError
from registry.redact import redact
from registry.render import md_code, md_text

JSON_FORMAT: Final = "modelreg.diff/v1"


@dataclass(frozen=True)
class MarkdownLimits:
    """Caps that keep a PR comment readable (GitHub also refuses comments over 64 KiB).

    Attributes:
        rows: table rows per section before the rest is summed up in one line.
    """

    rows: int = 25


# --- number formatting -----------------------------------------------------------------


def _size(n: int) -> str:
    value = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            text = f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
            return f"-{text}" if n < 0 else text
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _signed_size(n: int) -> str:
    return _size(n) if n < 0 else f"+{_size(n)}"


def _count(n: int) -> str:
    return f"{n:,}"


def _signed_count(n: int) -> str:
    return f"{n:+,}"


def _measure(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _metric(x: float | None, *, signed: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.4g}" if signed else f"{x:.4g}"


def _percent(x: float | None, *, signed: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{x * 100:+.2f} %" if signed else f"{x * 100:.2f} %"


def _type(t: TensorInfo) -> str:
    # The notation of the I/O signature table, so one reads both the same way.
    return f"{t.dtype}[{','.join(str(d) for d in t.shape)}]"


def _table(header: Sequence[str], align: str, rows: Sequence[Sequence[str]], limit: int) -> str:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join(":--" if a == "l" else "--:" for a in align) + "|")
    lines.extend("| " + " | ".join(row) + " |" for row in rows[:limit])
    if len(rows) > limit:
        more = [f"… and {len(rows) - limit} more", *[""] * (len(header) - 1)]
        lines.append("| " + " | ".join(more) + " |")
    return "\n".join(lines)


def _labels(diff: ModelDiff) -> tuple[str, str]:
    # Version labels come from manifests: as column headers too, they are data.
    return md_text(diff.old_label), md_text(diff.new_label)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# --- summary line ----------------------------------------------------------------------


def _weights_phrase(w: WeightsDiff, total: int, total_bytes: int) -> str:
    share = w.changed_bytes / total_bytes if total_bytes else 0.0
    return (
        f"{len(w.changed)} of {_plural(total, 'tensor')} changed "
        f"({_size(w.changed_bytes)} of {_size(total_bytes)}, {_percent(share)} of weight bytes)"
    )


def _graph_phrase(diff: ModelDiff) -> str:
    kinds = {"added": 0, "removed": 0, "changed": 0}
    for node in diff.graph.nodes:
        kinds[node.kind] += 1
    parts = [f"{_plural(n, 'node')} {k}" for k, n in kinds.items() if n]
    w = diff.weights
    layout = [
        f"{_plural(len(items), 'tensor')} {what}"
        for items, what in ((w.added, "added"), (w.removed, "removed"), (w.reshaped, "reshaped"))
        if items
    ]
    parts.extend(layout)
    parts.extend(f"opset {md_text(o.domain)} {o.old or '-'} → {o.new or '-'}" for o in diff.opsets)
    if diff.old.ir_version != diff.new.ir_version:
        parts.append(f"IR version {diff.old.ir_version} → {diff.new.ir_version}")
    return ", ".join(parts)


def _also(diff: ModelDiff) -> str:
    # An I/O verdict hides what else changed; one clause keeps the line honest.
    if diff.graph.changed or diff.weights.layout_changed or diff.opsets:
        return f"; also {_graph_phrase(diff)}"
    w = diff.weights
    if w.changed:
        return "; also " + _weights_phrase(w, diff.new.initializers, diff.new.weight_bytes)
    return ""


def summary(diff: ModelDiff) -> str:
    """The one-line verdict of the PR comment, e.g. ``**Weights only**: 4 of 16 ...``."""
    verdict = diff.verdict
    head = f"**{verdict[0].upper()}{verdict[1:]}**"
    if verdict in ("breaking I/O change", "compatible I/O change"):
        changes = [c for c in diff.signature if c.breaking] or list(diff.signature)
        shown = "; ".join(f"{c.side} {md_code(c.tensor)} {md_text(c.detail)}" for c in changes[:3])
        more = f" (+{len(changes) - 3} more)" if len(changes) > 3 else ""
        return f"{head}: {shown}{more}{_also(diff)}."
    if verdict == "graph change":
        return f"{head}: {_graph_phrase(diff)}; I/O signature unchanged."
    if verdict == "weights only":
        phrase = _weights_phrase(diff.weights, diff.new.initializers, diff.new.weight_bytes)
        return f"{head}: {phrase}; I/O signature, graph and opsets unchanged."
    if verdict == "metadata only":
        return f"{head}: graph and weights are identical; the files differ elsewhere."
    return f"{head}: the files are byte-for-byte the same."


# --- sections --------------------------------------------------------------------------


def _overview(diff: ModelDiff) -> str:
    a, b = diff.old, diff.new
    size_a, size_b = a.file_bytes + a.data_bytes, b.file_bytes + b.data_bytes
    rows = [
        ["File size" + (" (with external data)" if a.data_bytes or b.data_bytes else ""),
         _size(size_a), _size(size_b), _signed_size(size_b - size_a)],
        ["SHA-256", f"`{a.sha256[:12]}`", f"`{b.sha256[:12]}`", ""],
        ["IR version", str(a.ir_version), str(b.ir_version), ""],
    ]  # fmt: skip
    before, after = dict(a.opsets), dict(b.opsets)
    for domain in sorted(before.keys() | after.keys()):
        old, new = before.get(domain), after.get(domain)
        rows.append(
            [f"Opset {md_code(domain)}", "-" if old is None else str(old),
             "-" if new is None else str(new), ""]
        )  # fmt: skip
    for label, x, y in (
        ("Nodes", a.nodes, b.nodes),
        ("Initializers", a.initializers, b.initializers),
        ("Parameters", a.parameters, b.parameters),
    ):
        rows.append([label, _count(x), _count(y), _signed_count(y - x)])
    rows.append(
        ["Weight bytes", _size(a.weight_bytes), _size(b.weight_bytes),
         _signed_size(b.weight_bytes - a.weight_bytes)]
    )  # fmt: skip
    if a.producer != b.producer:
        rows.append(["Producer", md_text(a.producer), md_text(b.producer), ""])
    return _table(["", *_labels(diff), "Change"], "lrrr", rows, len(rows))


def _signature(diff: ModelDiff, limits: MarkdownLimits) -> str:
    if not diff.signature:
        return "No changes."
    rows = [
        ["**breaking**" if c.breaking else "compatible", c.side, md_code(c.tensor), c.kind,
         "-" if c.old is None else md_code(c.old), "-" if c.new is None else md_code(c.new),
         md_text(c.detail)]
        for c in diff.signature
    ]  # fmt: skip
    header = ["Impact", "Side", "Tensor", "Change", *_labels(diff), "Detail"]
    return _table(header, "lllllll", rows, limits.rows)


def _graph(diff: ModelDiff, limits: MarkdownLimits) -> str:
    g = diff.graph
    if not g.changed:
        ops = ", ".join(f"{md_text(o.op_type)} {o.new}" for o in g.ops)
        return f"No node changes ({_plural(diff.new.nodes, 'node')}: {ops})."
    rows = [
        [md_code(o.op_type), _count(o.old), _count(o.new), _signed_count(o.new - o.old),
         _count(o.added), _count(o.removed), _count(o.changed)]
        for o in g.ops
    ]  # fmt: skip
    header = ["Op type", *_labels(diff), "Change", "Added", "Removed", "Changed"]
    counts = _table(header, "lrrrrrr", rows, len(rows))
    nodes = [[n.kind, md_code(n.node), md_code(n.op_type), md_text(n.detail)] for n in g.nodes]
    return (
        counts + "\n\n" + _table(["Node", "Name", "Op type", "Detail"], "llll", nodes, limits.rows)
    )


def _tensor_row(kind: str, t: TensorInfo, *cells: str) -> list[str]:
    return [md_code(t.name), kind, md_code(_type(t)), _size(t.nbytes), *cells]


def _weights(diff: ModelDiff, limits: MarkdownLimits) -> str:
    w = diff.weights
    counts = (
        f"{len(w.changed)} changed ({_size(w.changed_bytes)}), {len(w.added)} added, "
        f"{len(w.removed)} removed, {len(w.reshaped)} reshaped, "
        f"{w.unchanged} unchanged ({_size(w.unchanged_bytes)})"
    )
    line = f"Initializers: {counts}."
    if not (w.changed or w.layout_changed):
        return line
    # Largest relative change first: what a reviewer should look at if the table is cut.
    changed = sorted(
        w.changed,
        key=lambda c: (-(c.rel_l2 if c.rel_l2 is not None else math.inf), c.tensor.name),
    )
    rows = [_tensor_row("changed", c.tensor, _measure(c.max_abs), _measure(c.rel_l2))
            for c in changed]  # fmt: skip
    rows.extend(
        [md_code(r.new.name), "reshaped",
         f"{md_code(_type(r.old))} → {md_code(_type(r.new))}",
         f"{_size(r.old.nbytes)} → {_size(r.new.nbytes)}", "", ""]
        for r in w.reshaped
    )  # fmt: skip
    rows.extend(_tensor_row("added", t, "", "") for t in w.added)
    rows.extend(_tensor_row("removed", t, "", "") for t in w.removed)
    header = ["Tensor", "Change", "Type", "Size", "Max abs Δ", "Rel. L2 Δ"]
    return line + "\n\n" + _table(header, "lllrrr", rows, limits.rows)


def _metrics(diff: ModelDiff, limits: MarkdownLimits) -> str:
    if not diff.metrics:
        return "No metrics declared."
    rows = [
        [md_code(m.name), _metric(m.old), _metric(m.new), _metric(m.delta, signed=True),
         _percent(m.relative, signed=True)]
        for m in diff.metrics
    ]  # fmt: skip
    header = ["Metric", *_labels(diff), "Δ", "Δ %"]
    return _table(header, "lrrrr", rows, limits.rows)


def _drift(diff: ModelDiff, drift: GoldenDrift, limits: MarkdownLimits) -> str:
    a, b = _labels(diff)
    intro = (
        f"Both models run on the {b} golden inputs. Rel. Δ is the max abs Δ over the "
        f"largest {a} output; within tolerance means {a} still meets the goldens' rtol/atol."
    )
    parts = [intro]
    if drift.outputs:
        notes = any(o.note for o in drift.outputs)
        rows = [
            [md_code(o.case), md_code(o.output), _measure(o.max_abs), _measure(o.relative),
             "yes" if o.within_tolerance else "**no**", *([md_text(o.note)] if notes else [])]
            for o in drift.outputs
        ]  # fmt: skip
        header = ["Case", "Output", "Max abs Δ", "Rel. Δ", "Within tolerance"]
        header += ["Note"] if notes else []
        parts.append(_table(header, "llrrll"[: len(header)], rows, limits.rows))
    reasons: dict[str, list[str]] = {}
    for skipped in drift.skipped:
        reasons.setdefault(skipped.reason, []).append(skipped.case)
    parts.extend(
        f"Not measured for {', '.join(md_code(c) for c in cases)}: {md_text(reason)}."
        for reason, cases in reasons.items()
    )
    return "\n\n".join(parts)


def to_markdown(
    diff: ModelDiff, title: str | None = None, *, limits: MarkdownLimits | None = None
) -> str:
    """The PR comment for one diff: a heading, the verdict line, then one section per aspect.

    Args:
        diff: the diff to render.
        title: heading text (default ``Model diff: NAME OLD → NEW``).
        limits: table caps (default :class:`MarkdownLimits`).
    """
    limits = limits or MarkdownLimits()
    name = f"{diff.name} " if diff.name else ""
    heading = title or f"Model diff: {name}{diff.old_label} → {diff.new_label}"
    sections = [
        (None, _overview(diff)),
        ("I/O signature", _signature(diff, limits)),
        ("Graph", _graph(diff, limits)),
        ("Weights", _weights(diff, limits)),
        ("Metrics", _metrics(diff, limits)),
    ]
    if diff.drift is not None:
        sections.append(("Golden output drift", _drift(diff, diff.drift, limits)))
    out = [f"### {md_text(heading)}", "", summary(diff)]
    for section, body in sections:
        out.append("")
        if section is not None:
            out += [f"#### {section}", ""]
        out.append(body)
    return "\n".join(out) + "\n"


def base_markdown(result: BaseDiff, *, limits: MarkdownLimits | None = None) -> str:
    """The PR comment for every version changed against a base ref."""
    out = [f"## Model diffs against {md_code(result.base)}", ""]
    if not result.diffs and not result.without_parent:
        out.append("No model version changed.")
    out.extend(
        f"- {md_code(name)} {md_text(version)}: new model version without a parent; "
        "nothing to diff."
        for name, version in result.without_parent
    )
    for diff in result.diffs:
        out += ["", to_markdown(diff, limits=limits).rstrip("\n")]
    return "\n".join(out) + "\n"


# --- JSON ------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN or infinity
    return value


def to_json(diff: ModelDiff) -> dict[str, Any]:
    """The diff as JSON-ready data; keys are stable within ``format`` (modelreg.diff/v1)."""
    w = diff.weights
    weights = _plain(w)
    weights["changed_bytes"] = w.changed_bytes
    metrics = [
        {**_plain(m), "delta": _plain(m.delta), "relative": _plain(m.relative)}
        for m in diff.metrics
    ]
    drift = None
    if diff.drift is not None:
        drift = {**_plain(diff.drift), "within_tolerance": diff.drift.within_tolerance}
    return {
        "format": JSON_FORMAT,
        "model": diff.name,
        "old": {"label": diff.old_label, **_plain(diff.old)},
        "new": {"label": diff.new_label, **_plain(diff.new)},
        "verdict": diff.verdict,
        "breaking": diff.breaking,
        "opsets": _plain(diff.opsets),
        "signature": _plain(diff.signature),
        "graph": _plain(diff.graph),
        "weights": weights,
        "metrics": metrics,
        "drift": drift,
    }


def base_json(result: BaseDiff) -> dict[str, Any]:
    """Every diff against a base ref as JSON-ready data."""
    return {
        "format": JSON_FORMAT,
        "base": result.base,
        "diffs": [to_json(d) for d in result.diffs],
        "without_parent": [{"model": n, "version": v} for n, v in result.without_parent],
    }


def append_step_summary(markdown: str, env: Mapping[str, str]) -> Path | None:
    """Append ``markdown`` to the GitHub Actions job summary that ``env`` names, if any.

    The text is redacted first (:func:`registry.redact.redact`, with the secrets of
    ``env``): the summary is shown to everyone who can see the run, and tool messages
    in it may quote credentials.

    Returns:
        The summary file written, or None when ``env`` has no ``GITHUB_STEP_SUMMARY``.

    Raises:
        PipelineError: the summary file cannot be written.
    """
    from pipelines.github import GitHubEnv

    path = GitHubEnv.from_env(env).step_summary
    if path is None:
        return None
    try:
        with path.open("a", encoding="utf-8") as f:
            text = redact(markdown, env)
            f.write(text if text.endswith("\n") else text + "\n")
            f.write("\n")  # the next step's summary starts a new block
    except OSError as e:
        raise PipelineError(f"{path}: cannot append the job summary ({e.strerror or e})") from e
    return path


__all__ = [
    "JSON_FORMAT",
    "MarkdownLimits",
    "append_step_summary",
    "base_json",
    "base_markdown",
    "summary",
    "to_json",
    "to_markdown",
]
