"""Whole-command results, reused while nothing under the repository changed.

``modelreg validate`` reads only files below the repository root (``registry.safe_io``
refuses anything else), so its result is a function of that tree.  The *fingerprint*
of the tree is every entry's path and ``lstat`` stamp (type and mode, size, mtime,
ctime, inode), folders and links included, hashed; the result of a run is stored
under the fingerprint of the tree it read, with the working directory (messages name
files relative to it) and the parse cache's key (modelreg's version and limits).  A
later run whose fingerprint matches prints the stored result without reading a
manifest; any edit, new file, removal, rename, ``touch`` or link anywhere in the tree
changes the fingerprint.  Skipped by the walk: what validate never reads and commands
write to (:data:`SKIPPED`); a folder counts by its entries, not its times.

Like git's index and the parse cache (``registry.cache``), results of a tree with an
entry modified within the last two seconds are not stored: a later edit within the
same timestamp tick would go unnoticed.  A stored result cannot be forged into use:
the fingerprint includes the inode numbers and change times of the reader's own
checkout, which a committed file cannot predict.  CI never uses it (see
``registry.cache.untrusted_checkout``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from registry.cache import read_own, write_own
from registry.errors import Problem
from registry.root import TOOL_FOLDERS

RESULTS_DIR: Final = ".modelreg/cache/results"
_FORMAT: Final = 1
_RACY_NS: Final = 2_000_000_000
SKIPPED: Final = frozenset(TOOL_FOLDERS)
"""Folders validate never reads (no manifest may name a file in them) and commands
write to: git's, modelreg's caches and default remote, DVC's cache and temporary files."""
_HOLDERS: Final = frozenset({".modelreg", ".dvc"})
"""Folders that a first command may create just to hold a skipped one: they count by
what else they hold."""
MAX_ENTRIES: Final = 500_000
"""A tree larger than this is not fingerprinted (the walk would cost more than it saves)."""
MAX_RESULT_BYTES: Final = 64 << 20


def fingerprint(root: Path, context: str) -> str | None:
    """The fingerprint of the tree at ``root`` for a command run in ``context``.

    Returns:
        A hex digest, or None when the tree cannot be fingerprinted soundly: an
        entry was modified within the racy window, the tree is over
        :data:`MAX_ENTRIES` entries, or a folder cannot be read.
    """
    digest = hashlib.blake2b(context.encode("utf-8", "surrogateescape"), digest_size=32)
    newest = time.time_ns() - _RACY_NS
    count = 0
    pending = [""]
    try:
        while pending:
            rel = pending.pop()
            where = os.path.join(root, rel) if rel else str(root)  # noqa: PTH118 - hot path
            lines, folders = [], []
            with os.scandir(where) as entries:
                for entry in entries:
                    name = f"{rel}/{entry.name}" if rel else entry.name
                    if name in SKIPPED:
                        continue
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode):
                        # A folder is its entries (listed in turn): its own times change
                        # when a cache is written below it, which changes nothing read.
                        if name not in _HOLDERS:
                            lines.append(f"{name}\0{info.st_mode}\n")
                        folders.append(name)
                        continue
                    if max(info.st_mtime_ns, info.st_ctime_ns) > newest:
                        return None  # racily new, by its content or an old mtime set back
                    lines.append(
                        f"{name}\0{info.st_mode} {info.st_size} {info.st_mtime_ns} "
                        f"{info.st_ctime_ns} {info.st_ino}\n"
                    )
            pending.extend(sorted(folders, reverse=True))
            count += len(lines)
            if count > MAX_ENTRIES:
                return None
            lines.sort()  # the listing order of a folder is not part of its state
            digest.update("".join(lines).encode("utf-8", "surrogateescape"))
    except OSError:
        return None
    return digest.hexdigest()


def context(command: str, *extra: str, packages: Sequence[str] = ("registry",)) -> str:
    """What a result depends on besides the tree.

    The working directory (messages name files relative to it), ``extra`` (the
    command's options), the versions of modelreg and of what parses and validates,
    and the stamps of the source files of ``packages`` (a version does not change
    while modelreg itself is edited, in an editable install).  Finding the packages
    imports none of them.
    """
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    parts = [command, str(Path.cwd()), *extra]
    for dist in ("modelreg", "pyyaml", "pydantic-core", "semver", "tuf"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} -")
    for package in packages:
        spec = find_spec(package)
        folder = Path(spec.origin).parent if spec and spec.origin else None
        for where, dirs, files in os.walk(folder) if folder else ():
            dirs.sort()
            for name in sorted(f for f in files if f.endswith(".py")):
                info = os.stat(os.path.join(where, name))  # noqa: PTH116, PTH118
                parts.append(f"{where}/{name} {info.st_size} {info.st_mtime_ns}")
    # Who runs it: what one user may read, another may not.
    parts.append(f"uid {os.geteuid()} gid {os.getegid()} groups {sorted(os.getgroups())}")
    return "\0".join(parts)


def git_state(root: Path) -> str | None:
    """What a result that reads git depends on, besides the tree: the HEAD commit (or
    the unborn branch), the stamps of the index, of git's configuration and ignore
    files (the repository's, the user's, ``core.excludesFile``, the ``.gitignore``
    files between the work tree's top and ``root``), and the ``GIT_*`` environment.

    None when one of those files changed within the racy window (not stored, like the
    tree).  Outside a git work tree, a fixed answer.
    """
    from registry.gitinfo import git

    proc = git(
        root, "rev-parse", "--absolute-git-dir", "--show-toplevel", "--verify", "-q", "HEAD",
        check=False,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    if len(lines) < 2:
        return f"git: none ({proc.returncode})"
    git_dir, top = Path(lines[0]), Path(lines[1])
    head = lines[2] if len(lines) > 2 else "unborn"
    excludes = git(root, "config", "--path", "--get", "core.excludesFile", check=False)
    home = Path.home()
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "git"
    files = [
        git_dir / "index",
        git_dir / "HEAD",
        git_dir / "config",
        git_dir / "info" / "exclude",
        home / ".gitconfig",
        xdg / "config",
        xdg / "ignore",
        *([Path(excludes.stdout.strip())] if excludes.stdout.strip() else []),
        *(folder / ".gitignore" for folder in (root, *root.parents) if folder.is_relative_to(top)),
    ]
    parts = [f"git: {head} at {top}"]
    newest = time.time_ns() - _RACY_NS
    for path in files:
        try:
            info = os.stat(path)  # noqa: PTH116
        except OSError:
            parts.append(f"{path} -")
            continue
        if max(info.st_mtime_ns, info.st_ctime_ns) > newest:
            return None
        parts.append(f"{path} {info.st_size} {info.st_mtime_ns} {info.st_ctime_ns} {info.st_ino}")
    parts.extend(sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("GIT_")))
    return "\0".join(parts)


def problem_row(problem: Problem) -> list[Any]:
    """A problem as a result stores it."""
    return [problem.file, problem.message, problem.line, problem.col, problem.field]


def problem_from_row(row: Any) -> Problem:
    """The problem a stored row holds.

    Raises:
        ValueError: the row is not one (a result file is never trusted to be).
    """
    try:
        file, message, line, col, field = row
    except (TypeError, ValueError):
        raise ValueError("not a stored problem") from None
    if not (
        isinstance(file, str)
        and isinstance(message, str)
        and all(v is None or type(v) is int for v in (line, col))
        and (field is None or isinstance(field, str))
    ):
        raise ValueError("not a stored problem")
    return Problem(file, message, line, col, field)


def load(root: Path, command: str, key: str) -> Any | None:
    """The result ``command`` stored under ``key`` in the repository at ``root``, if any."""
    held = read_own(root, f"{RESULTS_DIR}/{command}.json", MAX_RESULT_BYTES)
    with contextlib.suppress(ValueError, TypeError, KeyError):
        raw: Any = json.loads(held) if held is not None else {}
        if raw["format"] == _FORMAT and raw["key"] == key:
            return raw["result"]
    return None


def store(root: Path, command: str, key: str, result: Any) -> None:
    """Keep ``result`` of ``command`` under ``key``; a read-only or full disk is no error."""
    payload = json.dumps({"format": _FORMAT, "key": key, "result": result}).encode()
    if len(payload) > MAX_RESULT_BYTES:
        return
    write_own(root, f"{RESULTS_DIR}/{command}.json", payload)


__all__ = [
    "MAX_ENTRIES",
    "RESULTS_DIR",
    "SKIPPED",
    "context",
    "fingerprint",
    "git_state",
    "load",
    "problem_from_row",
    "problem_row",
    "store",
]
