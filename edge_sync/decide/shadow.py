"""A shadow comparison's decisions (docs/guide/behaviour.md): what one pair of answers
adds to the sums, and what the health gate reads of them (pure: no I/O, no clock).

While a new version's health gate is open, the device may run a sampled share of live
requests on the previous engine too, off the request path (``edge_sync.serve.shadow``).
What is kept of each pair of answers is a handful of running sums per output
(``registry.agreement``), never the inputs or the outputs, so nothing of a request
leaves the device:

* an output shaped like class scores (floating point, ``[batch, classes]`` with at least
  two classes) counts, per row, whether both versions pick the same top class (top-1)
  and whether the previous version's top class is among the new version's top ``k``
  (``k = min(5, classes)``);
* every numeric output adds its absolute and relative differences and the previous
  values' magnitudes; a value finite in one version only is counted apart;
* each engine's run time, for the latency ratio and the p99 ratio;
* an output the two versions do not both give, with the same shape and a numeric type,
  is counted as not comparable (a signature change, say).

The gate (``edge_sync.decide.health.judge``) reads :func:`check`: a version whose
agreement is under ``min_agreement``, or whose drift is over ``max_output_drift``,
fails once ``min_compared`` requests were compared; fewer than that by the end of the
(extended) window, and it is not judged on its answers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from registry.agreement import MAX_OUTPUTS, MAX_SUM, Agreement, OutputSums, bucket
from registry.errors import printable

__all__ = ["REL_FLOOR", "TOP_K", "ShadowPolicy", "ShadowStats", "check", "compare"]

Pair = tuple[Mapping[str, Any], Mapping[str, Any], float | None, float]
"""One request's answers, new and previous, and each engine's run time (the new one's
None when unknown: a request run in a batch, whose run time is the batch's)."""
REL_FLOOR: Final = 1e-6
"""A relative difference is taken against ``max(|previous|, REL_FLOOR)``."""
TOP_K: Final = 5


@dataclass(frozen=True)
class ShadowPolicy:
    """How a model's new versions are compared with the versions they replace.

    Attributes:
        sample: the share of answered requests also run on the previous engine.
        max_cpu_share: the share of the device's CPU time (all cores) the comparison
            may take; past it, sampled requests are dropped.
        after_s: keep comparing this long after the gate passed (the previous
            engine stays loaded as long).
        min_agreement: fail the gate when the agreement is under this (None: never).
        max_output_drift: fail the gate when the drift is over this (None: never).
        min_compared: requests compared before the answers are judged.
    """

    sample: float = 0.05
    max_cpu_share: float = 0.1
    after_s: float = 0.0
    min_agreement: float | None = None
    max_output_drift: float | None = None
    min_compared: int = 50

    @property
    def gating(self) -> bool:
        """Whether the gate judges the answers (a threshold is set)."""
        return self.min_agreement is not None or self.max_output_drift is not None


def _scores(array: Any) -> bool:
    return bool(array.dtype.kind == "f" and array.ndim == 2 and array.shape[1] >= 2)


def _differences(a: Any, b: Any) -> dict[str, Any]:
    """Sums of the differences of two arrays of one shape."""
    import numpy as np

    x, y = a.astype(np.float64, copy=False).ravel(), b.astype(np.float64, copy=False).ravel()
    finite_x, finite_y = np.isfinite(x), np.isfinite(y)
    values = nonfinite = int(a.size)
    if finite_x.all() and finite_y.all():  # the usual case: no masks
        nonfinite = 0
    else:
        both = finite_x & finite_y
        # a value NaN or infinite on one side only has no bounded difference: counted
        # apart; NaN (or the same infinity) on both sides agrees
        same = ~finite_x & ~finite_y & ((np.isnan(x) & np.isnan(y)) | (x == y))
        values = int(both.sum() + same.sum())
        nonfinite -= values
        x, y = x[both], y[both]
    with np.errstate(over="ignore", invalid="ignore"):
        diff = np.abs(x - y)
        magnitude = np.abs(y)
        rel = diff / np.maximum(magnitude, REL_FLOOR)
    if not np.isfinite(diff).all():  # float64 overflow of huge values: cap it
        diff = np.nan_to_num(diff, posinf=1e300)
        rel = np.nan_to_num(rel, posinf=1e300)
    with np.errstate(over="ignore"):  # a sum past float64's range is capped
        return {
            "values": values, "nonfinite": nonfinite,
            "abs_sum": _capped(diff.sum()), "abs_max": _capped(diff.max(initial=0.0)),
            "ref_sum": _capped(magnitude.sum()),
            "rel_sum": _capped(rel.sum()), "rel_max": _capped(rel.max(initial=0.0)),
        }  # fmt: skip


def _capped(value: Any) -> float:
    """A sum or a largest difference within what a report holds (``MAX_SUM``)."""
    return min(float(value), MAX_SUM)


def compare(new: Mapping[str, Any], old: Mapping[str, Any]) -> dict[str, OutputSums]:
    """The sums of one pair of answers, per output of the new version.

    Args:
        new: the new version's outputs by name (arrays).
        old: the previous version's outputs for the same inputs.
    """
    return {name: _sums(found) for name, found in _measure(new, old).items()}


def _measure(new: Mapping[str, Any], old: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """:func:`compare`'s sums as plain dicts (what :class:`ShadowStats` adds up)."""
    import numpy as np

    found: dict[str, dict[str, Any]] = {}
    for name, value in new.items():
        a = _array(value)
        b = _array(old[name]) if name in old else None
        if (
            a is None
            or b is None
            or a.shape != b.shape
            or a.dtype.kind not in "fiub"
            or b.dtype.kind not in "fiub"
        ):
            found[name] = {"incomparable": 1}
            continue
        sums: dict[str, Any] = _differences(a, b) if a.size else {}
        if _scores(a) and a.shape[0]:
            k = min(TOP_K, a.shape[1])
            previous = np.argmax(b, axis=1)
            ranked = np.argsort(-a, axis=1, kind="stable")[:, :k]
            sums |= {
                "rows": int(a.shape[0]), "k": k,
                "top1": int((ranked[:, 0] == previous).sum()),
                "topk": int((ranked == previous[:, None]).any(axis=1).sum()),
            }  # fmt: skip
        found[name] = sums
    return found


def _array(value: Any) -> Any:
    """``value`` as an array; None when it is none (a ragged sequence output, say)."""
    import numpy as np

    try:
        return np.asarray(value)
    except (ValueError, TypeError):
        return None


_ZERO: Final = OutputSums().model_dump()


def _sums(found: dict[str, Any]) -> OutputSums:
    """Sums this module computed (in bounds by construction: not validated again, a
    comparison is on the device's clock; the report is validated as a whole)."""
    return OutputSums.model_construct(**(_ZERO | found))


@dataclass
class ShadowStats:
    """The running sums of one version's comparison (``report`` makes the
    :class:`~registry.agreement.Agreement` a device shows and sends).

    Attributes:
        compared: pairs of answers compared.
        dropped: sampled requests not compared (busy, or the CPU budget spent).
        outputs: the sums per output.
        new_s, old_s: total run time of each version over the compared requests
            whose new run time is known (a request run alone).
        new_hist, old_hist: each version's run times by histogram bucket (of those).
    """

    compared: int = 0
    dropped: int = 0
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    new_s: float = 0.0
    old_s: float = 0.0
    new_hist: Counter[int] = field(default_factory=Counter)
    old_hist: Counter[int] = field(default_factory=Counter)

    def add(
        self,
        new: Mapping[str, Any],
        old: Mapping[str, Any],
        *,
        new_s: float | None,
        old_s: float,
    ) -> None:
        """Add one pair of answers (and each engine's run time for it)."""
        self._add_outputs(new, old, 1)
        self._add_times(new_s, old_s)

    def add_many(self, pairs: Sequence[Pair]) -> None:
        """Add several pairs of answers (new, old, new_s, old_s): their outputs stacked
        into one comparison where every pair gives the same outputs, with one shape past
        the first dimension (the same sums as one by one, for less work)."""
        stacked = _stacked(pairs)
        if stacked is None:
            for new, old, _, _ in pairs:
                self._add_outputs(new, old, 1)
        else:
            self._add_outputs(*stacked, len(pairs))
        for *_, new_s, old_s in pairs:
            self._add_times(new_s, old_s)

    def merge(self, other: ShadowStats) -> None:
        """Add ``other``'s sums to these (the comparison thread sums a burst apart, and
        merges it under the lock that readers of the sums take)."""
        for name, sums in other.outputs.items():
            if name in self.outputs:
                _add(self.outputs[name], sums)
            elif len(self.outputs) < MAX_OUTPUTS:
                self.outputs[name] = dict(sums)
        self.compared += other.compared
        self.dropped += other.dropped
        self.new_s += other.new_s
        self.old_s += other.old_s
        self.new_hist.update(other.new_hist)
        self.old_hist.update(other.old_hist)

    def _add_outputs(self, new: Mapping[str, Any], old: Mapping[str, Any], answers: int) -> None:
        for name, sums in _measure(new, old).items():
            if name in self.outputs:
                _add(self.outputs[name], sums)
            elif len(self.outputs) < MAX_OUTPUTS:
                self.outputs[name] = _ZERO | sums
        self.compared += answers

    def _add_times(self, new_s: float | None, old_s: float) -> None:
        if new_s is None:
            return  # the new run time is a batch's: no ratio with a run alone
        self.new_s += new_s
        self.old_s += old_s
        self.new_hist[bucket(new_s)] += 1
        self.old_hist[bucket(old_s)] += 1

    def report(self, version: str, against: str, *, running: bool = False) -> Agreement:
        """The sums as a device shows and reports them."""
        return Agreement(
            version=version, against=against, compared=self.compared, dropped=self.dropped,
            new_s=min(self.new_s, 1e300), old_s=min(self.old_s, 1e300),
            new_hist=[[i, n] for i, n in sorted(self.new_hist.items())],
            old_hist=[[i, n] for i, n in sorted(self.old_hist.items())],
            outputs=_named({
                name: OutputSums.model_validate(
                    sums | {k: min(sums[k], MAX_SUM) for k in _CAPPED}
                )
                for name, sums in sorted(self.outputs.items())
            }),
            open=running,
        )  # fmt: skip


_CAPPED: Final = ("abs_sum", "abs_max", "ref_sum", "rel_sum", "rel_max")


def _named(outputs: dict[str, OutputSums]) -> dict[str, OutputSums]:
    """``outputs`` by the names a report holds: a graph may name an output with control
    characters, or at length (they are dropped, the name cut); two names that come out
    the same are told apart by a suffix (``~2``), never merged into one."""
    named: dict[str, OutputSums] = {}
    for name, sums in outputs.items():
        base = printable(str(name), keep="")[:256] or "?"
        shown, n = base, 1
        while shown in named or (shown != name and shown in outputs):
            n += 1
            shown = f"{base[:250]}~{n}"
        named[shown] = sums
    return named


def _stacked(pairs: Sequence[Pair]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The pairs' answers stacked along their first dimension, output by output; None
    when they cannot be (outputs that differ between pairs or versions, shapes that do
    not stack, a scalar): those are compared one by one."""
    import numpy as np

    if len(pairs) < 2:
        return None
    names = set(pairs[0][0])
    new: dict[str, Any] = {}
    old: dict[str, Any] = {}
    for name in names:
        if any(set(p[0]) != names or name not in p[1] for p in pairs):
            return None
        a = [_array(p[0][name]) for p in pairs]
        b = [_array(p[1][name]) for p in pairs]
        if any(x is None for x in a + b):
            return None
        shapes = {x.shape[1:] for x in a + b if x.ndim}
        if (
            any(x.ndim == 0 or x.dtype.kind not in "fiub" for x in a + b)
            or len(shapes) != 1
            or any(x.shape != y.shape for x, y in zip(a, b, strict=True))
        ):
            return None
        new[name], old[name] = np.concatenate(a), np.concatenate(b)
    return new, old


def _add(total: dict[str, Any], found: dict[str, Any]) -> None:
    """Add one answer's sums to ``total`` (in place)."""
    for key in _ADDED:
        if key in found:
            total[key] += found[key]
    for key in ("abs_max", "rel_max"):
        total[key] = max(total[key], found.get(key, 0.0))
    if total["k"] is None:
        total["k"] = found.get("k")


_ADDED: Final = ("rows", "top1", "topk", "values", "abs_sum", "ref_sum", "rel_sum",
                 "nonfinite", "incomparable")  # fmt: skip


Check = tuple[Literal["pass", "fail", "wait"], str]


def check(policy: ShadowPolicy, found: Agreement | None) -> Check:
    """What the gate reads of a comparison: ``fail`` (with why) when its figures are past
    the policy's thresholds over at least ``min_compared`` comparable requests (those the
    previous version answered alike: ``Agreement.comparable``); ``wait`` while fewer were
    compared, or while a threshold's figure is not measured (an output shaped like class
    scores for ``min_agreement``): the gate then passes the version "not judged on its
    answers"; else ``pass`` (with the figures); ``pass`` with no threshold."""
    if not policy.gating:
        return "pass", found.text() if found is not None and found.compared else ""
    comparable = found.comparable if found is not None else 0
    if found is None or comparable < policy.min_compared:
        apart = (
            f" ({found.incomparable:,} answers not comparable)"
            if found and found.incomparable
            else ""
        )
        return "wait", (
            f"answers not compared with the previous version's: {comparable} of "
            f"{policy.min_compared} requests compared{apart}"
        )
    agreement, drift = found.agreement, found.drift
    if (
        policy.min_agreement is not None
        and agreement is not None
        and agreement < policy.min_agreement
    ):
        return "fail", (
            f"health gate: {found.text()} with the previous version; at least "
            f"{policy.min_agreement:.1%} agreement required"
        )
    if (
        policy.max_output_drift is not None
        and drift is not None
        and drift > policy.max_output_drift
    ):
        return "fail", (
            f"health gate: {found.text()} with the previous version; at most "
            f"{policy.max_output_drift:.1%} drift allowed"
        )
    if policy.min_agreement is not None and agreement is None:
        return "wait", (
            "agreement not measured: no output is shaped like class scores "
            f"([batch, classes] floats); {found.text()}"
        )
    if policy.max_output_drift is not None and drift is None:
        return "wait", f"drift not measured: no output value was compared; {found.text()}"
    return "pass", found.text()
