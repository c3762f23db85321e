"""The device's own key, and the sequence of the reports it signs (``signing.device_reports``).

The key is made on the device, the first time the daemon starts (or ``modelreg edge
key`` asks for it), as ``device.key`` in the state dir: Ed25519, PKCS#8 PEM, mode 0600,
created exclusively (two processes racing make one key), never printed, never sent.
Its public half (``device.pub``) is what the fleet enrolls.  A key file that is not a
private key of this kind, or readable by others, is refused with one line: the daemon
does not sign with a key someone else may have read.

``report.seq`` holds the sequence number of the last report signed; the next is one
more, written (and synced) before the report leaves, so that a crash can never send two
reports with one number.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Final

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from registry.atomic import write_atomic
from signing.device_reports import seal_report
from signing.errors import KeyMaterialError

__all__ = ["KEY_FILE", "PUBLIC_FILE", "SEQUENCE_FILE", "DeviceKey"]

KEY_FILE: Final = "device.key"
PUBLIC_FILE: Final = "device.pub"
SEQUENCE_FILE: Final = "report.seq"
_MAX_KEY_BYTES: Final = 4096


class DeviceKey:
    """The device's signing key in ``state_dir`` (see the module doc)."""

    def __init__(self, state_dir: Path, key: ed25519.Ed25519PrivateKey) -> None:
        self.state_dir = state_dir
        self._key = key

    @classmethod
    def load_or_create(cls, state_dir: Path) -> DeviceKey:
        """The device's key, made now if it has none.

        Raises:
            KeyMaterialError: the key file is not an Ed25519 private key, or others
                may read it (group or world permissions).
            OSError: the state dir cannot be written.
        """
        path = state_dir / KEY_FILE
        state_dir.mkdir(parents=True, exist_ok=True)
        key = ed25519.Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            found = cls._read(path)
        else:
            with os.fdopen(fd, "wb") as fh:
                fh.write(pem)
                fh.flush()
                os.fsync(fh.fileno())
            found = cls(state_dir, key)
        public = state_dir / PUBLIC_FILE
        if not public.is_file() or public.read_bytes() != found.public_pem():
            write_atomic(public, found.public_pem())
        return found

    @classmethod
    def _read(cls, path: Path) -> DeviceKey:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as e:
            raise KeyMaterialError(
                f"{path}: cannot read the device key ({e.strerror or e})"
            ) from None
        with os.fdopen(fd, "rb") as fh:
            info = os.fstat(fh.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise KeyMaterialError(f"{path}: the device key is not a regular file")
            if info.st_mode & 0o077:
                raise KeyMaterialError(
                    f"{path}: the device key is readable by others (mode "
                    f"{stat.S_IMODE(info.st_mode):o}); chmod 600 it, or remove it and "
                    "enroll the new key"
                )
            data = fh.read(_MAX_KEY_BYTES + 1)
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm):
            raise KeyMaterialError(f"{path}: not a PEM private key") from None
        if not isinstance(key, ed25519.Ed25519PrivateKey):
            raise KeyMaterialError(f"{path}: the device key is not Ed25519")
        return cls(path.parent, key)

    def public_pem(self) -> bytes:
        """The public key, PEM (what ``modelreg fleet enroll`` takes)."""
        return self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def next_sequence(self) -> int:
        """The next report's sequence number, recorded before it is used."""
        path = self.state_dir / SEQUENCE_FILE
        last = 0
        with contextlib.suppress(FileNotFoundError, ValueError):
            last = int(path.read_text(encoding="ascii").strip() or "0")
        write_atomic(path, f"{last + 1}\n".encode())
        return last + 1

    def seal(self, payload: bytes) -> bytes:
        """``payload`` (an encoded report) signed, in its envelope."""
        return seal_report(payload, self._key)
