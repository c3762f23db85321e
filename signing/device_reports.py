"""Device reports signed by their device, and the fleet's judgement of them (stable API).

Anyone who can write to the report sink (a bucket, a folder) could otherwise write a
report for any device, and move a rollout wave within what the channel declares.  So,
as Uptane's ECUs sign their version manifests:

* each device holds a key of its own (Ed25519, created on the device, never leaving
  it: ``edge_sync.state.device_key``), and sends every report in a DSSE envelope
  (:func:`seal_report`, securesystemslib's) with a per-device ``sequence`` that only
  grows;
* the repository lists the public key of every enrolled device, one file per device
  (``devices/<device-id>.pub``, added and removed by reviewed pull requests:
  ``modelreg fleet enroll`` / ``fleet revoke``);
* the fleet's view (``fleet status``, ``fleet devices``, ``fleet advance``) counts only
  a report whose envelope verifies against its device's enrolled key and whose sequence
  is newer than the last one seen from that device (:func:`standing`, a decision
  without I/O); every other report is listed apart with the reason and moves nothing.

The envelope's keyid is securesystemslib's id of the device's public key; the device
id is the one inside the signed payload, which must also be the name it is stored
under (``fleet.reports``).
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from registry.errors import RegistryError, one_line
from signing.errors import KeyMaterialError, SignatureError, VerificationError

__all__ = [
    "KEY_SUFFIX",
    "MAX_KEY_BYTES",
    "MAX_SIGNATURES",
    "PAYLOAD_TYPE",
    "Enrolled",
    "Seen",
    "is_envelope",
    "open_envelope",
    "public_key_from_pem",
    "read_enrolled",
    "seal_report",
    "standing",
    "verify_report",
]

PAYLOAD_TYPE: Final = "application/vnd.modelreg.device-report+json"
MAX_KEY_BYTES: Final = 4096
"""Largest public key file read (a PEM key is a few hundred bytes)."""
MAX_SIGNATURES: Final = 4
"""Signatures a report envelope may carry (a device makes one)."""
KEY_SUFFIX: Final = ".pub"
"""An enrolled device's key file: ``<device-id>.pub`` in the repository's devices folder."""
MAX_DEVICES: Final = 1_000_000

PublicKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey


@dataclass(frozen=True)
class Enrolled:
    """The devices a repository enrolls.

    Attributes:
        keys: each enrolled device's public key, by device id.
        problems: key files that could not be used, each with why (one line).
    """

    keys: Mapping[str, PublicKey]
    problems: Sequence[tuple[str, str]] = ()


def read_enrolled(folder: Path) -> Enrolled:
    """The enrolled devices in ``folder`` (``<device-id>.pub`` files), read as untrusted
    input: regular files only (no link), each within :data:`MAX_KEY_BYTES`.

    Raises:
        FileNotFoundError: the folder does not exist (no device is enrolled: reports are
            not authenticated).
        OSError: it cannot be listed.
    """
    from registry.device_report import DEVICE_ID_RE
    from registry.safe_io import folder_reader

    device_id = re.compile(DEVICE_ID_RE)
    keys: dict[str, PublicKey] = {}
    problems: list[tuple[str, str]] = []
    with os.scandir(folder) as entries:
        names = sorted(e.name for e in entries if e.name.endswith(KEY_SUFFIX))[:MAX_DEVICES]
    with folder_reader(folder, max_bytes=MAX_KEY_BYTES) as read:
        for name in names:
            device = name.removesuffix(KEY_SUFFIX)
            if not device_id.match(device):
                problems.append((name, "the name is not <device-id>.pub"))
                continue
            try:
                keys[device] = public_key_from_pem(read(name), name)
            except KeyMaterialError as e:
                problems.append((name, str(e).removeprefix(f"{name}: ")))
            except (OSError, RegistryError) as e:
                problems.append((name, one_line(str(e))))
    return Enrolled(keys, problems)


def public_key_from_pem(
    data: bytes, what: str
) -> ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey:
    """A device's public key from its PEM (Ed25519, or ECDSA P-256 for a device whose
    secure element makes those).

    Raises:
        KeyMaterialError: not a PEM public key of either kind.
    """
    if len(data) > MAX_KEY_BYTES:
        raise KeyMaterialError(f"{what}: {len(data)} bytes, not a public key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise KeyMaterialError(f"{what}: not a PEM public key") from None
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return key
    raise KeyMaterialError(f"{what}: a device key is Ed25519 or ECDSA P-256")


def seal_report(
    payload: bytes, key: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey
) -> bytes:
    """``payload`` (an encoded report) in a DSSE envelope signed by ``key``, as JSON."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import CryptoSigner, SSlibKey

    envelope = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(CryptoSigner(key, SSlibKey.from_crypto(key.public_key())))
    doc = envelope.to_dict()
    # payloadType first: a reader (or a person) sees what it is before the payload
    ordered = {"payloadType": doc["payloadType"], **doc}
    return json.dumps(ordered, separators=(",", ":")).encode()


def is_envelope(doc: object) -> bool:
    """Whether a parsed JSON document is a report envelope (not a bare report)."""
    return isinstance(doc, dict) and "payloadType" in doc and "payload" in doc


def open_envelope(doc: object, subject: str) -> bytes:
    """The payload of a report envelope, unverified (to read which device it claims).

    Raises:
        VerificationError: not a report envelope.
    """
    if not isinstance(doc, dict) or doc.get("payloadType") != PAYLOAD_TYPE:
        raise VerificationError("not a device report envelope", subject)
    signatures = doc.get("signatures")
    if not isinstance(signatures, list) or not 1 <= len(signatures) <= MAX_SIGNATURES:
        # each signature under the device's key id costs a verification: a report may
        # not make the fleet's reader verify a thousand
        raise VerificationError(
            f"a report envelope carries 1 to {MAX_SIGNATURES} signatures", subject
        )
    try:
        return base64.b64decode(doc["payload"], validate=True)
    except (KeyError, TypeError, ValueError):
        raise VerificationError("the envelope's payload is not base64", subject) from None


def verify_report(doc: object, key: PublicKey, subject: str) -> bytes:
    """The payload of a report envelope signed by ``key``.

    Raises:
        SignatureError: no signature of the envelope verifies with ``key``.
        VerificationError: not a report envelope.
    """
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError as SslibVerificationError
    from securesystemslib.signer import Key, SSlibKey

    payload = open_envelope(doc, subject)
    keys: list[Key] = [SSlibKey.from_crypto(key)]
    assert isinstance(doc, dict)  # noqa: S101 - open_envelope checked it
    try:
        # from_dict rewrites the signatures it is given: a copy, so ``doc`` stays as read
        signatures = [dict(sig) for sig in doc.get("signatures", [])]
        Envelope.from_dict({**doc, "signatures": signatures}).verify(keys, 1)
    except (SslibVerificationError, ValueError, KeyError, TypeError):
        raise SignatureError(
            "the signature does not verify with the device's enrolled key", subject
        ) from None
    return payload


@dataclass(frozen=True)
class Seen:
    """The newest report the fleet counted from one device: its sequence, and the
    SHA-256 of its payload (the same report read again is not a replay)."""

    sequence: int
    digest: str


def standing(
    *,
    device: str,
    signed: bool,
    enrolled: bool,
    verified: bool,
    sequence: int | None,
    digest: str,
    seen: Seen | None,
) -> str | None:
    """Why a report does not count, or None when it does (no I/O).

    Args:
        device: the device the report is from (its payload's, and its name's).
        signed: whether it came in an envelope.
        enrolled: whether the repository lists the device's key.
        verified: whether the envelope verifies with that key.
        sequence: the report's sequence number (None: it has none).
        digest: the SHA-256 of its payload.
        seen: the newest report counted from the device before (None: none).
    """
    if not signed:
        return "not signed (a device signs its reports from report format 3 on: upgrade it)"
    if not enrolled:
        return (
            f"device {device!r} is not enrolled (modelreg fleet enroll {device} --public-key FILE)"
        )
    if not verified:
        return (
            f"the signature does not verify with the key enrolled for {device!r} (forged, or "
            "signed by another device)"
        )
    if sequence is None:
        return "no sequence number"
    if seen is not None:
        if sequence < seen.sequence:
            return (
                f"replayed: sequence {sequence}, older than {seen.sequence} already seen "
                f"from {device!r}"
            )
        if sequence == seen.sequence and digest != seen.digest:
            return f"replayed: sequence {sequence} was seen from {device!r} with other content"
    return None
