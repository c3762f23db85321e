"""Random SIGKILLs across install, health gate and idle reject no version and leave no
inconsistent state; a version that kills the daemon itself, at load or on its first
requests, is rejected after at most two restarts and the device serves its last known
good version (issue 23, point 1).  See ``tests/edge/fault_driver.py`` for what each run
does and checks; this test makes a handful of runs (``FAULT_RUNS`` in the environment
asks for more: the issue's figures come from 60, run by hand)."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.edge.conftest import EdgeRig
from tests.edge.fault_driver import drive

pytestmark = pytest.mark.integration

RUNS = int(os.environ.get("FAULT_RUNS", "6"))


def test_random_kills_blame_no_version_and_crashing_versions_are_rejected(rig: EdgeRig) -> None:
    snapshot = rig.tmp / "holds-1.0.0"
    config = rig.config()
    assert rig.sync().updates["mlp"].version == "1.0.0"
    shutil.copytree(rig.tmp / "device/state", snapshot, symlinks=True)
    rig.release_version("1.1.0", "1.0.0")
    out = rig.tmp / "faults.json"
    report = drive(
        "tests.edge.fault_driver",
        [str(config), str(snapshot), str(RUNS), "20261204", str(out)], out,
    )  # fmt: skip
    runs = report["runs"]
    assert len(runs) == RUNS
    assert [r for r in runs if r["problem"]] == []
    assert [r for r in runs if r["rejected"]] == []  # no version caused these
    killed = [r for r in runs if r["killed"]]
    assert len(killed) >= RUNS - 1, runs
    assert {r["phase"] for r in killed} >= {"install", "gate", "idle"}, runs
    for crashing in report["crashing"]:
        assert crashing["problem"] is None, crashing
        assert 1 <= crashing["restarts"] <= 2, crashing
        assert (crashing["serving"], crashing["last_known_good"]) == ("1.0.0", "1.0.0")
        ((version, reason),) = crashing["rejected"]
        assert version == "1.1.0"
        assert "stopped unexpectedly twice" in reason
