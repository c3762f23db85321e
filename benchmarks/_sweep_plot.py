"""The edge update sweep's figure: update time against changed bytes, full and by
tensors, one line per model size (``benchmarks.edge_update``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_sweep"]

_STYLE = {"full": ("tab:red", "o", "-"), "tensors": ("tab:blue", "s", "-"),
          "tensor floor": ("tab:gray", "^", ":")}  # fmt: skip


def plot_sweep(points: Sequence[dict[str, Any]], path: Path, *, title: str) -> None:
    """Write the sweep ``points`` (``size``, ``changed_bytes``, ``full_s``,
    ``tensors_s``, ``tensor_floor_s``) as an SVG figure to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    sizes = sorted({p["size"] for p in points}, key=lambda s: min(
        q["model_bytes"] for q in points if q["size"] == s))  # fmt: skip
    fills = {size: i == 0 for i, size in enumerate(sizes)}
    for size in sizes:
        mine = sorted((p for p in points if p["size"] == size), key=lambda p: p["changed_bytes"])
        x = [p["changed_bytes"] / 1e6 for p in mine]
        for label, key in (("full", "full_s"), ("tensors", "tensors_s"),
                           ("tensor floor", "tensor_floor_s")):  # fmt: skip
            color, marker, line = _STYLE[label]
            ax.plot(x, [p[key] for p in mine], marker=marker, linestyle=line, color=color,
                    markerfacecolor=color if fills[size] else "white",
                    label=f"{label}, {size}")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("changed bytes (MB, log)")
    ax.set_ylabel("update time, new metadata to committed (s, log)")
    ax.set_title(title, fontsize=10)
    ax.grid(visible=True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncols=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
