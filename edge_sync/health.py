"""The health gate after a swap (SPEC section 7): the new version's error rate and
latency, over a window, against the version it replaced.

Two parts, apart as in python-tuf: :class:`Recorder` counts what the server answered
(thread-safe, bounded memory), and :func:`judge` decides from two windows of those
counts with no I/O and no clock of its own.  The daemon holds the previous engine
loaded while a gate is open, so a failing version is swapped back in one reference
assignment, under load, without a failed request.

A request the client got wrong (4xx) says nothing about a version; a server error
(5xx: the engine failed on valid input) counts against it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Final, Literal

__all__ = ["BASELINE_WINDOWS", "GatePolicy", "Recorder", "Verdict", "Window", "judge"]

_KEEP: Final = 4096
"""Samples kept per model version (the newest)."""
MIN_ERRORS: Final = 3
"""Server errors that fail a window that ended with fewer requests than it needs."""
MAX_EXTENSION: Final = 4
"""A window with too few requests waits for more, up to this many times its length."""
BASELINE_WINDOWS: Final = 10
"""The previous version's baseline: its answers in this many windows before the swap."""


@dataclass(frozen=True)
class GatePolicy:
    """When a new version fails its gate.

    Attributes:
        window_s: how long a new version is watched after its swap (0: no gate).
        min_requests: requests the new version must answer before it is judged; a
            window that ends with fewer is extended (up to :data:`MAX_EXTENSION` times
            its length), then passes as "not judged", unless :data:`MIN_ERRORS` server
            errors already put it over ``max_error_rate``.
        max_error_rate: the most server errors per request the new version may make
            (judged as soon as ``min_requests`` were answered: errors need no window).
        max_latency_ratio: its p99 over the previous version's, at most.
    """

    window_s: float = 30.0
    min_requests: int = 20
    max_error_rate: float = 0.05
    max_latency_ratio: float = 2.0


@dataclass(frozen=True)
class Window:
    """What one version answered in a window: requests, server errors, latencies."""

    requests: int
    errors: int
    p99_s: float | None

    @property
    def error_rate(self) -> float:
        """Server errors per request (0 with no requests)."""
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class Verdict:
    """A gate's decision: ``pass`` (retire the previous version), ``fail`` (swap back;
    ``reason`` says why) or ``wait``."""

    decision: Literal["pass", "fail", "wait"]
    reason: str = ""


def judge(policy: GatePolicy, new: Window, before: Window, elapsed_s: float) -> Verdict:
    """Decide a gate from the new version's window and the previous version's window
    before the swap, ``elapsed_s`` after the swap."""
    ended = elapsed_s >= policy.window_s
    enough = new.requests >= policy.min_requests
    if new.error_rate > policy.max_error_rate and (enough or (ended and new.errors >= MIN_ERRORS)):
        return Verdict(
            "fail",
            f"health gate: {new.errors} of {new.requests} requests failed "
            f"({new.error_rate:.1%}, at most {policy.max_error_rate:.1%} allowed; the "
            f"previous version: {before.error_rate:.1%})",
        )
    if not ended or (not enough and elapsed_s < policy.window_s * MAX_EXTENSION):
        return Verdict("wait")  # a window with too few requests is extended
    if (
        new.requests >= policy.min_requests
        and before.requests >= policy.min_requests
        and new.p99_s is not None
        and before.p99_s
        and new.p99_s > before.p99_s * policy.max_latency_ratio
    ):
        return Verdict(
            "fail",
            f"health gate: p99 latency {new.p99_s * 1000:.1f} ms over {new.requests} "
            f"requests, {new.p99_s / before.p99_s:.1f}x the previous version's "
            f"{before.p99_s * 1000:.1f} ms (at most {policy.max_latency_ratio:g}x allowed)",
        )
    if not enough:
        return Verdict(
            "pass",
            f"health gate not judged: {new.requests} requests in {elapsed_s:.0f} s, fewer "
            f"than {policy.min_requests}",
        )
    p99 = f"p99 {new.p99_s * 1000:.1f} ms" if new.p99_s is not None else "no latency"
    if before.requests < policy.min_requests or not before.p99_s:
        latency = f"{p99}, not compared: the previous version answered {before.requests}"
    else:
        latency = f"{p99} against the previous version's {before.p99_s * 1000:.1f} ms"
    return Verdict(
        "pass",
        f"health gate passed: {new.requests} requests, {new.errors} failed, {latency}",
    )


@dataclass
class Recorder:
    """The newest answers per model version: (monotonic time, server error, seconds)."""

    keep: int = _KEEP
    _samples: dict[tuple[str, str], deque[tuple[float, bool, float]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, model: str, version: str, *, error: bool, seconds: float) -> None:
        """Count one answer (client errors are not recorded: see the module doc)."""
        now = time.monotonic()
        with self._lock:
            samples = self._samples.get((model, version))
            if samples is None:
                samples = self._samples[(model, version)] = deque(maxlen=self.keep)
            samples.append((now, error, seconds))

    def window(self, model: str, version: str, since: float, until: float) -> Window:
        """What ``version`` answered between the monotonic times ``since`` and ``until``."""
        with self._lock:
            samples = [s for s in self._samples.get((model, version), ()) if since <= s[0] < until]
        errors = sum(1 for s in samples if s[1])
        latencies = sorted(s[2] for s in samples if not s[1])
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else None
        return Window(len(samples), errors, p99)

    def forget(self, model: str, version: str) -> None:
        """Drop a version's samples (it was released)."""
        with self._lock:
            self._samples.pop((model, version), None)
