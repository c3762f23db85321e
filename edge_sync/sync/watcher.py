"""Follow where the signed metadata is published: a git branch, or its mirror on the
artifact remote (``edge.yaml``: ``repository.source``).

The device needs only the signed metadata; either source is an untrusted transport
(``edge_sync.sync.trust`` verifies every file it reads).  A watcher's :meth:`sync` answers
"did anything change?" as cheaply as its source allows, and says where the TUF client
reads the metadata (:attr:`metadata`):

- :class:`GitWatcher` (``source: git``, the default): the checkout is shallow (one
  commit), sparse (only ``trust/metadata/`` is written) and blob-filtered where the
  server supports it; an idle poll is one ``ls-remote`` round trip, which compares the
  remote branch's commit with the checkout's before anything is fetched.  Links are
  checked out as plain files (``core.symlinks=false``), only the configured URL is
  contacted, git never prompts, and every git command has a time limit.  The object
  store is bounded: no reflog, everything but the one commit pruned after each fetch,
  and ``.git`` watched during the fetch: over ``TrustLimits.git_store_max_bytes`` (a
  host that ignores the blob filter and sends big files beside the metadata) the fetch
  is killed, the checkout removed, and the sync fails with :class:`GitStoreError`.
- :class:`RemoteMetadataWatcher` (``source: artifacts``): ``publish`` mirrors the
  metadata to ``<artifacts url>/metadata/``; an idle poll is one conditional read of
  ``timestamp.json`` there (HTTP ``If-None-Match``/``If-Modified-Since`` answered
  ``304``, S3 ``IfNoneMatch``, a file's ``stat``; see ``edge_sync.sync.probe``).  Its
  version stamp is the SHA-256 of the ``timestamp.json`` it read, so a server that
  changes an ETag without changing the bytes costs no refresh, and the validators it
  asks with are kept in ``<state_dir>/metadata-watch.json`` (a hint: losing it costs
  one unconditional read).

Errors::

    registry.RegistryError
    └── SourceError                 the metadata's source cannot be reached or read
        ├── GitError                git: unreachable, no such branch, a folder too large
        │   └── GitStoreError       git: the object store grew over its cap
        └── RemoteMetadataError     the artifact remote's mirror: unreachable, missing,
                                    an error status, a timestamp over its size cap
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, Protocol
from urllib.parse import urlsplit
from urllib.request import url2pathname

from pydantic import BaseModel, ConfigDict, ValidationError
from tuf.api import exceptions as tuf_errors

from edge_sync.errors import GitError, GitStoreError, RemoteMetadataError
from edge_sync.sync.limits import TrustLimits
from edge_sync.sync.probe import Probe, Prober, Validators, probe
from registry.atomic import write_atomic
from registry.redact import redact
from signing.tuf_roles import METADATA_DIR, MIRROR_DIR

if TYPE_CHECKING:
    from edge_sync.config import EdgeConfig

__all__ = [
    "WATCH_FILE",
    "GitWatcher",
    "Head",
    "Probe",
    "Prober",
    "RemoteMetadataWatcher",
    "Validators",
    "Watcher",
    "probe",
    "watcher_for",
]

_PROTOCOLS: Final = "file:git:http:https:ssh"
MAX_METADATA_FILES: Final = 100_000
"""Most files the metadata folder may hold (every root version, and the current roles)."""
MAX_METADATA_BYTES: Final = 256 << 20
"""Most bytes it may hold (devices read a few megabytes of it; see ``TrustLimits``)."""
_MAX_OUTPUT: Final = 1 << 20
_STORE_POLL_S: Final = 0.2
"""How often a running git command looks at ``cancelled`` (and a fetch's ``.git`` is
measured against its cap)."""


def _git_env() -> dict[str, str]:
    """The environment git runs in: never prompting, only the allowed protocols, no
    system config, ssh in batch mode, messages in plain English."""
    return {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": _PROTOCOLS,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_SSH_COMMAND": os.environ.get("GIT_SSH_COMMAND", "ssh -o BatchMode=yes"),
        "LC_ALL": "C",
    }


def _kill(proc: subprocess.Popen[str]) -> None:
    """Kill git and the helpers it started (its own session), and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


@dataclass(frozen=True)
class Head:
    """What the source holds now, and whether it moved in this call.

    Attributes:
        commit: an opaque version stamp: the branch's commit (git), or
            ``sha256:<hex>`` of the mirror's ``timestamp.json``.
        changed: whether it differs from what this watcher held before the call.
        prefetched: metadata files the watcher already downloaded, by name under
            :attr:`Watcher.metadata` (``timestamp.json``), so the TUF client does not
            download them again; untrusted like everything the source gives.
    """

    commit: str
    changed: bool
    prefetched: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}))


class Watcher(Protocol):
    """What the updater needs of a source: a poll, and where the metadata is read."""

    @property
    def metadata(self) -> str | Path:
        """The metadata folder or base URL the TUF client reads (``N.root.json``,
        ``timestamp.json`` ...)."""

    def sync(self) -> Head:
        """Poll the source once.

        Raises:
            SourceError: the source cannot be reached or read.
        """


class GitWatcher:
    """A sparse, shallow checkout of ``branch`` of ``url`` at ``checkout``."""

    def __init__(
        self,
        url: str,
        branch: str,
        checkout: Path,
        *,
        timeout_s: float = 120.0,
        store_max_bytes: int | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        """Follow ``branch`` of ``url`` (a path, file://, git://, http(s)://, ssh://),
        with at most ``store_max_bytes`` in ``.git`` (default: ``TrustLimits``'); a git
        command is killed within :data:`_STORE_POLL_S` once ``cancelled`` says so."""
        self.url = url
        self.branch = branch
        self.checkout = checkout
        self.timeout_s = timeout_s
        self.store_max_bytes = store_max_bytes or TrustLimits().git_store_max_bytes
        self._cancelled = cancelled

    @property
    def metadata(self) -> Path:
        """The checkout's metadata folder."""
        return self.checkout / METADATA_DIR

    def _git(self, *args: str, cwd: Path | None = None, bounded: bool = False) -> str:
        """Run git; its output (cut at :data:`_MAX_OUTPUT`).

        Args:
            args: git's arguments.
            cwd: where git runs.
            bounded: watch ``.git`` while it runs, and kill git once it holds more than
                :attr:`store_max_bytes` (a fetch).

        Raises:
            GitError: git failed, is missing, or took longer than :attr:`timeout_s`.
            GitStoreError: ``bounded`` and ``.git`` grew over its cap.
        """
        argv = ["git", *(["-C", str(cwd)] if cwd else []), *args]
        try:
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",  # a git host's messages are untrusted bytes
                env=_git_env(),
                start_new_session=True,  # its helpers (index-pack, ssh) are killed with it
            )
        except FileNotFoundError:
            raise GitError("git is not installed or not on PATH") from None
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                out, err = proc.communicate(timeout=_STORE_POLL_S)
                break
            except subprocess.TimeoutExpired:
                if self._cancelled is not None and self._cancelled():
                    _kill(proc)
                    raise GitError(f"git {args[0]}: stopped, the daemon is stopping") from None
                held = self._store_bytes() if bounded else 0
                if held > self.store_max_bytes:
                    _kill(proc)
                    raise GitStoreError(
                        f"git {args[0]} {self.url}: the checkout's object store holds {held} "
                        f"bytes, over the {self.store_max_bytes} a device keeps "
                        "(TrustLimits.git_store_max_bytes): the host sends files beside "
                        "trust/metadata"
                    ) from None
                if time.monotonic() >= deadline:
                    _kill(proc)
                    raise GitError(
                        f"git {args[0]}: no answer from {self.url} in {self.timeout_s:g} s"
                    ) from None
        if proc.returncode:
            detail = (err or out).strip().splitlines()
            reason = detail[-1] if detail else f"exit {proc.returncode}"
            raise GitError(f"git {args[0]} {self.url}: {reason[:300]}")
        return out[:_MAX_OUTPUT]

    def _store_bytes(self) -> int:
        """Bytes of the files under the checkout's ``.git`` (links not followed)."""
        total = 0
        for folder, _, names in os.walk(self.checkout / ".git"):
            for name in names:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(folder, name)).st_size  # noqa: PTH118 - os.walk's strings
        return total

    def remote_head(self) -> str:
        """The commit the remote branch points to (one round trip).

        Raises:
            GitError: unreachable, or no such branch.
        """
        ref = f"refs/heads/{self.branch}"
        out = self._git("ls-remote", "--", self.url, ref)
        for line in out.splitlines():
            sha, _, name = line.partition("\t")
            if name == ref and len(sha) in (40, 64):
                return sha
        raise GitError(f"{self.url} has no branch {self.branch!r}")

    def local_head(self) -> str | None:
        """The commit the checkout holds, or None before the first fetch."""
        if not (self.checkout / ".git").is_dir():
            return None
        try:
            return (
                self._git("rev-parse", "--verify", "-q", "HEAD^{commit}", cwd=self.checkout).strip()
                or None
            )
        except GitError:
            return None

    def _init(self) -> None:
        self.checkout.mkdir(parents=True, exist_ok=True)
        if (self.checkout / ".git").is_dir():
            known = self._git("config", "--get", "remote.origin.url", cwd=self.checkout).strip()
            if known != self.url:
                self._git("remote", "set-url", "origin", self.url, cwd=self.checkout)
            return
        self._git("init", "-q", str(self.checkout))
        for key, value in (
            ("core.symlinks", "false"),
            ("core.logAllRefUpdates", "false"),  # no reflog keeps an old commit
            ("core.sparseCheckout", "true"),
            ("core.hooksPath", "/dev/null"),
            ("advice.detachedHead", "false"),
            ("gc.auto", "0"),
        ):
            self._git("config", key, value, cwd=self.checkout)
        self._git("remote", "add", "origin", self.url, cwd=self.checkout)
        sparse = self.checkout / ".git/info/sparse-checkout"
        sparse.parent.mkdir(parents=True, exist_ok=True)
        sparse.write_text(f"/{METADATA_DIR}/\n")

    def sync(self) -> Head:
        """Bring the checkout to the remote branch's commit, if it moved.

        The checkout is a cache: one that git cannot use (a power cut in the middle of
        a write) is removed and made again, once per call.

        Raises:
            GitError: the remote cannot be reached or read, or its metadata folder is
                over :data:`MAX_METADATA_FILES` files or :data:`MAX_METADATA_BYTES`.
        """
        remote = self.remote_head()
        if self.local_head() == remote:
            return Head(remote, changed=False)
        try:
            return self._move_to(remote)
        except GitStoreError:
            shutil.rmtree(self.checkout, ignore_errors=True)  # give the disk back
            raise
        except GitError:
            if not (self.checkout / ".git").exists():
                raise
            shutil.rmtree(self.checkout, ignore_errors=True)
            try:
                return self._move_to(remote)
            except GitStoreError:
                shutil.rmtree(self.checkout, ignore_errors=True)
                raise

    def _move_to(self, remote: str) -> Head:
        self._init()
        self._git(
            "fetch", "-q", "--depth=1", "--no-tags", "--filter=blob:none", "origin",
            f"+refs/heads/{self.branch}:refs/remotes/origin/{self.branch}",
            cwd=self.checkout, bounded=True,
        )  # fmt: skip
        fetched = self._git(
            "rev-parse", f"refs/remotes/origin/{self.branch}^{{commit}}", cwd=self.checkout
        ).strip()
        self._check_size(fetched)
        # the blobs of trust/metadata arrive here when the filter was honoured
        self._git("checkout", "-q", "--force", "--detach", fetched, cwd=self.checkout, bounded=True)
        self._prune()
        held = self._store_bytes()
        if held > self.store_max_bytes:
            raise GitStoreError(
                f"{self.url}: one commit of the branch takes {held} bytes in the checkout's "
                f"object store, over the {self.store_max_bytes} a device keeps "
                "(TrustLimits.git_store_max_bytes): the host sends files beside trust/metadata"
            )
        return Head(fetched, changed=True)

    def _prune(self) -> None:
        """Keep only the objects the checked-out commit reaches (its trees, and the
        blobs the checkout holds), in one new pack; every other pack and loose object
        (older commits, files a host sent beside the metadata) is deleted.

        ``git gc`` would not do it: in a partial clone it keeps every object of the
        promisor packs, reachable or not.  The new pack is marked a promisor pack
        too, so that blobs left out by the filter are still allowed to be missing.

        Raises:
            GitError: git could not list or pack the objects.
        """
        git_dir = self.checkout / ".git"
        pack_dir = git_dir / "objects" / "pack"
        head = self._git("rev-parse", "HEAD", cwd=self.checkout).strip()
        listed = self._git_raw("rev-list", "--objects", "--missing=allow-any", head)
        names = b"\n".join(line.split(b" ", 1)[0] for line in listed.splitlines()) + b"\n"
        packed = self._git_raw(
            "pack-objects", "-q", "--missing=allow-any", str(pack_dir / "pack"), stdin=names
        )
        keep = f"pack-{packed.decode('ascii', 'replace').strip()}"
        if not (pack_dir / f"{keep}.pack").is_file():
            raise GitError(f"git pack-objects: no pack {keep} written in {pack_dir}")
        (pack_dir / f"{keep}.promisor").touch()
        for path in pack_dir.iterdir():
            if not path.name.startswith(f"{keep}."):
                path.unlink(missing_ok=True)
        for folder in (git_dir / "objects").iterdir():
            if len(folder.name) == 2 and folder.is_dir() and not folder.is_symlink():
                shutil.rmtree(folder, ignore_errors=True)
        shallow = git_dir / "shallow"
        if shallow.is_file():  # the cut-off commits of history no longer held
            kept = [c for c in shallow.read_text("ascii", "replace").split() if c == head]
            shallow.write_text("".join(f"{c}\n" for c in kept))

    def _git_raw(self, *args: str, stdin: bytes | None = None) -> bytes:
        """git's whole output as bytes (an object listing may be megabytes), with the
        same environment and time limit as :meth:`_git`, in the checkout; local only.

        Raises:
            GitError: git failed or took longer than :attr:`timeout_s`.
        """
        env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
               "GIT_ALLOW_PROTOCOL": "", "LC_ALL": "C"}  # fmt: skip
        try:
            proc = subprocess.run(
                ["git", "-C", str(self.checkout), *args],
                input=stdin,
                capture_output=True,
                env=env,
                timeout=self.timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise GitError("git is not installed or not on PATH") from None
        except subprocess.TimeoutExpired:
            raise GitError(f"git {args[0]}: not done in {self.timeout_s:g} s") from None
        if proc.returncode:
            detail = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            raise GitError(f"git {args[0]}: {(detail[-1] if detail else proc.returncode)!s:.300}")
        return proc.stdout

    def _check_size(self, commit: str) -> None:
        """Refuse a metadata folder too large to be metadata, before it is written out
        (a tiny pack can hold a file of gigabytes of zeros)."""
        listed = self._git(
            "ls-tree", "-r", "-l", "-z", commit, "--", f"{METADATA_DIR}/", cwd=self.checkout
        )
        total, count = 0, 0
        for item in filter(None, listed.split("\x00")):
            meta = item.partition("\t")[0].split()
            count += 1
            if len(meta) == 4 and meta[3].isdigit():
                total += int(meta[3])
        if count > MAX_METADATA_FILES or total > MAX_METADATA_BYTES:
            raise GitError(
                f"{self.url}: {METADATA_DIR} holds {count} files of {total} bytes, over the "
                f"{MAX_METADATA_FILES} files or {MAX_METADATA_BYTES} bytes a device accepts"
            )


WATCH_FILE: Final = "metadata-watch.json"
"""In the state dir: what :class:`RemoteMetadataWatcher` last read (its validators)."""
_MAX_WATCH_BYTES: Final = 4096
TIMESTAMP_FILE: Final = "timestamp.json"


class _Seen(BaseModel):
    """What the watcher last read (:data:`WATCH_FILE`): its stamp, and the validators
    to ask with next time."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    source: str
    stamp: str
    etag: str | None = None
    last_modified: str | None = None
    stat: tuple[int, int, int, int] | None = None

    @property
    def validators(self) -> Validators:
        return Validators(self.etag, self.last_modified, self.stat)


def _resolved(location: str) -> str:
    """A local remote's folder with its links resolved (a URL as it is)."""
    parsed = urlsplit(location)
    if parsed.scheme == "file":
        return Path(url2pathname(parsed.path)).resolve().as_uri()
    if parsed.scheme:
        return location.rstrip("/")
    return str(Path(location).resolve())


def _shown(url: str) -> str:
    """``url`` for a message: no query or fragment (tokens live there), no credentials."""
    return redact(urlsplit(url)._replace(query="", fragment="").geturl())


class RemoteMetadataWatcher:
    """Follow the signed metadata that ``publish`` mirrors to the artifact remote.

    Each :meth:`sync` is one conditional read of ``<artifacts>/metadata/timestamp.json``
    (see the module doc); :attr:`requests` and :attr:`bytes_received` count what the
    polls cost, :attr:`last` is the last one's answer.  For a fleet simulation, pass a
    ``prober`` (the real one is :func:`edge_sync.sync.probe.probe`) to count or fake the
    transport.
    """

    def __init__(
        self,
        artifacts_url: str,
        state_dir: Path,
        *,
        limits: TrustLimits | None = None,
        prober: Prober | None = None,
    ) -> None:
        """Follow ``<artifacts_url>/metadata/`` (a path, file://, http(s):// or s3://),
        keeping what was read in ``state_dir`` (:data:`WATCH_FILE`)."""
        self.artifacts_url = artifacts_url
        self.url = f"{artifacts_url.rstrip('/')}/{MIRROR_DIR}"
        # The operator's path to a local remote is resolved here, once: the probe then
        # follows no link below it (one planted on the remote would name any file).
        self.timestamp_url = f"{_resolved(artifacts_url)}/{MIRROR_DIR}/{TIMESTAMP_FILE}"
        self.state_dir = state_dir
        self.limits = limits or TrustLimits()
        self._prober = prober or probe
        # which remote the kept validators belong to, without keeping its URL (and any
        # credentials in it) on disk
        self._source = hashlib.sha256(self.url.encode()).hexdigest()[:32]
        self.requests = 0
        self.bytes_received = 0
        self.last: Probe | None = None

    @property
    def metadata(self) -> str:
        """The mirror's base URL (or folder): ``<artifacts>/metadata``."""
        return self.url

    def _load(self) -> _Seen | None:
        path = self.state_dir / WATCH_FILE
        try:
            with path.open("rb") as fh:
                data = fh.read(_MAX_WATCH_BYTES + 1)
        except OSError:
            return None
        if len(data) > _MAX_WATCH_BYTES:
            return None
        try:
            seen = _Seen.model_validate_json(data)
        except ValidationError:
            return None  # written by another version, or damaged: ask unconditionally
        return seen if seen.source == self._source else None

    def _save(self, seen: _Seen) -> None:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.state_dir / WATCH_FILE, seen.model_dump_json().encode())
        except OSError:
            pass  # a hint only: the next poll reads the file unconditionally

    def sync(self) -> Head:
        """Ask whether ``timestamp.json`` changed since the copy last read.

        Returns:
            The stamp of the timestamp now held (``sha256:<hex>`` of its bytes), whether
            it differs from the one before, and the bytes when they were read.

        Raises:
            RemoteMetadataError: the mirror cannot be reached, has no
                ``timestamp.json``, answers with an error, is too slow (the time limits
                of :class:`TrustLimits`), or sends more than a timestamp may hold.
        """
        seen = self._load()
        known = seen.validators if seen is not None else Validators()
        shown = _shown(self.timestamp_url)
        try:
            answer = self._prober(self.timestamp_url, known, self.limits)
        except tuf_errors.DownloadHTTPError as e:
            if e.status_code == 404:
                raise RemoteMetadataError(
                    f"{shown}: not found (has `modelreg publish` mirrored the metadata there?)"
                ) from None
            raise RemoteMetadataError(f"{shown}: {e}") from None
        except tuf_errors.SlowRetrievalError as e:
            raise RemoteMetadataError(f"{shown}: too slow: {e}") from None
        except (tuf_errors.DownloadError, OSError) as e:
            raise RemoteMetadataError(f"{shown}: {e}") from None
        self.last = answer
        self.requests += answer.requests
        self.bytes_received += answer.received
        if answer.body is None:
            if seen is None:  # "unchanged" when nothing was asked: a prober's bug
                raise RemoteMetadataError(f"{shown}: not modified, but nothing was held")
            return Head(seen.stamp, changed=False)
        stamp = f"sha256:{hashlib.sha256(answer.body).hexdigest()}"
        v = answer.validators
        now = _Seen(source=self._source, stamp=stamp, etag=v.etag,
                    last_modified=v.last_modified, stat=v.stat)  # fmt: skip
        if now != seen:
            self._save(now)
        prefetched = MappingProxyType({TIMESTAMP_FILE: answer.body})
        return Head(stamp, changed=seen is None or seen.stamp != stamp, prefetched=prefetched)


def watcher_for(
    config: EdgeConfig,
    state_dir: Path,
    checkout: Path,
    *,
    limits: TrustLimits | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Watcher:
    """The watcher ``config`` asks for (``repository.source``).

    Args:
        config: the device's configuration.
        state_dir: the state dir (the remote watcher keeps its validators there).
        checkout: where the git watcher keeps its checkout.
        limits: caps and time limits on what the remote sends.
        cancelled: asked while a poll waits (git, or the mirror's timestamp); True
            ends the poll within a fraction of a second (a stopping daemon).
    """
    repo = config.repository
    if repo.source == "artifacts":
        prober = functools.partial(probe, cancelled=cancelled)
        return RemoteMetadataWatcher(config.artifacts.url, state_dir, limits=limits, prober=prober)
    assert repo.url is not None  # noqa: S101 - the config requires it for git
    cap = (limits or TrustLimits()).git_store_max_bytes
    return GitWatcher(repo.url, repo.branch, checkout, store_max_bytes=cap, cancelled=cancelled)
