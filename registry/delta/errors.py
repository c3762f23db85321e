"""Exceptions of :mod:`registry.delta` (stable API).

::

    registry.RegistryError
    └── DeltaError              a delta cannot be applied; nothing was written
        ├── CorruptDeltaError   malformed, truncated, over a limit, or wrong output
        └── BaseMismatchError   the base file is not the one the delta was made against
"""

from __future__ import annotations

from registry.errors import RegistryError

__all__ = ["BaseMismatchError", "CorruptDeltaError", "DeltaError"]


class DeltaError(RegistryError):
    """A delta cannot be applied; nothing was written to the output path."""


class CorruptDeltaError(DeltaError):
    """The delta is malformed, truncated, over a limit, or does not yield the expected file."""


class BaseMismatchError(DeltaError):
    """The base file is not the one the delta was made against.

    Attributes:
        expected_sha256: the base digest recorded in the delta.
        actual_sha256: the digest of the base given, or None when its length already differed.
    """

    def __init__(self, message: str, expected_sha256: str, actual_sha256: str | None) -> None:
        self.expected_sha256 = expected_sha256
        self.actual_sha256 = actual_sha256
        super().__init__(message)
