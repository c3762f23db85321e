"""Kill syncs with SIGKILL at stage boundaries, and check the state dir each time.

Run as ``python -m tests.edge.crash_driver CONFIG SNAPSHOTS RUNS SEED OUT`` by
``test_crash_safety.py``.  For each run it restores a device state dir from one of the
snapshot folders (a scenario: a fresh device, a device that holds the previous version),
forks a child that runs one sync of the real Updater and SIGKILLs itself when the
``k``-th stage event (a stage starting or ending) happens, ``k`` drawn at random within
what a dry run of that scenario saw.  Then it checks, in a fresh child each:

* the state file loads (it is the old one or the new one, never a mix);
* every file in ``blobs/sha256/`` hashes to its name, and every blob the state names
  exists (no half-written file where the state points);
* a restart with no network serves the version the state names;
* the next sync completes and installs the channel's version.

Every boundary of every scenario is interrupted once (in a random order), then runs
continue at random boundaries up to the number asked for.

ONNX Runtime and edge_sync are imported once, before any fork (a child that imported
them itself spent most of its run doing so), but no session is made in this process,
so each child starts its thread pools itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import onnxruntime  # noqa: F401 - imported once, before the forks

from edge_sync.config import load_edge_config
from edge_sync.daemon import provision
from edge_sync.engine.host import InProcessHost
from edge_sync.errors import StateError
from edge_sync.state.store import StateDir
from edge_sync.sync.updater import Updater


def _child(config_path: Path, kill_at: int | None, events_out: Path | None) -> None:
    config = load_edge_config(config_path)
    state = StateDir(config.state_path)
    seen: list[str] = []

    def observer(stage: str, phase: str) -> None:
        seen.append(f"{stage}:{phase}")
        if kill_at is not None and len(seen) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    state.lock()
    provision(config, state)
    Updater(config, state, InProcessHost(), observer=observer).sync()
    if events_out is not None:
        events_out.write_text(json.dumps(seen))


def _check(config_path: Path, expected: str) -> str | None:
    """Why the state dir is inconsistent (None when it is not)."""
    config = load_edge_config(config_path)
    state_dir = StateDir(config.state_path)
    try:
        state = state_dir.load()
    except StateError as e:
        return f"state file: {e}"
    for blob in state_dir.blobs.folder.glob("*") if state_dir.blobs.folder.is_dir() else []:
        if hashlib.sha256(blob.read_bytes()).hexdigest() != blob.name:
            return f"blob {blob.name[:12]} does not hash to its name"
    for sha in state.referenced_blobs():
        if not state_dir.blobs.has(sha):
            return f"the state names blob {sha[:12]}, which is missing"
    serving = state.models.get("mlp")
    host = InProcessHost()
    with state_dir.locked():
        updater = Updater(config, state_dir, host)
        problems = updater.resume()
        if problems:
            return f"resume: {problems}"
        if serving is not None and serving.serving is not None:
            engine = host.current("mlp")
            if engine is None or engine.version != serving.serving.version:
                return f"restart serves {engine and engine.version}, state says {serving.serving.version}"
        report = updater.sync()
    after = state_dir.load().models.get("mlp")
    if after is None or after.serving is None or after.serving.version != expected:
        return f"the next sync left {after and after.serving} ({report.result}: {report.reason})"
    return None


def _fork(work: Any) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            result = work()
            code = 3 if isinstance(result, str) else 0
            if isinstance(result, str):
                sys.stderr.write(result + "\n")
        except BaseException as e:  # noqa: BLE001 - reported through the exit code
            sys.stderr.write(f"{type(e).__name__}: {e}\n")
            code = 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def main(argv: list[str]) -> None:
    config_path, snapshots_dir, runs, seed, out = (
        Path(argv[0]), Path(argv[1]), int(argv[2]), int(argv[3]), Path(argv[4])
    )  # fmt: skip
    expected = (snapshots_dir / "expected").read_text().strip()
    state_root = load_edge_config(config_path).state_path
    scenarios = sorted(p for p in snapshots_dir.iterdir() if p.is_dir())
    events: dict[str, list[str]] = {}
    for scenario in scenarios:
        shutil.rmtree(state_root, ignore_errors=True)
        shutil.copytree(scenario, state_root, symlinks=True)
        log = snapshots_dir / f"{scenario.name}.events.json"
        status = _fork(lambda log=log: _child(config_path, None, log))
        if status != 0:
            raise SystemExit(f"dry run of {scenario.name} failed ({status})")
        events[scenario.name] = json.loads(log.read_text())
    rng = random.Random(seed)
    # Every boundary of every scenario once, in a random order; then random ones.
    plan = [(s, k) for s in scenarios for k in range(1, len(events[s.name]) + 1)]
    rng.shuffle(plan)
    while len(plan) < runs:
        scenario = rng.choice(scenarios)
        plan.append((scenario, rng.randint(1, len(events[scenario.name]))))
    results: list[dict[str, Any]] = []
    for run, (scenario, k) in enumerate(plan):
        seen = events[scenario.name]
        shutil.rmtree(state_root, ignore_errors=True)
        shutil.copytree(scenario, state_root, symlinks=True)
        status = _fork(lambda k=k: _child(config_path, k, None))
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        problem = None
        check = _fork(lambda: _check(config_path, expected))
        if check != 0:
            problem = f"check exited with {check}"
        results.append(
            {"run": run, "scenario": scenario.name, "at": seen[k - 1], "killed": killed,
             "problem": problem}
        )  # fmt: skip
    out.write_text(json.dumps({"events": events, "runs": results}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
