"""Key generation and loading: files, CI secrets in the environment, passphrases."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from signing.errors import KeyMaterialError
from signing.keys import (
    key_value_kind,
    load_private_key,
    load_public_key,
    private_pem,
    public_key_of,
    signer_from_env,
    write_keypair,
)


def test_generate_writes_private_key_0600_and_stable_keyid(tmp_path: Path) -> None:
    files = write_keypair(tmp_path, "targets")
    assert stat.S_IMODE(files.private.stat().st_mode) == 0o600
    assert files.private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    public = load_public_key(files.public)
    assert public.keyid == files.keyid
    assert public.scheme == "ecdsa-sha2-nistp256"
    # the id is derived from the key, so it is the same however the key is loaded
    assert public_key_of(load_private_key(files.private)).keyid == files.keyid
    with pytest.raises(KeyMaterialError, match="refusing to overwrite"):
        write_keypair(tmp_path, "targets")


def test_signer_from_env_accepts_pem_or_path(tmp_path: Path) -> None:
    files = write_keypair(tmp_path, "snapshot")
    pem = files.private.read_text()
    by_value = signer_from_env("snapshot", {"MODELREG_SNAPSHOT_KEY": pem})
    by_path = signer_from_env("snapshot", {"MODELREG_SNAPSHOT_KEY": str(files.private)})
    from_dir = signer_from_env("snapshot", {}, key_dir=tmp_path)
    assert by_value.public_key.keyid == by_path.public_key.keyid == from_dir.public_key.keyid
    signature = by_value.sign(b"payload")
    by_value.public_key.verify_signature(signature, b"payload")


def test_encrypted_key_needs_its_passphrase(tmp_path: Path) -> None:
    files = write_keypair(tmp_path, "timestamp", passphrase=b"s3cret")
    env = {"MODELREG_TIMESTAMP_KEY": str(files.private)}
    with pytest.raises(KeyMaterialError, match="needs a passphrase"):
        signer_from_env("timestamp", env)
    with pytest.raises(KeyMaterialError, match="passphrase is wrong"):
        signer_from_env("timestamp", {**env, "MODELREG_TIMESTAMP_KEY_PASSPHRASE": "nope"})
    signer = signer_from_env("timestamp", {**env, "MODELREG_TIMESTAMP_KEY_PASSPHRASE": "s3cret"})
    assert signer.public_key.keyid == files.keyid


def test_secret_never_appears_in_errors(tmp_path: Path) -> None:
    broken = "-----BEGIN PRIVATE KEY-----\nTOPSECRETMATERIAL\n-----END PRIVATE KEY-----\n"
    with pytest.raises(KeyMaterialError) as info:
        signer_from_env("targets", {"MODELREG_TARGETS_KEY": broken})
    assert "TOPSECRET" not in str(info.value)
    assert "$MODELREG_TARGETS_KEY" in str(info.value)


def test_wrong_key_types_are_refused(tmp_path: Path) -> None:
    p384 = ec.generate_private_key(ec.SECP384R1())
    path = tmp_path / "p384.key"
    path.write_bytes(private_pem(p384))
    with pytest.raises(KeyMaterialError, match="expected an ECDSA P-256 key"):
        load_private_key(path)
    with pytest.raises(KeyMaterialError, match="no root key: set \\$MODELREG_ROOT_KEY"):
        signer_from_env("root", {})
    (tmp_path / "junk.pub").write_text("not a key")
    with pytest.raises(KeyMaterialError, match="not a PEM public key"):
        load_public_key(tmp_path / "junk.pub")


@pytest.mark.parametrize(
    "value",
    [
        "SUPERSECRETVALUE123",  # a relative path that does not exist
        "/nonexistent/SUPERSECRETVALUE123",
        "/",  # exists, not a file
    ],
)
def test_a_value_that_is_neither_pem_nor_a_file_is_not_echoed(value: str) -> None:
    with pytest.raises(KeyMaterialError) as info:
        signer_from_env("targets", {"MODELREG_TARGETS_KEY": value})
    assert str(info.value) == (
        "$MODELREG_TARGETS_KEY: neither a PEM private key nor a readable key file"
    )


@pytest.mark.parametrize(
    "value",
    [
        "S" * 300,  # one name longer than NAME_MAX: the OS would say ENAMETOOLONG
        "/tmp/" + "SUPERSECRET/" * 400,  # longer than PATH_MAX
        "SUPERSECRET\nVALUE",
        "SUPERSECRET\0VALUE",
        "   ",
    ],
)
def test_a_value_that_cannot_be_a_path_is_refused_without_asking_the_os(value: str) -> None:
    with pytest.raises(KeyMaterialError) as info:
        key_value_kind("MODELREG_TARGETS_KEY", value)
    assert (
        str(info.value)
        == "$MODELREG_TARGETS_KEY: neither a PEM private key nor a path to a key file"
    )
    with pytest.raises(KeyMaterialError) as again:
        signer_from_env("targets", {"MODELREG_TARGETS_KEY": value})
    assert str(again.value) == str(info.value)


@pytest.mark.parametrize("wrap", [False, True])
@pytest.mark.parametrize("alphabet", ["standard", "urlsafe"])
def test_a_base64_pem_in_the_variable_is_refused_by_name(
    tmp_path: Path, wrap: bool, alphabet: str
) -> None:
    # The reported attack: a base64 PEM (one line, ~320 characters) was taken for a
    # path, and the OS error "File name too long" printed it whole.
    pem = write_keypair(tmp_path, "timestamp").private.read_bytes()
    encode = base64.b64encode if alphabet == "standard" else base64.urlsafe_b64encode
    value = encode(pem).decode()
    if wrap:  # how `base64` wraps its output at 76 columns
        value = "\n".join(value[i : i + 76] for i in range(0, len(value), 76))
    assert key_value_kind("MODELREG_TIMESTAMP_KEY", pem.decode()) == "pem"
    with pytest.raises(KeyMaterialError) as info:
        signer_from_env("timestamp", {"MODELREG_TIMESTAMP_KEY": value})
    assert str(info.value) == (
        "$MODELREG_TIMESTAMP_KEY: holds base64-encoded PEM; store the PEM itself "
        "(or a path to it) in the secret"
    )
    assert value[:12] not in str(info.value)


def test_a_path_value_is_a_path_and_a_pem_value_is_pem(tmp_path: Path) -> None:
    assert key_value_kind("V", str(tmp_path / "timestamp.key")) == "path"
    assert key_value_kind("V", "relative/timestamp.key") == "path"
    assert key_value_kind("V", "\n  -----BEGIN PRIVATE KEY-----\n") == "pem"
