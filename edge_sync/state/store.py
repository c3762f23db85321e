"""The device's state dir: one atomically replaced state file, content-addressed blobs,
a lock, and the daemon's announcement (stable API).

Layout (docs/reference/daemon.md)::

    <state_dir>/            0700: only the daemon's user reads it or takes its lock
      lock                  held (flock) by the running daemon; a second one is refused
      state.json            what is installed and why: replaced atomically, never edited
      daemon.json           the running daemon's pid, listen address, start time
      blobs/sha256/<hex>    verified files by SHA-256 (artifacts, engines, goldens)
      tmp/                  downloads and delta outputs in progress (never used as is)
      checkout/             the sparse git checkout (untrusted: only metadata is read)
      trust/                the TUF client's trusted metadata (``edge_sync.sync.trust``)

Crash safety rests on two rules: a blob appears under its digest only once its bytes
verified (written in ``tmp/``, fsynced, renamed), and ``state.json`` names only blobs
that exist.  So after a SIGKILL at any point the state file is the old one or the new
one, every blob it names is whole, and what is left in ``tmp/`` is discarded (or
resumed, for a download) at the next start.

Whatever the umask, the state dir is made (and kept) 0700 and the files written here
0600 (blobs 0400): a daemon run by hand under umask 022 must not show other users its
blobs, and no other user may open ``lock``, whose shared lock would stop a restart.
Sync records carry a sequence number (:attr:`SyncInfo.seq`): the newest is the highest,
whatever the clock said when each was written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from edge_sync.errors import LockedError, StateError
from edge_sync.state.models import FORMAT, DaemonInfo, DeviceState, SyncInfo
from registry.atomic import fsync_dir, replace_file, write_atomic

__all__ = [
    "BLOBS_DIR",
    "STATE_FILE",
    "BlobStore",
    "StateDir",
]

STATE_FILE: Final = "state.json"
DAEMON_FILE: Final = "daemon.json"
SYNC_FILE: Final = "sync.json"
LOCK_FILE: Final = "lock"
BLOBS_DIR: Final = "blobs/sha256"
TMP_DIR: Final = "tmp"
CHECKOUT_DIR: Final = "checkout"
PARTIAL_DIR: Final = "partial"
MAX_STATE_BYTES: Final = 16 << 20
_HASH_CHUNK: Final = 1 << 20
DIR_MODE: Final = 0o700
FILE_MODE: Final = 0o600
BLOB_MODE: Final = 0o400
_LOCK_WAIT_S: Final = 2.0
"""How long :meth:`StateDir.lock` waits out a brief holder (``edge status`` looking)."""


class BlobStore:
    """Verified files by SHA-256 under ``blobs/sha256/``."""

    def __init__(self, folder: Path, tmp: Path) -> None:
        """Use ``folder`` for blobs and ``tmp`` for files in progress (same filesystem)."""
        self._stamps: dict[str, tuple[int, int, int, int]] = {}
        self.folder = folder
        self.tmp = tmp

    def path(self, sha256: str) -> Path:
        """Where blob ``sha256`` lives (whether or not it exists)."""
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise StateError(f"not a SHA-256 digest: {sha256[:80]!r}")
        return self.folder / sha256

    def has(self, sha256: str) -> bool:
        """Whether the blob exists (its content is trusted: it verified when added)."""
        return self.path(sha256).is_file()

    def verify(self, sha256: str) -> bool:
        """Whether the blob exists and still hashes to its name (a disk may rot)."""
        try:
            with self.path(sha256).open("rb") as fh:
                before = _stamp(os.fstat(fh.fileno()))
                hasher = hashlib.sha256()
                while chunk := fh.read(_HASH_CHUNK):
                    hasher.update(chunk)
                after = _stamp(os.fstat(fh.fileno()))
            now = _stamp(self.path(sha256).lstat())
        except FileNotFoundError:
            return False
        if hasher.hexdigest() != sha256:
            return False
        if before == after == now:  # the file hashed is the one there, unwritten since
            self._stamps[sha256] = now
        return True

    def unchanged(self, sha256: str) -> bool:
        """Whether the blob is as it was when this process last verified or adopted it
        (inode, size, modification and change times: one ``stat``, no hashing).  A
        local process that writes to a blob, or swaps or re-modes it, changes its
        change time, which only the kernel sets; False for a blob this process has
        not verified."""
        known = self._stamps.get(sha256)
        try:
            return known is not None and _stamp(self.path(sha256).lstat()) == known
        except FileNotFoundError:
            return False

    def checked(self, sha256: str) -> bool:
        """Whether the blob may be used as verified: unchanged since this process
        verified it, else hashed again now (:meth:`verify`)."""
        return self.unchanged(sha256) or self.verify(sha256)

    def adopt(self, verified: Path, sha256: str) -> Path:
        """Move a file whose content verified as ``sha256`` into the store.

        The caller verified it; it must be on the same filesystem (``tmp/``).
        """
        self.folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        path = replace_file(verified, self.path(sha256), mode=BLOB_MODE)
        self._stamps[sha256] = _stamp(path.lstat())
        return path

    def discard(self, sha256: str) -> None:
        """Remove a blob (one that no longer hashes to its name)."""
        self._stamps.pop(sha256, None)
        with contextlib.suppress(FileNotFoundError):
            self.path(sha256).unlink()

    def collect(self, keep: set[str]) -> list[str]:
        """Remove every blob not in ``keep``; returns the digests removed."""
        removed: list[str] = []
        if not self.folder.is_dir():
            return removed
        for path in self.folder.iterdir():
            if path.name not in keep:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                removed.append(path.name)
        if removed:
            fsync_dir(self.folder)
        return removed

    def clear_tmp(self) -> None:
        """Remove files in progress left by a crash or a failed update (the folders of
        interrupted downloads, ``tmp/partial/``, stay to be resumed)."""
        if not self.tmp.is_dir():
            return
        for path in self.tmp.iterdir():
            if path.name == PARTIAL_DIR:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class StateDir:
    """One device's state dir: the lock, the state file, the blobs."""

    def __init__(self, root: Path) -> None:
        """Use ``root`` (created when first locked)."""
        self.root = root
        self.blobs = BlobStore(root / BLOBS_DIR, root / TMP_DIR)
        self._lock_fd: int | None = None
        self._seq: int | None = None
        """The highest sync record number written or read (None: not looked yet)."""

    @property
    def checkout(self) -> Path:
        """The git checkout folder."""
        return self.root / CHECKOUT_DIR

    @property
    def partials(self) -> Path:
        """Interrupted downloads, resumed by the next try (``tmp/partial/``)."""
        return self.blobs.tmp / PARTIAL_DIR

    # --- the lock --------------------------------------------------------------------

    def lock(self) -> None:
        """Take the state dir for this process (until :meth:`unlock` or exit).

        The dir is made 0700 (an existing one is narrowed to it) and ``lock`` 0600, so
        no other user can open the lock, let alone hold it; a holder of a moment (this
        user's ``edge status`` looking whether a daemon runs) is waited out.

        Raises:
            LockedError: another live process holds it.
            OSError: the state dir cannot be created.
        """
        self._private_root()
        fd = os.open(
            self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE
        )
        try:
            os.fchmod(fd, FILE_MODE)  # a lock file made before, by a looser daemon
            self._flock(fd)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                info = self.daemon_info()
                who = f" (pid {info.pid})" if info else ""
                raise LockedError(
                    f"{self.root}: another modelreg edge daemon{who} uses this state dir"
                ) from None
            raise
        self._lock_fd = fd
        for folder in (self.blobs.folder, self.blobs.tmp):
            folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)

    @staticmethod
    def _flock(fd: int) -> None:
        """Take ``fd``'s exclusive lock, retrying for :data:`_LOCK_WAIT_S`.

        Raises:
            OSError: EWOULDBLOCK when it is still held after that.
        """
        deadline = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    raise
                if time.monotonic() >= deadline:
                    raise
            else:
                return
            time.sleep(0.05)

    def _private_root(self) -> None:
        """Make the state dir, 0700 whatever the umask (an existing one narrowed)."""
        self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        info = self.root.lstat()
        if stat.S_ISDIR(info.st_mode) and info.st_mode & 0o077 and info.st_uid == os.getuid():
            self.root.chmod(stat.S_IMODE(info.st_mode) & ~0o077)

    def unlock(self, *, forget: bool = True) -> None:
        """Release the lock, and with ``forget`` the daemon announcement (a daemon that
        did not stop cleanly leaves it: the next start tells an unclean stop by it)."""
        if self._lock_fd is None:
            return
        if forget:
            with contextlib.suppress(FileNotFoundError):
                (self.root / DAEMON_FILE).unlink()
        os.close(self._lock_fd)
        self._lock_fd = None

    def locked_by_other(self) -> bool:
        """Whether a live process (not this one) holds the lock.

        Raises:
            StateError: this user may not open the lock (the dir is the daemon's own).
        """
        path = self.root / LOCK_FILE
        if self._lock_fd is not None or not path.exists():
            return False
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except PermissionError:
            raise StateError(
                f"{self.root}: readable only by the daemon's user (run as that user, or root)"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)  # closing drops a lock we may have taken
        return False

    # --- the files -------------------------------------------------------------------

    def load(self) -> DeviceState:
        """The committed state (a fresh one before the first commit).

        Raises:
            StateError: the state file is corrupt or of a newer format.
        """
        path = self.root / STATE_FILE
        try:
            with path.open("rb") as fh:
                raw = fh.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return DeviceState()
        if len(raw) > MAX_STATE_BYTES:
            raise StateError(f"{path}: larger than {MAX_STATE_BYTES} bytes; not a state file")
        try:
            state = DeviceState.model_validate_json(raw)
        except ValidationError as e:
            detail = e.errors()[0]
            where = ".".join(str(p) for p in detail["loc"]) or "document"
            raise StateError(f"{path}: corrupt state file ({where}: {detail['msg']})") from None
        if state.format > FORMAT:
            raise StateError(f"{path}: format {state.format} is newer than this modelreg's")
        self._seq = max(self._seq or 0, state.sync.seq)
        return state

    def load_or_recover(self, last_channels: Callable[[], dict[str, Any] | None]) -> DeviceState:
        """The committed state; a corrupt state file is moved aside (``state.json.
        corrupt``) and a fresh state begins, which says so in ``sync.reason`` (the
        blobs stay: what is reinstalled from them is verified again).  ``last_channels``
        gives the fresh state the channels document last verified (the trust layer keeps
        it), whose sequences stay the high-water marks.

        Raises:
            StateError: the state file is of a newer format (not ours to replace).
        """
        try:
            return self.load()
        except StateError as e:
            if "is newer than" in str(e):
                raise
            path = self.root / STATE_FILE
            with contextlib.suppress(FileNotFoundError):
                path.replace(self.root / f"{STATE_FILE}.corrupt")
            fresh = DeviceState(
                channels=last_channels(),
                sync=SyncInfo(result="failed", reason=f"{e}; started afresh"),
            )
            self.commit(fresh)
            return fresh

    def commit(self, state: DeviceState) -> None:
        """Replace the state file atomically and durably (0600); a sync record not
        written before gets the next number (:attr:`SyncInfo.seq`)."""
        written = state.sync.last_checked is not None or state.sync.result is not None
        if state.sync.seq == 0 and written:
            state = state.model_copy(update={"sync": self._numbered(state.sync)})
        data = json.dumps(state.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"
        self._private_root()
        write_atomic(self.root / STATE_FILE, data.encode(), mode=FILE_MODE)
        self._seq = max(self._seq or 0, state.sync.seq)

    def note_sync(self, info: SyncInfo) -> None:
        """Record an idle sync in ``sync.json`` (no fsync: losing it costs nothing),
        numbered after every record before it."""
        info = self._numbered(info) if info.seq == 0 else info
        data = (json.dumps(info.model_dump(mode="json")) + "\n").encode()
        tmp = self.root / f".{SYNC_FILE}.tmp"
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = os.open(tmp, flags, FILE_MODE)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            tmp.replace(self.root / SYNC_FILE)
            self._seq = max(self._seq or 0, info.seq)

    def _noted(self) -> SyncInfo | None:
        try:
            return SyncInfo.model_validate_json((self.root / SYNC_FILE).read_bytes())
        except (OSError, ValidationError):
            return None

    def _numbered(self, info: SyncInfo) -> SyncInfo:
        """``info`` numbered after the newest record in ``state.json`` and ``sync.json``."""
        if self._seq is None:
            try:
                self._seq = self.load().sync.seq
            except StateError:
                self._seq = 0
        noted = self._noted()
        newest = max(self._seq, noted.seq if noted is not None else 0)
        return info.model_copy(update={"seq": newest + 1})

    def last_sync(self, state: DeviceState) -> SyncInfo:
        """The newer of the state's sync entry and the idle one in ``sync.json``: the
        higher number (a clock that ran ahead once must not hide the records after
        it); records from before numbers by their time, read as times."""
        noted = self._noted()
        if noted is None:
            return state.sync
        if noted.seq or state.sync.seq:
            return noted if noted.seq > state.sync.seq else state.sync
        return noted if _when(noted) > _when(state.sync) else state.sync

    def announce(self, info: DaemonInfo) -> None:
        """Write ``daemon.json`` for ``edge status``."""
        data = json.dumps(info.model_dump(mode="json"), indent=1) + "\n"
        write_atomic(self.root / DAEMON_FILE, data.encode(), mode=FILE_MODE)

    def daemon_info(self) -> DaemonInfo | None:
        """The running daemon's announcement, if any (may be stale: check the lock)."""
        try:
            return DaemonInfo.model_validate_json((self.root / DAEMON_FILE).read_bytes())
        except (OSError, ValidationError):
            return None

    @contextlib.contextmanager
    def locked(self) -> Iterator[StateDir]:
        """``with state_dir.locked():`` hold the lock for the block."""
        self.lock()
        try:
            yield self
        finally:
            self.unlock()


def _when(info: SyncInfo) -> datetime:
    """When an unnumbered record says it was written (the oldest time when it cannot)."""
    try:
        at = datetime.fromisoformat((info.last_checked or "").replace("Z", "+00:00"))
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
