"""A model repository's signed TUF metadata: load, publish, refresh, rotate, revoke.

Stable API.  Used by CI (``modelreg ci release``, ``modelreg freshness refresh``) and by
``modelreg keys``.  What the next metadata should be is decided in
``signing.tuf_roles`` (no I/O); this module reads and writes the files.

On disk, in the model repository (committed to git)::

    trust/metadata/1.root.json, 2.root.json, ...   every root, for rotation chains
    trust/metadata/N.targets.json                   consistent snapshots: versioned names
    trust/metadata/N.snapshot.json
    trust/metadata/timestamp.json                   the only unversioned file

and on the artifact remote (a local directory in the embedded default)::

    targets/<dir>/<sha256>.<name>                   e.g. targets/models/mlp/<sha>.1.0.0.onnx
    targets/<sha256>.channels.json
    metadata/                                       a mirror of the metadata devices fetch
                                                    (:meth:`TrustRepo.mirror_files`, uploaded
                                                    by ``pipelines.publish``)

Writes are atomic, and ``timestamp.json`` is written last: a reader that sees the new
timestamp finds every file it points to.  Old versions are kept (they are small, and a
device that is a few versions behind may still be reading them) and a versioned file is
never replaced: a version is signed once.

Loading trusts only the newest root (as a device does) and refuses a file set that a
release never leaves behind: versioned files without ``timestamp.json`` (deleted) or
above what it points to (rewound).  :meth:`TrustRepo.check_follows` and
:meth:`TrustRepo.check_floor` compare the loaded state with what was already released.

A key rotation writes, in this order: the re-signed versioned role files, the new
root, then ``timestamp.json``.  If it stops half-way the folder holds new untracked
files that :meth:`TrustRepo.load` refuses (versioned files above the timestamp's, or a
new root whose keys did not sign the timestamp chain): it never falls back on the
replaced keys.  The operator then restores the metadata folder from the last commit
(``git checkout -- trust/metadata && git clean -f trust/metadata``) and runs the
command again; the key folder is only changed once the metadata is written.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Final, TypeVar

from securesystemslib.signer import Signer
from tuf.api.exceptions import LengthOrHashMismatchError

# Re-exported by python-tuf's documented module without __all__ (see signing.tuf_roles).
from tuf.api.metadata import (
    Key,
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)

from registry.atomic import AtomicFile, write_atomic
from registry.errors import FileTooLargeError, UnsafeFileError, UsageError
from registry.safe_io import read_regular
from signing.errors import DigestMismatchError, FileSetError, HistoryError, VerificationError
from signing.tuf_facts import CHANNELS_PATH, ChannelsDoc, TargetFacts
from signing.tuf_history import VERSIONED_ROLES, TrustState, check_versioned_files
from signing.tuf_history import check_floor as _check_floor
from signing.tuf_history import check_follows as _check_follows
from signing.tuf_roles import (
    ONLINE_ROLES,
    RECOVER,
    TARGETS_DIR,
    Expiry,
    Online,
    channels_target,
    check_channels_update,
    meta_file,
    new_root,
    parse,
    plan_release,
    sign_online,
    sign_root,
    stored_name,
    successor_root,
    target_file,
    to_bytes,
    verifies,
    verify_listed,
    verify_root_chain,
)

_ROOT_FILE: Final = re.compile(r"^([1-9][0-9]*)\.root\.json$")
_VERSIONED_FILE: Final = re.compile(r"^([1-9][0-9]*)\.(snapshot|targets)\.json$")
R = TypeVar("R", Root, Timestamp, Snapshot, Targets)


@dataclass(frozen=True)
class PublishResult:
    """What a publish, refresh or revocation wrote.

    Attributes:
        versions: new version of each role that was re-signed.
        written: metadata files written, in write order.
    """

    versions: Mapping[str, int]
    written: tuple[Path, ...]

    @property
    def changed(self) -> bool:
        """Whether anything was written."""
        return bool(self.written)


def _utc(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(UTC)
    if now.tzinfo is None:
        raise UsageError("now must be timezone-aware")
    return now.astimezone(UTC)


MAX_METADATA_BYTES: Final = 64 << 20
"""Largest metadata file read (a targets file of tens of thousands of versions is
megabytes; devices cap what they fetch lower, see ``edge_sync.sync.limits``)."""


def _read(path: Path, max_bytes: int = MAX_METADATA_BYTES) -> bytes:
    """``path``'s bytes: a regular file, not a link (the metadata folder is a git
    checkout a pull request wrote to), at most ``max_bytes``."""
    try:
        return read_regular(path, max_bytes=max_bytes)
    except FileNotFoundError:
        raise FileSetError("missing: the metadata that lists it points to it", str(path)) from None
    except FileTooLargeError as e:
        raise DigestMismatchError(
            f"is {e.size} bytes, more than the {e.limit} allowed", str(path)
        ) from None
    except UnsafeFileError as e:
        raise FileSetError(e.reason, str(path)) from None


class TrustRepo:
    """The TUF metadata of one model repository, with the targets staged for release.

    Create it with :meth:`load` or :meth:`initialize`; stage files with
    :meth:`add_target` and :meth:`set_channels`; sign them with :meth:`publish`; copy
    the staged files to the artifact remote with :meth:`write_targets_to`.
    """

    def __init__(
        self,
        metadata_dir: Path,
        roots: list[tuple[bytes, Metadata[Root]]],
        online: dict[str, tuple[bytes, Online]],
        expiry: Expiry,
    ) -> None:
        """Use :meth:`load` or :meth:`initialize`; this takes already-verified state.

        ``roots`` pairs each root's stored bytes with its metadata, oldest first;
        ``online`` does the same for each online role's current version.
        """
        self.metadata_dir = metadata_dir
        self.expiry = expiry
        self._root_bytes = [data for data, _ in roots]
        self._roots = [md for _, md in roots]
        self._online = {role: md for role, (_, md) in online.items()}
        self._online_bytes = {role: data for role, (data, _) in online.items()}
        self._staged: dict[str, TargetFile] = (
            dict(self._signed(Targets).targets) if "targets" in online else {}
        )
        self._sources: dict[str, bytes | Path] = {}

    # --- construction -------------------------------------------------------------------

    @classmethod
    def initialize(
        cls,
        metadata_dir: Path,
        root_signers: Sequence[Signer],
        root_threshold: int,
        online_keys: Mapping[str, Key],
        *,
        expiry: Expiry | None = None,
        now: datetime | None = None,
    ) -> TrustRepo:
        """Create ``1.root.json``: root trusts the signers' keys and one key per online role.

        The online roles get their first versions at the first :meth:`publish`.

        Raises:
            ValueError: already initialized, a threshold out of range, or an online
                role without a key.
            KeyMaterialError: the signers do not reach ``root_threshold``.
            OSError: the folder is not writable.
        """
        expiry = expiry or Expiry()
        if (metadata_dir / "1.root.json").exists():
            raise UsageError(f"{metadata_dir}: already initialized (1.root.json exists)")
        root = new_root(
            [s.public_key for s in root_signers],
            root_threshold,
            online_keys,
            _utc(now) + expiry.root,
        )
        md = sign_root(root, root_signers, None)
        metadata_dir.mkdir(parents=True, exist_ok=True)
        data = to_bytes(md)
        write_atomic(metadata_dir / "1.root.json", data)
        return cls(metadata_dir, [(data, md)], {}, expiry)

    @classmethod
    def load(cls, metadata_dir: Path, *, expiry: Expiry | None = None) -> TrustRepo:
        """Load and verify the metadata in ``metadata_dir``.

        Verifies the root chain and that each online role is signed by its keys in
        the newest root, so that CI never signs on top of metadata that someone
        edited in git or wrote with replaced keys; and that the versioned files agree
        with ``timestamp.json`` (not deleted, not rewound).  Expiry is not checked:
        refreshing expired metadata is one reason to load it.

        Raises:
            FileSetError: no ``1.root.json``, a gap in the root versions, a file that
                the timestamp or snapshot points to is missing, or versioned files
                exist without ``timestamp.json``.
            RollbackError: a versioned file is above the version the timestamp chain
                points to.
            StaleKeyError: a role is signed only by keys of an older root.
            SignatureError: a root or role is not signed by a threshold of its keys.
            DigestMismatchError: a file differs from the length/hash listed for it.
            VerificationError: a file is not TUF metadata or has the wrong version.
            OSError: the folder cannot be read.
        """
        root_files = [(str(path), _read(path)) for path in _root_files(metadata_dir)]
        roots = verify_root_chain(root_files)
        online: dict[str, tuple[bytes, Online]] = {}
        listed: dict[str, int] | None = None
        # Each file is checked (listed length/hash, version, signature) before the
        # next one is read, in the order a device reads them.
        ts_path = metadata_dir / "timestamp.json"
        if os.path.lexists(ts_path):  # a link is refused by _read, not taken for absent
            ts_data = _read(ts_path)
            ts = verify_listed(ts_data, Timestamp, roots, str(ts_path))
            meta = ts.signed.snapshot_meta
            snap_path = metadata_dir / f"{meta.version}.snapshot.json"
            snap_data = _read(snap_path)
            snap = verify_listed(snap_data, Snapshot, roots, str(snap_path), meta)
            tmeta = snap.signed.meta.get("targets.json")
            if tmeta is None:
                raise FileSetError("does not list targets.json", str(snap_path))
            targets_path = metadata_dir / f"{tmeta.version}.targets.json"
            targets_data = _read(targets_path)
            targets = verify_listed(targets_data, Targets, roots, str(targets_path), tmeta)
            online = {
                "timestamp": (ts_data, ts),
                "snapshot": (snap_data, snap),
                "targets": (targets_data, targets),
            }
            listed = {"snapshot": meta.version, "targets": tmeta.version}
        check_versioned_files(_versioned_files(metadata_dir), listed, str(metadata_dir))
        pairs = [(data, md) for (_, data), md in zip(root_files, roots, strict=True)]
        return cls(metadata_dir, pairs, online, expiry or Expiry())

    # --- state --------------------------------------------------------------------------

    @property
    def root(self) -> Root:
        """The newest root."""
        return self._roots[-1].signed

    def version(self, role: str) -> int:
        """Current version of ``role`` (0 when it was never published)."""
        if role == "root":
            return self.root.version
        md = self._online.get(role)
        return md.signed.version if md is not None else 0

    @property
    def targets(self) -> Mapping[str, TargetFile]:
        """Staged targets: the published ones plus those added since (read-only view)."""
        return MappingProxyType(self._staged)

    def published(self, path: str) -> TargetFile | None:
        """The signed description of ``path``, or ``None`` when it is not published."""
        return self._signed(Targets).targets.get(path) if "targets" in self._online else None

    def mirrored_timestamp(self, data: bytes) -> int | None:
        """The version of ``data`` if it is timestamp metadata signed by a threshold of
        the timestamp keys of the newest root (a copy found on a mirror: one this
        repository signed, perhaps in a run whose metadata commit was lost), else None.

        Expiry is not checked; anything unsigned, malformed or of another role is None.
        """
        try:
            md = parse(data, Timestamp, "timestamp.json")
        except VerificationError:
            return None
        return md.signed.version if verifies(self.root, md) else None

    def mirror_files(self) -> tuple[tuple[str, bytes], ...]:
        """The files a TUF client fetches, by name, with the exact bytes verified or
        signed here, in the order a mirror must upload them.

        Every root (``N.root.json``: a device walks the chain from the root it
        trusts), then the current ``N.targets.json`` and ``N.snapshot.json``, then
        ``timestamp.json`` last: a reader that sees the new timestamp finds every file
        it points to.  Empty roles (before the first release) are left out.
        """
        pairs = zip(self._root_bytes, self._roots, strict=True)
        files = [(f"{md.signed.version}.root.json", data) for data, md in pairs]
        for role in ONLINE_ROLES:  # targets, snapshot, timestamp: each listed by the next
            if role not in self._online_bytes:
                continue
            name = "timestamp.json" if role == "timestamp" else f"{self.version(role)}.{role}.json"
            files.append((name, self._online_bytes[role]))
        return tuple(files)

    @property
    def state(self) -> TrustState:
        """The signed state (stored roots, current online roles), staged files left out."""
        return TrustState(tuple(self._root_bytes), MappingProxyType(dict(self._online)))

    # --- released history ---------------------------------------------------------------

    def check_follows(self, base: TrustRepo) -> None:
        """Check that this metadata continues ``base``'s (e.g. the base branch's).

        ``base``'s roots must be a byte-identical prefix of this one's; no role version
        may be below base's, nor equal with other signed content; every target base
        released must be here unchanged (``channels.json`` may change, its sequence
        only grows).  Load ``base`` with :meth:`load` from a folder holding the
        reference metadata.

        Raises:
            RollbackError: a root or role version, or the channels sequence, is below
                base's.
            HistoryError: a released root, role version or target differs from base's,
                or a released target is missing.
        """
        _check_follows(self.state, base.state)

    def check_floor(self, floor: Mapping[str, int]) -> None:
        """Check that no role's version is below ``floor`` (role -> lowest allowed).

        The floor is the highest version of each role known to have existed (git
        history, remote).  Once this passes, every role is at or above its floor, so
        the next :meth:`publish` (current + 1) writes at least floor + 1 and never
        re-signs a version number devices may hold.

        Raises:
            RollbackError: a role is below its floor.
            ValueError: an unknown role or a negative floor.
        """
        _check_floor(self.state, floor)

    # --- staging ------------------------------------------------------------------------

    def add_target(self, path: str, source: bytes | Path, facts: TargetFacts) -> TargetFile:
        """Stage a file (bytes, or a file that is streamed) with its facts for release.

        Released files are immutable: staging the same path with the same bytes and
        facts again is a no-op, with anything else an error.

        Raises:
            ValueError: unclean path, the channels document (use :meth:`set_channels`),
                or the path is already staged with other bytes or facts.
            OSError: ``source`` cannot be read.
        """
        if path == CHANNELS_PATH or facts.kind == "channels":
            raise ValueError("stage the channels document with set_channels()")
        if isinstance(source, Path):
            with source.open("rb") as fh:
                info = target_file(path, fh, facts)
        else:
            info = target_file(path, source, facts)
        current = self._staged.get(path)
        if current is not None and current != info:
            raise ValueError(
                f"{path}: already released with other bytes or facts; released files are "
                "immutable, release a new version instead"
            )
        self._staged[path] = info
        self._sources[path] = source
        return info

    def set_channels(self, doc: ChannelsDoc, previous: ChannelsDoc | None = None) -> TargetFile:
        """Stage a new ``channels.json``.

        Staging the document already signed is a no-op.  Otherwise its sequence must
        exceed the signed one; pass the signed document as ``previous`` (see
        :meth:`load_channels`) to check every assignment's sequence too.

        Raises:
            RollbackError: the sequence does not grow.
            ValueError: ``previous`` is not the signed document.
        """
        data, info = channels_target(doc)
        current = self._staged.get(CHANNELS_PATH)
        if current != info:
            check_channels_update(current, doc, previous)
            self._staged[CHANNELS_PATH] = info
            self._sources[CHANNELS_PATH] = data
        return info

    def load_channels(self, remote_dir: Path) -> ChannelsDoc | None:
        """The signed channels document, read from the remote and verified.

        Raises:
            DigestMismatchError: the remote copy differs from the signed one.
            FileSetError: the remote has no copy.
            ValueError: the signed file is not a channels document.
        """
        if self.published(CHANNELS_PATH) is None:
            return None
        return ChannelsDoc.from_bytes(self.read_target(remote_dir, CHANNELS_PATH))

    def read_target(self, remote_dir: Path, path: str) -> bytes:
        """A published target's bytes, read from the remote and verified.

        Raises:
            FileSetError: ``path`` is not published, or the remote has no copy.
            DigestMismatchError: the remote copy differs from the signed one.
        """
        info = self.published(path)
        if info is None:
            raise FileSetError("not published", path)
        data = _read(remote_dir / TARGETS_DIR / stored_name(info), max_bytes=info.length)
        try:
            info.verify_length_and_hashes(data)
        except LengthOrHashMismatchError as e:
            raise DigestMismatchError(str(e), path) from e
        return data

    # --- signing ------------------------------------------------------------------------

    def publish(
        self,
        signers: Mapping[str, Signer],
        *,
        now: datetime | None = None,
        floor: Mapping[str, int] | None = None,
    ) -> PublishResult:
        """Sign the staged targets: new targets, snapshot and timestamp versions as needed.

        A role gets a new version only when its content changed or it is due for
        renewal (less than half its validity left), so publishing twice in a row
        writes nothing the second time.  ``floor`` names versions of online roles that
        were signed elsewhere (see :meth:`mirrored_timestamp`): a role at or below its
        floor is signed again, above it, so that devices holding those move on.

        Raises:
            KeyMaterialError: a role must be re-signed and ``signers`` lacks its key, or
                a signer's key is not the role's.
            HistoryError: a metadata file of a new version already exists (never
                replaced).
            OSError: the folder is not writable.
        """
        return self._release(signers, _utc(now), include_staged=True, floor=floor)

    def refresh_timestamp(
        self,
        timestamp_signer: Signer,
        *,
        snapshot_signer: Signer | None = None,
        targets_signer: Signer | None = None,
        now: datetime | None = None,
        floor: Mapping[str, int] | None = None,
    ) -> PublishResult:
        """Re-sign the timestamp (the scheduled freshness job), leaving staged files out.

        Snapshot and targets are re-signed too when they would expire before the new
        timestamp does; their signers are needed only then.  ``floor``: as
        :meth:`publish`.

        Raises:
            KeyMaterialError: snapshot or targets must be re-signed and their signer
                is missing, or a signer's key is not the role's.
            HistoryError: a metadata file of a new version already exists (never
                replaced).
            OSError: the folder is not writable.
        """
        optional = {"snapshot": snapshot_signer, "targets": targets_signer}
        signers = {"timestamp": timestamp_signer}
        signers |= {role: signer for role, signer in optional.items() if signer is not None}
        return self._release(
            signers,
            _utc(now),
            include_staged=False,
            force={"timestamp"},
            renew_early=False,
            floor=floor,
        )

    def rotate_root(
        self,
        old_signers: Sequence[Signer],
        new_keys: Sequence[Key],
        new_signers: Sequence[Signer],
        threshold: int,
        *,
        now: datetime | None = None,
    ) -> int:
        """Write root N+1 trusting ``new_keys`` (``threshold`` of them) as root keys.

        It is signed by a threshold of the old root keys (so devices accept it) and
        of the new ones (so it is valid by itself).  Rotating to the same keys renews
        an expiring root.  Returns the new root version.

        Raises:
            ValueError: threshold outside 1..len(new_keys).
            KeyMaterialError: either threshold is not reached by the signers.
            HistoryError: a metadata file of a new version already exists (never
                replaced).
            OSError: the folder is not writable.
        """
        now = _utc(now)
        current = self.root
        new = successor_root(
            current,
            now + self.expiry.root,
            remove={"root": list(current.roles["root"].keyids)},
            add={"root": list(new_keys)},
            thresholds={"root": threshold},
        )
        self._write_root(sign_root(new, [*old_signers, *new_signers], current))
        return new.version

    def revoke_key(
        self,
        role: str,
        keyid: str,
        root_signers: Sequence[Signer],
        *,
        replacement: Key | None = None,
        signers: Mapping[str, Signer] | None = None,
        now: datetime | None = None,
    ) -> PublishResult:
        """Write root N+1 without ``keyid`` for ``role`` (and with ``replacement``).

        For an online role the role is re-signed at once with the replacement's
        signer (in ``signers``), with the roles that list it: devices that trusted
        metadata signed by the revoked key (even versions pushed far ahead by an
        attacker) drop it, because it no longer verifies, and take the new one:
        fast-forward recovery.

        Raises:
            ValueError: ``keyid`` is not one of ``role``'s keys, or the role would
                have fewer keys than its threshold.
            KeyMaterialError: root signers below either root threshold, or a role to
                re-sign has no signer in ``signers``.
            HistoryError: a metadata file of a new version already exists (never
                replaced).
            OSError: the folder is not writable.
        """
        now = _utc(now)
        current = self.root
        if role not in current.roles or keyid not in current.roles[role].keyids:
            raise UsageError(f"key {keyid[:12]} is not a {role} key of root v{current.version}")
        new = successor_root(
            current,
            now + self.expiry.root,
            remove={role: [keyid]},
            add={role: [replacement]} if replacement is not None else None,
        )
        md = sign_root(new, root_signers, current)
        if role == "root":
            # Root keys sign nothing else: no online role needs re-signing.
            path = self._write_root(md)
            return PublishResult({"root": new.version}, (path,))
        return self._release(
            signers or {}, now, include_staged=False, renew_early=False, new_root=md
        )

    def _release(
        self,
        signers: Mapping[str, Signer],
        now: datetime,
        *,
        include_staged: bool,
        force: set[str] | None = None,
        renew_early: bool = True,
        new_root: Metadata[Root] | None = None,
        floor: Mapping[str, int] | None = None,
    ) -> PublishResult:
        root = new_root.signed if new_root is not None else self.root
        floor = {role: v for role, v in (floor or {}).items() if role in self._online}
        # A role whose signatures the new root no longer accepts must be re-signed now:
        # its key is being replaced (load() refuses a role the newest root rejects).
        # One at or below its floor too: devices may hold a version of that number.
        force = (
            set(force or ())
            | {role for role, md in self._online.items() if not verifies(root, md)}
            | {role for role, v in floor.items() if v >= self.version(role)}
        )
        has_targets = "targets" in self._online
        signed_files = self._signed(Targets).targets if has_targets else {}
        files = self._staged if include_staged else signed_files
        plan = plan_release(
            {role: md.signed for role, md in self._online.items()},
            now=now,
            expiry=self.expiry,
            can_sign=set(signers),
            targets_changed=not has_targets or signed_files != files,
            force=force,
            renew_early=renew_early,
        )
        # Build and sign everything before writing anything: a missing key must not
        # leave half a release on disk.
        out: list[tuple[str, Path, bytes, Online]] = []
        listed: MetaFile | None = None
        for role in plan:
            version = max(self.version(role), floor.get(role, 0)) + 1
            expires = now + self.expiry.period(role)
            # A role re-signed without the one it lists keeps listing what it listed.
            if listed is None and role == "snapshot":
                listed = self._signed(Snapshot).meta["targets.json"]
            elif listed is None and role == "timestamp":
                listed = self._signed(Timestamp).snapshot_meta
            data, md = sign_online(
                role, version, expires, root, signers[role], files=files, listed=listed
            )
            listed = meta_file(version, data)
            name = "timestamp.json" if role == "timestamp" else f"{version}.{role}.json"
            out.append((role, self.metadata_dir / name, data, md))
        for _, path, _, _ in out:
            if path.name != "timestamp.json":
                _refuse_existing(path)
        if new_root is not None:
            _refuse_existing(self._root_path(new_root))
        # Versioned files first, then the root, then the timestamp: until the last
        # rename the timestamp chain is the old one, and a stop in between leaves new
        # files that load() refuses rather than state trusted under replaced keys.
        versioned = [item for item in out if item[0] != "timestamp"]
        timestamp = [item for item in out if item[0] == "timestamp"]
        versions: dict[str, int] = {}
        written: list[Path] = []
        for role, path, data, md in versioned:
            write_atomic(path, data)
            self._online[role], self._online_bytes[role] = md, data
            versions[role] = md.signed.version
            written.append(path)
        if new_root is not None:
            written.append(self._write_root(new_root))
            versions["root"] = new_root.signed.version
        for role, path, data, md in timestamp:
            write_atomic(path, data)
            self._online[role], self._online_bytes[role] = md, data
            versions[role] = md.signed.version
            written.append(path)
        return PublishResult(versions, tuple(written))

    def _signed(self, kind: type[R]) -> R:
        signed = self._online[kind.type].signed
        if not isinstance(signed, kind):  # pragma: no cover - keyed by type on insertion
            raise TypeError(f"{kind.type}: unexpected {type(signed).__name__}")
        return signed

    def _root_path(self, md: Metadata[Root]) -> Path:
        return self.metadata_dir / f"{md.signed.version}.root.json"

    def _write_root(self, md: Metadata[Root]) -> Path:
        path = self._root_path(md)
        _refuse_existing(path)
        data = to_bytes(md)
        write_atomic(path, data)
        self._roots.append(md)
        self._root_bytes.append(data)
        return path

    # --- targets on the remote ----------------------------------------------------------

    def write_targets_to(self, remote_dir: Path) -> list[Path]:
        """Copy the files staged in this session to ``remote_dir/targets/`` (hash names).

        A file already there with the right bytes is left alone, so re-running copies
        nothing.  Returns the paths written.

        Raises:
            DigestMismatchError: a source file changed since it was staged.
            OSError: a source is unreadable or the remote is not writable.
        """
        written: list[Path] = []
        for path, source in sorted(self._sources.items()):
            info = self._staged[path]
            dest = remote_dir / TARGETS_DIR / stored_name(info)
            if _holds(dest, info):
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(source, Path):
                _copy_verified(source, dest, info)
            else:
                write_atomic(dest, source)
            written.append(dest)
        return written


def _root_files(metadata_dir: Path) -> list[Path]:
    versions = sorted(
        int(m.group(1))
        for p in metadata_dir.glob("*.root.json")
        if (m := _ROOT_FILE.match(p.name)) is not None
    )
    if not versions or versions != list(range(1, len(versions) + 1)):
        raise FileSetError(
            f"root versions {versions or 'none'}: expected 1.root.json up to N without gaps",
            str(metadata_dir),
        )
    return [metadata_dir / f"{version}.root.json" for version in versions]


def _versioned_files(metadata_dir: Path) -> dict[str, set[int]]:
    present: dict[str, set[int]] = {role: set() for role in VERSIONED_ROLES}
    for path in metadata_dir.iterdir():
        if (m := _VERSIONED_FILE.match(path.name)) is not None:
            present[m.group(2)].add(int(m.group(1)))
    return present


def _refuse_existing(path: Path) -> None:
    # A version is signed once: devices may hold the existing file, and another
    # one under its name would be a fork of the history they trust.
    if os.path.lexists(path):
        raise HistoryError(
            f"already exists and would be replaced: a version is signed once; {RECOVER}",
            str(path),
        )


def _holds(path: Path, info: TargetFile) -> bool:
    try:
        with path.open("rb") as fh:
            info.verify_length_and_hashes(fh)
    except (OSError, LengthOrHashMismatchError):
        return False
    return True


def _copy_verified(source: Path, dest: Path, info: TargetFile) -> None:
    # Mode 0644 whatever the umask: remotes are shared.  Verified before the rename.
    with AtomicFile(dest, mode=0o644) as out, source.open("rb") as src:
        shutil.copyfileobj(src, out.file, 1 << 20)
        out.file.flush()
        out.file.seek(0)
        try:
            info.verify_length_and_hashes(out.file)
        except LengthOrHashMismatchError as e:
            raise DigestMismatchError(f"changed since it was staged ({e})", str(source)) from e
