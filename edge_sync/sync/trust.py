"""Device-side verification of release metadata and files (stable API).

A device trusts only signatures that chain to the root it was provisioned with
(:meth:`DeviceTrust.provision`).  Git and the artifact remote are untrusted transports:
python-tuf's ``ngclient.Updater`` does every check of the TUF client workflow
(signatures and thresholds, root rotation, rollback, freeze, mix-and-match, lengths and
hashes); this module feeds it metadata from the git checkout (or from the copy mirrored
to the artifact remote) and files from the remote, checks modelreg's signed facts, and
turns every failure into one ``signing.errors`` type:

=================================================  ===========================
python-tuf / transport failure                     raised here
=================================================  ===========================
``UnsignedMetadataError`` (below threshold)        ``SignatureError`` (``ForeignRootError``
                                                   when the repository's 1.root.json
                                                   shares no root key with the anchor)
``BadVersionNumberError`` (older than trusted)     ``RollbackError``
``ExpiredMetadataError``                           ``ExpiredError``
``LengthOrHashMismatchError``                      ``DigestMismatchError``
``DownloadLengthMismatchError`` (endless data)     ``DigestMismatchError``
other ``RepositoryError`` (malformed, missing)     ``VerificationError``
``SlowRetrievalError`` (too slow, see below)       ``TrustFetchError``
``DownloadError``, ``OSError``                     ``TrustFetchError``
=================================================  ===========================

Every download runs under the time limits of :class:`TrustLimits` (an overall
deadline per file, a minimum average rate, a longest wait for any one read), enforced
by the fetchers in ``edge_sync.sync.fetch``.  Nothing is written where the device looks
until a whole file has verified.

State, under the device's state dir::

    trust/anchor.root.json     the provisioned root (the trust anchor; never replaced)
    trust/metadata/            the Updater's trusted metadata (root_history/, timestamp.json ...)
    trust/channels.json        the last verified channels document

This module imports neither MLflow, DVC nor ``pipelines`` (a device has none of them).
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Final
from urllib.parse import urlparse
from urllib.request import url2pathname

from tuf.api import exceptions as tuf_errors
from tuf.api.metadata import Metadata, Root, TargetFile, Targets
from tuf.ngclient.fetcher import FetcherInterface
from tuf.ngclient.updater import Updater

from edge_sync.sync.fetch import LocalFetcher
from edge_sync.sync.limits import TrustLimits
from registry.atomic import replace_file, write_atomic
from registry.errors import UsageError
from signing.errors import (
    DigestMismatchError,
    ExpiredError,
    FileSetError,
    ForeignRootError,
    KeyMaterialError,
    RollbackError,
    SignatureError,
    TargetMismatchError,
    TrustFetchError,
    VerificationError,
)
from signing.target_names import deprecation_path, object_path
from signing.tuf_facts import CHANNELS_PATH, ChannelsDoc, TargetFacts, TargetKind
from signing.tuf_roles import HASH_ALGORITHM, METADATA_DIR, ONLINE_ROLES, TARGETS_DIR, stored_name

if TYPE_CHECKING:
    pass

TRUST_DIR: Final = "trust"
_METADATA: Final = "metadata"
"""Under :data:`TRUST_DIR`: the metadata the TUF client verified (written only after)."""
ANCHOR_FILE: Final = "anchor.root.json"

_DEPRECATION_MAX_BYTES: Final = 4096
"""A deprecation file holds one reason (at most 500 characters, UTF-8)."""


@dataclass(frozen=True)
class SignedTarget:
    """A target file as the verified metadata describes it."""

    path: str
    length: int
    sha256: str
    facts: TargetFacts


@dataclass(frozen=True)
class RoleState:
    """Version and expiry of one trusted role (for status and staleness reports)."""

    version: int
    expires: datetime


@contextmanager
def _translated(subject: str) -> Iterator[None]:
    """Turn python-tuf and transport errors into ``signing.errors`` (see module doc)."""
    try:
        yield
    except tuf_errors.UnsignedMetadataError as e:
        raise SignatureError(str(e), subject) from e
    except tuf_errors.BadVersionNumberError as e:
        raise RollbackError(str(e) or "version older than the trusted one", subject) from e
    except tuf_errors.ExpiredMetadataError as e:
        raise ExpiredError(str(e), subject) from e
    except tuf_errors.LengthOrHashMismatchError as e:
        raise DigestMismatchError(str(e), subject) from e
    except tuf_errors.RepositoryError as e:
        raise VerificationError(str(e) or type(e).__name__, subject) from e
    except tuf_errors.DownloadLengthMismatchError as e:
        raise DigestMismatchError(f"longer than allowed: {e}", subject) from e
    except (tuf_errors.DownloadError, OSError) as e:
        # fetch() wraps the transport's own error: say what it was
        detail = f"{e} ({e.__cause__})" if e.__cause__ else str(e)
        raise TrustFetchError(f"{subject}: {detail}") from e


class _Counting(FetcherInterface):
    """A fetcher that counts the downloads and bytes of another one (what a device
    downloaded), and answers the first request for a prefetched URL itself."""

    def __init__(
        self, inner: FetcherInterface, *, prefetched: Mapping[str, bytes] | None = None
    ) -> None:
        self._inner = inner
        self._prefetched = dict(prefetched or {})
        self.received = 0
        self.requests = 0

    def _fetch(self, url: str) -> Iterator[bytes]:
        given = self._prefetched.pop(url, None)
        if given is not None:  # already downloaded (and counted) by the watcher
            return iter((given,))
        self.requests += 1
        return self._count(self._inner._fetch(url))

    def fetch_from(self, url: str, offset: int) -> tuple[int, Iterator[bytes]]:
        """Resume at ``offset`` where the inner fetcher can (see ``LocalFetcher``)."""
        resume = getattr(self._inner, "fetch_from", None)
        if offset and callable(resume):
            self.requests += 1
            start, chunks = resume(url, offset)
            return int(start), self._count(chunks)
        return 0, self.fetch(url)

    def _count(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            self.received += len(chunk)
            yield chunk


def _parse_root(data: bytes, where: str) -> Metadata[Root]:
    with _translated(where):
        md = Metadata[Root].from_bytes(data)
        if not isinstance(md.signed, Root):
            raise VerificationError(f"expected root metadata, got {md.signed.type}", where)
        md.signed.verify_delegate(Root.type, md.signed_bytes, md.signatures)
    return md


def foreign_root(anchor: Root, first: Root, trust_dir: Path) -> str | None:
    """The reason a repository whose first root is ``first`` is another repository than
    the one whose root the device was provisioned with (``anchor``), or None when the
    two share a root key (the same repository: its own failure stands).

    A pure decision: ``first`` is read, never trusted.
    """
    ours = set(anchor.roles[Root.type].keyids)
    theirs = set(first.roles[Root.type].keyids)
    if ours & theirs:
        return None

    def keys(ids: set[str]) -> str:
        return ", ".join(sorted(k[:12] for k in ids)) or "none"

    return (
        f"the repository's first root (1.root.json, root key {keys(theirs)}) is not the "
        f"root this device was provisioned with (root key {keys(ours)}): the device holds "
        "another repository's trust root; set trust.root in edge.yaml to this repository's "
        f"trust/metadata/1.root.json and remove {trust_dir} so that the device trusts it "
        "instead"
    )


def _base_url(location: str | Path) -> tuple[str, Path | None]:
    """A base URL ending in '/' for a path or URL, and the local folder when there is one.

    Raises:
        ValueError: an unsupported URL scheme.
    """
    if isinstance(location, str):
        parsed = urlparse(location)
        if parsed.scheme in {"http", "https", "s3"}:
            return location.rstrip("/") + "/", None
        if parsed.scheme == "file":
            location = Path(url2pathname(parsed.path))
        elif parsed.scheme:
            raise UsageError(f"{location}: use a path, file://, http(s):// or s3:// URL")
    folder = Path(location).resolve()
    return folder.as_uri().rstrip("/") + "/", folder


def _anchor(trust_dir: Path) -> Path:
    """The trust anchor in ``trust_dir``.

    Raises:
        KeyMaterialError: the device was not provisioned with a root.
    """
    anchor = trust_dir / ANCHOR_FILE
    if not anchor.is_file():
        raise KeyMaterialError(
            f"{anchor}: no trust root; provision the device with the repository's 1.root.json first"
        )
    return anchor


class DeviceTrust:
    """The device's view of a model repository's signed releases.

    Call :meth:`refresh` once per poll; then :meth:`channels`, :meth:`target_info` and
    :meth:`fetch` answer from the metadata verified by that refresh (the first of them
    refreshes when no refresh has succeeded yet).  On any failure the previously
    trusted metadata stays in the state dir and the error says why.
    """

    def __init__(
        self,
        state_dir: Path,
        checkout_dir: Path | None,
        remote: str | Path,
        *,
        metadata: str | Path | None = None,
        prefetched: Mapping[str, bytes] | None = None,
        limits: TrustLimits | None = None,
        fetcher: FetcherInterface | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        """Verify releases of the repository checked out at ``checkout_dir``, or whose
        metadata is at ``metadata``.

        Args:
            state_dir: the device's state dir (trust state goes under ``trust/``).
            checkout_dir: the git checkout; metadata is read from ``trust/metadata/``
                (None when ``metadata`` says where it is).
            remote: the artifact remote: a folder, ``file://``, ``http(s)://`` URL.
            metadata: where metadata is read instead: a folder, or a ``file://``,
                ``http(s)://`` or ``s3://`` URL (the artifact remote's mirror,
                ``<remote>/metadata``).
            prefetched: metadata files already downloaded (by the watcher), by name
                under ``metadata`` (``timestamp.json``): the first request for each
                is answered from here, verified like any download.
            limits: caps on untrusted input: sizes, and the time each download may take.
            fetcher: transport to use instead of :class:`LocalFetcher` (tests wrap it).
            cancelled: asked between the chunks of a target download, and while any
                network download waits for data (at least every
                ``edge_sync.sync.transfer.CANCEL_POLL_S``); when it answers True the download
                stops (a target's is kept, with a partial folder, for resuming).

        Raises:
            KeyMaterialError: the device was not provisioned with a root.
            ValueError: ``remote`` or ``metadata`` has an unsupported URL scheme, or
                neither ``checkout_dir`` nor ``metadata`` is given.
        """
        self._dir = state_dir / TRUST_DIR
        self._anchor = _anchor(self._dir)
        self._limits = limits or TrustLimits()
        if metadata is None:
            if checkout_dir is None:
                raise UsageError("DeviceTrust: give the checkout or the metadata's location")
            metadata = checkout_dir / METADATA_DIR
        self._metadata_url, metadata_dir = _base_url(metadata)
        remote_url, remote_dir = _base_url(remote)
        self._targets_url = f"{remote_url}{TARGETS_DIR}/"
        roots = [d for d in (metadata_dir, remote_dir and remote_dir / TARGETS_DIR) if d]
        given = {f"{self._metadata_url}{name}": data for name, data in (prefetched or {}).items()}
        self._fetcher = _Counting(
            fetcher or LocalFetcher(roots, limits=self._limits, cancelled=cancelled),
            prefetched=given,
        )
        self._cancelled = cancelled
        self._updater: Updater | None = None

    @property
    def bytes_downloaded(self) -> int:
        """Bytes received from the transports (metadata and targets) by this object."""
        return self._fetcher.received

    @property
    def requests(self) -> int:
        """Downloads started by this object (metadata and targets; a download of a
        target that resumes counts once per try; prefetched files are not counted)."""
        return self._fetcher.requests

    @staticmethod
    def provision(state_dir: Path, root_json: bytes, *, replace: bool = False) -> None:
        """Install the trust anchor: the repository's first root (``1.root.json``).

        Provisioning again with the same root is a no-op.

        Raises:
            SignatureError: the root is not signed by a threshold of its own keys.
            VerificationError: the bytes are not TUF root metadata.
            ValueError: the device trusts another root and ``replace`` is not set.
            OSError: the state dir is not writable.
        """
        _parse_root(root_json, ANCHOR_FILE)
        trust_dir = state_dir / TRUST_DIR
        anchor = trust_dir / ANCHOR_FILE
        if anchor.is_file():
            if anchor.read_bytes() == root_json:
                return
            if not replace:
                raise UsageError(
                    f"{anchor}: the device trusts another root; pass replace=True to reset trust"
                )
            # A new anchor starts a new chain: nothing trusted under the old one stays.
            shutil.rmtree(trust_dir / _METADATA, ignore_errors=True)
            (trust_dir / "channels.json").unlink(missing_ok=True)
        trust_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(anchor, root_json)

    def refresh(self) -> None:
        """Fetch and verify new metadata: root chain, timestamp, snapshot, targets.

        Raises:
            SignatureError, RollbackError, ExpiredError, DigestMismatchError,
            VerificationError: the metadata failed verification (see module doc).
            TrustFetchError: metadata could not be read (or not within the time limits
                of :class:`TrustLimits`) or the state not written.
        """
        self._updater = None
        metadata_dir = self._dir / _METADATA
        with _translated("trust metadata"):
            metadata_dir.mkdir(parents=True, exist_ok=True)
            # The anchor, not the newest cached root, is the bootstrap: cached roots are
            # re-verified from it on every refresh (python-tuf's recommendation).
            updater = Updater(
                str(metadata_dir),
                self._metadata_url,
                target_base_url=self._targets_url,
                fetcher=self._fetcher,
                config=self._limits.updater_config(),
                bootstrap=self._anchor.read_bytes(),
            )
            try:
                updater.refresh()
            except tuf_errors.UnsignedMetadataError as e:
                reason = self._foreign_root()
                if reason is not None:
                    raise ForeignRootError(reason, "trust metadata") from e
                raise
        self._updater = updater

    def _foreign_root(self) -> str | None:
        """Why the repository's metadata cannot chain to the anchor, when the reason is
        that its first root is another repository's; None otherwise (or unknown).

        Diagnosis only: the file is read within the root's size cap and never trusted.
        """
        limit = self._limits.root_max_length
        try:
            data = b""
            for chunk in self._fetcher.fetch(f"{self._metadata_url}1.root.json"):
                data += chunk
                if len(data) > limit:
                    return None
            theirs: object = Metadata.from_bytes(data).signed
            ours: object = Metadata.from_bytes(self._anchor.read_bytes()).signed
        except Exception:  # noqa: BLE001 - any failure leaves the original error as it is
            return None
        if not isinstance(theirs, Root) or not isinstance(ours, Root):
            return None
        return foreign_root(ours, theirs, self._dir)

    def target_info(self, path: str) -> SignedTarget:
        """The signed length, digest and facts of the target at ``path``.

        Raises:
            FileSetError: ``path`` is not a signed target.
            TargetMismatchError: the target carries no readable modelreg facts.
            SigningError: refreshing failed (see :meth:`refresh`).
        """
        return self._lookup(path)[1]

    def fetch(
        self,
        path: str,
        dest_dir: Path,
        *,
        model: str | None = None,
        version: str | None = None,
        kind: TargetKind | None = None,
        partial_dir: Path | None = None,
    ) -> Path:
        """Download and verify a target into ``dest_dir`` as ``<sha256>.<name>``.

        With ``partial_dir``, an interrupted download is kept there and resumed by the
        next call (HTTP ``Range``, or a seek in a file); without it, nothing is kept.

        The facts signed with the file must name ``model``, ``version`` and ``kind``
        where given: a validly signed file of another model is still the wrong file.
        A verified copy already in place is returned without fetching.

        Raises:
            TargetMismatchError: the signed facts name another model, version or kind.
            DigestMismatchError: the bytes differ from the signed length or digest.
            FileSetError: ``path`` is not a signed target.
            TrustFetchError: the file could not be fetched (or not within the time
                limits of :class:`TrustLimits`) or written; nothing is left in
                ``dest_dir``.
            SigningError: refreshing failed (see :meth:`refresh`).
        """
        info, target = self._lookup(path)
        expect_facts(target, model=model, version=version, kind=kind)
        dest = dest_dir / f"{target.sha256}.{PurePosixPath(path).name}"
        return self._download(info, dest, partial_dir)

    def fetch_object(
        self, sha256: str, length: int, dest_dir: Path, *, partial_dir: Path | None = None
    ) -> Path:
        """Download an object (``signing.target_names.object_path``: a skeleton or a
        tensor) into ``dest_dir`` as ``<sha256>.object``, verified against the digest
        and length the caller read from signed metadata (a version's tensor manifest),
        resumed as :meth:`fetch` resumes.

        Raises:
            DigestMismatchError: the bytes differ from ``length`` or ``sha256``.
            TrustFetchError: the object could not be fetched or written.
            SigningError: refreshing failed (see :meth:`refresh`).
        """
        path = object_path(sha256)
        info = TargetFile(length, {HASH_ALGORITHM: sha256}, path)
        return self._download(info, dest_dir / f"{sha256}.object", partial_dir, url=path)

    def channels(self) -> ChannelsDoc:
        """The verified channels document.

        Raises:
            TargetMismatchError: ``channels.json`` is not signed as a channels document,
                or its sequence differs from the signed one.
            VerificationError: it is larger than allowed or not a channels document.
            DigestMismatchError, FileSetError, TrustFetchError, SigningError: as
                :meth:`fetch`.
        """
        info, target = self._lookup(CHANNELS_PATH)
        expect_facts(target, kind="channels")
        if info.length > self._limits.channels_max_length:
            raise VerificationError(
                f"{info.length} bytes, over the {self._limits.channels_max_length} allowed",
                CHANNELS_PATH,
            )
        data = self._download(info, self._dir / "channels.json").read_bytes()
        try:
            doc = ChannelsDoc.from_bytes(data)
        except ValueError as e:
            raise VerificationError(f"not a channels document: {e}", CHANNELS_PATH) from None
        if doc.sequence != target.facts.sequence:
            raise TargetMismatchError(
                f"sequence {doc.sequence}, signed as {target.facts.sequence}", CHANNELS_PATH
            )
        return doc

    def deprecation(self, model: str, version: str) -> str | None:
        """Why ``version`` of ``model`` is deprecated, from its signed deprecation file
        (``signing.target_names.deprecation_path``); None when none is signed.

        Raises:
            TargetMismatchError: the file is signed as another model, version or kind.
            VerificationError: it is larger than a reason may be, or not UTF-8.
            DigestMismatchError, TrustFetchError, SigningError: as :meth:`fetch`.
        """
        path = deprecation_path(model, version)
        with _translated(path):
            listed = self._refreshed().get_targetinfo(path)
        if listed is None:
            return None
        if listed.length > _DEPRECATION_MAX_BYTES:
            raise VerificationError(
                f"{listed.length} bytes, over the {_DEPRECATION_MAX_BYTES} a reason may be", path
            )
        data = self.fetch(
            path, self._dir / "deprecated", model=model, version=version, kind="deprecation"
        ).read_bytes()
        try:
            return " ".join(data.decode("utf-8").split()) or "no reason given"
        except UnicodeDecodeError:
            raise VerificationError("the reason is not UTF-8", path) from None

    def trusted(self) -> dict[str, RoleState]:
        """Version and expiry of each role the device trusts now (empty roles omitted).

        Read from the state dir, where the Updater stores only verified metadata.

        Raises:
            VerificationError: the state dir holds unreadable metadata.
        """
        states: dict[str, RoleState] = {}
        for role in ("root", *ONLINE_ROLES):
            state = trusted_role(self._dir.parent, role)
            if state is not None:
                states[role] = state
        return states

    def _refreshed(self) -> Updater:
        if self._updater is None:
            self.refresh()
        assert self._updater is not None  # noqa: S101 - refresh() sets it or raises
        return self._updater

    def _lookup(self, path: str) -> tuple[TargetFile, SignedTarget]:
        updater = self._refreshed()
        with _translated(path):
            info = updater.get_targetinfo(path)
        if info is None:
            raise FileSetError("not a signed target", path)
        try:
            facts = TargetFacts.from_custom(info.custom)
        except ValueError as e:
            raise TargetMismatchError(f"no readable modelreg facts ({e})", path) from None
        sha256 = info.hashes.get(HASH_ALGORITHM)
        if sha256 is None:
            raise VerificationError(f"signed without a {HASH_ALGORITHM} digest", path)
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            # it names files on the device: nothing but a digest may (a "../" would escape)
            raise VerificationError(f"signed {HASH_ALGORITHM} is not a hex digest", path)
        return info, SignedTarget(path, info.length, sha256, facts)

    def _download(
        self, info: TargetFile, dest: Path, partial_dir: Path | None = None, url: str | None = None
    ) -> Path:
        """Fetch a target into ``dest``, verified in one pass (length and SHA-256 as the
        bytes arrive), resuming a partial download kept in ``partial_dir``.

        A partial file is never used as it is: whatever it holds is hashed again with
        the rest, and the whole must match the signed digest before ``dest`` appears.
        """
        updater = self._refreshed()
        if updater.find_cached_target(info, str(dest)) is not None:
            return dest
        sha256 = info.hashes[HASH_ALGORITHM]
        folder = partial_dir or dest.parent
        partial = folder / f".{sha256}.partial"
        keep = partial_dir is not None
        with _translated(info.path):
            folder.mkdir(parents=True, exist_ok=True)
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._fetch_verified(info, partial, sha256, url or stored_name(info))
                replace_file(partial, dest)
            except DigestMismatchError:
                partial.unlink(missing_ok=True)  # wrong bytes: never resume from them
                raise
            except BaseException:
                if not keep:
                    partial.unlink(missing_ok=True)
                raise
        return dest

    def _fetch_verified(self, info: TargetFile, partial: Path, sha256: str, name: str) -> None:
        hasher = hashlib.sha256()
        held = 0
        if partial.is_file():
            with partial.open("rb") as fh:
                while chunk := fh.read(1 << 20):
                    hasher.update(chunk)
                    held += len(chunk)
            if held > info.length:
                held, hasher = 0, hashlib.sha256()
        url = f"{self._targets_url}{name}"
        start, chunks = self._fetcher.fetch_from(url, held)
        if start != held:  # the transport could not resume: start again
            held, hasher = 0, hashlib.sha256()
        with partial.open("r+b" if held else "wb") as out:
            out.seek(held)
            out.truncate()
            for chunk in chunks:
                if self._cancelled is not None and self._cancelled():
                    raise TrustFetchError(f"{info.path}: stopped after {held} bytes")
                held += len(chunk)
                if held > info.length:
                    raise DigestMismatchError(
                        f"longer than the {info.length} bytes signed", info.path
                    )
                hasher.update(chunk)
                out.write(chunk)
        if held != info.length:
            raise TrustFetchError(f"{info.path}: the remote sent {held} of {info.length} bytes")
        if hasher.hexdigest() != sha256:
            raise DigestMismatchError(
                f"sha256 {hasher.hexdigest()} differs from the signed {sha256}", info.path
            )


def trusted_role(state_dir: Path, role: str) -> RoleState | None:
    """Version and expiry of ``role`` as the device last verified it (None before the
    first refresh): read from the state dir, where only verified metadata is stored.

    Raises:
        VerificationError: the file there is unreadable.
    """
    path = state_dir / TRUST_DIR / _METADATA / f"{role}.json"
    if not path.is_file():
        return None
    with _translated(str(path)):
        signed = Metadata.from_bytes(path.read_bytes()).signed
    return RoleState(signed.version, signed.expires)


def expired_roles(state_dir: Path, now: datetime) -> list[str]:
    """The trusted roles whose expiry has passed at ``now`` (root first, then the online
    roles); a role not held yet is not listed.

    The idle poll must look at every role, not only the timestamp's: whoever holds the
    timestamp key alone can keep signing fresh timestamps over a snapshot whose own
    (7-day) bound has passed, and only a full refresh would notice.

    Raises:
        VerificationError: the state dir holds unreadable metadata.
    """
    expired = []
    for role in ("root", *ONLINE_ROLES):
        state = trusted_role(state_dir, role)
        if state is not None and state.expires <= now:
            expired.append(role)
    return expired


def trust_expiries(state_dir: Path) -> dict[str, float]:
    """When each trusted role the state dir holds expires (Unix time, root first); an
    unreadable one is left out (the next refresh says why)."""
    found = {}
    for role in ("root", *ONLINE_ROLES):
        try:
            held = trusted_role(state_dir, role)
        except VerificationError:
            continue
        if held is not None:
            found[role] = held.expires.timestamp()
    return found


@dataclass(frozen=True)
class Freshness:
    """How fresh the device's trusted metadata is (``edge status``, the idle poll).

    Attributes:
        timestamp: the trusted timestamp role (None before the first refresh).
        expired: the trusted roles whose expiry has passed (:func:`expired_roles`).
    """

    timestamp: RoleState | None
    expired: tuple[str, ...]

    @property
    def stale(self) -> bool | None:
        """Whether any trusted role has expired (None before the first refresh): a fresh
        timestamp over an expired snapshot is a freeze too."""
        return None if self.timestamp is None else bool(self.expired)


def freshness(state_dir: Path, now: datetime) -> Freshness:
    """The trusted timestamp and the roles expired at ``now``.

    Raises:
        VerificationError: the state dir holds unreadable metadata.
    """
    return Freshness(trusted_role(state_dir, "timestamp"), tuple(expired_roles(state_dir, now)))


def trusted_targets(state_dir: Path) -> dict[str, str]:
    """Target path -> SHA-256 from the targets metadata the TUF client last verified (its
    local copy is written only after verification); empty when there is none."""
    path = state_dir / TRUST_DIR / _METADATA / "targets.json"
    try:
        signed = Metadata[Targets].from_bytes(path.read_bytes()).signed
    except (OSError, ValueError, tuf_errors.RepositoryError):
        return {}
    return {name: str(info.hashes[HASH_ALGORITHM]) for name, info in signed.targets.items()
            if HASH_ALGORITHM in info.hashes}  # fmt: skip


def last_channels(state_dir: Path) -> dict[str, object] | None:
    """The channels document the trust layer last verified, as JSON data (its sequences
    stay the high-water marks when the state file is lost); None when there is none."""
    try:
        data = (state_dir / TRUST_DIR / "channels.json").read_bytes()
        return ChannelsDoc.from_bytes(data).model_dump(mode="json")
    except (OSError, ValueError):
        return None


def expect_facts(
    target: SignedTarget,
    *,
    model: str | None = None,
    version: str | None = None,
    kind: TargetKind | None = None,
) -> None:
    """Check the facts signed with a target name this model, version and kind (where
    given): a validly signed file of another model is still the wrong file.

    Raises:
        TargetMismatchError: a signed fact differs.
    """
    facts = target.facts
    for field, wanted, signed in (
        ("kind", kind, facts.kind),
        ("model", model, facts.model),
        ("version", version, facts.version),
    ):
        if wanted is not None and signed != wanted:
            raise TargetMismatchError(
                f"signed as {field} {signed!r}, expected {wanted!r}", target.path
            )


__all__ = [
    "ANCHOR_FILE",
    "TRUST_DIR",
    "DeviceTrust",
    "Freshness",
    "LocalFetcher",
    "RoleState",
    "SignedTarget",
    "TrustLimits",
    "expect_facts",
    "expired_roles",
    "foreign_root",
    "freshness",
    "last_channels",
    "trust_expiries",
    "trusted_role",
    "trusted_targets",
]
