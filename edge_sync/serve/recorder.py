"""What the inference server answered, per model version, for the health gate to judge
(:func:`edge_sync.decide.health.judge` reads :meth:`Recorder.window`).

Thread-safe and bounded: the newest answers only, a fixed number per version.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Final

from edge_sync.decide.health import Window

__all__ = ["Recorder"]

_KEEP: Final = 4096
"""Samples kept per model version (the newest)."""


@dataclass
class Recorder:
    """The newest answers per model version: (monotonic time, server error, seconds,
    input elements or None)."""

    keep: int = _KEEP
    _samples: dict[tuple[str, str], deque[tuple[float, bool, float, int | None]]] = field(
        default_factory=dict
    )
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(
        self, model: str, version: str, *, error: bool, seconds: float, units: int | None = None
    ) -> None:
        """Count one answer (client errors are not recorded: see the module doc).

        Args:
            model: the model name.
            version: the version that answered.
            error: whether it was a server error.
            seconds: how long the engine took (the latency the gate compares).
            units: the request's size, its decoded input elements (None: unknown; the
                answer then counts for the error rate only).
        """
        now = time.monotonic()
        with self._lock:
            samples = self._samples.get((model, version))
            if samples is None:
                samples = self._samples[(model, version)] = deque(maxlen=self.keep)
            samples.append((now, error, seconds, units))

    def window(self, model: str, version: str, since: float, until: float) -> Window:
        """What ``version`` answered between the monotonic times ``since`` and ``until``."""
        with self._lock:
            samples = [s for s in self._samples.get((model, version), ()) if since <= s[0] < until]
        errors = sum(1 for s in samples if s[1])
        latencies = tuple((s[3], s[2]) for s in samples if not s[1] and s[3] is not None)
        return Window(len(samples), errors, latencies)

    def forget(self, model: str, version: str) -> None:
        """Drop a version's samples (it was released)."""
        with self._lock:
            self._samples.pop((model, version), None)
