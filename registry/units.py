"""Durations as people write them in YAML: ``500ms``, ``30s``, ``5m``, ``1h`` (stable API).

Shared by the manifests (a rollout wave's soak time) and the device's ``edge.yaml``
(poll intervals, back-off), so that both read ``1h`` the same way; pure functions.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_DURATION_S", "format_duration", "parse_duration"]

MAX_DURATION_S: Final = 10**9
"""The longest duration accepted, in seconds (about 31 years)."""

_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_EXPECTED: Final = "expected a duration such as 500ms, 30s, 5m or 1h"


def parse_duration(value: object) -> float:
    """Seconds from ``500ms``, ``30s``, ``5m``, ``1h`` or a number of seconds.

    Raises:
        ValueError: anything else, or a duration outside 0 .. 10^9 seconds.
    """
    if isinstance(value, bool):
        raise ValueError(_EXPECTED)  # noqa: TRY004 - pydantic reports ValueError
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(value) if isinstance(value, str) else None
        if match is None:
            raise ValueError(_EXPECTED)
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not 0 <= seconds < MAX_DURATION_S:
        raise ValueError("a duration is between 0 and 10^9 seconds")
    return seconds


def format_duration(seconds: float) -> str:
    """``seconds`` the way a person reads it: ``1h30m``, ``4m5s``, ``0s``, ``250ms``.

    Whole seconds are shown (a fraction only below one second); negative values are
    shown as ``0s``.
    """
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return "".join(parts) or "0s"
