"""Every exception the device raises to its callers, in one tree (stable API).

::

    RegistryError                (registry.errors: one line, exit 1 at the CLI)
    ├── StateError               the state dir cannot be used (corrupt, foreign format)
    ├── LockedError              another daemon holds the state dir
    ├── StoppedError             the daemon is stopping: a sync ends at a stage boundary
    ├── SourceError              the metadata's source could not be reached or read
    │   ├── GitError             the git repository
    │   │   └── GitStoreError    the checkout's object store grew over its cap
    │   └── RemoteMetadataError  the metadata mirrored to the artifact remote
    ├── SendError                a report did not reach its sink
    └── EngineError              an engine could not be built from a verified file
        ├── SelfTestError        it built, but failed its self-test
        └── EngineClosedError    a run on an engine already released (a host bug)
    ValueError
    └── WeightError              a file whose weights cannot be split out (load it whole)
    Exception
    └── RefusedError             an inference request answered with an HTTP error status

Trust failures are ``signing.errors`` (``VerificationError`` and below), raised by
:mod:`edge_sync.sync.trust`.  A few exceptions stay private to the module that raises and
catches them (control flow, never seen by a caller).
"""

from __future__ import annotations

from registry.errors import RegistryError

__all__ = [
    "EngineClosedError",
    "EngineError",
    "GitError",
    "GitStoreError",
    "LockedError",
    "RefusedError",
    "RemoteMetadataError",
    "SelfTestError",
    "SendError",
    "SourceError",
    "StateError",
    "StoppedError",
    "WeightError",
]


class StateError(RegistryError):
    """The state dir cannot be used: a corrupt state file, a foreign format."""


class LockedError(RegistryError):
    """Another daemon holds the state dir."""


class StoppedError(RegistryError):
    """The daemon is stopping: the sync ends at a stage boundary (what was committed
    stays; a download in progress is kept and resumed at the next start)."""


class SourceError(RegistryError):
    """The signed metadata's source (git, or the artifact remote's mirror) could not be
    reached or read: a device-wide failure of the sync."""


class GitError(SourceError):
    """The repository could not be reached or read."""


class GitStoreError(GitError):
    """The checkout's object store grew over ``TrustLimits.git_store_max_bytes``."""


class RemoteMetadataError(SourceError):
    """The metadata mirrored to the artifact remote could not be reached or read."""


class SendError(RegistryError):
    """A report that did not reach its sink (refused, unreachable, too slow)."""


class EngineError(RegistryError):
    """An engine could not be built from a verified file (and another try would not
    change that: the version is rejected)."""


class SelfTestError(EngineError):
    """An engine built, but failed its self-test."""


class EngineClosedError(EngineError):
    """A run on an engine that was already released (a host bug: engines are released
    only when no request holds them)."""


class WeightError(ValueError):
    """The file is not an ONNX model whose weights can be split out (truncated or not
    protobuf); the caller loads it whole instead."""


class RefusedError(Exception):
    """A request the server answers with ``{"error": ...}`` and ``status``."""

    def __init__(
        self, status: int, message: str, version: str = "", *, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.version = version
        """The version whose engine refused it ("" when none was reached)."""
        self.retry_after = retry_after
        """Seconds the client should wait before it retries (a full server's 503)."""
