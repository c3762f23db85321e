"""How a new version's answers agree with the previous version's on the same inputs:
aggregates only (issue 29, shadow comparison; this module is its first part).

While a new version's health gate is open, the device may run a share of live requests
on the previous engine too, off the request path.  What is kept of each pair of answers
is a handful of running sums per output, never the inputs or the outputs themselves, so
nothing of a request leaves the device:

* an output shaped like class scores (floating point, ``[batch, classes]`` with at least
  two classes) counts, per row, whether both versions pick the same top class (top-1
  agreement) and whether the previous version's top class is among the new version's
  top ``k`` (top-k agreement, ``k = min(5, classes)``);
* every numeric output adds its mean and largest absolute difference and relative
  difference (against the previous version's value, floored at :data:`REL_FLOOR`);
* the run time of each engine, for the latency ratio;
* an output the two versions do not both give, with the same shape and a numeric type,
  is counted as not comparable (a signature change, say).

Pure: :func:`compare` measures one pair of answers; :class:`ShadowStats` adds them up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["REL_FLOOR", "TOP_K", "OutputAgreement", "ShadowStats", "compare"]

REL_FLOOR: Final = 1e-6
"""A relative difference is taken against ``max(|previous|, REL_FLOOR)``."""
TOP_K: Final = 5


@dataclass
class OutputAgreement:
    """The running agreement of one output.

    Attributes:
        rows: rows compared as class scores (0: not shaped like class scores).
        top1: rows whose top class is the same in both versions.
        topk: rows whose previous top class is among the new version's top ``k``.
        k: the ``k`` of ``topk`` (None: not class scores).
        values: values compared.
        abs_sum, abs_max: sum and largest absolute difference.
        rel_sum, rel_max: sum and largest relative difference.
        incomparable: answers whose output could not be compared.
    """

    rows: int = 0
    top1: int = 0
    topk: int = 0
    k: int | None = None
    values: int = 0
    abs_sum: float = 0.0
    abs_max: float = 0.0
    rel_sum: float = 0.0
    rel_max: float = 0.0
    incomparable: int = 0

    def add(self, other: OutputAgreement) -> None:
        """Add ``other``'s counts (one answer's) to these."""
        self.rows += other.rows
        self.top1 += other.top1
        self.topk += other.topk
        self.k = self.k if other.k is None else other.k
        self.values += other.values
        self.abs_sum += other.abs_sum
        self.abs_max = max(self.abs_max, other.abs_max)
        self.rel_sum += other.rel_sum
        self.rel_max = max(self.rel_max, other.rel_max)
        self.incomparable += other.incomparable

    @property
    def top1_agreement(self) -> float | None:
        """The share of rows with the same top class (None: not class scores)."""
        return self.top1 / self.rows if self.rows else None

    @property
    def topk_agreement(self) -> float | None:
        """The share of rows whose previous top class is in the new top ``k``."""
        return self.topk / self.rows if self.rows else None

    def to_json(self) -> dict[str, Any]:
        """The aggregates as a device reports them."""
        mean = (lambda total: total / self.values) if self.values else (lambda _: None)
        return {
            "rows": self.rows,
            "top1_agreement": self.top1_agreement,
            "topk_agreement": self.topk_agreement,
            "k": self.k,
            "values": self.values,
            "mean_abs_diff": mean(self.abs_sum),
            "max_abs_diff": self.abs_max if self.values else None,
            "mean_rel_diff": mean(self.rel_sum),
            "max_rel_diff": self.rel_max if self.values else None,
            "incomparable": self.incomparable,
        }


def _scores(array: Any) -> bool:
    return bool(array.dtype.kind == "f" and array.ndim == 2 and array.shape[1] >= 2)


def _differences(one: OutputAgreement, a: Any, b: Any) -> None:
    """Absolute and relative differences of two arrays of one shape, into ``one``."""
    import numpy as np

    x, y = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        diff = np.abs(x - y)
        # a value that is NaN or infinite on one side only differs without bound
        diff = np.where(np.isfinite(diff) | (np.isnan(x) & np.isnan(y)), diff, np.inf)
        diff = np.nan_to_num(diff, nan=0.0, posinf=np.inf)
        rel = diff / np.maximum(np.abs(np.nan_to_num(y)), REL_FLOOR)
    one.values = int(a.size)
    one.abs_sum, one.abs_max = float(diff.sum()), float(diff.max())
    one.rel_sum, one.rel_max = float(rel.sum()), float(rel.max())


def compare(new: Mapping[str, Any], old: Mapping[str, Any]) -> dict[str, OutputAgreement]:
    """The agreement of one pair of answers, per output of the new version.

    Args:
        new: the new version's outputs by name (arrays).
        old: the previous version's outputs for the same inputs.
    """
    import numpy as np

    found: dict[str, OutputAgreement] = {}
    for name, value in new.items():
        a = np.asarray(value)
        b = np.asarray(old[name]) if name in old else None
        if (
            b is None
            or a.shape != b.shape
            or a.dtype.kind not in "fiub"
            or b.dtype.kind not in "fiub"
        ):
            found[name] = OutputAgreement(incomparable=1)
            continue
        one = OutputAgreement()
        if a.size:
            _differences(one, a, b)
        if _scores(a) and a.shape[0]:
            k = min(TOP_K, a.shape[1])
            previous = np.argmax(b, axis=1)
            ranked = np.argsort(-a, axis=1, kind="stable")[:, :k]
            one.rows = int(a.shape[0])
            one.top1 = int((ranked[:, 0] == previous).sum())
            one.topk = int((ranked == previous[:, None]).any(axis=1).sum())
            one.k = k
        found[name] = one
    return found


@dataclass
class ShadowStats:
    """The agreement of every pair of answers compared for one version.

    Attributes:
        compared: pairs of answers compared.
        outputs: the agreement per output.
        new_s, old_s: total run time of each version over the compared requests.
    """

    compared: int = 0
    outputs: dict[str, OutputAgreement] = field(default_factory=dict)
    new_s: float = 0.0
    old_s: float = 0.0

    def add(
        self, new: Mapping[str, Any], old: Mapping[str, Any], *, new_s: float, old_s: float
    ) -> None:
        """Add one pair of answers (and each engine's run time for it)."""
        for name, one in compare(new, old).items():
            self.outputs.setdefault(name, OutputAgreement()).add(one)
        self.compared += 1
        self.new_s += new_s
        self.old_s += old_s

    @property
    def agreement(self) -> float | None:
        """The lowest top-1 agreement over the outputs shaped like class scores (None:
        none is)."""
        shares = [o.top1_agreement for o in self.outputs.values() if o.top1_agreement is not None]
        return min(shares) if shares else None

    @property
    def latency_ratio(self) -> float | None:
        """The new version's run time over the previous one's, on the same requests."""
        return self.new_s / self.old_s if self.old_s > 0 else None

    def to_json(self) -> dict[str, Any]:
        """The aggregates as a device reports them (no request data)."""
        return {
            "compared": self.compared,
            "agreement": self.agreement,
            "latency_ratio": self.latency_ratio,
            "outputs": {name: o.to_json() for name, o in sorted(self.outputs.items())},
        }
