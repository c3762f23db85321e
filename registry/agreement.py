"""How a new version's answers agree with the previous version's on a device's own
traffic: the aggregates a device keeps and reports, and the figures read from them
(pure; shared by the device, ``edge_sync.decide.shadow``, and the fleet,
``fleet.waves``).

While a version's health gate is open, a device may run a sampled share of its live
requests on the previous engine too (a shadow comparison, docs/guide/behaviour.md).
What it keeps is sums, never a request: per output, the rows compared as class scores
and how many kept their top class, the values compared and the sum of their absolute
differences and of the previous values' magnitudes, and a histogram of each engine's
run time.  Sums add up: a fleet's figures are the sums of its devices' (:func:`combine`),
not an average of their ratios.

The figures:

* **agreement**: the share of rows whose top class is the same in both versions, the
  lowest over the outputs shaped like class scores (None: none is);
* **drift**: the largest, over the outputs, sum of absolute differences over the sum of
  the previous version's magnitudes (a relative L1 difference: 0.01 is 1 %), and never
  less than the share of values that became non-finite on one side only;
* **p99 ratio**: the 99th percentile of the new engine's run time over the previous
  engine's, on the same requests (from log-spaced histograms: within 10 %).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Annotated, Final

from pydantic import AfterValidator, Field, StringConstraints, model_validator

from registry.errors import printable
from registry.schema import SemVer, Strict

__all__ = [
    "BUCKETS",
    "MAX_OUTPUTS",
    "Agreement",
    "OutputSums",
    "bucket",
    "bucket_seconds",
    "combine",
    "percentile",
]

BUCKET_BASE_S: Final = 1e-6
BUCKET_FACTOR: Final = 1.1
BUCKETS: Final = 256
"""Latency histogram buckets: bucket ``i`` holds runs of up to ``1 us * 1.1**(i+1)``
(the last one everything longer, about 11 hours)."""
MAX_OUTPUTS: Final = 32
"""Outputs a comparison keeps the sums of (the first it sees; a model with more has them
counted in ``compared`` but not summed)."""
MAX_COUNT: Final = 2**53
MAX_SUM: Final = 1e300


def bucket(seconds: float) -> int:
    """The histogram bucket of a run of ``seconds``."""
    if not seconds > BUCKET_BASE_S:
        return 0
    found = math.floor(math.log(seconds / BUCKET_BASE_S) / math.log(BUCKET_FACTOR))
    return min(max(found, 0), BUCKETS - 1)


def bucket_seconds(index: int) -> float:
    """The upper edge of bucket ``index`` (what a percentile in it reads as)."""
    return BUCKET_BASE_S * BUCKET_FACTOR ** (index + 1)


def percentile(histogram: Iterable[Sequence[int]], share: float) -> float | None:
    """The run time under which ``share`` of the histogram's runs fall (None: empty)."""
    pairs = sorted((index, count) for index, count in histogram)
    total = sum(n for _, n in pairs)
    if not total:
        return None
    wanted, seen = share * total, 0
    for index, count in pairs:
        seen += count
        if seen >= wanted:
            return bucket_seconds(index)
    return bucket_seconds(pairs[-1][0])  # pragma: no cover - share <= 1


def _printable(value: str) -> str:
    if printable(value, keep="") != value:
        raise ValueError("holds control or format characters")
    return value


Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Sum = Annotated[float, Field(ge=0, le=MAX_SUM, allow_inf_nan=False)]
OutputName = Annotated[
    str, StringConstraints(min_length=1, max_length=256), AfterValidator(_printable)
]


def _buckets(pairs: list[list[int]]) -> list[list[int]]:
    indexes = [index for index, _ in pairs]
    if any(not 0 <= i < BUCKETS for i in indexes) or len(set(indexes)) != len(indexes):
        raise ValueError(f"bucket indexes must be distinct, 0 to {BUCKETS - 1}")
    return pairs


Histogram = Annotated[
    list[Annotated[list[Count], Field(min_length=2, max_length=2)]],
    Field(max_length=BUCKETS),
    AfterValidator(_buckets),
]
"""``[bucket, count]`` pairs (:func:`bucket`)."""


class OutputSums(Strict):
    """One output's sums over the compared answers.

    Attributes:
        rows: rows compared as class scores (float ``[batch, classes >= 2]``).
        top1: of those, rows whose top class is the same in both versions.
        topk: rows whose previous top class is among the new version's top ``k``.
        k: that ``k`` (None: not class scores).
        values: values compared (finite on both sides, or not finite on both).
        abs_sum, abs_max: sum and largest absolute difference of those.
        ref_sum: sum of the previous version's magnitudes over those.
        rel_sum, rel_max: sum and largest relative difference (against the previous
            value, floored at 1e-6).
        nonfinite: values finite on one side only (NaN or infinite in one version).
        incomparable: answers whose output the versions do not both give, with one
            shape and a numeric type (a signature change).
    """

    rows: Count = 0
    top1: Count = 0
    topk: Count = 0
    k: Annotated[int, Field(ge=2, le=5)] | None = None
    values: Count = 0
    abs_sum: Sum = 0.0
    abs_max: Sum = 0.0
    ref_sum: Sum = 0.0
    rel_sum: Sum = 0.0
    rel_max: Sum = 0.0
    nonfinite: Count = 0
    incomparable: Count = 0

    @model_validator(mode="after")
    def _consistent(self) -> OutputSums:
        if not self.top1 <= self.topk <= self.rows:
            raise ValueError(
                "top1 <= topk <= rows does not hold (a same top class is in the top k)"
            )
        if self.abs_max > self.abs_sum or self.rel_max > self.rel_sum:
            raise ValueError("a largest difference is over the sum of the differences")
        return self

    @property
    def top1_agreement(self) -> float | None:
        """The share of rows with the same top class (None: not class scores)."""
        return self.top1 / self.rows if self.rows else None

    @property
    def topk_agreement(self) -> float | None:
        """The share of rows whose previous top class is in the new top ``k``."""
        return self.topk / self.rows if self.rows else None

    @property
    def drift(self) -> float | None:
        """The relative L1 difference (module doc; None: no value compared)."""
        counted = self.values + self.nonfinite
        if not counted:
            return None
        relative = self.abs_sum / max(self.ref_sum, 1e-12) if self.abs_sum else 0.0
        return max(relative, self.nonfinite / counted)

    def plus(self, other: OutputSums) -> OutputSums:
        """These sums and ``other``'s."""

        def count(a: int, b: int) -> int:  # saturated as the sums are: they still add up
            return min(a + b, MAX_COUNT)

        return OutputSums(
            rows=count(self.rows, other.rows), top1=count(self.top1, other.top1),
            topk=count(self.topk, other.topk), k=other.k if self.k is None else self.k,
            values=count(self.values, other.values),
            abs_sum=min(self.abs_sum + other.abs_sum, MAX_SUM),
            abs_max=max(self.abs_max, other.abs_max),
            ref_sum=min(self.ref_sum + other.ref_sum, MAX_SUM),
            rel_sum=min(self.rel_sum + other.rel_sum, MAX_SUM),
            rel_max=max(self.rel_max, other.rel_max),
            nonfinite=count(self.nonfinite, other.nonfinite),
            incomparable=count(self.incomparable, other.incomparable),
        )  # fmt: skip

    def summary(self) -> dict[str, float | int | None]:
        """The figures of this output (for ``/status`` and the JSON views)."""
        mean = (lambda s: s / self.values) if self.values else (lambda _: None)
        return {
            "top1_agreement": self.top1_agreement, "topk_agreement": self.topk_agreement,
            "k": self.k, "drift": self.drift, "mean_abs_diff": mean(self.abs_sum),
            "max_abs_diff": self.abs_max if self.values else None,
            "mean_rel_diff": mean(self.rel_sum),
            "max_rel_diff": self.rel_max if self.values else None,
            "nonfinite": self.nonfinite, "incomparable": self.incomparable,
        }  # fmt: skip


class Agreement(Strict):
    """A shadow comparison of ``version`` against ``against``: its sums (a device's, or
    a fleet's by :func:`combine`).

    Attributes:
        version: the new version.
        against: the version it was compared with (the one it replaced).
        compared: requests run on both.
        dropped: sampled requests not compared (the device was busy, or the shadow's
            CPU budget was spent): dropped first, never waited for.
        devices: devices whose sums these are (1 for a device's own).
        new_s, old_s: each engine's total run time over the compared requests.
        new_hist, old_hist: each engine's run times, ``(bucket, count)``
            (:func:`bucket`).
        outputs: the sums per output of the new version (at most
            :data:`MAX_OUTPUTS`).
        open: the comparison is still running.
    """

    version: SemVer
    against: SemVer
    compared: Count = 0
    dropped: Count = 0
    devices: Annotated[int, Field(ge=1, le=MAX_COUNT)] = 1
    new_s: Sum = 0.0
    old_s: Sum = 0.0
    new_hist: Histogram = Field(default_factory=list)
    old_hist: Histogram = Field(default_factory=list)
    outputs: Annotated[dict[OutputName, OutputSums], Field(max_length=MAX_OUTPUTS)] = Field(
        default_factory=dict
    )
    open: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> Agreement:
        if any(o.incomparable > self.compared for o in self.outputs.values()):
            raise ValueError("an output has more answers not comparable than were compared")
        return self

    @property
    def comparable(self) -> int:
        """The evidence behind the figures: requests compared on each output that gives
        a figure (rows as class scores, or values), the least over those outputs.  An
        answer the previous version failed on, or gave unlike, is not evidence; an
        output the previous version does not give at all (a new output) gives no figure
        and does not lessen it."""
        return min(
            (self.compared - o.incomparable for o in self.outputs.values() if o.rows or o.values),
            default=0,
        )

    @property
    def agreement(self) -> float | None:
        """The lowest top-1 agreement over the class-score outputs (None: none)."""
        shares = [o.top1_agreement for o in self.outputs.values()]
        found = [s for s in shares if s is not None]
        return min(found) if found else None

    @property
    def drift(self) -> float | None:
        """The largest drift over the outputs (None: nothing compared)."""
        found = [d for d in (o.drift for o in self.outputs.values()) if d is not None]
        return max(found) if found else None

    @property
    def incomparable(self) -> int:
        """Answers with an output that could not be compared (all outputs together)."""
        return sum(o.incomparable for o in self.outputs.values())

    @property
    def latency_ratio(self) -> float | None:
        """The new engine's total run time over the previous one's."""
        return self.new_s / self.old_s if self.old_s > 0 and self.compared else None

    @property
    def p99_ratio(self) -> float | None:
        """The new engine's p99 run time over the previous one's (None: no runs)."""
        new, old = percentile(self.new_hist, 0.99), percentile(self.old_hist, 0.99)
        return new / old if new is not None and old else None

    def text(self) -> str:
        """The figures in one line: ``agreement 99.2% over 1,234 compared requests
        on 3 devices, drift 0.4%, p99 1.05x``."""
        head = f"{self.compared:,} compared requests"
        if self.devices > 1:
            head += f" on {self.devices:,} devices"
        if self.agreement is not None:
            head = f"agreement {_share(self.agreement)} over {head}"
        parts = [head]
        if self.drift is not None:
            parts.append(f"drift {_share(self.drift)}")
        if self.p99_ratio is not None:
            parts.append(f"p99 {self.p99_ratio:.2f}x")
        if self.incomparable:
            parts.append(f"{self.incomparable:,} answers not comparable")
        return ", ".join(parts)

    def figures(self) -> dict[str, object]:
        """The figures, for JSON views (``/status``, ``fleet status --json``)."""
        return {
            "version": self.version, "against": self.against, "compared": self.compared,
            "dropped": self.dropped, "devices": self.devices, "agreement": self.agreement,
            "drift": self.drift, "latency_ratio": self.latency_ratio,
            "p99_ratio": self.p99_ratio, "open": self.open,
            "outputs": {n: o.summary() for n, o in sorted(self.outputs.items())},
        }  # fmt: skip


def _share(value: float) -> str:
    """``0.807`` -> ``80.7%``; near 100 % with the digits that tell it from 100 %."""
    text = f"{value * 100:.3g}%"
    if text == "100%" and value != 1:
        digits = 2
        while f"{value * 100:.{digits}f}" == "100." + "0" * digits and digits < 6:
            digits += 1
        text = f"{value * 100:.{digits}f}%"
    return text


def _merged(histograms: Iterable[list[list[int]]]) -> list[list[int]]:
    found: dict[int, int] = {}
    for histogram in histograms:
        for index, count in histogram:
            found[index] = min(found.get(index, 0) + count, MAX_COUNT)
    return [[index, count] for index, count in sorted(found.items())]


def combine(parts: Iterable[Agreement]) -> Agreement | None:
    """The sums of several comparisons of one version against one other (devices'
    reports); None when given none.

    Raises:
        ValueError: they compare different versions.
    """
    parts = list(parts)
    if not parts:
        return None
    pairs = {(p.version, p.against) for p in parts}
    if len(pairs) > 1:
        raise ValueError(f"comparisons of different versions: {sorted(pairs)}")
    outputs: dict[str, OutputSums] = {}
    for part in parts:
        for name, sums in part.outputs.items():
            outputs[name] = outputs[name].plus(sums) if name in outputs else sums
    first = parts[0]
    return Agreement(
        version=first.version, against=first.against,
        compared=min(sum(p.compared for p in parts), MAX_COUNT),
        dropped=min(sum(p.dropped for p in parts), MAX_COUNT),
        devices=min(sum(p.devices for p in parts), MAX_COUNT),
        new_s=min(sum(p.new_s for p in parts), MAX_SUM),
        old_s=min(sum(p.old_s for p in parts), MAX_SUM),
        new_hist=_merged(p.new_hist for p in parts),
        old_hist=_merged(p.old_hist for p in parts),
        outputs=dict(sorted(outputs.items())[:MAX_OUTPUTS]),
        open=any(p.open for p in parts),
    )  # fmt: skip
