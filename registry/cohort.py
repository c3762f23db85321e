"""Rollout cohorts: which devices take a channel's version under ``rollout.percent``
(stable API).

Shared by the device, which decides for itself (``edge_sync.sync.updater``), and by
``modelreg fleet status``, which counts the devices of a cohort from their reports: the
two must draw the same line, so there is one function.  Pure, no I/O.
"""

from __future__ import annotations

import hashlib

__all__ = ["cohort_draw", "in_cohort"]


def in_cohort(device_id: str, model: str, version: str, percent: float | None) -> bool:
    """Whether a device takes ``version`` of ``model`` under a rollout of ``percent``.

    A stable hash of (device id, model, version) mapped to [0, 100): the same device
    gets the same answer across restarts and machines (no per-process salt), about
    ``percent`` of all devices are in, and a device in at 10 % stays in at 50 %.
    """
    if percent is None or percent >= 100:
        return True
    if percent <= 0:
        return False
    return cohort_draw(device_id, model, version) < percent


def cohort_draw(device_id: str, model: str, version: str) -> float:
    """The device's draw in [0, 100) for ``version`` of ``model``: it is in every
    rollout of a percent above it."""
    digest = hashlib.sha256(f"{device_id}\0{model}\0{version}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * 100
