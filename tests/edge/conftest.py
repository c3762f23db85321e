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
        it, release it."""
        artifact = artifact or self.models / f"mlp/{source or version}.onnx"
        args = ["version", "add", "mlp", version, "--artifact", str(artifact)]
        if parent:
            args += ["--parent", parent]
        self.run(*args)
        self.promote(version, channel)

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


@pytest.fixture
def rig(
    _released_template: Path,
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
    return EdgeRig(root, tmp_path, cli, example_models, source=source)
