"""What git knows about manifest files: last commit per file, uncommitted changes.

Uses the ``git`` executable (present wherever a checkout is) rather than a library, and
reads ``git log`` as a stream so a long history stops being read once every wanted
file has been seen.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from registry.errors import ToolError


@dataclass(frozen=True, slots=True)
class Commit:
    """The last commit that touched a file."""

    sha: str
    date: str

    @property
    def short(self) -> str:
        """Abbreviated hash, as shown in tables."""
        return self.sha[:8]


def git(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``git -C root args`` and capture its output.

    Raises:
        ToolError: git is missing, or exits non-zero while ``check`` is set.
    """
    argv = ["git", "-C", str(root), *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise ToolError("git is not installed or not on PATH", argv) from None
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise ToolError(
            f"git {' '.join(args)} failed: {detail[-1] if detail else ''}", argv, proc.stderr
        )
    return proc


def toplevel(path: Path) -> Path | None:
    """Root of the git work tree containing ``path``, or None outside any."""
    proc = git(path, "rev-parse", "--show-toplevel", check=False)
    return Path(proc.stdout.strip()) if proc.returncode == 0 else None


def stage(root: Path, paths: Sequence[Path]) -> None:
    """``git add`` what a command wrote, so that a plain ``git commit`` takes it.

    Outside a git work tree this does nothing (the files are written all the same).

    Raises:
        ToolError: git is missing or fails.
    """
    if paths and toplevel(root) is not None:
        git(root, "add", "--", *(str(p) for p in paths))


def last_commits(root: Path, wanted: Iterable[str], under: str) -> dict[str, Commit]:
    """Last commit touching each of ``wanted`` (paths relative to the git top level).

    Args:
        root: the work tree.
        wanted: paths to look up (POSIX, relative to the top level).
        under: folder to restrict ``git log`` to.

    Returns:
        Path -> commit, for the paths that have one (uncommitted files are absent).

    Raises:
        ToolError: git is missing.
    """
    remaining = set(wanted)
    found: dict[str, Commit] = {}
    if not remaining or toplevel(root) is None:
        return found
    argv = [
        "git",
        "-C",
        str(root),
        "log",
        "--format=%x00%H %cI",
        "--name-only",
        "--no-renames",
        "--",
        under,
    ]
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except FileNotFoundError:
        raise ToolError("git is not installed or not on PATH", argv) from None
    assert proc.stdout is not None  # noqa: S101 - stdout=PIPE
    current: Commit | None = None
    try:
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            if line.startswith("\x00"):
                sha, _, date = line[1:].partition(" ")
                current = Commit(sha, date)
            elif line and current is not None and line in remaining:
                remaining.discard(line)
                found[line] = current
                if not remaining:
                    break
    finally:
        proc.kill()
        proc.stdout.close()
        proc.wait()
    return found


def dirty_paths(root: Path, under: str) -> set[str]:
    """Paths under ``under`` that differ from HEAD or are untracked (top-level relative)."""
    if toplevel(root) is None:
        return set()
    # --no-optional-locks: a read never rewrites the index (git status refreshes it when
    # it can), so the index stays what a stored status result was keyed by.
    proc = git(
        root,
        "--no-optional-locks",
        "status",
        "--porcelain=v1",
        "-z",
        "--untracked-files=all",
        "--",
        under,
    )
    out: set[str] = set()
    entries = proc.stdout.split("\x00")
    i = 0
    while i < len(entries):
        entry = entries[i]
        if len(entry) > 3:
            out.add(entry[3:])
            if entry[0] in "RC":
                i += 1  # the rename source follows
        i += 1
    return out
