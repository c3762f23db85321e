"""`make demo` runs end to end (the story a newcomer sees must not rot)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "modelreg.demo", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "must be promoted to 'canary' before 'production'" in out
    assert "unknown key 'fromat'; did you mean 'format'?" in out
    assert "a tampered copy on the remote is refused" in out
    assert "content differs from its signed digest (sha256 " in out
    # the MLflow mirror of the released v2 carries its diff and bundle
    assert "    diff: **Weights only**" in out
    assert "attached: modelreg/1.1.0.diff.md, modelreg/1.1.0.sigstore.json" in out
    assert "channel changes of 'mlp' are released from branch 'main' only" in out
    # two devices, one following git and one the remote's metadata mirror, both report
    assert "repository: {source: artifacts, poll_interval: 1h}" in out
    assert "2 devices reporting in" in out
    production = next(line for line in out.splitlines() if "│ production │" in line)
    assert [c.strip() for c in production.split("│")[1:-1]] == [
        "mlp", "production", "1.1.0", "100", "2", "2", "2", "0", "0", "0"
    ]  # fmt: skip
    assert "Traceback" not in out + proc.stderr
