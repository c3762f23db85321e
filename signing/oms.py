"""OpenSSF Model Signing (OMS v1.0) bundles, ECDSA P-256 keys, ``cryptography`` only.

Stable API: the names in ``__all__`` and the bundle format below keep their meaning
across releases.  The format's pure parts (building, parsing and checking bundles and
statements, no I/O) live in the private ``signing._oms_format`` and are re-exported
here; this module adds what touches files: signing, reading, writing and verifying.

A bundle is what ``model_signing sign key`` (PyPI ``model-signing`` 1.1.1) writes with
the ``files`` serialization and SHA-256, and ``model_signing verify key`` accepts ours:

* a Sigstore bundle, ``mediaType`` ``application/vnd.dev.sigstore.bundle.v0.3+json``,
  ``verificationMaterial`` = ``{"publicKey": {"hint": <sha256 hex of the public key's
  SubjectPublicKeyInfo PEM>}, "tlogEntries": []}``, written as compact JSON;
* ``dsseEnvelope``: ``payloadType`` ``application/vnd.in-toto+json``, ``payload`` the
  base64 statement, one signature ``{"sig": <base64 DER ECDSA-SHA256 over the DSSE
  PAE>, "keyid": ""}``;
* the payload, an in-toto Statement v1 as JSON indented by 2 (protobuf's
  ``MessageToJson`` layout): one ``subject`` ``{"name": <model name>, "digest":
  {"sha256": <SHA-256 over the concatenated raw digests of the resources, in order>}}``,
  ``predicateType`` ``https://model_signing/signature/v1.0``, ``predicate``
  ``{"serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks":
  false, "ignore_paths": [...]}, "resources": [{"name", "algorithm": "sha256",
  "digest"}, ...]}``.  Resources are files relative to the model folder, sorted by path
  components; a single-file model has one resource named ``"."``.

Our signed facts go in an extra predicate field, ``"modelreg"``: OMS v1.0 verifiers
ignore predicate fields other than ``serialization`` and ``resources`` (the reference
verifier reads the payload with ``json.loads`` and indexes only those two).

Verification checks, in order: reading the bundle file (:func:`read_bundle`): a
regular file reached through no link, its size and its count of JSON values, all
before parsing; then without I/O (:func:`open_bundle`): bundle shape, key hint, the
signature, the statement; then with I/O (:func:`verify_model`): the file set on disk,
then every file's digest.  Limits on untrusted input are in :class:`OmsLimits`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any, Final

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from securesystemslib.signer import SSlibKey

from registry.atomic import write_atomic
from registry.errors import FileTooLargeError, UnsafeFileError, UsageError
from registry.safe_io import read_regular
from signing import keys
from signing._oms_format import (
    BUNDLE_MEDIA_TYPE,
    DEFAULT_LIMITS,
    FACTS_FIELD,
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    ModelFacts,
    OmsLimits,
    SignedManifest,
    build_bundle,
    build_statement,
    check_bundle_values,
    check_digests,
    check_file_set,
    check_p256,
    key_hint,
    loads_strict,
    open_bundle,
    pae,
    parse_statement,
    root_digest,
)
from signing.errors import KeyMaterialError, SigningError, VerificationError
from signing.hashing import SINGLE_FILE, default_workers, list_model_files, sha256_files

GIT_PATHS: Final = (".git", ".gitattributes", ".github", ".gitignore")
"""Ignored and recorded by default, as ``model_signing`` does (``--ignore-git-paths``)."""


@dataclass(frozen=True)
class VerifiedModel:
    """A model on disk that matches a bundle signed by the expected key.

    Attributes:
        path: the verified file or folder.
        name: the signed subject name.
        digest: the subject's SHA-256 (a digest of the whole model).
        files: resource name to SHA-256 hex; ``{".": ...}`` for a single file.
        facts: the signed :class:`ModelFacts`, if the bundle has them.
    """

    path: Path
    name: str
    digest: str
    files: Mapping[str, str] = field(repr=False)
    facts: ModelFacts | None


def model_name_of(path: Path) -> str:
    """The subject name ``model_signing`` gives ``path``: its last component."""
    name = path.name
    return name if name and name != ".." else path.resolve().name


def _relative_ignores(model: Path, paths: Iterable[str | os.PathLike[str]]) -> set[str]:
    """Ignore paths as canonical names relative to a model folder."""
    out = set()
    for p in paths:
        pure = Path(p)
        if pure.is_absolute():
            try:
                pure = pure.resolve().relative_to(model.resolve())
            except ValueError:
                raise UsageError(f"ignore path {p} is outside the model {model}") from None
        text = PurePosixPath(*pure.parts).as_posix()
        if text in ("", ".") or ".." in pure.parts:
            raise UsageError(f"ignore path {p!r} must name something inside the model")
        out.add(text)
    return out


def _bundle_inside(model: Path, bundle: Path | None) -> set[str]:
    # As the reference CLI does with --signature: a bundle kept in the model folder is
    # not part of the model.
    if bundle is None or not model.is_dir():
        return set()
    try:
        return {bundle.resolve().relative_to(model.resolve()).as_posix()}
    except ValueError:
        return set()


def sign_model(
    path: Path,
    private_key: ec.EllipticCurvePrivateKey,
    *,
    model_name: str | None = None,
    facts: ModelFacts | None = None,
    ignore_paths: Iterable[str | os.PathLike[str]] = (),
    bundle_path: Path | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """Hash a model file or folder and sign an OMS bundle for it.

    Args:
        path: the model file or folder.
        private_key: the ECDSA P-256 signing key.
        model_name: subject name; default the last component of ``path``.
        facts: release facts to sign in the ``"modelreg"`` predicate field.
        ignore_paths: paths inside the folder to leave out (relative to it, or
            absolute); ``.git``, ``.gitattributes``, ``.github`` and ``.gitignore``
            always are, as with ``model_signing``.  Recorded in the statement, so
            verifiers skip them too.
        bundle_path: where the bundle will be written; ignored (and recorded) when it
            lies inside the model folder, like ``model_signing --signature``.
        workers: hashing threads (default :func:`default_workers`).

    Returns:
        The bundle's JSON object (write it with :func:`write_bundle`).

    Raises:
        KeyMaterialError: the key is not ECDSA P-256.
        ValueError: an empty model name, an ignore path outside the model, or ignore
            paths for a single file.
        FileNotFoundError: ``path`` does not exist.
        SigningError: the model holds a symlink or a special file, or no file at all.
        OSError: a file cannot be read.
    """
    check_p256(private_key, "private key")
    name = model_name_of(path) if model_name is None else model_name
    if not name:
        raise UsageError(f"{path}: the model needs a non-empty name")
    ignore = _relative_ignores(path, ignore_paths)
    if ignore and path.is_file():
        raise UsageError(f"{path}: a single-file model has no paths to ignore")
    ignore |= set(GIT_PATHS) | _bundle_inside(path, bundle_path)
    files = list_model_files(path, ignore, error=SigningError)
    if not files:
        # Both tools would verify an empty signature against any empty folder: useless.
        raise SigningError(f"{path}: no files to sign (after ignores)")
    digests = sha256_files(files.values(), workers=workers or default_workers())
    by_name = {name: digests[p] for name, p in files.items()}
    statement = build_statement(name, by_name, ignore, facts)
    return build_bundle(statement, private_key)


def sign_files(
    files: Mapping[str, Path],
    private_key: ec.EllipticCurvePrivateKey,
    *,
    model_name: str,
    facts: ModelFacts | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """Sign an OMS bundle over a named set of files, as if they were one model folder.

    A model stored with ONNX external data is its ``.onnx`` and the data files beside
    it; its folder also holds other versions, so it is not walked: the files are named
    here.  The bundle is the ``files`` serialization ``model_signing`` would write for a
    folder holding exactly these files, so ``model_signing verify key`` accepts it for
    one (``.git`` and friends ignored, as it does).

    Args:
        files: each file by its resource name (a plain name or relative POSIX path).
        private_key: the ECDSA P-256 signing key.
        model_name: the subject name.
        facts: release facts to sign in the ``"modelreg"`` predicate field.
        workers: hashing threads (default :func:`default_workers`).

    Returns:
        The bundle's JSON object.

    Raises:
        KeyMaterialError: the key is not ECDSA P-256.
        ValueError: no files, an empty model name, or a name that is not a clean
            relative path.
        OSError: a file cannot be read.
    """
    check_p256(private_key, "private key")
    if not files or not model_name:
        raise UsageError("sign_files needs files and a model name")
    for name in files:
        parts = name.split("/")
        if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise UsageError(f"resource name {name!r} is not a clean relative path")
    digests = sha256_files(files.values(), workers=workers or default_workers())
    by_name = {name: digests[p] for name, p in files.items()}
    statement = build_statement(model_name, by_name, set(GIT_PATHS), facts)
    return build_bundle(statement, private_key)


def write_bundle(bundle: Mapping[str, Any], dest: Path) -> None:
    """Write a bundle atomically as compact JSON (as ``model_signing`` does).

    Raises:
        OSError: the destination cannot be written.
    """
    write_atomic(dest, json.dumps(bundle, separators=(",", ":")).encode(), mode=0o644)


def read_bundle(path: Path, limits: OmsLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Read a bundle file, refusing what would cost more than ``limits`` before parsing.

    The file is opened without following a link and must be a regular file (a FIFO
    would block, a device never end); its size is checked on the open descriptor
    before any byte is read, and its JSON values are counted before it is parsed.

    Raises:
        VerificationError: a link or not a regular file, over
            ``limits.max_bundle_bytes`` or ``limits.max_bundle_values``, not JSON, not
            an object.
        FileNotFoundError: the file does not exist.
        IsADirectoryError: ``path`` is a folder.
        OSError: the file cannot be read.
    """
    try:
        data = read_regular(path, max_bytes=limits.max_bundle_bytes)
    except FileTooLargeError as e:
        raise VerificationError(
            f"bundle is {e.size} bytes, over the {e.limit} allowed", str(path)
        ) from None
    except UnsafeFileError as e:
        raise VerificationError(f"bundle {e.reason}", str(path)) from None
    check_bundle_values(data, limits, str(path))
    value = loads_strict(data, str(path))
    if not isinstance(value, dict):
        raise VerificationError("bundle must be a JSON object", str(path))
    return value


def public_key_from(
    source: Path | SSlibKey | ec.EllipticCurvePublicKey,
) -> ec.EllipticCurvePublicKey:
    """An ECDSA P-256 public key from a PEM file, a TUF key or a ``cryptography`` key.

    Raises:
        KeyMaterialError: unreadable, malformed or not P-256.
    """
    if isinstance(source, ec.EllipticCurvePublicKey):
        check_p256(source, "public key")
        return source
    sslib = keys.load_public_key(source) if isinstance(source, Path) else source
    if sslib.scheme != keys.SCHEME:
        raise KeyMaterialError(f"key {sslib.keyid}: scheme {sslib.scheme}, expected {keys.SCHEME}")
    try:
        public = serialization.load_pem_public_key(sslib.keyval["public"].encode())
    except (KeyError, AttributeError, ValueError, UnsupportedAlgorithm):
        raise KeyMaterialError(f"key {sslib.keyid}: not a PEM public key") from None
    if not isinstance(public, ec.EllipticCurvePublicKey):
        raise KeyMaterialError(f"key {sslib.keyid}: expected an ECDSA P-256 key")
    check_p256(public, f"key {sslib.keyid}")
    return public


def verify_model(
    path: Path,
    bundle: Path | Mapping[str, Any],
    public_key: Path | SSlibKey | ec.EllipticCurvePublicKey,
    *,
    ignore_paths: Iterable[str | os.PathLike[str]] = (),
    limits: OmsLimits = DEFAULT_LIMITS,
    workers: int | None = None,
) -> VerifiedModel:
    """Verify a model file or folder against an OMS bundle signed by ``public_key``.

    The file set must be exactly the signed one, less the paths the statement ignores,
    ``ignore_paths`` and the bundle file itself when it lies in the model folder.  For a
    bundle over an ``.onnx`` and its external data files (:func:`sign_files`), ``path``
    may be the ``.onnx``: the other signed files are then looked for beside it.

    Args:
        path: the model file or folder.
        bundle: the bundle file, or its parsed JSON object.
        public_key: the trusted key (PEM file, TUF key or ``cryptography`` key).
        ignore_paths: more paths to leave out (relative to the folder, or absolute).
        limits: bounds on the untrusted bundle.
        workers: hashing threads (default :func:`default_workers`).

    Returns:
        The signed subject, digests and facts.

    Raises:
        KeyMaterialError: ``public_key`` cannot be loaded or is not P-256.
        SignatureError: the bundle is not signed by ``public_key``.
        VerificationError: the bundle is malformed, over ``limits``, unsupported, a
            link or not a regular file, or the model holds a symlink or special file.
        FileSetError: files are missing or extra.
        DigestMismatchError: a file's content differs from what was signed.
        ValueError: an ignore path outside the model.
        FileNotFoundError: ``path`` does not exist.
        OSError: the bundle or a model file cannot be read.
    """
    key = public_key_from(public_key)
    if isinstance(bundle, Path):
        signed = open_bundle(read_bundle(bundle, limits), key, limits, str(bundle))
    else:
        signed = open_bundle(bundle, key, limits)
    ignore = set(signed.ignore_paths) | _relative_ignores(path, ignore_paths)
    if isinstance(bundle, Path):
        ignore |= _bundle_inside(path, bundle)
    if path.is_file() and SINGLE_FILE not in signed.files and path.name in signed.files:
        files = _beside(path, signed.files)  # an .onnx with its external data files
    else:
        files = list_model_files(path, ignore)
    check_file_set(signed.files, files, str(path))
    digests = sha256_files(files.values(), workers=workers or default_workers())
    check_digests(signed.files, {name: digests[p] for name, p in files.items()}, str(path))
    files_view = MappingProxyType(dict(signed.files))
    return VerifiedModel(path, signed.name, signed.digest, files_view, signed.facts)


def _beside(path: Path, signed: Mapping[str, str]) -> dict[str, Path]:
    """The signed files found beside ``path`` (a bundle from :func:`sign_files` of an
    ``.onnx`` and its ONNX external data): plain names only, regular files, no links.

    Raises:
        VerificationError: a signed name is a path, or the file is a link or not regular.
    """
    files: dict[str, Path] = {}
    for name in signed:
        if "/" in name or name in (".", ".."):
            raise VerificationError(f"{name}: not a file beside the model", str(path))
        candidate = path.parent / name
        if candidate.is_symlink():
            raise VerificationError(f"{name}: symbolic links are not allowed in a model", str(path))
        if candidate.is_file():
            files[name] = candidate
        elif candidate.exists():
            raise VerificationError(f"{name}: not a regular file", str(path))
    return files


__all__ = [
    "BUNDLE_MEDIA_TYPE",
    "DEFAULT_LIMITS",
    "FACTS_FIELD",
    "GIT_PATHS",
    "PAYLOAD_TYPE",
    "PREDICATE_TYPE",
    "SINGLE_FILE",
    "STATEMENT_TYPE",
    "ModelFacts",
    "OmsLimits",
    "SignedManifest",
    "VerifiedModel",
    "build_bundle",
    "build_statement",
    "check_bundle_values",
    "check_digests",
    "check_file_set",
    "default_workers",
    "key_hint",
    "list_model_files",
    "model_name_of",
    "open_bundle",
    "pae",
    "parse_statement",
    "public_key_from",
    "read_bundle",
    "root_digest",
    "sign_files",
    "sign_model",
    "verify_model",
    "write_bundle",
]
