"""A released fleet repository and devices that follow it (the edge daemon's tests).

The repository is released by ``modelreg ci release`` (mlp 1.0.0 on canary, with
goldens and an ONNX Runtime target); each test copies it and releases more as it goes.
A device is an ``edge.yaml`` with its own state dir; :meth:`EdgeRig.sync` runs one sync
of the real :class:`~edge_sync.sync.updater.Updater` in-process (the daemon's loop and
signals are tested through ``modelreg edge run`` in a subprocess).

Devices follow the git repository, or with ``rig.source = "artifacts"`` the metadata
that ``publish`` mirrors to the artifact remote; a test runs in both modes with
``@pytest.mark.parametrize("rig", SOURCES, indirect=True)``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import git

pytestmark = pytest.mark.integration

SOURCES = ("git", "artifacts")
"""Where a device follows the signed metadata (``repository.source``)."""

_RELEASE_ENV = ("MODELREG_", "GITHUB_", "AWS_", "CI")
"""The environment a release may read (the rest is the test's own HOME and such)."""


def _fingerprint(root: Path) -> frozenset[tuple[str, int, int | str]]:
    """Every path under ``root`` with its size and mtime (a link: its target).  Copies
    keep mtimes, so a copy has its original's fingerprint, and any write changes it.
    ``.modelreg/ci`` (what the last release reported, naming its folder) is left out."""
    found: set[tuple[str, int, int | str]] = set()
    skip = root / ".modelreg/ci"
    for top, dirs, files in os.walk(root):  # links to folders are not followed
        folder = Path(top)
        dirs[:] = [d for d in dirs if folder / d != skip]
        for name in dirs + files:
            path = folder / name
            info = path.lstat()
            mark: int | str = str(path.readlink()) if path.is_symlink() else info.st_mtime_ns
            size = info.st_size if name in files else 0
            found.add((str(path.relative_to(root)), size, mark))
    return frozenset(found)


@dataclass
class ReleaseMemo:
    """Releases already made in this session (one xdist worker): a repository in the
    same state as one that was released before, given the same release, becomes a copy
    of what that release left (about 60 ms) rather than releasing again (1-2 s, and 40
    tests release 1.1.0 over the fleet as the template left it)."""

    folder: Path
    done: dict[tuple[Any, ...], tuple[Path, Path]] = field(default_factory=dict)
    """(fingerprint before, the release's arguments, its environment) -> (the copy of
    the repository after it, the folder it was released in)."""

    def key(self, root: Path, *args: Any) -> tuple[Any, ...]:
        env = sorted((k, v) for k, v in os.environ.items() if k.startswith(_RELEASE_ENV))
        return (_fingerprint(root), args, tuple(env))

    def replay(self, key: tuple[Any, ...], root: Path) -> bool:
        """Make ``root`` what the release under ``key`` left, if one was made."""
        if key not in self.done:
            return False
        after, released_in = self.done[key]
        shutil.rmtree(root)
        shutil.copytree(after, root, symlinks=True)
        for report in (root / ".modelreg/ci").glob("*"):  # as if it were released here
            report.write_text(report.read_text().replace(str(released_in), str(root)))
        return True

    def keep(self, key: tuple[Any, ...], root: Path) -> None:
        """Keep what the release under ``key`` left in ``root``."""
        after = self.folder / str(len(self.done))
        shutil.copytree(root, after, symlinks=True)
        self.done[key] = (after, root)


@dataclass
class EdgeRig:
    """The fleet repository, its artifact remote, and devices following it."""

    root: Path
    tmp: Path
    cli: Any
    models: Path
    hosts: dict[str, Any] = field(default_factory=dict)
    updater_options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments every Updater of this rig gets (a health gate, say)."""
    source: str = "git"
    """Where devices follow the metadata: the git repository, or the artifact
    remote's mirror (``artifacts``)."""
    releases: ReleaseMemo | None = None
    """Releases of example versions already made in this session (see :class:`ReleaseMemo`)."""

    @property
    def remote(self) -> Path:
        """The artifact remote devices read (``<DVC remote>/modelreg``)."""
        return self.root / ".modelreg/remote/modelreg"

    @property
    def mirror(self) -> Path:
        """The metadata mirror on the artifact remote (``<remote>/metadata``)."""
        return self.remote / "metadata"

    def push(self, message: str) -> None:
        """Bring what was written by hand to ``trust/metadata`` to devices, as whoever
        holds the transport does: a commit on the branch (git), or the exact bytes
        copied to the remote's mirror (artifacts).

        A device that follows the mirror looks only when ``timestamp.json`` changes:
        when these files leave it as it was, its copy gets a trailing newline (its
        signature still verifies), as an attacker who wants the device to look does.
        """
        git(self.root, "add", "-A")
        git(self.root, "commit", "-qm", message)
        if self.source != "artifacts":
            return
        before = (self.mirror / "timestamp.json").read_bytes()
        for path in sorted((self.root / "trust/metadata").iterdir()):
            if path.name != "timestamp.json":
                shutil.copyfile(path, self.mirror / path.name)
        timestamp = (self.root / "trust/metadata/timestamp.json").read_bytes()
        (self.mirror / "timestamp.json").write_bytes(
            timestamp + b"\n" if timestamp == before else timestamp
        )

    def run(self, *args: str) -> Any:
        """``modelreg ARGS`` in the repository; asserts success."""
        result = self.cli(*args, cwd=self.root)
        assert result.code == 0, (args, result.err)
        return result

    def release_version(
        self,
        version: str,
        parent: str | None,
        *,
        channel: str = "canary",
        source: str | None = None,
        artifact: Path | None = None,
    ) -> None:
        """Add ``mlp`` ``version`` (from the example models, or ``artifact``), promote
        it, release it.  An example version released the same way over the same
        repository earlier in the session is copied from that release."""
        memo = self.releases if artifact is None else None
        key = memo.key(self.root, version, parent, channel, source) if memo else None
        if memo and key and memo.replay(key, self.root):
            return
        artifact = artifact or self.models / f"mlp/{source or version}.onnx"
        args = ["version", "add", "mlp", version, "--artifact", str(artifact)]
        if parent:
            args += ["--parent", parent]
        self.run(*args)
        self.promote(version, channel)
        if memo and key:
            memo.keep(key, self.root)

    def promote(self, version: str, channel: str = "canary", percent: float | None = None) -> None:
        """Assign ``version`` to ``channel``, commit and release."""
        args = ["promote", "mlp", version, "-c", channel]
        if percent is not None:
            args += ["--percent", str(percent)]
        self.run(*args)
        git(self.root, "add", "-A")
        git(self.root, "commit", "-qm", f"mlp {version} on {channel}")
        self.run("ci", "release")

    def config(self, name: str = "device", /, **overrides: Any) -> Path:
        """Write a device's ``edge.yaml`` (mlp@canary); returns its path."""
        folder = self.tmp / name
        folder.mkdir(exist_ok=True)
        anchor = folder / "1.root.json"
        if not anchor.exists():
            shutil.copy(self.root / "trust/metadata/1.root.json", anchor)
        polls = {"poll_interval": "1s", "jitter": 0.1, "max_backoff": "4s"}
        follow = {"url": str(self.root), "branch": "main"}
        if self.source == "artifacts":
            follow = {"source": "artifacts"}
        doc: dict[str, Any] = {
            "apiVersion": "modelreg/v1",
            "kind": "EdgeConfig",
            "device": {"id": f"{name}-0001", "labels": {"arch": "x86_64"}},
            "repository": {**follow, **polls},
            "trust": {"root": "1.root.json"},
            "artifacts": {"url": str(self.remote)},
            "models": [{"name": "mlp", "channel": "canary"}],
            "state_dir": "state",
            "serve": {"listen": "127.0.0.1:0"},
        }
        doc.update(overrides)
        path = folder / "edge.yaml"
        path.write_text(json.dumps(doc, indent=1))  # JSON is YAML
        return path

    @contextmanager
    def updater(self, name: str = "device", /, **overrides: Any) -> Iterator[Any]:
        """A locked state dir and an Updater for device ``name`` (its host kept)."""
        from edge_sync.config import load_edge_config
        from edge_sync.daemon import provision
        from edge_sync.engine.host import InProcessHost
        from edge_sync.state.store import StateDir
        from edge_sync.sync.updater import Updater

        config = load_edge_config(self.config(name, **overrides))
        state = StateDir(config.state_path)
        host = self.hosts.setdefault(name, InProcessHost())
        with state.locked():
            provision(config, state)
            yield Updater(config, state, host, **self.updater_options)

    def sync(self, name: str = "device", /, **overrides: Any) -> Any:
        """One sync of device ``name``; its report."""
        with self.updater(name, **overrides) as updater:
            return updater.sync()

    def state(self, name: str = "device") -> Any:
        """Device ``name``'s committed state."""
        from edge_sync.state.store import StateDir

        return StateDir(self.tmp / name / "state").load()


@pytest.fixture(scope="session")
def _release_memo(tmp_path_factory: pytest.TempPathFactory) -> ReleaseMemo:
    return ReleaseMemo(tmp_path_factory.mktemp("releases"))


@pytest.fixture
def rig(
    _released_template: Path,
    _release_memo: ReleaseMemo,
    tmp_path: Path,
    cli: Any,
    example_models: Path,
    request: pytest.FixtureRequest,
) -> EdgeRig:
    """A fresh copy of the released fleet repository (mlp 1.0.0 on canary); devices
    follow git, or the source given by indirect parametrization (:data:`SOURCES`)."""
    root = tmp_path / "fleet"
    shutil.copytree(_released_template, root, symlinks=True)
    source = getattr(request, "param", "git")
    return EdgeRig(root, tmp_path, cli, example_models, source=source, releases=_release_memo)
