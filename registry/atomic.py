"""Atomic file replacement: readers see the old file or the new one, never a mix (stable API).

Every file modelreg writes where a reader may look (manifests, keys, trust metadata,
targets on a local remote, rebuilt models, engines, a device's state) goes through one
discipline, here:

1. a temporary file in the destination's own folder (a rename is atomic only within
   one file system), created exclusively (``O_EXCL``, never through a link);
2. write, flush, ``fsync``;
3. permission bits: ``mode`` when given, else the replaced file's own, else what the
   process's umask gives a new file;
4. ``os.replace`` onto the destination, then ``fsync`` the folder, so the rename
   itself survives a power cut.

On any failure the temporary file is removed and the destination is untouched.

:class:`AtomicFile` is the general form (write in pieces, verify before committing),
:func:`write_atomic` the one-call form for bytes, and :func:`replace_file` steps 2 to
4 for a file another program wrote (ONNX Runtime's optimized model, a download).

The process umask is never changed: ``os.umask`` can only be read by setting it, and
a thread that creates a file while another has set it to 0 gets a world-writable file.
A new file is created with mode 0o666 and the kernel applies the umask.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Final

__all__ = [
    "AtomicFile",
    "current_umask",
    "fsync_dir",
    "replace_file",
    "replacement_mode",
    "write_atomic",
]

_CREATE: Final = (
    os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
)
_ATTEMPTS: Final = 100


def fsync_dir(folder: Path) -> None:
    """Flush a directory entry change (rename, create) to disk.

    Raises:
        OSError: the folder cannot be opened.
    """
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask_from_proc() -> int | None:
    # Linux states the umask in /proc (since 4.7): reading it changes nothing.
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:  # noqa: PTH123
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _umask_at_import() -> int:
    found = _umask_from_proc()
    if found is not None:
        return found
    # No /proc: the one read that must set it, done once, while this module is being
    # imported (under the import lock, before any writer here can run).  The value set
    # meanwhile is the strictest, so a file another thread creates in that instant is
    # private rather than world-writable.
    umask = os.umask(0o077)
    os.umask(umask)
    return umask


_UMASK_AT_IMPORT: Final = _umask_at_import()


def current_umask() -> int:
    """The process's umask, read without changing it.

    From ``/proc/self/status`` where the system has it; elsewhere the value read once
    when this module was imported.
    """
    found = _umask_from_proc()
    return _UMASK_AT_IMPORT if found is None else found


def replacement_mode(path: Path) -> int:
    """Permission bits for a file about to replace ``path``: its own, else the umask's.

    A replaced model keeps what the old file had, so the user that serves it can
    still read it.
    """
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        return 0o666 & ~current_umask()


def _existing_mode(path: Path) -> int | None:
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        return None


class AtomicFile:
    """A temporary file beside ``path`` that replaces it on :meth:`commit`.

    As a context manager it commits when the block ends normally and aborts on an
    exception, so a check that raises inside the block (a digest that does not match)
    leaves ``path`` as it was::

        with AtomicFile(dest, mode=0o644) as out:
            out.file.write(data)
            check(out.file)  # raises: nothing replaced

    Attributes:
        path: the file to replace.
        file: the temporary file, open for reading and writing.
    """

    def __init__(self, path: Path, *, mode: int | None = None, buffering: int = -1) -> None:
        """Create the temporary file.

        Args:
            path: the file to replace (its folder must exist).
            mode: permission bits of the result; by default the replaced file's,
                else what the umask gives a new file.
            buffering: as :func:`open`'s.

        Raises:
            OSError: the folder is not writable.
        """
        self.path = path
        self._mode = mode
        self._tmp, fd = _create_beside(path)
        try:
            self.file: BinaryIO = os.fdopen(fd, "w+b", buffering=buffering)
        except BaseException:
            os.close(fd)
            self._tmp.unlink(missing_ok=True)
            raise
        self._done = False

    def write(self, data: bytes | memoryview) -> int:
        """Write ``data`` to the temporary file.

        Raises:
            OSError: the disk is full.
        """
        return self.file.write(data)

    def commit(self) -> Path:
        """Make the written bytes durable and put them at ``path``.

        Raises:
            OSError: flushing, renaming or syncing failed; the temporary file is
                removed and ``path`` is as it was.
            ValueError: already committed or aborted.
        """
        if self._done:
            raise ValueError(f"{self.path}: already committed or aborted")
        try:
            self.file.flush()
            mode = self._mode if self._mode is not None else _existing_mode(self.path)
            if mode is not None:
                os.fchmod(self.file.fileno(), mode)
            os.fsync(self.file.fileno())
            self.file.close()
            self._tmp.replace(self.path)
        except BaseException:
            self.abort()
            raise
        self._done = True
        fsync_dir(self.path.parent)
        return self.path

    def abort(self) -> None:
        """Drop the temporary file; ``path`` stays as it was (nothing to do once done)."""
        if self._done:
            return
        self._done = True
        self.file.close()
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def _create_beside(path: Path) -> tuple[Path, int]:
    """A new, exclusively created file in ``path``'s folder, and its descriptor.

    Mode 0o666 lets the kernel apply the umask (``mkstemp`` would make it 0600).
    """
    for _ in range(_ATTEMPTS):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return tmp, os.open(tmp, _CREATE, 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(f"{path.parent}: no free temporary name after {_ATTEMPTS} tries")


def write_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    An existing file's permission bits are kept unless ``mode`` is given.

    Raises:
        OSError: the directory is not writable or the disk is full; ``path`` is
            then untouched and no temporary file is left behind.
    """
    with AtomicFile(path, mode=mode) as out:
        out.write(data)


def replace_file(written: Path, path: Path, *, mode: int | None = None) -> Path:
    """Put ``written`` (a complete file another program wrote) at ``path``, durably.

    ``written`` must be on ``path``'s file system, best in its folder.  It is synced,
    given ``mode`` when set, renamed over ``path``, and the folder(s) synced.

    Raises:
        OSError: syncing or renaming failed; ``written`` is removed and ``path`` is
            as it was.
    """
    try:
        fd = os.open(written, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        written.replace(path)
    except BaseException:
        written.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    if written.parent != path.parent:
        fsync_dir(written.parent)
    return path
