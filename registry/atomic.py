"""Atomic file replacement: readers see the old file or the new one, never a mix."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def fsync_dir(folder: Path) -> None:
    """Flush a directory entry change (rename, create) to disk."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replacement_mode(path: Path) -> int:
    """Permission bits for a file about to replace ``path``: its own, else the umask's.

    ``mkstemp`` creates files 0600, which would hide a replaced model from the user
    that serves it; a replacement keeps what the old file had.
    """
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    Writes a temporary file in the same directory, fsyncs it, renames it over
    ``path`` and fsyncs the directory.  An existing file's permission bits are kept
    unless ``mode`` is given.

    Raises:
        OSError: the directory is not writable or the disk is full; ``path`` is
            then untouched and no temporary file is left behind.
    """
    folder = path.parent
    if mode is None:
        mode = replacement_mode(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        Path(tmp).replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            Path(tmp).unlink()
        raise
    fsync_dir(folder)
