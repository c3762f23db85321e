"""Smoke test of the ``registry_scale`` benchmark at a tiny size (keeps ``make bench`` honest).

The generators must keep producing a registry that ``modelreg validate`` accepts and
tags that gto lists; otherwise the benchmark would time error paths.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
MODELS, VERSIONS = 3, 2


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[ModuleType, dict[str, str]]:
    """The benchmark module and a private environment (HOME, git config, identity)."""
    home = tmp_path / "home"
    home.mkdir()
    gitconfig = home / ".gitconfig"
    gitconfig.write_text("[init]\n\tdefaultBranch = main\n")
    for var, value in {
        "HOME": str(home),
        "GIT_CONFIG_GLOBAL": str(gitconfig),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "bench tests",
        "GIT_AUTHOR_EMAIL": "bench-tests@example.invalid",
        "GIT_COMMITTER_NAME": "bench tests",
        "GIT_COMMITTER_EMAIL": "bench-tests@example.invalid",
    }.items():
        monkeypatch.setenv(var, value)
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.syspath_prepend(str(REPO))
    from benchmarks import _util, registry_scale

    return registry_scale, _util.isolated_env(home)


def _gto_tool(module: ModuleType) -> Any:
    if importlib.util.find_spec("gto") is None:
        pytest.skip("gto is not installed")
    exe = Path(sys.executable).parent / "gto"
    if not exe.exists():
        pytest.skip("no gto executable beside this interpreter")
    return module.GtoTool(exe, Path(sys.executable), "test", "test interpreter")


def test_modelreg_registry_is_valid(bench, tmp_path: Path) -> None:
    rs, env = bench
    repo = tmp_path / "modelreg"
    files = rs.generate_modelreg_repo(repo, MODELS, VERSIONS, env)
    assert files == 2 + MODELS * (2 + 2 * VERSIONS)
    report = rs.validate_report(repo, env)
    assert report["ok"] is True
    assert (report["models"], report["versions"]) == (MODELS, MODELS * VERSIONS)
    version = (repo / "manifests" / "m0002" / "versions" / "1.1.0.yaml").read_text()
    assert "parent: 1.0.0" in version
    assert len(version.splitlines()) >= 35
    pointer = (repo / "models" / "m0002" / "1.1.0.onnx.dvc").read_text()
    assert "path: 1.1.0.onnx" in pointer
    status = subprocess.run(
        [*rs.modelreg_argv(), "status"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr
    assert len(status.stdout.splitlines()) == 1 + MODELS * VERSIONS
    assert "canary (10%), production" in status.stdout
    log = subprocess.run(
        ["git", "log", "--format=%an"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert log.stdout.split() == ["bench"]


def test_gto_repo_lists_every_version(bench, tmp_path: Path) -> None:
    rs, env = bench
    gto = _gto_tool(rs)
    repo = tmp_path / "gto"
    tags = rs.generate_gto_repo(repo, MODELS, VERSIONS, env)
    assert tags == MODELS * VERSIONS + 2 * MODELS
    shown = subprocess.run(
        [str(gto.exe), "show", "--json"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    state = json.loads(shown.stdout)
    assert sorted(state) == ["m0001", "m0002", "m0003"]
    for entry in state.values():
        assert entry["version"] == "v1.1.0"
        assert entry["stage"] == {"canary": "v1.1.0", "production": "v1.1.0"}
    counts = rs.gto_counts(gto, repo, env)
    assert counts == {"artifacts": MODELS, "versions": MODELS * VERSIONS, "assignments": 6}


def test_fixtures_are_reused_while_parameters_match(bench, tmp_path: Path) -> None:
    rs, env = bench
    gto = _gto_tool(rs)
    params = rs.ScaleParams(MODELS, VERSIONS)
    first = rs.prepare(params, tmp_path / "fixtures", env, gto)
    assert first["reused"] is False
    assert first["modelreg"]["versions"] == first["gto"]["versions"] == MODELS * VERSIONS
    again = rs.prepare(params, tmp_path / "fixtures", env, gto)
    assert again["reused"] is True
    other = rs.prepare(rs.ScaleParams(MODELS, 1), tmp_path / "fixtures", env, gto)
    assert other["reused"] is False
    assert other["modelreg"]["versions"] == MODELS


def test_report_renders(bench) -> None:
    from benchmarks.__main__ import render

    text = render(
        {
            "name": "registry_scale",
            "summary": "tiny",
            "measurements": {
                "gto show": {"runs": 1, "min_s": 3.0, "median_s": 3.0, "max_s": 3.0},
                "modelreg validate": {"runs": 3, "min_s": 0.1, "median_s": 0.2, "max_s": 0.3},
            },
            "ratios": {"gto_show_s / modelreg_validate_s": 15.0},
            "goals": [
                {
                    "name": "fast",
                    "value": 0.2,
                    "target": 2.0,
                    "comparison": "<=",
                    "passed": True,
                    "indicative": False,
                }
            ],
        }
    )
    assert "15.0x" in text
    assert "PASS" in text
    assert "0.200 s" in text
