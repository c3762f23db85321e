"""ECDSA P-256 keys for the TUF roles and OMS bundles (stable API).

Keys are PEM files: ``<role>.key`` (PKCS#8, 0600, optionally encrypted) and
``<role>.pub`` (SubjectPublicKeyInfo).  CI passes private keys as secrets: an
environment variable holds either the PEM itself or a path to it, and an optional
``<VAR>_PASSPHRASE`` variable unlocks it.  Key ids are TUF's: the SHA-256 of the
canonical JSON form of the public key, as computed by securesystemslib, so the same id
appears in our metadata and in any TUF tool.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from securesystemslib.signer import CryptoSigner, SSlibKey

from registry.atomic import write_atomic
from registry.redact import decodes_to_pem
from signing.errors import KeyMaterialError

__all__ = [
    "PEM_HEADER",
    "ROLES",
    "SCHEME",
    "KeyFiles",
    "env_var",
    "generate",
    "key_value_kind",
    "load_private_key",
    "load_public_key",
    "private_key_from_env",
    "private_pem",
    "public_key_of",
    "public_pem",
    "signer_from_env",
    "write_keypair",
]

ROLES: Final = ("root", "targets", "snapshot", "timestamp")
SCHEME: Final = "ecdsa-sha2-nistp256"
PEM_HEADER: Final = "-----BEGIN"
# Linux's limits on a path and on one of its names: a longer value is no path, and
# asking the OS about it fails with ENAMETOOLONG, an error that carries the value.
_PATH_MAX: Final = 4096
_NAME_MAX: Final = 255


def env_var(role: str) -> str:
    """Name of the environment variable that holds ``role``'s private key (or its path)."""
    return f"MODELREG_{role.upper()}_KEY"


@dataclass(frozen=True)
class KeyFiles:
    """Where ``write_keypair`` put a key pair."""

    role: str
    private: Path
    public: Path
    keyid: str


def generate() -> ec.EllipticCurvePrivateKey:
    """A new ECDSA P-256 private key."""
    return ec.generate_private_key(ec.SECP256R1())


def public_key_of(private: ec.EllipticCurvePrivateKey) -> SSlibKey:
    """The TUF public key (with its key id) of a private key."""
    return SSlibKey.from_crypto(private.public_key(), scheme=SCHEME)


def private_pem(private: ec.EllipticCurvePrivateKey, passphrase: bytes | None = None) -> bytes:
    """PKCS#8 PEM of ``private``, encrypted when a passphrase is given."""
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase)
        if passphrase
        else serialization.NoEncryption()
    )
    return private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def public_pem(private: ec.EllipticCurvePrivateKey) -> bytes:
    """SubjectPublicKeyInfo PEM of the public half of ``private``."""
    return private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def write_keypair(out_dir: Path, role: str, passphrase: bytes | None = None) -> KeyFiles:
    """Generate a key pair for ``role`` into ``out_dir`` (private key mode 0600).

    Raises:
        KeyMaterialError: a key for ``role`` already exists there (never overwritten).
        OSError: the folder is not writable.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    private_path, public_path = out_dir / f"{role}.key", out_dir / f"{role}.pub"
    for path in (private_path, public_path):
        if path.exists():
            raise KeyMaterialError(f"{path}: already exists; refusing to overwrite a key")
    key = generate()
    write_atomic(private_path, private_pem(key, passphrase), mode=0o600)
    write_atomic(public_path, public_pem(key), mode=0o644)
    return KeyFiles(role, private_path, public_path, public_key_of(key).keyid)


def _load_private(data: bytes, origin: str, passphrase: bytes | None) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(data, password=passphrase)
    except TypeError:
        # cryptography raises TypeError both for "encrypted, no password" and the reverse
        hint = (
            "needs a passphrase" if passphrase is None else "is not encrypted; drop the passphrase"
        )
        raise KeyMaterialError(f"{origin}: private key {hint}") from None
    except (ValueError, UnsupportedAlgorithm):
        raise KeyMaterialError(
            f"{origin}: not a PEM private key, or the passphrase is wrong"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise KeyMaterialError(f"{origin}: expected an ECDSA P-256 key")
    return key


def key_value_kind(var: str, value: str) -> Literal["pem", "path"]:
    """Whether the value of the key variable ``var`` is PEM or a path to a PEM file.

    A pure decision on the text: the OS is not asked, so no OS error can carry the
    value into a message.  Refusals name the variable, never the value (a secret).

    Raises:
        KeyMaterialError: the value is base64-encoded PEM (CI secrets must hold the PEM
            itself or a path), or is neither PEM nor something that can be a path.
    """
    if value.lstrip().startswith(PEM_HEADER):
        return "pem"
    if decodes_to_pem(value):
        raise KeyMaterialError(
            f"${var}: holds base64-encoded PEM; store the PEM itself (or a path to it) "
            "in the secret"
        )
    parts = value.split("/")
    if (
        not value.strip()
        or len(value) >= _PATH_MAX
        or any(ch in value for ch in "\0\n\r")
        or any(len(part.encode("utf-8", "surrogateescape")) > _NAME_MAX for part in parts)
    ):
        raise KeyMaterialError(f"${var}: neither a PEM private key nor a path to a key file")
    return "path"


def _read_key_file(var: str, value: str) -> bytes:
    # The path is part of the secret's value: OS errors (which carry it) are dropped.
    unreadable = KeyMaterialError(f"${var}: neither a PEM private key nor a readable key file")
    path = Path(value)
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise unreadable
        return path.read_bytes()
    except OSError:
        raise unreadable from None


def load_private_key(
    source: str | Path, passphrase: bytes | None = None
) -> ec.EllipticCurvePrivateKey:
    """Load an ECDSA P-256 private key from a PEM file.

    Raises:
        KeyMaterialError: unreadable, malformed, not P-256, or the passphrase is wrong.
    """
    path = Path(source)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise KeyMaterialError(f"{path}: cannot read private key ({e.strerror or e})") from None
    return _load_private(data, str(path), passphrase)


def signer_from_env(
    role: str, env: Mapping[str, str] | None = None, key_dir: Path | None = None
) -> CryptoSigner:
    """The signer for ``role``: from ``MODELREG_<ROLE>_KEY`` or ``key_dir/<role>.key``.

    See :func:`private_key_from_env` for where the key is looked up.

    Raises:
        KeyMaterialError: no key configured, or it cannot be loaded.
    """
    key = private_key_from_env(role, env, key_dir)
    return CryptoSigner(key, public_key_of(key))


def private_key_from_env(
    role: str, env: Mapping[str, str] | None = None, key_dir: Path | None = None
) -> ec.EllipticCurvePrivateKey:
    """The private key for ``role``: from ``MODELREG_<ROLE>_KEY`` or ``key_dir/<role>.key``.

    The variable holds the PEM itself (how CI secrets usually arrive) or a path to it
    (:func:`key_value_kind` decides which); ``MODELREG_<ROLE>_KEY_PASSPHRASE`` unlocks
    an encrypted key.  Neither the value nor the key material is ever logged or
    included in error messages.

    Raises:
        KeyMaterialError: no key configured, it is base64-encoded, or it cannot be loaded.
    """
    env = os.environ if env is None else env
    var = env_var(role)
    value = env.get(var, "")
    secret = env.get(f"{var}_PASSPHRASE")
    passphrase = secret.encode() if secret else None
    if value:
        kind = key_value_kind(var, value)
        data = value.encode() if kind == "pem" else _read_key_file(var, value)
        key = _load_private(data, f"${var}", passphrase)
    elif key_dir is not None and (key_dir / f"{role}.key").is_file():
        key = load_private_key(key_dir / f"{role}.key", passphrase)
    else:
        where = f" or {key_dir / f'{role}.key'}" if key_dir is not None else ""
        raise KeyMaterialError(f"no {role} key: set ${var} (PEM or path){where}")
    return key


def load_public_key(source: str | Path) -> SSlibKey:
    """Load an ECDSA P-256 public key (PEM) as a TUF key.

    Raises:
        KeyMaterialError: unreadable, malformed or not P-256.
    """
    path = Path(source)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise KeyMaterialError(f"{path}: cannot read public key ({e.strerror or e})") from None
    try:
        public = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise KeyMaterialError(f"{path}: not a PEM public key") from None
    if not isinstance(public, ec.EllipticCurvePublicKey) or not isinstance(
        public.curve, ec.SECP256R1
    ):
        raise KeyMaterialError(f"{path}: expected an ECDSA P-256 public key")
    return SSlibKey.from_crypto(public, scheme=SCHEME)
