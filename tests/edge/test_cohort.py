"""Rollout cohorts: a stable hash of (device id, model, version) under ``percent``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edge_sync.sync.updater import in_cohort
from tests.edge.conftest import EdgeRig

IDS = [f"cam-{n:04d}" for n in range(1000)]


@pytest.mark.parametrize("percent", [1.0, 10.0, 25.0, 50.0, 90.0])
def test_about_percent_of_a_thousand_devices_are_in(percent: float) -> None:
    inside = sum(in_cohort(i, "mlp", "1.1.0", percent) for i in IDS)
    # binomial, n=1000: 4 standard deviations either way
    sd = (1000 * percent / 100 * (1 - percent / 100)) ** 0.5
    assert abs(inside - 10 * percent) <= 4 * sd + 1, inside


def test_cohorts_nest_as_the_rollout_widens_and_differ_by_version() -> None:
    narrow = {i for i in IDS if in_cohort(i, "mlp", "1.1.0", 10)}
    wide = {i for i in IDS if in_cohort(i, "mlp", "1.1.0", 50)}
    assert narrow <= wide  # a device in at 10 % stays in at 50 %
    other = {i for i in IDS if in_cohort(i, "mlp", "1.2.0", 10)}
    assert other != narrow  # each version draws its own canaries
    assert all(in_cohort(i, "mlp", "1.1.0", None) for i in IDS[:10])
    assert not any(in_cohort(i, "mlp", "1.1.0", 0) for i in IDS[:10])


def test_the_answer_is_the_same_in_another_process() -> None:
    """No per-process salt (Python's str hash is salted): restarts give the same answer."""
    here = [in_cohort(i, "mlp", "1.1.0", 30) for i in IDS[:200]]
    code = (
        "from edge_sync.sync.updater import in_cohort; "
        "print(''.join('1' if in_cohort(f'cam-{n:04d}', 'mlp', '1.1.0', 30) else '0' "
        "for n in range(200)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "".join("1" if x else "0" for x in here)


@pytest.mark.integration
def test_a_partial_rollout_reaches_only_its_cohort(rig: EdgeRig) -> None:
    rig.sync("a")
    rig.sync("b")
    rig.run("version", "add", "mlp", "1.1.0", "--artifact", str(rig.models / "mlp/1.1.0.onnx"),
            "--parent", "1.0.0")  # fmt: skip
    rig.promote("1.1.0", percent=50)
    ins = {name: in_cohort(f"{name}-0001", "mlp", "1.1.0", 50) for name in ("a", "b")}
    for name in ("a", "b"):
        for _ in range(2):  # a second sync (a restart) changes nothing
            rig.sync(name)
            wanted = "1.1.0" if ins[name] else "1.0.0"
            assert rig.state(name).models["mlp"].serving.version == wanted
