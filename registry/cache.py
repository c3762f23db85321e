"""A parse cache for manifests, keyed by each file's stat (like git's index).

Parsing YAML is most of the cost of loading a large repository, and between two
commands almost no file changes.  The cache keeps the *parsed data* (never the
validated result: validation and cross-references always run) in JSON, which is
safe to read even if someone commits a crafted cache file, unlike pickle.

An entry is used only when the file's size, mtime, ctime and inode all match.  Like
git's "racily clean" rule, entries for files modified less than a couple of seconds
before the cache was written are not stored, since a later edit within the same
timestamp tick could go unnoticed (on file systems with whole-second timestamps).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Final

from registry.atomic import write_atomic
from registry.errors import RegistryError

CACHE_FILE: Final = ".modelreg/cache/manifests.json"
_MAX_BYTES: Final = 1 << 30
_FORMAT: Final = 1
_RACY_SECONDS: Final = 2.0

Stamp = tuple[int, int, int, int]


def stamp_of(st: os.stat_result) -> Stamp:
    """What identifies one state of a file: size, mtime, ctime (ns) and inode."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class ParseCache:
    """Parsed manifest data by path, valid while the file's stamp is unchanged."""

    def __init__(self, root: Path, key: str) -> None:
        """Open the cache of the repository at ``root``.

        Args:
            root: repository root.
            key: what else the data depends on (modelreg version, limits); a cache
                written under another key is ignored.
        """
        self.root = root
        self.path = root / CACHE_FILE
        self.key = key
        self.entries: dict[str, list[Any]] = {}
        self.dirty = False
        with contextlib.suppress(ValueError, TypeError, KeyError):
            held = read_own(root, CACHE_FILE, _MAX_BYTES)
            raw: Any = json.loads(held) if held is not None else {}
            if raw["format"] == _FORMAT and raw["key"] == key and isinstance(raw["entries"], dict):
                self.entries = raw["entries"]

    def get(self, path: str, stamp: Stamp) -> Any | None:
        """The cached data for ``path`` if its stamp matches, else None."""
        entry = self.entries.get(path)
        if entry is not None and len(entry) == 2 and tuple(entry[0]) == stamp:
            return entry[1]
        return None

    def put(self, path: str, stamp: Stamp, data: Any) -> None:
        """Remember ``data`` for ``path`` at ``stamp`` (skipped for racily new files)."""
        # mtime or ctime: a tool that writes in place and sets an old mtime back
        # (cp -p, rsync -t, touch -d) leaves only the ctime to tell the change by.
        if time.time_ns() - max(stamp[1], stamp[2]) < _RACY_SECONDS * 1e9:
            self.entries.pop(path, None)
            return
        self.entries[path] = [list(stamp), data]
        self.dirty = True

    def keep_only(self, paths: set[str]) -> None:
        """Forget files that no longer exist."""
        for gone in set(self.entries) - paths:
            del self.entries[gone]
            self.dirty = True

    def save(self) -> None:
        """Write the cache if it changed; a read-only or full disk is not an error."""
        if not self.dirty:
            return
        payload = {"format": _FORMAT, "key": self.key, "entries": self.entries}
        write_own(self.root, CACHE_FILE, json.dumps(payload, separators=(",", ":")).encode())
        self.dirty = False


def read_own(root: Path, name: str, max_bytes: int) -> bytes | None:
    """The content of ``root/name``, a file of modelreg's own (a cache), or None.

    None also when it is not a regular file reached through real folders below
    ``root`` (a committed ``.modelreg/cache`` link to a shared folder is never read),
    when another user owns it (what one user could read is not what another can), or
    when it is over ``max_bytes``.
    """
    from registry.safe_io import open_regular

    try:
        with open_regular(root / name, root=root, max_bytes=max_bytes) as fh:
            if os.fstat(fh.fileno()).st_uid != os.geteuid():
                return None
            return fh.read(max_bytes + 1)
    except (OSError, RegistryError):
        return None


def write_own(root: Path, name: str, data: bytes) -> None:
    """Replace ``root/name`` with ``data``, through real folders only; a read-only or
    full disk, or a link on the way, is no error (nothing is written)."""
    path = root / name
    with contextlib.suppress(OSError):
        folder = root
        for part in Path(name).parent.parts:
            folder /= part
            try:
                if not stat.S_ISDIR(folder.lstat().st_mode):
                    return  # a link or a file on the way: nothing is written
            except FileNotFoundError:
                folder.mkdir()  # in a folder just checked to be a real one
        write_atomic(path, data)


_UNTRUSTED_CHECKOUT: ContextVar[bool] = ContextVar("modelreg_untrusted_checkout", default=False)


@contextlib.contextmanager
def untrusted_checkout() -> Iterator[None]:
    """Within this block no load reads or writes a local cache (``.modelreg/cache``).

    CI wraps whole runs in it: the checkout's local state is the pull request's (or a
    previous job's on a reused runner), and what is built, signed and mirrored must be
    parsed from the manifests themselves, whichever function loads them.
    """
    token = _UNTRUSTED_CHECKOUT.set(True)
    try:
        yield
    finally:
        _UNTRUSTED_CHECKOUT.reset(token)


def in_untrusted_checkout() -> bool:
    """Whether this runs inside :func:`untrusted_checkout` (no local cache may be used)."""
    return _UNTRUSTED_CHECKOUT.get()
