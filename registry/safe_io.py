"""Open files of a work tree that arrived with a pull request: never through a link,
never unbounded (stable API).

A pull request can commit a symbolic link anywhere: a manifest that points at
``.modelreg/keys/targets.key``, a ``.dvc`` pointer that points at a token file, an
artifact that points at ``/etc/passwd``, or a folder (``manifests/mlp -> /etc``) that
moves every file below it.  Following one would print, hash or sign a file the
pull request does not own.  So every read of the work tree goes through here:

* below the repository root, every folder is opened with ``O_NOFOLLOW`` relative to
  its parent's descriptor (``openat``), and the file itself with ``O_NOFOLLOW``: a link
  anywhere inside the repository is refused, a link above the root (the runner's own
  ``/tmp`` -> ``/private/tmp``) is not the pull request's doing and is allowed;
* only a regular file is read (a FIFO would block, a device would never end): the
  check is ``fstat`` on the opened descriptor, so nothing can change in between;
* a size cap is checked on that descriptor before reading, and the read stops at
  the cap whatever the size said.

Refusals are :class:`~registry.errors.UnsafeFileError`: one short reason, no content.

Stable API: ``open_regular``, ``read_regular``, ``check_regular``, ``check_folder``,
``reusing_folders``, ``folder_reader``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import BinaryIO, Final

from registry.errors import FileTooLargeError, UnsafeFileError

_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever;
# regular files ignore the flag.
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_LINK_REASON: Final = "is a symbolic link; links in a repository are never followed"


def _parts(path: Path | str, root: Path | None) -> tuple[str, tuple[str, ...]]:
    """(where the walk starts, the components to open below it).

    Raises:
        UnsafeFileError: ``path`` is not below ``root`` or holds ``..``.
    """
    absolute = os.path.abspath(path)  # noqa: PTH100 - no resolve(): links must stay visible
    if root is None:
        head, name = os.path.split(absolute)
        return head, (name,)
    base = os.path.abspath(root)  # noqa: PTH100
    if absolute.startswith(base + os.sep):
        # Both are normalised (abspath), so this is what relpath would give, at a
        # fraction of its cost: loading a repository comes here twice per version.
        return base, tuple(absolute[len(base) + 1 :].split(os.sep))  # noqa: PTH206
    rel = os.path.relpath(absolute, base)
    parts = Path(rel).parts
    if rel == "." or parts[0] == ".." or os.path.isabs(rel):  # noqa: PTH117
        raise UnsafeFileError(str(path), "is outside the repository")
    return base, parts


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


class _Folders:
    """Descriptors of folders already opened (as ``_open_folder`` does), most recent last.

    Loading a repository reads two files in each of thousands of folders: walking from
    the root for each one costs more than reading it.  A descriptor stays the folder
    it was opened as (never a link), so reusing it within one load is as safe as
    opening it again, and safer against a folder swapped in the meantime.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.fds: OrderedDict[tuple[str, ...], int] = OrderedDict()

    def get(self, key: tuple[str, ...]) -> int | None:
        fd = self.fds.get(key)
        if fd is not None:
            self.fds.move_to_end(key)
        return fd

    def put(self, key: tuple[str, ...], fd: int) -> None:
        self.fds[key] = fd
        while len(self.fds) > self.size:
            os.close(self.fds.popitem(last=False)[1])

    def close(self) -> None:
        while self.fds:
            os.close(self.fds.popitem()[1])


_FOLDERS: ContextVar[_Folders | None] = ContextVar("modelreg_safe_io_folders", default=None)
_FOLDERS_HELD: Final = 64
"""Descriptors kept open by ``reusing_folders`` (well under any open-files limit)."""


@contextlib.contextmanager
def reusing_folders() -> Iterator[None]:
    """Within this block each folder walked to is opened once, not once per file.

    The refusals are the same (a link below the root is refused when the folder is
    first opened; a file is always opened with ``O_NOFOLLOW``).  A few descriptors
    stay open until the block ends; a process forked inside it may use them too.
    """
    if _FOLDERS.get() is not None:
        yield
        return
    folders = _Folders(_FOLDERS_HELD)
    token = _FOLDERS.set(folders)
    try:
        yield
    finally:
        _FOLDERS.reset(token)
        folders.close()


def _open_folder(start: str, folders: tuple[str, ...], shown: str) -> int:
    """A descriptor of ``start/folders...``, no component of ``folders`` a link.

    Inside ``reusing_folders`` the descriptor is shared: close it with ``_release``.

    Raises:
        UnsafeFileError: a component is a link.
        OSError: a component is missing or not a folder.
    """
    held = _FOLDERS.get()
    if held is None:
        return _walk(start, folders, shown)
    key = (start, *folders)
    fd = held.get(key)
    if fd is not None:
        return fd
    if folders:
        parent = _open_folder(start, folders[:-1], shown)
        fd = _step(parent, folders, len(folders) - 1, shown)
    else:
        fd = os.open(start, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    held.put(key, fd)
    return fd


def _release(fd: int) -> None:
    """Close a descriptor from ``_open_folder`` unless ``reusing_folders`` holds it."""
    if _FOLDERS.get() is None:
        os.close(fd)


def _step(fd: int, folders: tuple[str, ...], i: int, shown: str) -> int:
    """Open ``folders[i]`` in the folder ``fd``, refusing a link."""
    part = folders[i]
    try:
        return os.open(part, _DIR_FLAGS, dir_fd=fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(part, fd):
            where = "/".join(folders[: i + 1])
            raise UnsafeFileError(shown, f"folder {where} {_LINK_REASON}") from None
        raise


def _walk(start: str, folders: tuple[str, ...], shown: str) -> int:
    fd = os.open(start, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        for i in range(len(folders)):
            child = _step(fd, folders, i, shown)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: Path, *, root: Path | None = None, max_bytes: int | None = None) -> BinaryIO:
    """Open ``path`` for reading; refuse links, anything but a regular file, and size.

    Args:
        path: the file.
        root: the repository root; every folder between it and ``path`` must be a real
            folder too.  Without it only ``path`` itself is checked (a file the user
            named outside any repository).
        max_bytes: refuse a larger file (checked on the open descriptor).

    Returns:
        The open file (binary, unbuffered reads are the caller's choice); close it.

    Raises:
        UnsafeFileError: ``path`` or a folder below ``root`` is a link, ``path`` is
            not a regular file, or it is outside ``root``.
        FileTooLargeError: larger than ``max_bytes``.
        FileNotFoundError: it or a folder on the way does not exist.
        IsADirectoryError: it is a folder.
        OSError: it cannot be opened for another reason (permissions).
    """
    return os.fdopen(_open_fd(path, root, max_bytes), "rb")


def _open_fd(path: Path | str, root: Path | None, max_bytes: int | None) -> int:
    """The descriptor ``open_regular`` wraps (the same checks and refusals)."""
    return _open_sized(path, root, max_bytes)[0]


def _open_sized(path: Path | str, root: Path | None, max_bytes: int | None) -> tuple[int, int]:
    """``_open_fd``'s descriptor and the size ``fstat`` gave it."""
    shown = str(path)
    start, parts = _parts(path, root)
    dir_fd = _open_folder(start, parts[:-1], shown)
    try:
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as e:
            if e.errno == errno.ELOOP or (e.errno == errno.ENOTDIR and _is_link(parts[-1], dir_fd)):
                raise UnsafeFileError(shown, _LINK_REASON) from None
            raise
    finally:
        _release(dir_fd)
    try:
        size = _check_opened(fd, shown, max_bytes)
    except BaseException:
        os.close(fd)
        raise
    return fd, size


def _check_opened(fd: int, shown: str, max_bytes: int | None) -> int:
    # On the descriptor itself: what is checked is what will be read.
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), shown)
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFileError(shown, "is not a regular file")
    if max_bytes is not None and info.st_size > max_bytes:
        raise FileTooLargeError(shown, info.st_size, max_bytes)
    os.set_blocking(fd, True)
    return info.st_size


def read_regular(path: Path | str, *, root: Path | None = None, max_bytes: int) -> bytes:
    """The content of ``path``, opened as :func:`open_regular` does, at most ``max_bytes``.

    Raises:
        UnsafeFileError: see :func:`open_regular`.
        FileTooLargeError: larger than ``max_bytes`` (also when it grew while read).
        FileNotFoundError: it or a folder on the way does not exist.
        IsADirectoryError: it is a folder.
        OSError: it cannot be read.
    """
    # Straight from the descriptor: a buffered file object costs more than reading a
    # manifest does, and a repository load reads two files per version.
    fd, size = _open_sized(path, root, max_bytes)
    try:
        return _read_fd(fd, str(path), max_bytes, size)
    finally:
        os.close(fd)


def _read_fd(fd: int, shown: str, max_bytes: int, size: int) -> bytes:
    """At most ``max_bytes`` of ``fd``, which ``fstat`` said holds ``size`` bytes; one
    more means it grew while read: refused."""
    # Sized by fstat (a buffer of max_bytes per read costs more than the read): a first
    # read that returned exactly the size met the end of the file.  Anything else reads
    # on, to the cap: the file grew, it is a /proc file that stats as 0 bytes, or the
    # read was short (Linux returns at most 2 GiB - 4 KiB per read; FUSE may return less).
    chunks = [os.read(fd, min(max_bytes, size) + 1)]
    left = max_bytes + 1 - len(chunks[0])
    while len(chunks[0]) != size and left > 0:
        chunk = os.read(fd, left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if len(data) > max_bytes:
        raise FileTooLargeError(shown, len(data), max_bytes)
    return data


@contextlib.contextmanager
def folder_reader(folder: Path, *, max_bytes: int) -> Iterator[Callable[[str], bytes]]:
    """``with folder_reader(folder, max_bytes=N) as read: read(name)``: the files of one
    folder by name, as :func:`read_regular` reads them (no link, a regular file, at most
    ``max_bytes``), with the folder opened once (``openat``) rather than walked to for
    every file: for folders of thousands of small files (the fleet's device reports).

    ``folder`` itself is the caller's to trust (a link to it is followed); what is in
    it is not.

    Raises:
        FileNotFoundError, NotADirectoryError, OSError: ``folder`` cannot be opened.

    ``read`` raises :class:`~registry.errors.UnsafeFileError` (a link, not a regular
    file, a name that is not a plain name in the folder), ``FileTooLargeError``, and
    ``OSError`` (gone, a folder, unreadable).
    """
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)

    def read(name: str) -> bytes:
        shown = str(folder / name)
        if not name or "/" in name or name in (".", ".."):
            raise UnsafeFileError(shown, "is not a plain name in its folder")
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnsafeFileError(shown, _LINK_REASON) from None
            raise
        try:
            return _read_fd(fd, shown, max_bytes, _check_opened(fd, shown, max_bytes))
        finally:
            os.close(fd)

    try:
        yield read
    finally:
        os.close(dir_fd)


def check_regular(path: Path, *, root: Path | None = None) -> None:
    """Check that ``path`` is a regular file reached through no link (opens and closes it).

    Raises:
        UnsafeFileError: see :func:`open_regular`.
        FileNotFoundError: it or a folder on the way does not exist.
        IsADirectoryError: it is a folder.
        OSError: it cannot be opened.
    """
    open_regular(path, root=root).close()


def check_folder(path: Path, *, root: Path) -> None:
    """Check that ``path`` is a folder below ``root`` reached through no link.

    Raises:
        UnsafeFileError: it, or a folder on the way, is a link; or it is outside ``root``.
        FileNotFoundError: it does not exist.
        NotADirectoryError: it is not a folder.
        OSError: it cannot be opened.
    """
    start, parts = _parts(path, root)
    _release(_open_folder(start, parts, str(path)))


__all__ = [
    "check_folder",
    "check_regular",
    "folder_reader",
    "open_regular",
    "read_regular",
    "reusing_folders",
]
