"""OMS bundles interoperate with the reference ``model_signing`` CLI (PyPI 1.1.1), both ways.

Every check runs the real CLI in a subprocess: ``model_signing sign key`` and
``model_signing verify key`` (its flags are ``--private_key``/``--public_key``, with
underscores).  The fixtures in ``tests/data/oms_fixtures`` (ours and the reference's
bundles for a file and a folder) must verify forever; ``MODELREG_REGEN_GOLDEN=1``
rebuilds them with a new key.  Our verifier's own refusals, which need no CLI, are in
``tests/unit/test_oms.py``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from modelreg.examples import model_bytes
from signing import keys, oms
from signing.errors import (
    DigestMismatchError,
    FileSetError,
    SignatureError,
    VerificationError,
)
from tests.conftest import REGEN_ENV
from tests.oms_helpers import (
    FACTS,
    Keys,
    add_file,
    flip_byte,
    make_model_dir,
    make_model_file,
    remove_file,
)

# model-signing is a dev dependency that `make test` installs: these tests always run.
pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "oms_fixtures"


def model_signing(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run the reference CLI (same interpreter, so the same installed version)."""
    return subprocess.run(
        [sys.executable, "-m", "model_signing", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def their_sign(model: Path, private: Path, bundle: Path) -> None:
    proc = model_signing("sign", "key", model, "--private_key", private, "--signature", bundle)
    assert proc.returncode == 0, proc.stderr


def their_verify(model: Path, bundle: Path, public: Path) -> subprocess.CompletedProcess[str]:
    return model_signing("verify", "key", model, "--signature", bundle, "--public_key", public)


def statement_of(bundle: Path) -> dict[str, Any]:
    payload = json.loads(bundle.read_bytes())["dsseEnvelope"]["payload"]
    statement: dict[str, Any] = json.loads(base64.b64decode(payload))
    return statement


@pytest.fixture(scope="module")
def key_pair(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys(tmp_path_factory.mktemp("keys"))


# -- (a) our bundles verify with model_signing ------------------------------------------


@pytest.mark.parametrize("kind", ["file", "dir", "dir-bundle-inside"])
def test_our_bundle_verifies_with_model_signing(
    kind: str, key_pair: Keys, tmp_path: Path, example_models: Path
) -> None:
    model = (
        make_model_file(tmp_path) if kind == "file" else make_model_dir(tmp_path, example_models)
    )
    bundle = model / "model.sig" if kind == "dir-bundle-inside" else tmp_path / "ours.sig"
    signed = oms.sign_model(model, key_pair.private, facts=FACTS, bundle_path=bundle)
    oms.write_bundle(signed, bundle)

    proc = their_verify(model, bundle, key_pair.public_pem)
    assert proc.returncode == 0, proc.stderr
    assert "Verification succeeded" in proc.stdout
    verified = oms.verify_model(model, bundle, key_pair.public_pem)
    assert verified.facts == FACTS
    assert verified.name == model.name


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_same_statement_as_model_signing(
    kind: str, key_pair: Keys, tmp_path: Path, example_models: Path
) -> None:
    """Field by field, our statement is theirs plus the facts field."""
    model = (
        make_model_file(tmp_path) if kind == "file" else make_model_dir(tmp_path, example_models)
    )
    their_sign(model, key_pair.private_pem, tmp_path / "theirs.sig")
    oms.write_bundle(oms.sign_model(model, key_pair.private, facts=FACTS), tmp_path / "ours.sig")

    ours, theirs = statement_of(tmp_path / "ours.sig"), statement_of(tmp_path / "theirs.sig")
    assert ours["predicate"].pop(oms.FACTS_FIELD) == FACTS.to_json()
    # The reference writes ignore_paths from a frozenset, in no fixed order.
    theirs["predicate"]["serialization"]["ignore_paths"].sort()
    assert ours == theirs
    ours_bundle = json.loads((tmp_path / "ours.sig").read_bytes())
    theirs_bundle = json.loads((tmp_path / "theirs.sig").read_bytes())
    for b in (ours_bundle, theirs_bundle):
        b["dsseEnvelope"]["payload"] = b["dsseEnvelope"]["signatures"][0]["sig"] = "..."
    assert ours_bundle == theirs_bundle


# -- (b) model_signing's bundles verify with ours ---------------------------------------


@pytest.mark.parametrize("kind", ["file", "dir", "dir-bundle-inside"])
def test_model_signing_bundle_verifies_with_ours(
    kind: str, key_pair: Keys, tmp_path: Path, example_models: Path
) -> None:
    model = (
        make_model_file(tmp_path) if kind == "file" else make_model_dir(tmp_path, example_models)
    )
    bundle = model / "model.sig" if kind == "dir-bundle-inside" else tmp_path / "theirs.sig"
    their_sign(model, key_pair.private_pem, bundle)

    for key in (key_pair.public_pem, keys.load_public_key(key_pair.public_pem)):
        verified = oms.verify_model(model, bundle, key)
        assert verified.facts is None
        assert verified.name == model.name
    if kind == "file":
        assert verified.files == {".": hashlib.sha256(model.read_bytes()).hexdigest()}
    else:
        assert sorted(verified.files) == [
            "a-b.json",
            "extra/cnn.onnx",
            "extra/deep/labels.txt",
            "model.onnx",
        ]
        assert (
            verified.files["model.onnx"]
            == hashlib.sha256((model / "model.onnx").read_bytes()).hexdigest()
        )


TAMPERING = {
    "flipped-byte": (flip_byte, DigestMismatchError),
    "extra-file": (add_file, FileSetError),
    "missing-file": (remove_file, FileSetError),
}


@pytest.mark.parametrize("producer", ["ours", "theirs"])
@pytest.mark.parametrize("tamper", [*TAMPERING, "wrong-key"])
def test_both_verifiers_refuse(
    producer: str, tamper: str, key_pair: Keys, tmp_path: Path, example_models: Path
) -> None:
    model = make_model_dir(tmp_path, example_models)
    bundle = tmp_path / f"{producer}.sig"
    if producer == "ours":
        oms.write_bundle(oms.sign_model(model, key_pair.private, facts=FACTS), bundle)
    else:
        their_sign(model, key_pair.private_pem, bundle)
    public = key_pair.public_pem
    expected: type[VerificationError]
    if tamper == "wrong-key":
        public, expected = key_pair.other_pem, SignatureError
    else:
        change, expected = TAMPERING[tamper]
        change(model)

    proc = their_verify(model, bundle, public)
    assert proc.returncode != 0, proc.stdout
    assert "Verification failed" in proc.stderr
    with pytest.raises(expected) as caught:
        oms.verify_model(model, bundle, public)
    assert type(caught.value) is expected


def test_single_file_tampering_refused_by_both(key_pair: Keys, tmp_path: Path) -> None:
    model = make_model_file(tmp_path)
    bundle = tmp_path / "ours.sig"
    oms.write_bundle(oms.sign_model(model, key_pair.private), bundle)
    data = bytearray(model.read_bytes())
    data[-1] ^= 0x80
    model.write_bytes(bytes(data))
    assert their_verify(model, bundle, key_pair.public_pem).returncode != 0
    with pytest.raises(DigestMismatchError):
        oms.verify_model(model, bundle, key_pair.public_pem)


def test_tampered_statement_refused_by_both(key_pair: Keys, tmp_path: Path) -> None:
    """Editing the signed payload (here: dropping the facts) breaks the signature."""
    model = make_model_file(tmp_path)
    signed = oms.sign_model(model, key_pair.private, facts=FACTS)
    statement = json.loads(base64.b64decode(signed["dsseEnvelope"]["payload"]))
    del statement["predicate"][oms.FACTS_FIELD]
    payload = json.dumps(statement, indent=2).encode()
    signed["dsseEnvelope"]["payload"] = base64.b64encode(payload).decode()
    oms.write_bundle(signed, tmp_path / "edited.sig")
    assert their_verify(model, tmp_path / "edited.sig", key_pair.public_pem).returncode != 0
    with pytest.raises(SignatureError):
        oms.verify_model(model, tmp_path / "edited.sig", key_pair.public_pem)


def test_malformed_bundle_refused(key_pair: Keys, tmp_path: Path) -> None:
    model = make_model_file(tmp_path)
    (tmp_path / "bad.sig").write_text(
        '{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}'
    )
    assert their_verify(model, tmp_path / "bad.sig", key_pair.public_pem).returncode != 0
    with pytest.raises(VerificationError) as caught:
        oms.verify_model(model, tmp_path / "bad.sig", key_pair.public_pem)
    assert type(caught.value) is VerificationError


# -- signed fixtures, verified forever ---------------------------------------------------

FIXTURE_MODELS = ("model.onnx", "dir_model")
"""A single-file model and a folder model (files below), beside their bundles."""
SIGNERS = ("modelreg", "model_signing")


def _fixture_files() -> dict[str, bytes]:
    onnx = model_bytes("cnn", "1.0.0")
    return {
        "model.onnx": onnx,
        "dir_model/model.onnx": onnx,
        "dir_model/config.json": b'{"input": "image", "classes": 10}\n',
        "dir_model/vocab/labels.txt": b"".join(b"class-%d\n" % i for i in range(10)),
    }


def _write_fixture_models(root: Path) -> None:
    for rel, content in _fixture_files().items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)


def _regenerate(root: Path, scratch: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    _write_fixture_models(root)
    pair = Keys(scratch)  # the private key is thrown away
    shutil.copy(pair.public_pem, root / "key.pub")
    for name in FIXTURE_MODELS:
        model = root / name
        facts = FACTS if name == "model.onnx" else None
        oms.write_bundle(
            oms.sign_model(model, pair.private, facts=facts), root / f"{name}.modelreg.sig"
        )
        their_sign(model, pair.private_pem, root / f"{name}.model_signing.sig")


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.environ.get(REGEN_ENV) == "1":
        _regenerate(FIXTURES, tmp_path_factory.mktemp("regen-keys"))
    if not (FIXTURES / "key.pub").is_file():
        pytest.fail(f"missing {FIXTURES}; run with {REGEN_ENV}=1 and review the diff")
    return FIXTURES


def test_fixture_models_are_the_deterministic_examples(fixtures: Path) -> None:
    for rel, content in _fixture_files().items():
        assert (fixtures / rel).read_bytes() == content, rel


@pytest.mark.parametrize("signer", SIGNERS)
@pytest.mark.parametrize("name", list(FIXTURE_MODELS))
def test_fixture_bundles_verify_forever(fixtures: Path, name: str, signer: str) -> None:
    model, bundle, public = fixtures / name, fixtures / f"{name}.{signer}.sig", fixtures / "key.pub"
    verified = oms.verify_model(model, bundle, public)
    assert verified.name == name
    expected_facts = FACTS if (signer, name) == ("modelreg", "model.onnx") else None
    assert verified.facts == expected_facts
    proc = their_verify(model, bundle, public)
    assert proc.returncode == 0, proc.stderr


def test_fixture_bundles_agree(fixtures: Path) -> None:
    """Both signers' statements name the same digests for the same fixture."""
    for name in FIXTURE_MODELS:
        ours = statement_of(fixtures / f"{name}.modelreg.sig")
        theirs = statement_of(fixtures / f"{name}.model_signing.sig")
        assert ours["subject"] == theirs["subject"]
        assert ours["predicate"]["resources"] == theirs["predicate"]["resources"]


# -- ignore paths, recorded by us and honoured by both verifiers -------------------------


def test_ignore_paths(key_pair: Keys, tmp_path: Path, example_models: Path) -> None:
    model = make_model_dir(tmp_path, example_models)
    (model / "notes").mkdir()
    (model / "notes" / "todo.md").write_text("unsigned notes\n")
    bundle = tmp_path / "ours.sig"
    oms.write_bundle(oms.sign_model(model, key_pair.private, ignore_paths=["notes"]), bundle)
    assert "notes" in statement_of(bundle)["predicate"]["serialization"]["ignore_paths"]
    (model / "notes" / "more.md").write_text("still ignored\n")
    assert their_verify(model, bundle, key_pair.public_pem).returncode == 0
    oms.verify_model(model, bundle, key_pair.public_pem)
    (model / "scratch.txt").write_text("x")
    with pytest.raises(FileSetError, match="extra"):
        oms.verify_model(model, bundle, key_pair.public_pem)
    verified = oms.verify_model(
        model, bundle, key_pair.public_pem, ignore_paths=[model / "scratch.txt"]
    )
    assert "scratch.txt" not in verified.files
    with pytest.raises(ValueError, match="outside"):
        oms.verify_model(model, bundle, key_pair.public_pem, ignore_paths=[tmp_path])
    with pytest.raises(ValueError, match="single-file"):
        oms.sign_model(make_model_file(tmp_path / "f"), key_pair.private, ignore_paths=["x"])
