"""Signed device reports (issue 28, point 3): the envelope, the device's key, the
enrolled keys as untrusted files, and the decision on each report as a table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from edge_sync.state.device_key import DeviceKey
from signing.device_reports import (
    Seen,
    open_envelope,
    public_key_from_pem,
    read_enrolled,
    seal_report,
    standing,
    verify_report,
)
from signing.errors import KeyMaterialError, SignatureError, VerificationError

PAYLOAD = b'{"device": "cam-1"}'


def _pem(key: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@pytest.mark.parametrize(
    "make", [ed25519.Ed25519PrivateKey.generate, lambda: ec.generate_private_key(ec.SECP256R1())],
    ids=["ed25519", "p256"],
)  # fmt: skip
def test_a_sealed_report_verifies_with_its_key_only(make: object) -> None:
    key = make()  # type: ignore[operator]
    doc = json.loads(seal_report(PAYLOAD, key))
    assert open_envelope(doc, "r") == PAYLOAD
    assert verify_report(doc, public_key_from_pem(_pem(key), "k"), "r") == PAYLOAD
    other = ed25519.Ed25519PrivateKey.generate().public_key()
    with pytest.raises(SignatureError, match="does not verify"):
        verify_report(doc, other, "r")
    tampered = dict(doc, payload=doc["payload"][:-4] + "AAA=")
    with pytest.raises(SignatureError):
        verify_report(tampered, key.public_key(), "r")
    with pytest.raises(VerificationError, match="not a device report envelope"):
        open_envelope(dict(doc, payloadType="application/vnd.in-toto+json"), "r")


def test_only_device_keys_are_enrolled() -> None:
    rsa_like = b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"
    with pytest.raises(KeyMaterialError, match="not a PEM public key"):
        public_key_from_pem(rsa_like, "k")
    p384 = ec.generate_private_key(ec.SECP384R1())
    with pytest.raises(KeyMaterialError, match="Ed25519 or ECDSA P-256"):
        public_key_from_pem(_pem(p384), "k")
    with pytest.raises(KeyMaterialError, match="not a public key"):
        public_key_from_pem(b"x" * 5000, "k")


def test_the_enrolled_keys_are_read_as_untrusted_files(tmp_path: Path) -> None:
    folder = tmp_path / "devices"
    folder.mkdir()
    good = ed25519.Ed25519PrivateKey.generate()
    (folder / "cam-1.pub").write_bytes(_pem(good))
    (folder / "cam-2.pub").write_text("not a key")
    (folder / "..hidden.pub").write_bytes(_pem(good))
    (folder / "README.md").write_text("one file per device")
    secret = tmp_path / "secret.key"
    secret.write_text("a private key")
    (folder / "cam-3.pub").symlink_to(secret)
    found = read_enrolled(folder)
    assert list(found.keys) == ["cam-1"]
    reasons = dict(found.problems)
    assert reasons["cam-2.pub"] == "not a PEM public key"
    assert reasons["..hidden.pub"] == "the name is not <device-id>.pub"
    assert "link" in reasons["cam-3.pub"]
    with pytest.raises(FileNotFoundError):
        read_enrolled(tmp_path / "nowhere")


SEEN = Seen(5, "d" * 64)
COUNTS = {"signed": True, "enrolled": True, "verified": True, "sequence": 6, "digest": "e" * 64,
          "seen": SEEN}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({}, None),
        ({"seen": None}, None),  # the first report seen from it
        ({"sequence": 5, "digest": "d" * 64}, None),  # the same report, read again
        ({"signed": False}, "not signed"),
        ({"enrolled": False}, "device 'cam-1' is not enrolled"),
        ({"verified": False}, "the signature does not verify with the key enrolled for 'cam-1'"),
        ({"sequence": None}, "no sequence number"),
        ({"sequence": 4}, "replayed: sequence 4, older than 5"),
        ({"sequence": 5}, "replayed: sequence 5 was seen from 'cam-1' with other content"),
    ],
)  # fmt: skip
def test_which_reports_count(change: dict[str, object], reason: str | None) -> None:
    found = standing(device="cam-1", **(COUNTS | change))  # type: ignore[arg-type]
    if reason is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith(reason)


def test_the_device_key_is_made_once_private_and_numbers_its_reports(tmp_path: Path) -> None:
    state = tmp_path / "state"
    key = DeviceKey.load_or_create(state)
    assert (state / "device.key").stat().st_mode & 0o777 == 0o600
    assert (state / "device.pub").read_bytes() == key.public_pem()
    again = DeviceKey.load_or_create(state)
    assert again.public_pem() == key.public_pem()  # never made twice
    assert [key.next_sequence() for _ in range(3)] == [1, 2, 3]
    assert DeviceKey.load_or_create(state).next_sequence() == 4  # kept across restarts
    doc = json.loads(key.seal(PAYLOAD))
    assert verify_report(doc, public_key_from_pem(key.public_pem(), "k"), "r") == PAYLOAD
    (state / "device.key").chmod(0o644)
    with pytest.raises(KeyMaterialError, match="readable by others"):
        DeviceKey.load_or_create(state)
    (state / "device.key").chmod(0o600)
    (state / "device.key").write_text("garbage")
    with pytest.raises(KeyMaterialError, match="not a PEM private key"):
        DeviceKey.load_or_create(state)


def test_a_large_signed_report_is_read_as_one() -> None:
    """An envelope whose payload is long (eight rejections with long reasons) is still
    recognized and read, wherever its fields fall in the document."""
    from fleet.reports import read_entry
    from tests.fleet_reports import NOW, model, report, stamp

    rejected = [{"version": "1.2.0", "sha256": "2" * 64, "reason": "x" * 500, "at": stamp(NOW)}] * 8
    doc = report("cam-1", {"mlp": model("1.0.0", rejected=rejected)}, format=3, sequence=9)
    sealed = seal_report(json.dumps(doc).encode(), ed25519.Ed25519PrivateKey.generate())
    assert len(sealed) > 5000
    assert sealed.startswith(b'{"payloadType":')
    found = read_entry("cam-1.json", sealed)
    assert (found.device, found.sequence, len(found.models["mlp"].rejected)) == ("cam-1", 9, 8)


def test_verifying_leaves_the_envelope_as_it_was_read() -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    doc = json.loads(seal_report(PAYLOAD, key))
    before = json.dumps(doc, sort_keys=True)
    for _ in range(2):  # the same envelope checked twice (a second reader) verifies twice
        assert verify_report(doc, key.public_key(), "r") == PAYLOAD
    assert json.dumps(doc, sort_keys=True) == before


def test_an_envelope_may_not_make_the_reader_verify_hundreds_of_signatures(tmp_path: Path) -> None:
    """A sink writer copies the device's (public) key id onto hundreds of signatures: the
    reader refuses the report before it verifies any of them."""
    import time

    from fleet.reports import load_reports
    from fleet.trust import ReportTrust
    from signing.device_reports import Enrolled
    from tests.fleet_reports import model, report

    key = ed25519.Ed25519PrivateKey.generate()
    doc = report("cam-1", {"mlp": model("1.0.0")}, format=3, sequence=1)
    envelope = json.loads(seal_report(json.dumps(doc).encode(), key))
    envelope["signatures"] = envelope["signatures"] * 400  # what fits under the size cap
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "cam-1.json").write_text(json.dumps(envelope))
    trust = ReportTrust(Enrolled({"cam-1": key.public_key()}))
    start = time.perf_counter()
    loaded = load_reports(str(folder), trust=trust)
    assert loaded.reports == []
    assert loaded.unreadable[0].reason == "a report envelope carries 1 to 4 signatures"
    assert time.perf_counter() - start < 5
    with pytest.raises(VerificationError, match="1 to 4 signatures"):
        open_envelope(dict(envelope, signatures=[]), "r")
