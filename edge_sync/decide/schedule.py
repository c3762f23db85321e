"""When the daemon looks again: the regular poll with jitter, and the backoff after
failed syncs (pure: the random source is passed in, no clock)."""

from __future__ import annotations

import random
from typing import Final

__all__ = ["FIRST_RETRY_S", "backoff_delay", "next_delay"]

FIRST_RETRY_S: Final = 5.0
"""The first retry after a failed sync waits at most this long."""


def next_delay(poll_s: float, jitter: float, rng: random.Random) -> float:
    """The wait before the next regular poll: ``poll_s * (1 +- jitter)``."""
    return float(poll_s * (1 + rng.uniform(-jitter, jitter)))


def backoff_delay(failures: int, poll_s: float, max_backoff_s: float) -> float:
    """The wait after ``failures`` failed syncs in a row (``failures >= 1``)."""
    first = min(poll_s, FIRST_RETRY_S)
    doubled = first * 2.0 ** min(failures - 1, 60)  # days offline must not overflow it
    return float(min(doubled, max(max_backoff_s, first)))
