"""Exception tree of the ``signing`` package (stable API).

::

    registry.RegistryError
    └── SigningError                 anything the trust layer refuses or cannot do
        ├── KeyMaterialError         a key is missing, malformed, of the wrong type, or locked
        ├── VerificationError        data is untrusted: every check failure is one of these
        │   ├── SignatureError       a signature does not verify / wrong key / below threshold
        │   │   ├── StaleKeyError    signed only by keys the newest root no longer trusts
        │   │   └── ForeignRootError the repository's first root is not the device's anchor
        │   ├── DigestMismatchError  bytes differ from their signed digest or length
        │   ├── FileSetError         files missing from, or extra to, what was signed
        │   ├── RollbackError        a version older than one already trusted
        │   ├── HistoryError         released metadata or a released target rewritten
        │   ├── ExpiredError         signed metadata past its expiry (freeze attack)
        │   └── TargetMismatchError  a signed file that belongs to another model/target
        └── TrustFetchError          metadata or targets could not be fetched (transport)

Each error carries the path or role it concerns where there is one.
"""

from __future__ import annotations

from registry.errors import RegistryError

__all__ = [
    "DigestMismatchError",
    "ExpiredError",
    "FileSetError",
    "ForeignRootError",
    "HistoryError",
    "KeyMaterialError",
    "RollbackError",
    "SignatureError",
    "SigningError",
    "StaleKeyError",
    "TargetMismatchError",
    "TrustFetchError",
    "VerificationError",
]


class SigningError(RegistryError):
    """Base of the trust layer's errors."""


class KeyMaterialError(SigningError):
    """A key could not be loaded or used (missing, malformed, wrong type, bad passphrase)."""


class VerificationError(SigningError):
    """Data failed verification and must not be trusted.

    Attributes:
        subject: the file, role or target the failure concerns.
    """

    def __init__(self, message: str, subject: str = "") -> None:
        self.subject = subject
        super().__init__(f"{subject}: {message}" if subject else message)


class SignatureError(VerificationError):
    """No valid signature (or fewer than the threshold) from a trusted key."""


class StaleKeyError(SignatureError):
    """Signed by a role's keys of an older root that the newest root no longer trusts.

    Such metadata was written with rotated or revoked keys (by an interrupted
    rotation, or by whoever holds the old keys); it is never loaded, extended or
    re-signed.
    """


class ForeignRootError(SignatureError):
    """The repository's metadata does not chain to the device's anchor because the
    repository's first root is another one, with none of the anchor's root keys: the
    device was provisioned with another repository's root (or the repository was
    created again).  Nothing from the repository is trusted."""


class DigestMismatchError(VerificationError):
    """Bytes differ from their signed digest or length."""


class FileSetError(VerificationError):
    """The set of files differs from the signed set (missing or extra files)."""


class RollbackError(VerificationError):
    """A version lower than one already trusted was offered."""


class HistoryError(VerificationError):
    """Released history rewritten: a root, a role version or a released target that
    differs from the one already released, or a versioned metadata file that would be
    replaced."""


class ExpiredError(VerificationError):
    """Signed metadata is past its expiry date."""


class TargetMismatchError(VerificationError):
    """A correctly signed file that belongs to another model, version or target."""


class TrustFetchError(SigningError):
    """Metadata or a target could not be fetched (transport or environment problem)."""
