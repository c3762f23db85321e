"""The device's clock: the one place the device reads the time of day, so that a test
can move it (``monkeypatch.setattr(clock, "now", ...)`` moves every reader).

Intervals (gates, timeouts, backoff) use ``time.monotonic()`` instead; this clock is for
what is compared with signed expiries and written in records.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["now", "now_iso"]


def now() -> datetime:
    """The current UTC time."""
    return datetime.now(UTC)


def now_iso() -> str:
    """The current UTC time, ISO 8601 with microseconds and ``Z`` (as records keep it)."""
    return now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
