"""The fleet simulation's repository: every release it plays, made up front by the real
``modelreg`` command line, and served from loopback one step at a time.

The model ``mlp`` (the small example, 30 KB, with golden cases) has one channel,
``production``, which every simulated device follows; its canary is a rollout share
(docs/reference/repository.md), not a channel of its own.  The simulation plays three releases:

* ``start``: 1.0.0 on ``production``; 1.1.0 (parent 1.0.0, so a delta is signed)
  released but on no channel yet;
* ``canary``: ``promote mlp 1.1.0 -c production --percent 10``: the canary cohort;
* ``production``: ``promote mlp 1.1.0 -c production``: every device.

Each step is a ``modelreg ci release`` made in advance, so that releasing it during the
simulation is instant and costs the fleet's servers nothing: for git, moving ``main``
of the served bare repository to the step's commit (``git update-ref``); for the
metadata mirrored to the artifact remote (``<remote>/modelreg/metadata/``, which
``publish`` writes), putting that step's files in place, ``timestamp.json`` last.
The signed targets of every step are served from the start (a device learns of one only
from metadata that signs it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from benchmarks._util import isolated_env, run_checked
from modelreg.examples import write_examples

MODEL: Final = "mlp"
CHANNEL: Final = "production"
OLD, NEW = "1.0.0", "1.1.0"
CANARY_PERCENT: Final = 10.0
METADATA_MIRROR: Final = "metadata"
"""Under ``<remote>/modelreg``: the metadata ``publish`` mirrors for gitless devices."""
TIMESTAMP: Final = "timestamp.json"


@dataclass(frozen=True)
class Step:
    """One release the simulation plays: its commit and its mirrored metadata."""

    name: str
    commit: str
    metadata: Path | None


@dataclass(frozen=True)
class FleetRepo:
    """The released repository and its steps (see the module doc)."""

    repo: Path
    root: Path
    steps: dict[str, Step]

    @property
    def remote(self) -> Path:
        """``<DVC remote>/modelreg``: signed targets (and mirrored metadata)."""
        return self.repo / ".modelreg/remote/modelreg"

    @property
    def delta_bytes(self) -> int:
        """Size of the signed delta 1.0.0 -> 1.1.0 (what a device at 1.0.0 downloads)."""
        (delta,) = (self.remote / f"targets/deltas/{MODEL}").glob(f"*.{NEW}.from-{OLD}.delta")
        return delta.stat().st_size


def build(work: Path) -> FleetRepo:
    """Release everything the simulation plays, in ``work/fleet``.

    Raises:
        BenchmarkError: a command fails.
    """
    examples = work / "examples"
    write_examples(examples, size="small", models=[MODEL], goldens=True)
    env = isolated_env(work / "home", {"MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"})
    repo = work / "fleet"
    steps_dir = work / "steps"

    def modelreg(*args: str) -> None:
        run_checked([sys.executable, "-m", "modelreg", *args],
                    cwd=repo if repo.exists() else work, env=env)  # fmt: skip

    def release(message: str, step: str | None = None) -> None:
        run_checked(["git", "add", "-A"], cwd=repo, env=env)
        run_checked(["git", "commit", "-qm", message], cwd=repo, env=env)
        modelreg("ci", "release")
        if step is None:
            return
        head = run_checked(["git", "rev-parse", "HEAD"], cwd=repo, env=env)
        mirror = repo / ".modelreg/remote/modelreg" / METADATA_MIRROR
        kept = None
        if mirror.is_dir():
            kept = steps_dir / step
            shutil.copytree(mirror, kept)
        steps[step] = Step(step, head.stdout.decode().strip(), kept)

    steps: dict[str, Step] = {}
    modelreg("init", str(repo))
    modelreg("model", "add", MODEL, "--channel-order", CHANNEL)
    for version, parent in ((OLD, None), (NEW, OLD)):
        args = ["version", "add", MODEL, version,
                "--artifact", str(examples / f"{MODEL}/{version}.onnx"),
                "--golden-inputs", str(examples / f"{MODEL}/{version}.inputs.npz")]  # fmt: skip
        modelreg(*args, *(["--parent", parent] if parent else []))
    modelreg("promote", MODEL, OLD, "-c", CHANNEL)
    release(f"{MODEL} {OLD} on {CHANNEL}, {NEW} released", "start")
    modelreg("promote", MODEL, NEW, "-c", CHANNEL, "--percent", f"{CANARY_PERCENT:g}")
    release(f"{MODEL} {NEW} to {CANARY_PERCENT:g} % of {CHANNEL}", "canary")
    modelreg("promote", MODEL, NEW, "-c", CHANNEL)
    release(f"{MODEL} {NEW} on {CHANNEL}", "production")
    return FleetRepo(repo, repo / "trust/metadata/1.root.json", steps)


@dataclass(frozen=True)
class Served:
    """What the loopback servers serve: a bare repository and an artifact folder."""

    git_base: Path
    """Served by ``git daemon`` (``fleet.git`` inside)."""
    http_root: Path
    """Served over HTTP: ``modelreg/`` inside is the artifact remote."""
    fleet: FleetRepo

    def release(self, step: str) -> None:
        """Publish ``step`` to both: git's ``main`` and the metadata mirror.

        Raises:
            subprocess.CalledProcessError: git fails.
        """
        target = self.fleet.steps[step]
        subprocess.run(
            ["git", "update-ref", "refs/heads/main", target.commit],
            cwd=self.git_base / "fleet.git", check=True, capture_output=True,
        )  # fmt: skip
        if target.metadata is None:
            return
        mirror = self.http_root / "modelreg" / METADATA_MIRROR
        mirror.mkdir(parents=True, exist_ok=True)
        files = sorted(target.metadata.iterdir(), key=lambda p: p.name == TIMESTAMP)
        for source in files:  # timestamp.json last: a device polls it
            if source.is_file():
                tmp = mirror / f".{source.name}.tmp"
                shutil.copy(source, tmp)  # modified now, as an upload would be
                tmp.replace(mirror / source.name)


def serve(fleet: FleetRepo, where: Path) -> Served:
    """Lay out what the servers serve under ``where``, at the ``start`` step.

    Raises:
        subprocess.CalledProcessError: git fails.
    """
    shutil.rmtree(where, ignore_errors=True)
    git_base, http_root = where / "git", where / "http"
    git_base.mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(fleet.repo), str(git_base / "fleet.git")],
                   check=True, capture_output=True)  # fmt: skip
    shutil.copytree(fleet.remote, http_root / "modelreg",
                    ignore=shutil.ignore_patterns(METADATA_MIRROR))  # fmt: skip
    served = Served(git_base, http_root, fleet)
    served.release("start")
    return served
