"""What the next TUF metadata of a model repository should be: decisions only, no I/O.

Stable API.  ``signing.tuf_repo`` reads and writes ``trust/metadata/`` and calls these
functions: building, signing and verifying metadata objects and bytes.

Roles: ``root`` (offline keys, threshold >= 1) delegates ``targets``, ``snapshot`` and
``timestamp`` (online keys, held by CI).  Consistent snapshots are on: metadata files
are ``N.<role>.json`` (``timestamp.json`` excepted) and target files are stored as
``<dir>/<sha256>.<basename>``.  Snapshot and timestamp list the file they point to
with its version, length and sha256.

Verifying follows the device: online roles count only under the newest root.  Whether
a verified state may be extended (never reset, replaced or rewound) is decided in
``signing.tuf_history``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import IO, Final, TypeVar

from pydantic import TypeAdapter, ValidationError
from securesystemslib.signer import Signer
from tuf.api.exceptions import LengthOrHashMismatchError, RepositoryError, UnsignedMetadataError

# tuf.api.metadata is python-tuf's documented API; it re-exports these names from a
# private module without __all__, which mypy --strict flags (see pyproject.toml).
from tuf.api.metadata import (
    SPECIFICATION_VERSION,
    Key,
    Metadata,
    MetaFile,
    Role,
    Root,
    Signed,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization.json import JSONSerializer

from registry.errors import UsageError
from registry.schema import RepoPath
from signing.errors import (
    DigestMismatchError,
    KeyMaterialError,
    RollbackError,
    SignatureError,
    StaleKeyError,
    VerificationError,
)
from signing.tuf_facts import CHANNELS_PATH, ChannelsDoc, TargetFacts, check_channels_successor

METADATA_DIR: Final = "trust/metadata"
"""Where the signed metadata lives, relative to the model repository's root."""
TARGETS_DIR: Final = "targets"
"""Where target files live, relative to the artifact remote's root."""
MIRROR_DIR: Final = "metadata"
"""Where ``publish`` mirrors the signed metadata, relative to the artifact remote's root
(the exact bytes of the files a TUF client fetches; a device may follow it there instead
of the git repository)."""
SPEC_VERSION: Final = ".".join(SPECIFICATION_VERSION)
ONLINE_ROLES: Final = ("targets", "snapshot", "timestamp")
"""Online roles in signing order: each one's new version is listed by the next."""
HASH_ALGORITHM: Final = "sha256"
RESTORE: Final = "restore the metadata folder from the last good commit"
"""What an operator does when the metadata on disk is refused (error messages end with it)."""
RECOVER: Final = f"{RESTORE} and re-run the key rotation or release if one stopped half-way"
"""The same, where an interrupted rotation or release may have left the files."""

R = TypeVar("R", Root, Timestamp, Snapshot, Targets)
Online = Metadata[Targets] | Metadata[Snapshot] | Metadata[Timestamp]
"""Metadata of an online role."""


@dataclass(frozen=True)
class Expiry:
    """How long each role's metadata stays valid after it is signed.

    A device refuses expired metadata (freeze attack), so the online roles are
    re-signed before they run out: ``publish`` renews a role once less than half of
    its period is left, and the scheduled ``refresh_timestamp`` re-signs the
    timestamp (and whatever would expire before the new timestamp does).
    """

    root: timedelta = timedelta(days=365)
    targets: timedelta = timedelta(days=90)
    snapshot: timedelta = timedelta(days=7)
    timestamp: timedelta = timedelta(days=1)

    def __post_init__(self) -> None:
        for role in ("root", *ONLINE_ROLES):
            if self.period(role) <= timedelta(0):
                raise UsageError(f"expiry of {role} must be positive")

    def period(self, role: str) -> timedelta:
        """Validity period of ``role``.

        Raises:
            ValueError: ``role`` is not a top-level role.
        """
        if role not in ("root", *ONLINE_ROLES):
            raise UsageError(f"unknown role {role!r}")
        period: timedelta = getattr(self, role)
        return period


_TARGET_PATH: Final = TypeAdapter(RepoPath)


def check_target_path(path: str) -> str:
    """Validate a target path: a clean relative POSIX path (no ``..``, no leading ``/``).

    Raises:
        ValueError: the path is not clean.
    """
    try:
        return _TARGET_PATH.validate_python(path)
    except ValidationError as e:
        raise ValueError(f"target path {path!r}: {e.errors()[0]['msg']}") from None


def target_file(path: str, data: bytes | IO[bytes], facts: TargetFacts) -> TargetFile:
    """The signed description (length, sha256, facts) of ``data`` published at ``path``."""
    info = TargetFile.from_data(check_target_path(path), data, [HASH_ALGORITHM])
    info.unrecognized_fields["custom"] = facts.to_custom()
    return info


def channels_target(doc: ChannelsDoc) -> tuple[bytes, TargetFile]:
    """The bytes of ``channels.json`` and their signed description."""
    data = doc.to_bytes()
    return data, target_file(
        CHANNELS_PATH, data, TargetFacts(kind="channels", sequence=doc.sequence)
    )


def check_channels_update(
    current: TargetFile | None, doc: ChannelsDoc, previous: ChannelsDoc | None
) -> None:
    """Check that ``doc`` may replace the signed ``current`` channels document.

    Its sequence must exceed the signed one; when the caller passes the signed
    document as ``previous``, every assignment's sequence is checked too.

    Raises:
        RollbackError: a sequence does not grow.
        ValueError: ``previous`` is not the signed document.
    """
    if current is None:
        return
    signed_seq = TargetFacts.from_custom(current.custom).sequence or 0
    if doc.sequence <= signed_seq:
        raise RollbackError(
            f"sequence {doc.sequence} does not follow the signed {signed_seq}", CHANNELS_PATH
        )
    if previous is not None:
        if channels_target(previous)[1] != current:
            raise ValueError("previous is not the signed channels document")
        check_channels_successor(previous, doc)


def stored_name(info: TargetFile) -> str:
    """Where a target lives under the remote's ``targets/``: ``<dir>/<sha256>.<name>``."""
    parent, sep, name = info.path.rpartition("/")
    return f"{parent}{sep}{info.hashes[HASH_ALGORITHM]}.{name}"


# --- Next metadata ----------------------------------------------------------------------


def new_root(
    root_keys: Sequence[Key],
    threshold: int,
    online_keys: Mapping[str, Key],
    expires: datetime,
    version: int = 1,
) -> Root:
    """A root that trusts ``root_keys`` (``threshold`` of them) and one key per online role.

    Raises:
        ValueError: threshold outside 1..len(root_keys), or an online role without a key.
    """
    if not 1 <= threshold <= len({k.keyid for k in root_keys}):
        raise UsageError(f"root threshold {threshold} needs 1..{len(root_keys)} distinct keys")
    if set(online_keys) != set(ONLINE_ROLES):
        raise UsageError(f"online keys must be given for exactly {', '.join(ONLINE_ROLES)}")
    roles = {"root": Role([], threshold), **{r: Role([], 1) for r in ONLINE_ROLES}}
    root = Root(version, SPEC_VERSION, expires, {}, roles, consistent_snapshot=True)
    for key in root_keys:
        root.add_key(key, "root")
    for role, key in online_keys.items():
        root.add_key(key, role)
    return root


def successor_root(
    current: Root,
    expires: datetime,
    *,
    remove: Mapping[str, Sequence[str]] | None = None,
    add: Mapping[str, Sequence[Key]] | None = None,
    thresholds: Mapping[str, int] | None = None,
) -> Root:
    """Root version N+1: ``current`` with keys removed/added and thresholds changed.

    Raises:
        ValueError: a removed key is not in its role, or a role would be left with
            fewer keys than its threshold (devices could never verify it again).
    """
    # deepcopy, not to_dict/from_dict: those share the roles' keyid lists
    root = copy.deepcopy(current)
    root.version = current.version + 1
    root.expires = expires
    for role, keyids in (remove or {}).items():
        for keyid in keyids:
            root.revoke_key(keyid, role)
    for role, keys in (add or {}).items():
        for key in keys:
            root.add_key(key, role)
    for role, threshold in (thresholds or {}).items():
        root.roles[role].threshold = threshold
    for role, spec in root.roles.items():
        if not 1 <= spec.threshold <= len(spec.keyids):
            raise UsageError(
                f"{role} would have {len(spec.keyids)} key(s) for threshold {spec.threshold}"
            )
    return root


# The role each online role lists: a new version of it forces a new version of the lister.
_LISTS: Final = {"snapshot": "targets", "timestamp": "snapshot"}


def renewal_due(signed: Signed, now: datetime, period: timedelta) -> bool:
    """Whether less than half of a role's validity period is left."""
    return signed.expires - now < period / 2


def plan_release(
    current: Mapping[str, Signed | None],
    *,
    now: datetime,
    expiry: Expiry,
    can_sign: Set[str],
    targets_changed: bool = False,
    force: Set[str] = frozenset(),
    renew_early: bool = True,
) -> tuple[str, ...]:
    """Which online roles get a new version, in signing order.

    A role *must* be re-signed when it is missing, forced (e.g. its key was
    replaced), its content changed (new targets; a new version of the role it lists)
    or it would expire before a timestamp signed now does.  With ``renew_early`` it is
    also re-signed once less than half of its period is left, if its key is at hand.
    Nothing else changes a role, so planning twice in a row plans nothing the second
    time.

    Raises:
        KeyMaterialError: a role must be re-signed but its key is not in ``can_sign``.
    """
    horizon = now + expiry.timestamp
    plan: list[str] = []
    for role in ONLINE_ROLES:
        signed = current.get(role)
        listed_changed = _LISTS.get(role) in plan
        must = (
            signed is None
            or role in force
            or listed_changed
            or (role == "targets" and targets_changed)
            or (role != "timestamp" and signed.expires < horizon)
            or (role == "timestamp" and signed.expires <= now)
        )
        want = must or (
            renew_early and signed is not None and renewal_due(signed, now, expiry.period(role))
        )
        if must and role not in can_sign:
            raise KeyMaterialError(f"{role} metadata must be re-signed: no {role} key given")
        if want and role in can_sign:
            plan.append(role)
    return tuple(plan)


def build_targets(version: int, expires: datetime, files: Mapping[str, TargetFile]) -> Targets:
    """Targets metadata listing ``files``."""
    return Targets(version, SPEC_VERSION, expires, dict(sorted(files.items())))


def build_snapshot(version: int, expires: datetime, targets_meta: MetaFile) -> Snapshot:
    """Snapshot metadata listing the targets metadata (version, length and hash).

    The length and hash bind the exact targets file: an old targets file under the
    new name fails (mix-and-match), and so does a longer one (endless data).
    """
    return Snapshot(version, SPEC_VERSION, expires, {"targets.json": targets_meta})


def build_timestamp(version: int, expires: datetime, snapshot_meta: MetaFile) -> Timestamp:
    """Timestamp metadata pointing at one snapshot (version, length and hash)."""
    return Timestamp(version, SPEC_VERSION, expires, snapshot_meta)


def meta_file(version: int, data: bytes) -> MetaFile:
    """How a snapshot or timestamp lists a metadata file serialized as ``data``."""
    return MetaFile.from_data(version, data, [HASH_ALGORITHM])


# --- Signing ----------------------------------------------------------------------------


def _sign_all(md: Metadata[R], signers: Sequence[Signer]) -> None:
    for signer in signers:
        try:
            md.sign(signer, append=True)
        except UnsignedMetadataError as e:
            raise KeyMaterialError(f"{md.signed.type}: signing failed ({e})") from None


def sign_role(signed: R, signers: Sequence[Signer], root: Root) -> Metadata[R]:
    """Sign an online role's metadata and check that ``root`` would accept it.

    Raises:
        KeyMaterialError: a signer's key is not one of the role's keys, or the signers
            do not reach the role's threshold.
    """
    role = root.get_delegated_role(signed.type)
    for signer in signers:
        if signer.public_key.keyid not in role.keyids:
            raise KeyMaterialError(
                f"{signed.type}: key {signer.public_key.keyid[:12]} is not a {signed.type} key "
                f"of root v{root.version}"
            )
    md = Metadata(signed)
    _sign_all(md, signers)
    result = root.get_verification_result(signed.type, md.signed_bytes, md.signatures)
    if not result:
        raise KeyMaterialError(
            f"{signed.type}: {len(result.signed)} of the {result.threshold} signatures needed"
        )
    return md


def sign_root(root: Root, signers: Sequence[Signer], previous: Root | None) -> Metadata[Root]:
    """Sign a root with a threshold of the previous root's keys and of its own.

    Raises:
        KeyMaterialError: a signer's key belongs to neither root, or either threshold
            is not reached.
    """
    known = set(root.roles["root"].keyids)
    if previous is not None:
        known |= set(previous.roles["root"].keyids)
    for signer in signers:
        if signer.public_key.keyid not in known:
            raise KeyMaterialError(
                f"root: key {signer.public_key.keyid[:12]} is not a root key of "
                f"v{root.version} or the version before"
            )
    md = Metadata(root)
    _sign_all(md, signers)
    result = root.get_root_verification_result(previous, md.signed_bytes, md.signatures)
    if not result:
        old, new = result.first, result.second
        raise KeyMaterialError(
            f"root v{root.version}: signed by {len(old.signed)}/{old.threshold} of the "
            f"previous root keys and {len(new.signed)}/{new.threshold} of its own"
        )
    return md


def sign_online(
    role: str,
    version: int,
    expires: datetime,
    root: Root,
    signer: Signer,
    *,
    files: Mapping[str, TargetFile],
    listed: MetaFile | None,
) -> tuple[bytes, Online]:
    """Build, sign and serialize version ``version`` of an online role.

    ``files`` are the targets (for ``targets``); ``listed`` is how the role lists the
    file below it (targets metadata for ``snapshot``, snapshot for ``timestamp``).

    Raises:
        KeyMaterialError: as :func:`sign_role`.
        ValueError: a snapshot or timestamp without ``listed``.
    """
    if role == "targets":
        targets = sign_role(build_targets(version, expires, files), [signer], root)
        return to_bytes(targets), targets
    if listed is None:
        raise ValueError(f"{role}: nothing to list")
    if role == "snapshot":
        snapshot = sign_role(build_snapshot(version, expires, listed), [signer], root)
        return to_bytes(snapshot), snapshot
    timestamp = sign_role(build_timestamp(version, expires, listed), [signer], root)
    return to_bytes(timestamp), timestamp


def to_bytes(md: Metadata[R]) -> bytes:
    """Serialized metadata as stored in git: indented, sorted keys (readable diffs)."""
    return md.to_bytes(JSONSerializer(compact=False))


# --- Verifying (what the repository side reads back from git) -----------------------------


def parse(data: bytes, kind: type[R], where: str) -> Metadata[R]:
    """Deserialize metadata of role type ``kind`` (signatures not checked).

    Raises:
        VerificationError: not TUF metadata, or metadata of another role.
    """
    try:
        md = Metadata[R].from_bytes(data)
    except RepositoryError as e:  # DeserializationError
        raise VerificationError(f"not valid TUF metadata ({e})", where) from e
    if not isinstance(md.signed, kind):
        raise VerificationError(f"expected {kind.type} metadata, got {md.signed.type}", where)
    return md


def verifies(root: Root, md: Metadata[R] | Online) -> bool:
    """Whether ``md`` carries a threshold of signatures of its role's keys in ``root``."""
    return bool(root.get_verification_result(md.signed.type, md.signed_bytes, md.signatures))


def verify_root_chain(files: Sequence[tuple[str, bytes]]) -> list[Metadata[Root]]:
    """Verify roots 1..N: each signed by a threshold of its predecessor's keys and its own.

    Raises:
        VerificationError: a file is not root metadata or holds another version.
        SignatureError: a root is not signed as the chain requires.
    """
    roots: list[Metadata[Root]] = []
    for number, (where, data) in enumerate(files, start=1):
        md = parse(data, Root, where)
        if md.signed.version != number:
            raise VerificationError(f"holds version {md.signed.version}", where)
        previous = roots[-1].signed if roots else None
        result = md.signed.get_root_verification_result(previous, md.signed_bytes, md.signatures)
        if not result:
            raise SignatureError(
                "not signed by a threshold of the previous root's keys and its own", where
            )
        roots.append(md)
    return roots


def verify_listed(
    data: bytes,
    kind: type[R],
    roots: Sequence[Metadata[Root]],
    where: str,
    meta: MetaFile | None = None,
) -> Metadata[R]:
    """Verify an online role's file against how it is listed (``meta``) and signed.

    Only the newest root's keys count, as on a device: metadata signed with keys that
    a rotation or revocation replaced must never be extended or re-signed by CI, or
    whoever holds the old keys could get anything re-signed under the new ones.  The
    older roots only name the rotated keys in the error.

    Raises:
        DigestMismatchError: length or hash differs from ``meta``.
        VerificationError: not metadata of ``kind``, or another version than listed.
        StaleKeyError: signed by the role's keys of an older root only.
        SignatureError: not signed by the role's keys of any root.
    """
    if meta is not None:
        try:
            meta.verify_length_and_hashes(data)
        except LengthOrHashMismatchError as e:
            raise DigestMismatchError(str(e), where) from e
    md = parse(data, kind, where)
    if meta is not None and md.signed.version != meta.version:
        raise VerificationError(
            f"holds version {md.signed.version}, listed as {meta.version}", where
        )
    newest = roots[-1].signed
    if verifies(newest, md):
        return md
    for old in reversed(roots[:-1]):
        if verifies(old.signed, md):
            raise StaleKeyError(
                f"signed by {kind.type} keys of root v{old.signed.version} that root "
                f"v{newest.version} no longer trusts (rotated or revoked); such metadata is "
                f"never loaded or re-signed: {RECOVER}",
                where,
            )
    raise SignatureError(
        f"not signed by the {kind.type} keys of root v{newest.version} (the newest root)", where
    )
