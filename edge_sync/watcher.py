"""Follow one branch of the fleet's git repository, as cheaply as git allows.

The device needs only the signed metadata (``trust/metadata/``), so the checkout is
shallow (one commit), sparse (only that folder is written) and blob-filtered where the
server supports it; an idle poll is one ``ls-remote`` round trip, which compares the
remote branch's commit with the checkout's before anything is fetched.

The checkout is untrusted input (``edge_sync.trust`` verifies every file it reads):
links are checked out as plain files (``core.symlinks=false``), only the configured URL
is contacted, git never prompts, and every git command has a time limit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from registry.errors import RegistryError
from signing.tuf_roles import METADATA_DIR

__all__ = ["GitError", "GitWatcher", "Head"]

_PROTOCOLS: Final = "file:git:http:https:ssh"
MAX_METADATA_FILES: Final = 100_000
"""Most files the metadata folder may hold (every root version, and the current roles)."""
MAX_METADATA_BYTES: Final = 256 << 20
"""Most bytes it may hold (devices read a few megabytes of it; see ``TrustLimits``)."""
_MAX_OUTPUT: Final = 1 << 20


class GitError(RegistryError):
    """The repository could not be reached or read."""


@dataclass(frozen=True)
class Head:
    """The branch's commit, and whether the checkout moved to it in this call."""

    commit: str
    changed: bool


class GitWatcher:
    """A sparse, shallow checkout of ``branch`` of ``url`` at ``checkout``."""

    def __init__(self, url: str, branch: str, checkout: Path, *, timeout_s: float = 120.0) -> None:
        """Follow ``branch`` of ``url`` (a path, file://, git://, http(s)://, ssh://)."""
        self.url = url
        self.branch = branch
        self.checkout = checkout
        self.timeout_s = timeout_s

    def _git(self, *args: str, cwd: Path | None = None) -> str:
        env = {
            **os.environ,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_ALLOW_PROTOCOL": _PROTOCOLS,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_SSH_COMMAND": os.environ.get("GIT_SSH_COMMAND", "ssh -o BatchMode=yes"),
            "LC_ALL": "C",
        }
        argv = ["git", *(["-C", str(cwd)] if cwd else []), *args]
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                errors="replace",  # a git host's messages are untrusted bytes
                env=env,
                timeout=self.timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise GitError("git is not installed or not on PATH") from None
        except subprocess.TimeoutExpired:
            raise GitError(
                f"git {args[0]}: no answer from {self.url} in {self.timeout_s:g} s"
            ) from None
        if proc.returncode:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            reason = detail[-1] if detail else f"exit {proc.returncode}"
            raise GitError(f"git {args[0]} {self.url}: {reason[:300]}")
        return proc.stdout[:_MAX_OUTPUT]

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
        except GitError:
            if not (self.checkout / ".git").exists():
                raise
            shutil.rmtree(self.checkout, ignore_errors=True)
            return self._move_to(remote)

    def _move_to(self, remote: str) -> Head:
        self._init()
        self._git(
            "fetch", "-q", "--depth=1", "--no-tags", "--filter=blob:none", "origin",
            f"+refs/heads/{self.branch}:refs/remotes/origin/{self.branch}",
            cwd=self.checkout,
        )  # fmt: skip
        fetched = self._git(
            "rev-parse", f"refs/remotes/origin/{self.branch}^{{commit}}", cwd=self.checkout
        ).strip()
        self._check_size(fetched)
        self._git("checkout", "-q", "--force", "--detach", fetched, cwd=self.checkout)
        return Head(fetched, changed=True)

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
