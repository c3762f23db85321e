"""The OMS v1.0 bundle format, without I/O.  Private: import from :mod:`signing.oms`.

Statement and bundle layout (described in :mod:`signing.oms`), DSSE PAE, key hint, the
checks of an untrusted bundle and statement under :class:`OmsLimits`, and the comparison
of signed and found files and digests.  Files are read and written by :mod:`signing.oms`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from signing.errors import (
    DigestMismatchError,
    FileSetError,
    KeyMaterialError,
    SignatureError,
    VerificationError,
)
from signing.hashing import SINGLE_FILE

BUNDLE_MEDIA_TYPE: Final = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE: Final = "application/vnd.in-toto+json"
STATEMENT_TYPE: Final = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE: Final = "https://model_signing/signature/v1.0"
FACTS_FIELD: Final = "modelreg"
"""The extra predicate field holding :class:`ModelFacts`."""

_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_FACT_KEYS: Final = ("model", "version", "git_commit", "ci_run", "parent", "targets")


@dataclass(frozen=True, slots=True)
class OmsLimits:
    """Bounds on untrusted bundles, checked before the data is used.

    A real bundle is one large string (the base64 statement) in a dozen small fields,
    so the bundle caps bound what the JSON parser is asked to build before it starts:
    its size (checked on the open file, before reading) and its values (counted from
    the separators, before parsing; a 64 MiB ``[{},{},...]`` made ``json.loads`` build
    21 million objects, 1.8 GB).  Nesting needs no cap of its own: it is bounded by the
    value count, and CPython's parser refuses depth past its recursion limit cheaply.
    The statement is parsed only once its signature has verified.

    Attributes:
        max_bundle_bytes: size of a bundle file.  32 MiB holds the statement of
            ``max_resources`` files with names of about 60 characters.
        max_bundle_values: JSON values in a bundle, counted before parsing as one
            plus its ``{``, ``[`` and ``,`` characters (a real bundle has about 20;
            the payload, being base64, holds none of them).
        max_payload_bytes: size of the decoded statement (3/4 of the bundle cap).
        max_signatures: DSSE signatures tried.
        max_signature_bytes: size of one decoded signature (P-256 DER: at most 72).
        max_resources: files in a signed model.
        max_ignore_paths: entries of ``ignore_paths``.
        max_name_bytes: UTF-8 length of a resource name or ignore path.
        max_fact_chars: length of one fact string.
        max_targets: entries of ``ModelFacts.targets``.
    """

    max_bundle_bytes: int = 32 << 20
    max_bundle_values: int = 1_024
    max_payload_bytes: int = 24 << 20
    max_signatures: int = 8
    max_signature_bytes: int = 1_024
    max_resources: int = 100_000
    max_ignore_paths: int = 1_000
    max_name_bytes: int = 4_096
    max_fact_chars: int = 1_024
    max_targets: int = 256


DEFAULT_LIMITS: Final = OmsLimits()


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """Release facts signed with the model (the ``"modelreg"`` predicate field).

    Attributes:
        model: registered model name.
        version: model version.
        git_commit: commit of the registry that released it.
        ci_run: the CI run that signed it (URL or id).
        parent: version it was derived from, if any.
        targets: names of the deployment targets it was released for.
    """

    model: str
    version: str
    git_commit: str
    ci_run: str
    parent: str | None = None
    targets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Check field types and values.

        Raises:
            ValueError: a field is empty or of the wrong type, or a target repeats.
        """
        for key in ("model", "version", "git_commit", "ci_run"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ValueError(f"facts: {key} must be a non-empty string")
        if self.parent is not None and (not isinstance(self.parent, str) or not self.parent):
            raise ValueError("facts: parent must be a non-empty string or null")
        if not isinstance(self.targets, tuple) or not all(
            isinstance(t, str) and t for t in self.targets
        ):
            raise ValueError("facts: targets must be a tuple of non-empty strings")
        if len(set(self.targets)) != len(self.targets):
            raise ValueError("facts: targets repeat")

    def to_json(self) -> dict[str, Any]:
        """The JSON object signed in the predicate."""
        return {
            "model": self.model,
            "version": self.version,
            "git_commit": self.git_commit,
            "ci_run": self.ci_run,
            "parent": self.parent,
            "targets": list(self.targets),
        }

    @classmethod
    def from_json(cls, value: Any, limits: OmsLimits = DEFAULT_LIMITS) -> ModelFacts:
        """Parse the predicate field (exactly the keys ``to_json`` writes).

        Raises:
            ValueError: wrong keys, types or sizes.
        """
        if not isinstance(value, dict) or sorted(value) != sorted(_FACT_KEYS):
            raise ValueError(f"facts: expected an object with keys {', '.join(_FACT_KEYS)}")
        targets = value["targets"]
        if not isinstance(targets, list) or len(targets) > limits.max_targets:
            raise ValueError(f"facts: targets must be a list of at most {limits.max_targets}")
        strings = [value[k] for k in _FACT_KEYS[:5]] + targets
        if any(isinstance(s, str) and len(s) > limits.max_fact_chars for s in strings):
            raise ValueError(f"facts: a value is over {limits.max_fact_chars} characters")
        return cls(
            model=value["model"],
            version=value["version"],
            git_commit=value["git_commit"],
            ci_run=value["ci_run"],
            parent=value["parent"],
            targets=tuple(targets),
        )


@dataclass(frozen=True)
class SignedManifest:
    """What a correctly signed statement says (not yet compared with any files).

    Attributes:
        name: the subject name (the model folder or file name at signing).
        digest: the subject's SHA-256, over the resource digests.
        files: resource name to SHA-256 hex, in signed order.
        ignore_paths: paths the signer left out, relative to the model folder.
        facts: our signed facts, None in bundles without them.
    """

    name: str
    digest: str
    files: Mapping[str, str]
    ignore_paths: tuple[str, ...]
    facts: ModelFacts | None


def root_digest(digests: Iterable[str]) -> str:
    """The subject digest: SHA-256 over the raw bytes of each digest, in order."""
    h = hashlib.sha256()
    for d in digests:
        h.update(bytes.fromhex(d))
    return h.hexdigest()


def _sort_key(name: str) -> tuple[str, ...]:
    # The reference sorts PurePosixPath keys: by components, so "a/b" < "a-b" < "a-b/c".
    return tuple(name.split("/"))


def build_statement(
    name: str,
    files: Mapping[str, str],
    ignore_paths: Iterable[str],
    facts: ModelFacts | None = None,
) -> dict[str, Any]:
    """The in-toto statement for a model's file digests (resources sorted as signed)."""
    resources = [
        {"name": n, "algorithm": "sha256", "digest": files[n]} for n in sorted(files, key=_sort_key)
    ]
    predicate: dict[str, Any] = {
        "serialization": {
            "method": "files",
            "hash_type": "sha256",
            "allow_symlinks": False,
            "ignore_paths": sorted(set(ignore_paths)),
        },
        "resources": resources,
    }
    if facts is not None:
        predicate[FACTS_FIELD] = facts.to_json()
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": name, "digest": {"sha256": root_digest(r["digest"] for r in resources)}}
        ],
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what the signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def key_hint(public_key: ec.EllipticCurvePublicKey) -> str:
    """The bundle's ``publicKey.hint``: SHA-256 hex of the key's SPKI PEM."""
    pem = public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(pem).hexdigest()


def build_bundle(
    statement: Mapping[str, Any], private_key: ec.EllipticCurvePrivateKey
) -> dict[str, Any]:
    """Sign ``statement`` into a Sigstore bundle (ECDSA P-256, SHA-256).

    Raises:
        KeyMaterialError: the key is not ECDSA P-256.
    """
    check_p256(private_key, "private key")
    # indent=2 and ASCII escapes: the layout protobuf's MessageToJson gives the reference.
    payload = json.dumps(statement, indent=2).encode()
    signature = private_key.sign(pae(PAYLOAD_TYPE, payload), ec.ECDSA(hashes.SHA256()))
    return {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {
            "publicKey": {"hint": key_hint(private_key.public_key())},
            "tlogEntries": [],
        },
        "dsseEnvelope": {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"sig": base64.b64encode(signature).decode(), "keyid": ""}],
        },
    }


def open_bundle(
    bundle: Mapping[str, Any],
    public_key: ec.EllipticCurvePublicKey,
    limits: OmsLimits = DEFAULT_LIMITS,
    subject: str = "bundle",
) -> SignedManifest:
    """Authenticate a bundle with ``public_key`` and parse its statement.

    Nothing in the payload is parsed before its signature has verified.

    Args:
        bundle: the bundle's JSON object.
        public_key: the only key trusted to have signed it.
        limits: bounds on the untrusted input.
        subject: what error messages name (the bundle file).

    Raises:
        SignatureError: no signature verifies with ``public_key``, or the bundle names
            another key.
        VerificationError: the bundle or its statement is malformed or unsupported.
    """
    b = _obj(bundle, "bundle", {"mediaType", "verificationMaterial", "dsseEnvelope"}, subject)
    if b["mediaType"] != BUNDLE_MEDIA_TYPE:
        raise VerificationError(f"unsupported mediaType {b['mediaType']!r}", subject)
    material = _obj(
        b["verificationMaterial"],
        "verificationMaterial",
        {"publicKey"},
        subject,
        optional={"tlogEntries", "timestampVerificationData"},
    )
    hint = _obj(material["publicKey"], "publicKey", set(), subject, optional={"hint"}).get("hint")
    # The hint is unauthenticated: it can only make us refuse, never trust.  Like the
    # reference, an empty or absent hint (bundles before model_signing 1.0) is no claim.
    if hint not in (None, "") and hint != key_hint(public_key):
        raise SignatureError("bundle was signed by another key (publicKey.hint differs)", subject)
    env = _obj(b["dsseEnvelope"], "dsseEnvelope", {"payload", "payloadType", "signatures"}, subject)
    if env["payloadType"] != PAYLOAD_TYPE:
        raise VerificationError(f"unsupported payloadType {env['payloadType']!r}", subject)
    payload = _b64(env["payload"], "payload", limits.max_payload_bytes, subject)
    sigs = _list(env["signatures"], "signatures", limits.max_signatures, subject)
    if not sigs:
        raise SignatureError("bundle has no signature", subject)
    message = pae(PAYLOAD_TYPE, payload)
    for s in sigs:
        sig = _obj(s, "signature", {"sig"}, subject, optional={"keyid"})
        try:
            public_key.verify(
                _b64(sig["sig"], "sig", limits.max_signature_bytes, subject),
                message,
                ec.ECDSA(hashes.SHA256()),
            )
            break
        except InvalidSignature:
            continue
    else:
        raise SignatureError("signature does not verify with the given key", subject)
    return parse_statement(loads_strict(payload, subject), limits, subject)


def parse_statement(
    statement: Any, limits: OmsLimits = DEFAULT_LIMITS, subject: str = "bundle"
) -> SignedManifest:
    """Check an (authenticated) OMS v1.0 statement and extract what it signs.

    Raises:
        VerificationError: wrong types or formats, unsupported serialization, limits
            exceeded, or a subject digest that does not match the resources.
    """
    st = _obj(statement, "statement", {"_type", "subject", "predicateType", "predicate"}, subject)
    if st["_type"] != STATEMENT_TYPE:
        raise VerificationError(f"statement _type {st['_type']!r} is not {STATEMENT_TYPE}", subject)
    if st["predicateType"] != PREDICATE_TYPE:
        raise VerificationError(f"unsupported predicateType {st['predicateType']!r}", subject)
    subjects = _list(st["subject"], "subject", 1, subject)
    if len(subjects) != 1:
        raise VerificationError("statement must have exactly one subject", subject)
    subj = _obj(subjects[0], "subject", {"name", "digest"}, subject)
    name = _str(subj["name"], "subject.name", limits.max_name_bytes, subject)
    signed_root = _obj(subj["digest"], "subject.digest", {"sha256"}, subject)["sha256"]
    predicate = st["predicate"]
    if not isinstance(predicate, dict):
        raise VerificationError("predicate must be an object", subject)
    # OMS v1.0: fields other than serialization and resources are extensions to ignore;
    # ours (FACTS_FIELD) is read below.
    pred = _obj(predicate, "predicate", {"serialization", "resources"}, subject, extra_ok=True)
    ignore_paths = _parse_serialization(pred["serialization"], limits, subject)
    files = _parse_resources(pred["resources"], limits, subject)
    if _hex(signed_root, "subject digest", subject) != root_digest(files.values()):
        raise VerificationError("subject digest does not match the resources", subject)
    facts = None
    if FACTS_FIELD in pred:
        try:
            facts = ModelFacts.from_json(pred[FACTS_FIELD], limits)
        except ValueError as e:
            raise VerificationError(str(e), subject) from None
    return SignedManifest(name, signed_root, files, ignore_paths, facts)


def _parse_serialization(value: Any, limits: OmsLimits, subject: str) -> tuple[str, ...]:
    ser = _obj(
        value,
        "serialization",
        {"method", "hash_type", "allow_symlinks"},
        subject,
        optional={"ignore_paths"},
    )
    if ser["method"] != "files" or ser["hash_type"] != "sha256":
        raise VerificationError(
            f"unsupported serialization {ser['method']!r}/{ser['hash_type']!r} (only files/sha256)",
            subject,
        )
    # allow_symlinks only permits links; we never follow them, so either value will do.
    if not isinstance(ser["allow_symlinks"], bool):
        raise VerificationError("serialization.allow_symlinks must be a boolean", subject)
    ignore = _list(ser.get("ignore_paths", []), "ignore_paths", limits.max_ignore_paths, subject)
    return tuple(_path(p, "ignore_paths", limits, subject) for p in ignore)


def _parse_resources(value: Any, limits: OmsLimits, subject: str) -> dict[str, str]:
    files: dict[str, str] = {}
    for r in _list(value, "resources", limits.max_resources, subject):
        res = _obj(r, "resource", {"name", "algorithm", "digest"}, subject)
        if res["algorithm"] != "sha256":
            raise VerificationError(f"unsupported algorithm {res['algorithm']!r}", subject)
        name = res["name"]
        if name != SINGLE_FILE:
            name = _path(name, "resource name", limits, subject)
        if name in files:
            raise VerificationError(f"resource {name!r} appears twice", subject)
        files[name] = _hex(res["digest"], f"digest of {name!r}", subject)
    if SINGLE_FILE in files and len(files) > 1:
        raise VerificationError('resource "." (a single-file model) must be alone', subject)
    return files


def check_file_set(signed: Iterable[str], found: Iterable[str], subject: str) -> None:
    """Refuse when the files found differ from the files signed.

    Raises:
        FileSetError: files are missing or extra (both are listed).
    """
    want, have = set(signed), set(found)
    problems = []
    for what, names in (("missing", want - have), ("extra", have - want)):
        if names:
            shown = sorted(names, key=_sort_key)
            more = f" and {len(shown) - 10} more" if len(shown) > 10 else ""
            problems.append(f"{len(shown)} {what} ({', '.join(shown[:10])}{more})")
    if problems:
        raise FileSetError("files differ from the signed set: " + "; ".join(problems), subject)


def check_digests(signed: Mapping[str, str], actual: Mapping[str, str], subject: str) -> None:
    """Refuse when a file's digest differs from its signed digest.

    Raises:
        DigestMismatchError: one or more files differ (named in the message).
    """
    bad = sorted((n for n in signed if actual.get(n) != signed[n]), key=_sort_key)
    if bad == [SINGLE_FILE]:
        # The resource of a single-file model is named "." (OMS); the subject names it.
        raise DigestMismatchError(
            f"content differs from its signed digest (sha256 {actual.get(SINGLE_FILE)}, "
            f"signed {signed[SINGLE_FILE]})",
            subject,
        )
    if bad:
        detail = ", ".join(f"{n} (sha256 {actual.get(n)}, signed {signed[n]})" for n in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise DigestMismatchError(
            f"{len(bad)} file(s) differ from their signed digest: {detail}{more}", subject
        )


def _obj(
    value: Any,
    what: str,
    required: set[str],
    subject: str,
    *,
    optional: set[str] | frozenset[str] = frozenset(),
    extra_ok: bool = False,
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise VerificationError(f"{what} must be an object", subject)
    if missing := required - value.keys():
        raise VerificationError(f"{what} lacks {', '.join(sorted(missing))}", subject)
    if not extra_ok and (extra := value.keys() - required - optional):
        raise VerificationError(f"{what} has unknown fields {', '.join(sorted(extra))}", subject)
    return value


def _list(value: Any, what: str, limit: int, subject: str) -> list[Any]:
    if not isinstance(value, list):
        raise VerificationError(f"{what} must be a list", subject)
    if len(value) > limit:
        raise VerificationError(f"{what} has {len(value)} entries, over the limit {limit}", subject)
    return value


def _str(value: Any, what: str, limit: int, subject: str) -> str:
    if not isinstance(value, str) or not value:
        raise VerificationError(f"{what} must be a non-empty string", subject)
    if len(value.encode("utf-8", "surrogatepass")) > limit:
        raise VerificationError(f"{what} is over {limit} bytes", subject)
    return value


def _hex(value: Any, what: str, subject: str) -> str:
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise VerificationError(f"{what} is not a lowercase hex SHA-256", subject)
    return value


def _path(value: Any, what: str, limits: OmsLimits, subject: str) -> str:
    """A relative POSIX path in canonical form (as the reference writes them)."""
    text = _str(value, what, limits.max_name_bytes, subject)
    if text.startswith("/") or "\0" in text or any(p in ("", ".", "..") for p in text.split("/")):
        raise VerificationError(f"{what} {text!r} is not a canonical relative path", subject)
    return text


def _b64(value: Any, what: str, limit: int, subject: str) -> bytes:
    if not isinstance(value, str) or len(value) > 4 * (limit // 3 + 1):
        raise VerificationError(f"{what} must be base64 of at most {limit} bytes", subject)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise VerificationError(f"{what} is not valid base64", subject) from None


def check_bundle_values(data: bytes, limits: OmsLimits, subject: str) -> None:
    """Refuse a bundle that holds more JSON values than ``limits`` allow, before parsing.

    Every value after the first in a container follows a ``,`` and every container
    starts with ``{`` or ``[``, so one plus their count bounds the values the parser
    would build; characters inside strings are counted too, which can only overcount.
    Counting is a C-speed pass per character, with no object built.

    Raises:
        VerificationError: more than ``limits.max_bundle_values`` values.
    """
    values = 1 + sum(data.count(c) for c in (b"{", b"[", b","))
    if values > limits.max_bundle_values:
        raise VerificationError(
            f"bundle has about {values} JSON values, over the {limits.max_bundle_values} "
            "allowed (a bundle is a few small fields and one base64 payload)",
            subject,
        )


def _strict_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        # Parsers differ on which duplicate wins; a signed document must not be ambiguous.
        raise ValueError("duplicate key in JSON object")
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_strict(data: bytes, subject: str) -> Any:
    """Parse untrusted JSON (no duplicate keys, NaN or Infinity), else VerificationError."""
    try:
        return json.loads(data, object_pairs_hook=_strict_object, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError too
        raise VerificationError(f"not valid JSON ({e})", subject) from None


def check_p256(key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey, what: str) -> None:
    """Refuse, with KeyMaterialError, any key (named ``what``) but ECDSA P-256."""
    if not isinstance(
        key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey
    ) or not isinstance(key.curve, ec.SECP256R1):
        raise KeyMaterialError(f"{what}: expected an ECDSA P-256 key")
