"""The README's "A short tour" runs as written (what a newcomer copies must work).

The shell block is extracted from README.md and run by bash with ``set -e`` in an
empty folder: real git, DVC with its local remote, the real CLI (``python -m
modelreg`` behind a ``modelreg`` on PATH) and MLflow's embedded default, a sqlite
store in ``.modelreg/mlflow.db``, the same code path as a tracking server. The files
the tour names beside the repository (``../mlp.onnx`` ...) are the project's example
models, built here; nothing is downloaded.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from edge_sync.state.device_key import DeviceKey
from modelreg.examples import golden_inputs, model_bytes
from registry.goldens import npz_bytes
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def tour() -> str:
    """The first ``sh`` block after the "A short tour" heading."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## A short tour\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"^```sh\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert found, "README.md: no ```sh block under '## A short tour'"
    return found.group(1)


def test_the_tour_is_a_tour() -> None:
    """What the run below relies on: the block is there and covers the main commands."""
    text = tour()
    for command in ("init", "model add", "version add", "promote", "rollback", "validate", "ci pr",
                    "ci release", "register --check", "verify", "keys rotate",
                    "fleet enroll"):  # fmt: skip
        assert f"modelreg {command}" in text, command


def test_the_readme_tour_runs(tmp_path: Path) -> None:
    for name, version in (("mlp.onnx", "1.0.0"), ("mlp-ft.onnx", "1.1.0")):
        (tmp_path / name).write_bytes(model_bytes("mlp", version))
    (tmp_path / "inputs.npz").write_bytes(npz_bytes(golden_inputs("mlp", "1.0.0")))
    (tmp_path / "cam-0042.pub").write_bytes(DeviceKey.load_or_create(tmp_path / "dev").public_pem())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "modelreg"  # what `pip install modelreg` puts on PATH, run from this tree
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m modelreg "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO_ROOT),
    }
    for var in ("MLFLOW_TRACKING_URI", "GITHUB_ACTIONS", "GITHUB_EVENT_PATH", "GITHUB_OUTPUT",
                "GITHUB_STEP_SUMMARY", "GITHUB_REF"):  # fmt: skip
        env.pop(var, None)  # the tour runs on a laptop, not inside a workflow
    script = "set -euxo pipefail\n" + tour()
    proc = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env,
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    # -x traces each command to stderr: the last one traced is the one that failed
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert "Traceback" not in out + proc.stderr
    assert "MLflow mirrors Git: no drift" in out
    assert "Model diff: mlp 1.0.0 → 1.1.0" in out
    repo = tmp_path / "fleet-models"
    assert (repo / "manifest.schema.json").read_text().startswith("{")
    assert (repo / "trust/metadata/2.root.json").is_file()  # keys rotate made a new root
    assert "provenance:     no pull request (" in out  # released by hand: nothing invented
    assert (repo / "devices/cam-0042.pub").read_bytes() == (tmp_path / "cam-0042.pub").read_bytes()
