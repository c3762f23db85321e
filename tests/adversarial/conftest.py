"""A released fleet repository that an attacker sends pull requests to.

Every attack test replays its attack through the real commands a fleet runs: the
attacker commits on a branch, ``modelreg ci pr`` judges it, the branch is merged (a
reviewer was fooled, or the check was not required), ``modelreg ci release`` runs on
main with the online keys, and a device that trusts only the repository's root
refreshes its metadata.  The tests assert the refusal at the first place that must
refuse, and that the device never receives what the attacker wanted signed.

The released repository is built once per test session and copied for each test (the
DVC remote and keys live inside it, referenced by relative paths).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Result, git

pytestmark = pytest.mark.integration

ARTIFACT = "models/mlp/1.0.0.onnx"
"""The released artifact's TUF target path."""


@dataclass
class Fleet:
    """One test's copy of the released repository, and the commands a fleet runs on it.

    Attributes:
        root: the main checkout (where CI runs).
        tmp: the test's scratch folder (event file, outputs, device state).
        remote: the artifact remote devices read (``<DVC remote>/modelreg``).
    """

    root: Path
    tmp: Path
    remote: Path
    cli: Any
    monkeypatch: pytest.MonkeyPatch
    models: Path

    def sha(self, ref: str = "HEAD") -> str:
        """The commit ``ref`` names."""
        return git(self.root, "rev-parse", ref).strip()

    def branch(self, name: str) -> str:
        """Start the attacker's branch from main; returns the base commit."""
        git(self.root, "checkout", "-q", "main")
        git(self.root, "checkout", "-qb", name)
        return self.sha()

    def commit(self, message: str, *paths: str, force: bool = False) -> str:
        """Commit everything (or ``paths``, ``git add -f`` with ``force``); the new head."""
        git(self.root, "add", *(["-f"] if force else []), *(paths or ["-A"]))
        git(self.root, "commit", "-qm", message, "--allow-empty")
        return self.sha()

    def github_env(self, *, base: str, head: str | None = None, number: int = 7) -> None:
        """The environment of a GitHub Actions run on a pull request of ``base``."""
        event = {
            "pull_request": {
                "number": number,
                "base": {"sha": base, "ref": "main"},
                "head": {"sha": head or self.sha()},
                "user": {"login": "mallory"},
            }
        }
        (self.tmp / "event.json").write_text(json.dumps(event))
        env = {
            "GITHUB_EVENT_PATH": self.tmp / "event.json",
            "GITHUB_STEP_SUMMARY": self.tmp / "summary.md",
            "GITHUB_OUTPUT": self.tmp / "output.txt",
        }
        for var, path in env.items():
            self.monkeypatch.setenv(var, str(path))
        self.monkeypatch.setenv("GITHUB_RUN_ID", "4242")
        self.monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.example")
        self.monkeypatch.setenv("GITHUB_REPOSITORY", "acme/fleet")

    def ci_pr(self, base: str) -> Result:
        """``modelreg ci pr`` on the current branch against ``base``."""
        self.github_env(base=base)
        result: Result = self.cli("ci", "pr", cwd=self.root)
        return result

    def comment(self) -> str:
        """The PR comment the last ``ci pr`` wrote."""
        return (self.root / ".modelreg/ci/pr-comment.md").read_text(encoding="utf-8")

    def merge(self, branch: str) -> str:
        """Merge ``branch`` into main (the check was not required, or was fooled)."""
        git(self.root, "checkout", "-q", "main")
        git(self.root, "merge", "-q", "--no-ff", "-m", f"Merge {branch}", branch)
        return self.sha()

    def release(self) -> Result:
        """``modelreg ci release --json`` on main, as the release workflow runs it."""
        git(self.root, "checkout", "-q", "main")
        self.monkeypatch.delenv("GITHUB_EVENT_PATH", raising=False)
        self.monkeypatch.setenv("GITHUB_REF", "refs/heads/main")
        result: Result = self.cli("ci", "release", "--json", cwd=self.root)
        return result

    def device(self, name: str = "device") -> Any:
        """A device provisioned with root v1 (the fleet's anchor), refreshed."""
        from edge_sync.sync.trust import DeviceTrust

        state = self.tmp / name
        if not state.exists():
            DeviceTrust.provision(state, (self.root / "trust/metadata/1.root.json").read_bytes())
        device = DeviceTrust(state, self.root, self.remote)
        device.refresh()
        return device


@pytest.fixture
def fleet(
    _released_template: Path,
    tmp_path: Path,
    cli: Any,
    monkeypatch: pytest.MonkeyPatch,
    example_models: Path,
) -> Fleet:
    """A fresh copy of the released fleet repository (mlp 1.0.0 released on canary).

    MLflow is the repository's embedded default store (``.modelreg/mlflow.db``), copied
    with it, so a release that adds nothing mirrors nothing.
    """
    root = tmp_path / "fleet"
    shutil.copytree(_released_template, root, symlinks=True)
    return Fleet(root, tmp_path, root / ".modelreg/remote/modelreg", cli, monkeypatch,
                 example_models)  # fmt: skip
