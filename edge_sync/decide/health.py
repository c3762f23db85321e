"""The health gate after a swap (docs/reference/daemon.md): the new version's error rate and
latency, over a window, against the version it replaced.

Two parts, apart as in python-tuf: :class:`Recorder` counts what the server answered
(thread-safe, bounded memory), and :func:`judge` decides from two windows of those
counts with no I/O and no clock of its own.  The daemon holds the previous engine
loaded while a gate is open, so a failing version is swapped back in one reference
assignment, under load, without a failed request.

A request the client got wrong (4xx) says nothing about a version; a server error
(5xx: the engine failed on valid input) counts against it.

No client can fail a gate by what it asks: latency is compared like with like
(:func:`compare_latency`).  A request's latency is the engine's run, not the time the
client took to send it, and it is compared only with the previous version's answers to
requests of the same size class (its decoded input elements, within a factor of
:data:`SIZE_CLASS`): 25 huge requests sent right after the swap (``x-model-version``
tells a client when it happened) have no counterpart before it and are left out, so the
mix of sizes a client chooses moves nothing.  The statistic is the median of each
compared answer's latency over the median of its size class before the swap, with at
least ``min_requests`` answers compared on each side (below that the latency is not
judged; a p99 of a few dozen samples is their maximum).

The verdicts, in order:

======================================  =================================================
what the window shows                   verdict
======================================  =================================================
error rate over the bound, with         ``fail`` at once (errors need no window)
``min_requests`` answered (or
:data:`MIN_ERRORS` errors at its end)
window not over, or too few requests    ``wait`` (a window is extended up to
and under :data:`MAX_EXTENSION` windows  :data:`MAX_EXTENSION` times its length)
too few requests after the extension    ``pass``, "not judged" (no traffic blames
                                        nothing: the version stands)
too few comparable answers, the         ``wait`` (same extension), then ``pass`` with
baseline has enough                     "latency not compared"
median latency ratio over the bound     ``retry`` the first time (a new window: one
                                        busy window is no verdict), then ``fail``
the shadow comparison's figures past    ``fail`` as soon as ``min_compared`` requests
its thresholds (opt-in:                 were compared (``edge_sync.decide.shadow``)
``edge_sync.decide.shadow.check``)
too few requests compared               ``wait`` (same extension), then ``pass``, "not
                                        judged on its answers"
otherwise                               ``pass``
======================================  =================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Final, Literal

__all__ = [
    "BASELINE_WINDOWS",
    "GatePolicy",
    "Latency",
    "Verdict",
    "Window",
    "compare_latency",
    "judge",
]

MIN_ERRORS: Final = 3
"""Server errors that fail a window that ended with fewer requests than it needs."""
MAX_EXTENSION: Final = 4
"""A window with too few requests waits for more, up to this many times its length."""
BASELINE_WINDOWS: Final = 10
"""The previous version's baseline: its answers in this many windows before the swap."""
SIZE_CLASS: Final = math.sqrt(2)
"""Requests whose sizes differ by at most this factor are compared with each other: a
client that picks sizes within a class moves a latency by at most this much (the run
of an ONNX model grows at most linearly with its input), under any gate's bound."""
MIN_CLASS_SAMPLES: Final = 5
"""Baseline answers a size class needs before its median is a reference."""


@dataclass(frozen=True)
class GatePolicy:
    """When a new version fails its gate.

    Attributes:
        window_s: how long a new version is watched after its swap (0: no gate).
        min_requests: requests the new version must answer before it is judged; a
            window that ends with fewer is extended (up to :data:`MAX_EXTENSION` times
            its length), then passes as "not judged", unless :data:`MIN_ERRORS` server
            errors already put it over ``max_error_rate``.  Also the fewest answers
            whose latency is compared, on each side.
        max_error_rate: the most server errors per request the new version may make
            (judged as soon as ``min_requests`` were answered: errors need no window).
        max_latency_ratio: its median latency over the previous version's, request
            size for request size, at most (twice over: see :func:`judge`).
    """

    window_s: float = 30.0
    min_requests: int = 20
    max_error_rate: float = 0.05
    max_latency_ratio: float = 2.0


@dataclass(frozen=True)
class Window:
    """What one version answered in a window: requests, server errors, and the
    (input elements, seconds) of each answer whose size is known."""

    requests: int
    errors: int
    latencies: tuple[tuple[int, float], ...] = ()

    @property
    def error_rate(self) -> float:
        """Server errors per request (0 with no requests)."""
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class Latency:
    """The evidence of a latency comparison (:func:`compare_latency`).

    Attributes:
        new: answers of the new version compared (in a size class the baseline holds).
        before: baseline answers in those size classes.
        new_median_s: the median latency of the new answers compared.
        before_median_s: the median latency of the baseline answers compared.
        ratio: the median, over the new answers compared, of each one's latency over
            its size class's baseline median (None: too few on a side).
        sizes: the smallest and largest input elements compared.
        seen: the new version's answers with a known size.
    """

    new: int
    before: int
    new_median_s: float | None
    before_median_s: float | None
    ratio: float | None
    sizes: tuple[int, int] | None
    seen: int

    def text(self) -> str:
        """The evidence as a reason says it."""
        if self.ratio is None or self.new_median_s is None or self.before_median_s is None:
            return (
                f"latency not compared: {self.new} of {self.seen} answers in a size class "
                f"the previous version answered ({self.before} baseline answers)"
            )
        low, high = self.sizes or (0, 0)
        return (
            f"median latency {self.ratio:.2f}x the previous version's, size for size "
            f"({self.new} answers, median {self.new_median_s * 1000:.2f} ms, against "
            f"{self.before} before, median {self.before_median_s * 1000:.2f} ms; "
            f"{low} to {high} input elements)"
        )


def _size_class(units: int) -> int:
    return -1 if units < 1 else math.floor(math.log(units, SIZE_CLASS) + 1e-9)


def compare_latency(new: Window, before: Window, min_samples: int) -> Latency:
    """Compare the new version's latencies with the baseline's, size class for size
    class (see the module doc); no I/O."""
    classes: dict[int, list[float]] = {}
    for units, seconds in before.latencies:
        classes.setdefault(_size_class(units), []).append(seconds)
    reference = {c: median(s) for c, s in classes.items() if len(s) >= MIN_CLASS_SAMPLES}
    compared = [(u, s) for u, s in new.latencies if _size_class(u) in reference]
    used = {_size_class(u) for u, _ in compared}
    baseline = [s for c in used for s in classes[c]]
    ratio = None
    if len(compared) >= min_samples and len(baseline) >= min_samples:
        ratio = median(s / max(reference[_size_class(u)], 1e-9) for u, s in compared)
    sizes = [u for u, _ in compared]
    return Latency(
        new=len(compared),
        before=len(baseline),
        new_median_s=median(s for _, s in compared) if compared else None,
        before_median_s=median(baseline) if baseline else None,
        ratio=ratio,
        sizes=(min(sizes), max(sizes)) if sizes else None,
        seen=len(new.latencies),
    )


@dataclass(frozen=True)
class Verdict:
    """A gate's decision: ``pass`` (retire the previous version), ``fail`` (swap back;
    ``reason`` says why), ``retry`` (a latency-only failure in a first window: watch a
    new one) or ``wait``."""

    decision: Literal["pass", "fail", "retry", "wait"]
    reason: str = ""


def judge(
    policy: GatePolicy,
    new: Window,
    before: Window,
    elapsed_s: float,
    *,
    retried: bool = False,
    shadow: tuple[Literal["pass", "fail", "wait"], str] | None = None,
) -> Verdict:
    """Decide a gate from the new version's window and the previous version's window
    before the swap, ``elapsed_s`` after the window opened; ``retried``: this is the
    second window, after a latency failure; ``shadow``: what the comparison of its
    answers with the previous version's says (``edge_sync.decide.shadow.check``; see
    the module doc's table)."""
    ended = elapsed_s >= policy.window_s
    extended = elapsed_s >= policy.window_s * MAX_EXTENSION
    enough = new.requests >= policy.min_requests
    if new.error_rate > policy.max_error_rate and (enough or (ended and new.errors >= MIN_ERRORS)):
        return Verdict(
            "fail",
            f"health gate: {new.errors} of {new.requests} requests failed "
            f"({new.error_rate:.1%}, at most {policy.max_error_rate:.1%} allowed; the "
            f"previous version: {before.error_rate:.1%})",
        )
    if shadow is not None and shadow[0] == "fail":
        return Verdict("fail", shadow[1])
    if not ended or (not enough and not extended):
        return Verdict("wait")  # a window with too few requests is extended
    if not enough:
        return Verdict(
            "pass",
            f"health gate not judged: {new.requests} requests in {elapsed_s:.0f} s, fewer "
            f"than {policy.min_requests}",
        )
    latency = compare_latency(new, before, policy.min_requests)
    if latency.ratio is None and len(before.latencies) >= policy.min_requests and not extended:
        return Verdict("wait")  # answers of the baseline's sizes may come yet
    if latency.ratio is not None and latency.ratio > policy.max_latency_ratio:
        said = f"health gate: {latency.text()}, at most {policy.max_latency_ratio:g}x allowed"
        if not retried:
            return Verdict("retry", said)
        return Verdict("fail", f"{said}, in two windows in a row")
    if shadow is not None and shadow[0] == "wait" and not extended:
        return Verdict("wait")  # too few answers compared yet
    compared = f"; {shadow[1]}" if shadow is not None and shadow[1] else ""
    if shadow is not None and shadow[0] == "wait":
        compared = f"; not judged on its answers: {shadow[1].removeprefix('answers ')}"
    return Verdict(
        "pass",
        f"health gate passed: {new.requests} requests, {new.errors} failed, "
        f"{latency.text()}{compared}",
    )
