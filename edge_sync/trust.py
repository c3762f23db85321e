"""Device-side verification of release metadata and files (stable API).

A device trusts only signatures that chain to the root it was provisioned with
(:meth:`DeviceTrust.provision`).  Git and the artifact remote are untrusted transports:
python-tuf's ``ngclient.Updater`` does every check of the TUF client workflow
(signatures and thresholds, root rotation, rollback, freeze, mix-and-match, lengths and
hashes); this module feeds it metadata from the git checkout and files from the remote,
checks modelreg's signed facts, and turns every failure into one ``signing.errors`` type:

=================================================  ===========================
python-tuf / transport failure                     raised here
=================================================  ===========================
``UnsignedMetadataError`` (below threshold)        ``SignatureError``
``BadVersionNumberError`` (older than trusted)     ``RollbackError``
``ExpiredMetadataError``                           ``ExpiredError``
``LengthOrHashMismatchError``                      ``DigestMismatchError``
``DownloadLengthMismatchError`` (endless data)     ``DigestMismatchError``
other ``RepositoryError`` (malformed, missing)     ``VerificationError``
``SlowRetrievalError`` (too slow, see below)       ``TrustFetchError``
``DownloadError``, ``OSError``                     ``TrustFetchError``
=================================================  ===========================

Every download (metadata and targets, over HTTP or from a folder) runs under a
:class:`_TransferBudget` built from :class:`TrustLimits`: an overall deadline per file,
a minimum average rate after a grace period, and a longest wait for any one read.
Over HTTP the budget sets the socket timeout before each read of the connection
(status line and headers included), so a server that trickles one byte every few
seconds is cut off when a limit is passed, not when it stops.  Nothing is written
where the device looks until a whole file has verified.

State, under the device's state dir::

    trust/anchor.root.json     the provisioned root (the trust anchor; never replaced)
    trust/metadata/            the Updater's trusted metadata (root_history/, timestamp.json ...)
    trust/channels.json        the last verified channels document

This module imports neither MLflow, DVC nor ``pipelines`` (a device has none of them).
"""

from __future__ import annotations

import functools
import http.client
import io
import math
import os
import shutil
import socket
import ssl
import stat
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, Final
from urllib.parse import urlparse
from urllib.request import url2pathname

from tuf.api import exceptions as tuf_errors
from tuf.api.metadata import Metadata, Root, TargetFile
from tuf.ngclient.config import UpdaterConfig
from tuf.ngclient.fetcher import FetcherInterface
from tuf.ngclient.updater import Updater

from registry.atomic import fsync_dir, write_atomic
from registry.errors import UsageError
from signing.errors import (
    DigestMismatchError,
    ExpiredError,
    FileSetError,
    KeyMaterialError,
    RollbackError,
    SignatureError,
    TargetMismatchError,
    TrustFetchError,
    VerificationError,
)
from signing.tuf_facts import CHANNELS_PATH, ChannelsDoc, TargetFacts, TargetKind
from signing.tuf_roles import HASH_ALGORITHM, METADATA_DIR, ONLINE_ROLES, TARGETS_DIR

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

TRUST_DIR: Final = "trust"
ANCHOR_FILE: Final = "anchor.root.json"


@dataclass(frozen=True)
class TrustLimits:
    """Caps on untrusted input, in bytes unless named otherwise.

    Metadata whose length is signed (snapshot and targets, listed with length and hash)
    is capped by that length; these caps apply where nothing signed says how long a
    file is (root, timestamp) and to the channels document, which is read into memory.

    Time is capped per file downloaded (each metadata file, each target), counted from
    the request, so that a remote cannot hold the device forever (slow retrieval):

    Attributes:
        read_timeout_s: longest wait for a connection or for any data at all
            (python-tuf's own default).
        min_bytes_per_s: lowest average rate since the request, judged once
            ``rate_grace_s`` has passed; 0 judges no rate.  A trickle of one byte
            every 5 s is cut off at the end of the grace period.
        rate_grace_s: time allowed for connecting and a slow start.
        download_deadline_s: longest any one file may take, however fast it flows
            (an engine of 300 MB needs about 85 kB/s to make it).
    """

    root_max_length: int = 512_000
    timestamp_max_length: int = 16_384
    snapshot_max_length: int = 2_000_000
    targets_max_length: int = 5_000_000
    channels_max_length: int = 1_000_000
    max_root_rotations: int = 256
    chunk_size: int = 64 * 1024
    read_timeout_s: float = 30.0
    min_bytes_per_s: int = 1024
    rate_grace_s: float = 10.0
    download_deadline_s: float = 3600.0

    def __post_init__(self) -> None:
        """Refuse limits that cannot work.

        Raises:
            ValueError: a time limit that is not positive, a negative rate or grace.
        """
        for name in ("read_timeout_s", "download_deadline_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise UsageError(f"TrustLimits.{name} must be a positive number, got {value!r}")
        if not self.min_bytes_per_s >= 0 or not self.rate_grace_s >= 0:
            raise UsageError("TrustLimits.min_bytes_per_s and rate_grace_s must be >= 0")
        if self.chunk_size < 1:
            raise UsageError(f"TrustLimits.chunk_size must be >= 1, got {self.chunk_size}")

    def updater_config(self) -> UpdaterConfig:
        """python-tuf's configuration with these caps."""
        return UpdaterConfig(
            max_root_rotations=self.max_root_rotations,
            root_max_length=self.root_max_length,
            timestamp_max_length=self.timestamp_max_length,
            snapshot_max_length=self.snapshot_max_length,
            targets_max_length=self.targets_max_length,
        )


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


class _TransferBudget:
    """The time one download may still take: the slow-retrieval decisions, no I/O.

    The clock starts at construction (before connecting).  Readers call :meth:`wait_s`
    before a read that may block, :meth:`add` after it, and :meth:`stalled` when the
    wait ran out; each raises ``SlowRetrievalError`` once a limit is passed.
    """

    def __init__(self, limits: TrustLimits, clock: Callable[[], float] = time.monotonic) -> None:
        """Start the clock of one download under ``limits`` (``clock`` in seconds)."""
        self._limits = limits
        self._clock = clock
        self._start = clock()
        self.received = 0

    def violation(self) -> str | None:
        """Why the download must stop now, or None while it is within its limits."""
        limits, elapsed = self._limits, self._clock() - self._start
        if elapsed > limits.download_deadline_s:
            return f"not done after {limits.download_deadline_s:g} s ({self.received} bytes)"
        if elapsed > limits.rate_grace_s and self.received < limits.min_bytes_per_s * elapsed:
            return (
                f"slower than {limits.min_bytes_per_s} bytes/s "
                f"({self.received} bytes in {elapsed:.1f} s)"
            )
        return None

    def wait_s(self) -> float:
        """How long the next read may block: until the first limit it would reach.

        That is the read timeout, the deadline, or the moment the average rate falls
        below the minimum if no byte arrives, whichever comes first.

        Raises:
            SlowRetrievalError: a limit is already passed.
        """
        self.check()
        limits, elapsed = self._limits, self._clock() - self._start
        rate_until = math.inf
        if limits.min_bytes_per_s > 0:
            rate_until = max(limits.rate_grace_s, self.received / limits.min_bytes_per_s)
        ends = min(limits.download_deadline_s, rate_until) - elapsed
        # A zero timeout would make the socket non-blocking; the floor only rounds up.
        return max(min(limits.read_timeout_s, ends), 0.001)

    def add(self, n: int) -> None:
        """Count ``n`` bytes received.

        Raises:
            SlowRetrievalError: a limit is passed.
        """
        self.received += n
        self.check()

    def check(self) -> None:
        """Raise when a limit is passed.

        Raises:
            SlowRetrievalError: a limit is passed.
        """
        if (why := self.violation()) is not None:
            raise tuf_errors.SlowRetrievalError(why)

    def stalled(self) -> tuf_errors.SlowRetrievalError:
        """The error for a read whose wait (:meth:`wait_s`) ran out."""
        why = self.violation() or f"no data for {self._limits.read_timeout_s:g} s"
        return tuf_errors.SlowRetrievalError(why)


class _GuardedReader(io.RawIOBase):
    """The socket under an HTTP response: no read blocks longer than the budget allows."""

    def __init__(self, sock: socket.socket, budget: _TransferBudget) -> None:
        super().__init__()
        self._sock = sock
        # A SocketIO, as http.client's own makefile: it keeps the descriptor open after
        # urllib closes the connection object, until the response is closed.
        self._raw = sock.makefile("rb", buffering=0)
        self._budget = budget

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        self._sock.settimeout(self._budget.wait_s())
        try:
            n = self._raw.readinto(buffer) or 0
        except TimeoutError:
            raise self._budget.stalled() from None
        self._budget.add(n)
        return n

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def _guarded_response(budget: _TransferBudget) -> type[http.client.HTTPResponse]:
    class _Response(http.client.HTTPResponse):
        def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
            super().__init__(sock, *args, **kwargs)
            self.fp.close()
            self.fp = io.BufferedReader(_GuardedReader(sock, budget))

    return _Response


class _GuardedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, *, budget: _TransferBudget, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self.response_class = _guarded_response(budget)


class _GuardedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, *, budget: _TransferBudget, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self.response_class = _guarded_response(budget)


class _GuardedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, budget: _TransferBudget) -> None:
        super().__init__()
        self._budget = budget

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_GuardedHTTPConnection, budget=self._budget), req)


class _GuardedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, budget: _TransferBudget) -> None:
        self._ssl = ssl.create_default_context()
        super().__init__(context=self._ssl)
        self._budget = budget

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = functools.partial(_GuardedHTTPSConnection, budget=self._budget)
        return self.do_open(connection, req, context=self._ssl)


def _fetch_http(url: str, limits: TrustLimits, chunk_size: int) -> Iterator[bytes]:
    """Open ``url`` (proxies from the environment, redirects followed) under a budget.

    Only HTTP(S) handlers are installed: a redirect to ``ftp:`` or ``file:`` fails.

    Raises:
        DownloadHTTPError: the server answered with an error status.
        SlowRetrievalError: a time limit was passed before the body started.
        URLError, HTTPException, OSError: no connection (``fetch()`` wraps them).
    """
    budget = _TransferBudget(limits)
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(),
        _GuardedHTTPHandler(budget),
        _GuardedHTTPSHandler(budget),
        urllib.request.HTTPRedirectHandler(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
        urllib.request.UnknownHandler(),
    ):
        opener.add_handler(handler)
    try:
        response = opener.open(url, timeout=limits.read_timeout_s)
    except urllib.error.HTTPError as e:
        e.close()
        # Without the URL: a remote's URL may hold credentials.
        raise tuf_errors.DownloadHTTPError(f"HTTP error {e.code}", e.code) from None
    return _http_chunks(response, chunk_size)


def _http_chunks(response: BinaryIO, chunk_size: int) -> Iterator[bytes]:
    with response:
        try:
            while chunk := response.read(chunk_size):
                yield chunk
        except (OSError, http.client.HTTPException) as e:
            # Raised inside the Updater's loop, where fetch() no longer wraps errors.
            raise tuf_errors.DownloadError(f"connection failed: {e!r}") from e


class LocalFetcher(FetcherInterface):
    """Serves ``file://`` URLs inside given folders, and ``http(s)://`` URLs.

    Files are streamed in chunks, so the Updater stops reading as soon as a file
    exceeds the length it allows (endless data), and every download runs under the
    time limits of :class:`TrustLimits` (slow retrieval).  A missing file is an HTTP
    404, which the Updater needs to know that the newest root has been reached.
    """

    def __init__(
        self,
        roots: Sequence[Path],
        *,
        limits: TrustLimits | None = None,
        chunk_size: int | None = None,
    ) -> None:
        """Serve files under ``roots`` only (symlinks resolved) under ``limits``.

        Args:
            roots: the folders ``file://`` URLs may name.
            limits: time limits and chunk size (default :class:`TrustLimits`).
            chunk_size: bytes per chunk, instead of ``limits.chunk_size``.
        """
        self._roots = tuple(root.resolve() for root in roots)
        self._limits = limits or TrustLimits()
        self._chunk_size = chunk_size or self._limits.chunk_size

    def _fetch(self, url: str) -> Iterator[bytes]:
        parsed = urlparse(url)
        if parsed.scheme in {"http", "https"}:
            return _fetch_http(url, self._limits, self._chunk_size)
        if parsed.scheme != "file" or parsed.netloc not in {"", "localhost"}:
            raise tuf_errors.DownloadError(f"{url}: unsupported URL")
        budget = _TransferBudget(self._limits)
        path = Path(url2pathname(parsed.path)).resolve()
        # Checks happen here, not in the generator, so that they raise at fetch time.
        if not any(path.is_relative_to(root) for root in self._roots):
            raise tuf_errors.DownloadHTTPError(f"{url}: outside the served folders", 403)
        # O_NONBLOCK: a FIFO planted on the remote would block the open forever; the
        # type is checked on the opened descriptor, so it cannot change in between.
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags)
        except (FileNotFoundError, NotADirectoryError):
            raise tuf_errors.DownloadHTTPError(f"{url}: not found", 404) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise tuf_errors.DownloadHTTPError(f"{url}: not found (not a regular file)", 404)
        os.set_blocking(fd, True)
        return self._chunks(os.fdopen(fd, "rb"), budget)

    def _chunks(self, fh: BinaryIO, budget: _TransferBudget) -> Iterator[bytes]:
        with fh:
            while chunk := fh.read(self._chunk_size):
                budget.add(len(chunk))
                yield chunk


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


def _parse_root(data: bytes, where: str) -> Metadata[Root]:
    with _translated(where):
        md = Metadata[Root].from_bytes(data)
        if not isinstance(md.signed, Root):
            raise VerificationError(f"expected root metadata, got {md.signed.type}", where)
        md.signed.verify_delegate(Root.type, md.signed_bytes, md.signatures)
    return md


def _base_url(location: str | Path) -> tuple[str, Path | None]:
    """A base URL ending in '/' for a path or URL, and the local folder when there is one.

    Raises:
        ValueError: an unsupported URL scheme.
    """
    if isinstance(location, str):
        parsed = urlparse(location)
        if parsed.scheme in {"http", "https"}:
            return location.rstrip("/") + "/", None
        if parsed.scheme == "file":
            location = Path(url2pathname(parsed.path))
        elif parsed.scheme:
            raise UsageError(f"{location}: use a path, file://, http:// or https:// URL")
    folder = Path(location).resolve()
    return folder.as_uri().rstrip("/") + "/", folder


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
        checkout_dir: Path,
        remote: str | Path,
        *,
        limits: TrustLimits | None = None,
        fetcher: FetcherInterface | None = None,
    ) -> None:
        """Verify releases of the repository checked out at ``checkout_dir``.

        Args:
            state_dir: the device's state dir (trust state goes under ``trust/``).
            checkout_dir: the git checkout; metadata is read from ``trust/metadata/``.
            remote: the artifact remote: a folder, ``file://``, ``http(s)://`` URL.
            limits: caps on untrusted input: sizes, and the time each download may take.
            fetcher: transport to use instead of :class:`LocalFetcher` (tests wrap it).

        Raises:
            KeyMaterialError: the device was not provisioned with a root.
            ValueError: ``remote`` has an unsupported URL scheme.
        """
        self._dir = state_dir / TRUST_DIR
        self._anchor = self._dir / ANCHOR_FILE
        if not self._anchor.is_file():
            raise KeyMaterialError(
                f"{self._anchor}: no trust root; provision the device with the repository's "
                "1.root.json first"
            )
        self._limits = limits or TrustLimits()
        self._metadata_url, metadata_dir = _base_url(checkout_dir / METADATA_DIR)
        remote_url, remote_dir = _base_url(remote)
        self._targets_url = f"{remote_url}{TARGETS_DIR}/"
        roots = [d for d in (metadata_dir, remote_dir and remote_dir / TARGETS_DIR) if d]
        self._fetcher = fetcher or LocalFetcher(roots, limits=self._limits)
        self._updater: Updater | None = None

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
            shutil.rmtree(trust_dir / "metadata", ignore_errors=True)
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
        metadata_dir = self._dir / "metadata"
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
            updater.refresh()
        self._updater = updater

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
    ) -> Path:
        """Download and verify a target into ``dest_dir`` as ``<sha256>.<name>``.

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
        _expect(target, model=model, version=version, kind=kind)
        dest = dest_dir / f"{target.sha256}.{PurePosixPath(path).name}"
        return self._download(info, dest)

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
        _expect(target, kind="channels")
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

    def trusted(self) -> dict[str, RoleState]:
        """Version and expiry of each role the device trusts now (empty roles omitted).

        Read from the state dir, where the Updater stores only verified metadata.

        Raises:
            VerificationError: the state dir holds unreadable metadata.
        """
        states: dict[str, RoleState] = {}
        for role in ("root", *ONLINE_ROLES):
            path = self._dir / "metadata" / f"{role}.json"
            if path.is_file():
                with _translated(str(path)):
                    signed = Metadata.from_bytes(path.read_bytes()).signed
                states[role] = RoleState(signed.version, signed.expires)
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
        return info, SignedTarget(path, info.length, sha256, facts)

    def _download(self, info: TargetFile, dest: Path) -> Path:
        updater = self._refreshed()
        if updater.find_cached_target(info, str(dest)) is not None:
            return dest
        partial = dest.with_name(f".{dest.name}.partial")
        with _translated(info.path):
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                # The Updater verifies length and digest before it writes ``partial``;
                # the rename makes the verified file appear whole or not at all.
                updater.download_target(info, str(partial))
                with partial.open("rb") as fh:
                    os.fsync(fh.fileno())
                partial.replace(dest)
            finally:
                partial.unlink(missing_ok=True)
            fsync_dir(dest.parent)
        return dest


def _expect(
    target: SignedTarget,
    *,
    model: str | None = None,
    version: str | None = None,
    kind: TargetKind | None = None,
) -> None:
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
    "LocalFetcher",
    "RoleState",
    "SignedTarget",
    "TrustLimits",
]
