"""`make demo` runs end to end, from an installed wheel in a folder that is not the
checkout (the story a newcomer sees must not rot, nor lean on a file only a checkout has).

The wheel is built offline, with the build backend already installed, from a copy of
what it is made of (building in place would leave ``build/`` and ``*.egg-info`` in the
checkout).  It goes into a fresh venv outside the checkout, which borrows this
interpreter's installed dependencies through a ``.pth`` file added after the install,
never the checkout or an editable install of it.  This is the suite's one demo run.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _packages() -> list[str]:
    """The top-level packages the wheel ships (pyproject's ``packages.find`` patterns)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted(
        p.name
        for p in REPO_ROOT.iterdir()
        if (p / "__init__.py").is_file() and any(fnmatch.fnmatch(p.name, g) for g in patterns)
    )


def _run(
    argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{argv}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    return proc


def _build_wheel(tmp: Path) -> Path:
    src, dist = tmp / "src", tmp / "dist"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, src / name)
    for name in _packages():
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(REPO_ROOT / name, src / name, ignore=ignore)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "--check-build-dependencies", "--no-index", "--wheel-dir", str(dist), str(src)])  # fmt: skip
    (wheel,) = dist.glob("modelreg-*.whl")
    # every file of every package ships: templates, unit files, anything read at run time
    files = {
        str(f.relative_to(src)) for n in _packages() for f in (src / n).rglob("*") if f.is_file()
    }
    with zipfile.ZipFile(wheel) as whl:
        assert files <= set(whl.namelist()), sorted(files - set(whl.namelist()))
    return wheel


def _borrowed_paths() -> list[str]:
    """This interpreter's folders of installed packages, less the checkout and any folder
    that holds one of our packages (a source tree), so that only the wheel has them.  A
    venv inside the checkout (``make``'s ``.venv``, as in CI) is lent all the same: its
    site-packages holds our editable install only as a ``.pth`` hook, which a folder
    named by a ``.pth`` line does not run."""
    ours = _packages()
    return [
        p
        for p in dict.fromkeys(sys.path)
        if Path(p).is_absolute()
        and Path(p).is_dir()
        and (not Path(p).resolve().is_relative_to(REPO_ROOT) or Path(p).name == "site-packages")
        and not any((Path(p) / name).exists() for name in ours)
    ]


def _fresh_venv(tmp: Path, wheel: Path, env: dict[str, str]) -> Path:
    """A venv with the wheel installed; its dependencies borrowed. Returns its python."""
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    # installed before the .pth exists: pip sees no other modelreg, so it neither skips
    # the wheel as "already satisfied" nor touches an install outside this venv
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
          "--no-index", str(wheel)], env=env)  # fmt: skip
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = Path(_run([str(python), "-c", where], env=env).stdout.strip())
    (purelib / "borrowed-dependencies.pth").write_text("\n".join(_borrowed_paths()) + "\n")
    return python


def test_demo_runs_end_to_end_from_the_installed_wheel(tmp_path: Path) -> None:
    assert not tmp_path.resolve().is_relative_to(REPO_ROOT)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    python = _fresh_venv(tmp_path, _build_wheel(tmp_path), env)
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"

    # what the demo imports is the wheel's: no checkout, no benchmarks/ beside it
    probe = (
        "import importlib.util, json, sys;"
        "print(json.dumps({n: getattr(importlib.util.find_spec(n), 'origin', None)"
        " for n in sys.argv[1:]}))"
    )
    found = json.loads(_run([str(python), "-c", probe, *_packages(), "benchmarks"],
                            cwd=elsewhere, env=env).stdout)  # fmt: skip
    assert found.pop("benchmarks") is None
    venv = (tmp_path / "venv").resolve()
    assert set(found) >= {"modelreg", "edge_sync", "pipelines", "registry", "signing"}
    for name, origin in found.items():
        assert Path(origin).resolve().is_relative_to(venv), f"{name} from {origin}"

    proc = subprocess.run(
        [str(python), "-m", "modelreg.demo", "--dir", str(tmp_path / "demo")],
        cwd=elsewhere,
        env=env,
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
    # the traffic step's client came with the wheel, and every request was answered
    assert "$ python -m modelreg.loadgen http://127.0.0.1:" in out
    assert re.search(r"traffic: \d+ requests \(1\.0\.0: \d+, 1\.1\.0: \d+\), 0 failed", out)
    # the fine-tune came as its changed tensors, and the whole file can still be written
    fetched = re.findall(r"last update: installed 1\.1\.0 via delta, (\d+) bytes", out)
    full = len(re.findall(r"last update: installed 1\.0\.0 via full", out))
    # 1.0.0 whole; 1.1.0 as the one matrix it changed (64 KiB) and its skeleton
    assert fetched
    assert full
    assert all(64 * 1024 < int(n) < 160 * 1024 for n in fetched), fetched
    assert re.search(r"stages \(ms\): .*layout", out)
    assert re.search(r"mlp 1\.1\.0: \d+ bytes, sha256 [0-9a-f]{64} verified", out)
    assert re.search(r"  gRPC: model_version 1\.\d\.0: probs \[", out)  # serve.grpc_listen
    # where the served version came from, from its signed description (issue 28): v1
    # released by hand, v2 by the (played) release workflow after ann approved it
    assert "  provenance: no pull request known; not released by CI (commit " in out
    assert re.search(
        r"  provenance: PR #1 approved by ann; CI run http://127\.0\.0\.1:\d+/"
        r"demo/fleet-models/actions/runs/1 \(commit [0-9a-f]{12}\)",
        out,
    )
    assert "  provenance:     PR #1 approved by ann; CI run 1 attempt 1" in out  # show
    # devices enrolled; a report forged for cam-0042 does not count
    assert "$ modelreg fleet enroll --from " in out
    assert "enrolled 2 device(s)" in out
    # (the table's console wraps the line's end)
    assert "not counted: cam-0042.json: the signature does not verify with the key" in out
    assert "1 device reporting in" in out
    assert "Traceback" not in out + proc.stderr
