"""Our OMS verifier's own refusals, without the reference CLI: pure checks on signed input.

Bundle shape, malformed signed statements and payloads, limits, the file set, symlinks,
P-256 keys and the signed facts.  Interop with ``model_signing`` is in
``tests/integration/test_oms_interop.py``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from signing import oms
from signing.errors import (
    FileSetError,
    KeyMaterialError,
    SignatureError,
    SigningError,
    VerificationError,
)
from tests.oms_helpers import (
    FACTS,
    Keys,
    add_file,
    flip_byte,
    make_model_dir,
    make_model_file,
    remove_file,
)


@pytest.fixture(scope="module")
def key_pair(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys(tmp_path_factory.mktemp("keys"))


def _statement(model: Path) -> dict[str, Any]:
    files = {".": hashlib.sha256(model.read_bytes()).hexdigest()}
    return oms.build_statement(model.name, files, oms.GIT_PATHS, FACTS)


def _set(path: str, value: Any) -> Any:
    def change(st: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = st
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value

    return change


_DELETE = object()
_ZERO = "0" * 64
_ECDSA = ec.ECDSA(hashes.SHA256())

BAD_STATEMENTS = {
    "statement type": _set("_type", "https://in-toto.io/Statement/v0.1"),
    "predicate type (pre-1.0)": _set("predicateType", "https://model_signing/Digests/v0.1"),
    "unknown statement field": _set("extra", 1),
    "two subjects": lambda st: st["subject"].append(st["subject"][0]),
    "subject digest": _set("subject.0.digest.sha256", _ZERO),
    "subject digest algorithm": _set("subject.0.digest", {"sha512": _ZERO}),
    "shard serialization": _set("predicate.serialization.method", "shards"),
    "blake2": _set("predicate.serialization.hash_type", "blake2"),
    "allow_symlinks type": _set("predicate.serialization.allow_symlinks", "false"),
    "ignore path escapes": _set("predicate.serialization.ignore_paths", ["../x"]),
    "resource algorithm": _set("predicate.resources.0.algorithm", "blake3"),
    "resource digest case": lambda st: st["predicate"]["resources"][0].update(
        digest=st["predicate"]["resources"][0]["digest"].upper()
    ),
    "resource name absolute": _set("predicate.resources.0.name", "/etc/passwd"),
    "resources missing": _set("predicate.resources", _DELETE),
    "facts unknown key": _set("predicate.modelreg.channel", "production"),
    "facts empty model": _set("predicate.modelreg.model", ""),
    "facts targets type": _set("predicate.modelreg.targets", "cpu"),
}


@pytest.mark.parametrize("case", list(BAD_STATEMENTS))
def test_malformed_signed_statements_refused(case: str, key_pair: Keys, tmp_path: Path) -> None:
    model = make_model_file(tmp_path)
    statement = _statement(model)
    BAD_STATEMENTS[case](statement)
    bundle = oms.build_bundle(statement, key_pair.private)
    with pytest.raises(VerificationError) as caught:
        oms.verify_model(model, bundle, key_pair.public_pem)
    assert type(caught.value) is VerificationError, caught.value


def test_unknown_predicate_fields_are_ignored(key_pair: Keys, tmp_path: Path) -> None:
    """OMS v1.0: verifiers ignore predicate extensions (as model_signing ignores ours)."""
    model = make_model_file(tmp_path)
    statement = _statement(model)
    statement["predicate"]["model_card"] = {"license": "apache-2.0"}
    verified = oms.verify_model(
        model, oms.build_bundle(statement, key_pair.private), key_pair.public_pem
    )
    assert verified.facts == FACTS


def _raw_bundle(payload: bytes, key_pair: Keys, **envelope: Any) -> dict[str, Any]:
    sig = key_pair.private.sign(oms.pae(oms.PAYLOAD_TYPE, payload), _ECDSA)
    bundle = oms.build_bundle({}, key_pair.private)
    bundle["dsseEnvelope"].update(
        payload=base64.b64encode(payload).decode(),
        signatures=[{"sig": base64.b64encode(sig).decode(), "keyid": ""}],
        **envelope,
    )
    return bundle


@pytest.mark.parametrize(
    "payload",
    [
        b'{"_type": "a", "_type": "b"}',  # duplicate keys: parsers disagree on the winner
        b'{"x": NaN}',
        b"[" * 100_000,
        b"\xff\xfe",
        b"[]",
    ],
)
def test_signed_payload_that_is_not_a_statement(
    payload: bytes, key_pair: Keys, tmp_path: Path
) -> None:
    model = make_model_file(tmp_path)
    with pytest.raises(VerificationError) as caught:
        oms.verify_model(model, _raw_bundle(payload, key_pair), key_pair.public_pem)
    assert type(caught.value) is VerificationError


def test_bundle_shape_refused(key_pair: Keys, tmp_path: Path) -> None:
    model = make_model_file(tmp_path)
    good = oms.sign_model(model, key_pair.private)
    cases: list[tuple[dict[str, Any], type[VerificationError]]] = []
    for path, value in [
        ("mediaType", "application/vnd.dev.sigstore.bundle+json;version=0.1"),
        ("dsseEnvelope.payloadType", "text/plain"),
        ("dsseEnvelope.payload", "not base64!"),
        ("dsseEnvelope.signatures", []),
        ("verificationMaterial.publicKey", _DELETE),
        ("verificationMaterial.x509CertificateChain", {"certificates": []}),
        ("messageSignature", {}),
    ]:
        bad = json.loads(json.dumps(good))
        _set(path, value)(bad)
        cases.append((bad, SignatureError if path.endswith("signatures") else VerificationError))
    hint = json.loads(json.dumps(good))
    hint["verificationMaterial"]["publicKey"]["hint"] = _ZERO
    cases.append((hint, SignatureError))
    for bad, expected in cases:
        with pytest.raises(expected) as caught:
            oms.verify_model(model, bad, key_pair.public_pem)
        assert type(caught.value) is expected, bad
    # Without a hint (older bundles) the signature alone decides.
    del good["verificationMaterial"]["publicKey"]["hint"]
    oms.verify_model(model, good, key_pair.public_pem)


def test_limits(key_pair: Keys, tmp_path: Path, example_models: Path) -> None:
    model = make_model_dir(tmp_path, example_models)
    bundle = tmp_path / "ours.sig"
    oms.write_bundle(oms.sign_model(model, key_pair.private), bundle)
    size = bundle.stat().st_size
    with pytest.raises(VerificationError, match="over"):
        oms.verify_model(
            model, bundle, key_pair.public_pem, limits=oms.OmsLimits(max_bundle_bytes=size - 1)
        )
    with pytest.raises(VerificationError, match="over the limit 3"):
        oms.verify_model(model, bundle, key_pair.public_pem, limits=oms.OmsLimits(max_resources=3))
    oms.verify_model(model, bundle, key_pair.public_pem, limits=oms.OmsLimits(max_resources=4))
    (tmp_path / "junk.sig").write_bytes(b"\x00not json")
    with pytest.raises(VerificationError, match="not valid JSON"):
        oms.verify_model(model, tmp_path / "junk.sig", key_pair.public_pem)


def test_file_set_is_checked_before_digests(
    key_pair: Keys, tmp_path: Path, example_models: Path
) -> None:
    model = make_model_dir(tmp_path, example_models)
    signed = oms.sign_model(model, key_pair.private)
    flip_byte(model)
    add_file(model)
    remove_file(model)
    with pytest.raises(FileSetError, match=r"1 missing \(extra/deep/labels.txt\); 1 extra"):
        oms.verify_model(model, signed, key_pair.public_pem)


def test_symlinks_refused(key_pair: Keys, tmp_path: Path, example_models: Path) -> None:
    model = make_model_dir(tmp_path, example_models)
    signed = oms.sign_model(model, key_pair.private)
    (model / "link.onnx").symlink_to(model / "model.onnx")
    with pytest.raises(FileSetError, match="symbolic links"):
        oms.verify_model(model, signed, key_pair.public_pem)
    with pytest.raises(SigningError, match="symbolic links"):
        oms.sign_model(model, key_pair.private)


def test_keys_must_be_p256(key_pair: Keys, tmp_path: Path) -> None:
    model = make_model_file(tmp_path)
    p384 = ec.generate_private_key(ec.SECP384R1())
    with pytest.raises(KeyMaterialError):
        oms.sign_model(model, p384)
    signed = oms.sign_model(model, key_pair.private)
    with pytest.raises(KeyMaterialError):
        oms.verify_model(model, signed, p384.public_key())
    oms.verify_model(model, signed, key_pair.private.public_key())
    with pytest.raises(KeyMaterialError):
        oms.verify_model(model, signed, tmp_path / "absent.pub")


def test_model_facts_validation() -> None:
    with pytest.raises(ValueError, match="model"):
        oms.ModelFacts(model="", version="1", git_commit="c", ci_run="r")
    with pytest.raises(ValueError, match="repeat"):
        oms.ModelFacts(model="m", version="1", git_commit="c", ci_run="r", targets=("a", "a"))
    with pytest.raises(ValueError, match="tuple"):
        oms.ModelFacts(model="m", version="1", git_commit="c", ci_run="r", targets=["a"])  # type: ignore[arg-type]
    assert oms.ModelFacts.from_json(FACTS.to_json()) == FACTS


def test_empty_model_is_not_signed(key_pair: Keys, tmp_path: Path) -> None:
    (tmp_path / "empty" / ".git").mkdir(parents=True)
    with pytest.raises(SigningError, match="no files"):
        oms.sign_model(tmp_path / "empty", key_pair.private)


# --- bounded work on an untrusted bundle file (issue 8, point 7) ---------------------


def test_bundle_values_are_counted_before_parsing() -> None:
    limits = oms.OmsLimits(max_bundle_values=5)
    oms.check_bundle_values(b'{"a": [1, 2], "b": "x"}', limits, "b.json")  # 1 + 2 + 2 = 5
    with pytest.raises(VerificationError, match=r"b\.json: bundle has about 6 JSON values"):
        oms.check_bundle_values(b'{"a": [1, 2, 3], "b": "x"}', limits, "b.json")
    # Characters inside strings count too: a real bundle's strings (base64, hex) hold none.
    with pytest.raises(VerificationError, match="about 7 JSON values"):
        oms.check_bundle_values(b'"{[,{[,"', limits, "b.json")


def test_a_real_bundle_is_far_below_the_value_cap(
    key_pair: Keys, tmp_path: Path, example_models: Path
) -> None:
    bundle = tmp_path / "ours.sig"
    oms.write_bundle(oms.sign_model(make_model_dir(tmp_path, example_models), key_pair.private),
                     bundle)  # fmt: skip
    data = bundle.read_bytes()
    values = 1 + sum(data.count(c) for c in (b"{", b"[", b","))
    assert values < 32 < oms.DEFAULT_LIMITS.max_bundle_values
    oms.check_bundle_values(data, oms.OmsLimits(max_bundle_values=values), "ours.sig")


def test_read_bundle_refuses_many_values_without_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "many.sig"
    bundle.write_bytes(b"[" + b"{}," * 10_000 + b"{}]")
    parsed: list[bytes] = []
    monkeypatch.setattr(oms, "loads_strict", lambda data, subject: parsed.append(data))
    with pytest.raises(VerificationError, match="about 20003 JSON values, over the 1024 allowed"):
        oms.read_bundle(bundle)
    assert parsed == []


def test_read_bundle_refuses_size_before_reading(tmp_path: Path) -> None:
    bundle = tmp_path / "huge.sig"
    with bundle.open("wb") as fh:  # sparse: 1 GiB that costs nothing on disk
        fh.truncate(1 << 30)
    limit = oms.DEFAULT_LIMITS.max_bundle_bytes
    # The whole size, which only the open descriptor's fstat knows: a read stops at the
    # cap, so a refusal after reading would report limit + 1.
    with pytest.raises(VerificationError, match=f"bundle is {1 << 30} bytes, over the {limit}"):
        oms.read_bundle(bundle)


def test_read_bundle_refuses_links_and_special_files(tmp_path: Path) -> None:
    import os
    import threading

    real = tmp_path / "real.sig"
    oms.write_bundle({"mediaType": "x"}, real)
    assert oms.read_bundle(real) == {"mediaType": "x"}
    (tmp_path / "link.sig").symlink_to(real)
    with pytest.raises(VerificationError, match=r"link\.sig: bundle is a symbolic link"):
        oms.read_bundle(tmp_path / "link.sig")
    os.mkfifo(tmp_path / "fifo.sig")
    errors: list[BaseException] = []

    def read_fifo() -> None:
        try:
            oms.read_bundle(tmp_path / "fifo.sig")
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            errors.append(e)

    reader = threading.Thread(target=read_fifo, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # unblock the reader: a FIFO open waits for a writer
        os.close(os.open(tmp_path / "fifo.sig", os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
        pytest.fail("reading a FIFO bundle blocked")
    assert len(errors) == 1
    assert isinstance(errors[0], VerificationError)
    assert "fifo.sig: bundle is not a regular file" in str(errors[0])


def test_deep_nesting_is_one_verification_error(tmp_path: Path) -> None:
    bundle = tmp_path / "deep.sig"
    bundle.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(VerificationError, match="JSON values"):
        oms.read_bundle(bundle)
    # Below the value cap, the parser's own depth guard refuses it cheaply.
    with pytest.raises(VerificationError, match="not valid JSON"):
        oms.read_bundle(bundle, oms.OmsLimits(max_bundle_values=200_000))
