"""modelreg's own version: the one lookup every part reports (``modelreg --version``,
the device's ``/status`` and reports, the parse cache's key)."""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Final

__all__ = ["UNKNOWN_VERSION", "modelreg_version"]

UNKNOWN_VERSION: Final = "0.0.0+unknown"
"""What a source tree that was never installed reports."""


@cache
def modelreg_version() -> str:
    """The installed modelreg's version (:data:`UNKNOWN_VERSION` when it is not installed)."""
    try:
        return version("modelreg")
    except PackageNotFoundError:  # pragma: no cover - a source tree not installed
        return UNKNOWN_VERSION
