"""SIGKILL at every stage boundary of an update leaves a consistent state dir
(issue 9, point 5): at least 60 runs in a random order over two scenarios, a fresh device installing the
channel's version in full and a device that holds the previous version updating by
delta, every boundary of each at least once.  See ``tests/edge/crash_driver.py`` for
what each run checks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT
from tests.edge.conftest import EdgeRig

pytestmark = pytest.mark.integration

RUNS = 60


def test_sigkill_at_any_stage_boundary_leaves_a_consistent_state(rig: EdgeRig) -> None:
    snapshots = rig.tmp / "snapshots"
    snapshots.mkdir()
    config = rig.config()
    state = rig.tmp / "device/state"
    (snapshots / "fresh").mkdir()
    assert rig.sync().updates["mlp"].version == "1.0.0"
    shutil.copytree(state, snapshots / "holds-1.0.0", symlinks=True)
    rig.release_version("1.1.0", "1.0.0")
    (snapshots / "expected").write_text("1.1.0")
    out = rig.tmp / "crashes.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.edge.crash_driver", str(config), str(snapshots),
         str(RUNS), "20261203", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=540, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert len(runs) >= RUNS
    bad = [r for r in runs if r["problem"]]
    assert bad == [], bad
    assert all(r["killed"] for r in runs)  # every boundary drawn was reached
    stages = {e.split(":")[0] for events in report["events"].values() for e in events}
    assert {"detect", "verify_metadata", "plan", "fetch", "verify_bytes", "apply_delta",
            "build", "self_test", "swap", "commit"} <= stages  # fmt: skip
    hit = {(r["scenario"], r["at"]) for r in runs}
    every = {(s, e) for s, events in report["events"].items() for e in events}
    assert every <= hit
