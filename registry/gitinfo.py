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
from typing import Final

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
    top = toplevel(root) if remaining else None
    if top is None:
        return {}
    # At the top level: ``wanted`` and ``under`` are relative to it (``root`` may be a
    # folder inside a larger work tree).
    argv = ["git", "-C", str(top), "--literal-pathspecs", *_LOG_ARGS, "--", under]
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except FileNotFoundError:
        raise ToolError("git is not installed or not on PATH", argv) from None
    return _read_log(proc, remaining)


class StatusQuery:
    """What ``status`` asks git of the files under ``under``: the last commit of each file
    in HEAD, and the uncommitted paths.  The git processes start at once and are read
    when asked, so that they run while the caller loads the manifests.

    Use as a context manager: leaving it stops whatever git has not finished.
    """

    def __init__(self, top: Path, under: str) -> None:
        self._procs: list[subprocess.Popen[str]] = []
        # The files in HEAD are the ones the history names: reading the log can stop
        # once each has been seen (a file never committed would never be).
        self._tree = self._spawn(top, "ls-tree", "-r", "--name-only", "HEAD", "--", under)
        self._log = self._spawn(top, *_LOG_ARGS, "--", under)
        self._status = self._spawn(top, *_STATUS_ARGS, "--", under)

    def _spawn(self, top: Path, *args: str) -> subprocess.Popen[str]:
        # --literal-pathspecs: the folder is a name, never pathspec magic (":(glob)...").
        argv = ["git", "-C", str(top), "--literal-pathspecs", *args]
        try:
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
        except OSError as e:
            self.close()  # the ones already started
            if isinstance(e, FileNotFoundError):
                raise ToolError("git is not installed or not on PATH", argv) from None
            raise ToolError(f"cannot run git: {e.strerror or e}", argv) from None
        self._procs.append(proc)
        return proc

    def commits(self) -> dict[str, Commit]:
        """Path (top-level relative) -> its last commit, for every file in HEAD."""
        out, _ = self._tree.communicate()
        # Split as the log is (on newlines only: with core.quotePath off, a name may hold
        # other line breaks, which splitlines() would cut it at).
        wanted = set(out.split("\n")) - {""} if self._tree.returncode == 0 else set()
        return _read_log(self._log, wanted)

    def dirty(self) -> set[str]:
        """Paths that differ from HEAD or are untracked (top-level relative)."""
        out, _ = self._status.communicate()
        return _porcelain_paths(out) if self._status.returncode == 0 else set()

    def close(self) -> None:
        """Stop and reap the git processes."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            if proc.stdout is not None:
                proc.stdout.close()
            proc.wait()

    def __enter__(self) -> StatusQuery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_LOG_BLOCK: Final = 1 << 16
_LOG_ARGS: Final = ("log", "--format=%x00%H %cI", "--name-only", "--no-renames")
# --no-optional-locks: a read never rewrites the index (git status refreshes it when
# it can), so the index stays what a stored status result was keyed by.
_STATUS_ARGS: Final = (
    "--no-optional-locks",
    "status",
    "--porcelain=v1",
    "-z",
    "--untracked-files=all",
)


def _read_log(proc: subprocess.Popen[str], wanted: set[str]) -> dict[str, Commit]:
    """The first (newest) commit ``git log --name-only`` names each of ``wanted`` in;
    stops reading (and stops git) once all are found."""
    remaining = set(wanted)
    found: dict[str, Commit] = {}
    assert proc.stdout is not None  # noqa: S101 - stdout=PIPE
    current: Commit | None = None
    tail = ""
    try:
        # Read in blocks (a line at a time costs more than the lines' own work on a
        # large repository) and stop at the block where the last wanted file appears.
        while remaining and (block := proc.stdout.read(_LOG_BLOCK)):
            lines = (tail + block).split("\n")
            tail = lines.pop()  # a line cut by the block's end: the next block ends it
            for line in lines:
                if line.startswith("\x00"):
                    sha, _, date = line[1:].partition(" ")
                    current = Commit(sha, date)
                elif current is not None and line in remaining:
                    remaining.discard(line)
                    found[line] = current
                    if not remaining:
                        break
        if remaining and tail and current is not None and tail in remaining:
            found[tail] = current  # the output's last line, without its newline
    finally:
        proc.kill()
        proc.stdout.close()
        proc.wait()
    return found


def _porcelain_paths(text: str) -> set[str]:
    out: set[str] = set()
    entries = text.split("\x00")
    i = 0
    while i < len(entries):
        entry = entries[i]
        if len(entry) > 3:
            out.add(entry[3:])
            if entry[0] in "RC":
                i += 1  # the rename source follows
        i += 1
    return out


def dirty_paths(root: Path, under: str) -> set[str]:
    """Paths under ``under`` that differ from HEAD or are untracked (top-level relative)."""
    top = toplevel(root)
    if top is None:
        return set()
    proc = git(top, "--literal-pathspecs", *_STATUS_ARGS, "--", under)  # as last_commits
    return _porcelain_paths(proc.stdout)
