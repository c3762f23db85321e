"""Smoke test of the ``registry_scale`` benchmark at a tiny size (keeps ``make bench`` honest).

The generators must keep producing a registry that ``modelreg validate`` accepts and
tags that gto lists, and the warm-up must fill modelreg's parse cache; otherwise the
benchmark would time error paths, or label cold runs warm.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import _scale_fixtures as fx
from benchmarks import _scale_repos as repos
from benchmarks import _util
from registry.cache import CACHE_FILE

MODELS, VERSIONS = 3, 2


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """A private environment for the benchmark's commands (HOME, git config, identity)."""
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
    return _util.isolated_env(home)


def _gto_tool() -> fx.GtoTool:
    # gto arrives with DVC (modelreg[ci]); the benchmark's comparison depends on it.
    assert importlib.util.find_spec("gto") is not None, "gto should come with dvc"
    exe = Path(sys.executable).parent / "gto"
    assert exe.exists(), f"no gto executable beside {sys.executable}"
    return fx.GtoTool(exe, Path(sys.executable), "test", "test interpreter")


def test_modelreg_registry_is_valid(env, tmp_path: Path) -> None:
    repo = tmp_path / "modelreg"
    files = repos.generate_modelreg_repo(repo, MODELS, VERSIONS, env)
    assert files == 2 + MODELS * (2 + 2 * VERSIONS)
    report = fx.validate_report(repo, env)
    assert report["ok"] is True
    assert (report["models"], report["versions"]) == (MODELS, MODELS * VERSIONS)
    version = (repo / "manifests" / "m0002" / "versions" / "1.1.0.yaml").read_text()
    assert "parent: 1.0.0" in version
    assert len(version.splitlines()) >= 35
    pointer = (repo / "models" / "m0002" / "1.1.0.onnx.dvc").read_text()
    assert "path: 1.1.0.onnx" in pointer
    status = subprocess.run(
        [*fx.modelreg_argv(), "status"],
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


def test_gto_repo_lists_every_version(env, tmp_path: Path) -> None:
    gto = _gto_tool()
    repo = tmp_path / "gto"
    tags = repos.generate_gto_repo(repo, MODELS, VERSIONS, env)
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
    counts = fx.gto_counts(gto, repo, env)
    assert counts == {"artifacts": MODELS, "versions": MODELS * VERSIONS, "assignments": 6}


def test_fixtures_are_reused_while_parameters_match(env, tmp_path: Path) -> None:
    gto = _gto_tool()
    params = repos.ScaleParams(MODELS, VERSIONS)
    first = fx.prepare(params, tmp_path / "fixtures", env, gto)
    assert first["reused"] is False
    assert first["modelreg"]["versions"] == first["gto"]["versions"] == MODELS * VERSIONS
    again = fx.prepare(params, tmp_path / "fixtures", env, gto)
    assert again["reused"] is True
    other = fx.prepare(repos.ScaleParams(MODELS, 1), tmp_path / "fixtures", env, gto)
    assert other["reused"] is False
    assert other["modelreg"]["versions"] == MODELS


def test_warm_up_fills_the_parse_cache_and_cold_runs_leave_it(env, tmp_path: Path) -> None:
    repo = tmp_path / "modelreg"
    repos.generate_modelreg_repo(repo, MODELS, VERSIONS, env)
    manifests = fx.manifest_count(repos.ScaleParams(MODELS, VERSIONS))
    assert manifests == MODELS * (1 + VERSIONS)
    assert fx.cache_entries(repo) == 0
    warm = fx.warm_cache(repo, env, manifests)
    assert warm["entries"] == fx.cache_entries(repo) == manifests
    assert warm["bytes"] > 0
    before = (repo / CACHE_FILE).stat().st_mtime_ns
    for cmd in (["validate", "--no-cache"], ["status", "--no-cache"]):
        subprocess.run([*fx.modelreg_argv(), *cmd], cwd=repo, env=env, check=True, timeout=120)
    assert (repo / CACHE_FILE).stat().st_mtime_ns == before
    clean = subprocess.run(
        ["git", "status", "--porcelain"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert clean.stdout == ""


def test_report_renders() -> None:
    from benchmarks.__main__ import render

    text = render(
        {
            "name": "registry_scale",
            "summary": "tiny",
            "notes": ["cold = no cache"],
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
    assert "note: cold = no cache" in text


def test_goals_cover_cold_and_warm() -> None:
    from benchmarks import registry_scale as rs

    medians = {
        rs.VALIDATE_COLD: 2.5,
        rs.VALIDATE_COLD_JOBS1: 3.0,
        rs.VALIDATE_WARM: 0.5,
        rs.STATUS_COLD: 2.2,
        rs.STATUS_WARM: 0.4,
        rs.LIST_COLD: 1.0,
        rs.LIST_WARM: 0.3,
        rs.SHOW_COLD: 0.9,
        rs.HISTORY_COLD: 2.1,
        rs.GTO_SHOW: 30.0,
    }
    ratios = {f"gto show / {k}": 30.0 / v for k, v in medians.items() if k != rs.GTO_SHOW}
    goals = rs.goals(medians, ratios, total=10_000, quick=False)
    # time goals for 8 commands; speed-up goals for the 6 that list the whole registry
    assert len(goals) == 14
    by_name = {g["name"]: g["passed"] for g in goals}
    assert [passed for name, passed in by_name.items() if name.startswith("modelreg history")] == [
        False
    ]
    by_name = {g["name"]: g["passed"] for g in goals}
    cold = [name for name in by_name if name.startswith("modelreg validate (cold")]
    warm = [name for name in by_name if name.startswith("modelreg validate (warm")]
    assert [by_name[n] for n in cold] == [False, True]
    assert [by_name[n] for n in warm] == [True, True]
    assert all("--no-cache" in n for n in cold)


# --- large_model: a model over 2 GB, stage by stage -----------------------------------


def test_large_model_stage_reports_a_childs_peak_rss(tmp_path: Path) -> None:
    """The benchmark's one RSS probe: a child that touches 200 MiB peaks above it, and
    not at the size of the process that started it (Linux hands a forked child its
    parent's high-water mark at ``exec``)."""
    from benchmarks.large_model import stage

    grow = "b = bytearray(200 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
    big = bytearray(1100 << 20)  # this process, over the bound below
    big[::4096] = b"\x01" * len(range(0, len(big), 4096))
    seconds, rss = stage([sys.executable, "-c", grow], cwd=tmp_path, env=dict(os.environ))
    del big
    assert seconds > 0
    assert 200 << 20 <= rss < 1 << 30
    with pytest.raises(_util.BenchmarkError, match="exited 3"):
        stage([sys.executable, "-c", "raise SystemExit(3)"], cwd=tmp_path, env=dict(os.environ))


def test_large_model_fixture_is_an_external_data_pair_that_checks(tmp_path: Path) -> None:
    """The generator the benchmark times against: two versions, each an ``.onnx`` and
    one data file, accepted by the build's checks, 1.1.0 a fine-tune of 1.0.0."""
    from benchmarks.large_model import ensure_models
    from pipelines.build._checks import check_onnx
    from pipelines.onnx import load_onnx_external

    models = ensure_models(0.001, width=128, root=tmp_path / "models")
    assert (tmp_path / "models/done").exists()
    spans = {}
    for version in ("1.0.0", "1.1.0"):
        path = models / version / "model.onnx"
        check_onnx(path, str(path))
        _, external = load_onnx_external(path, str(path))
        assert external.files == ("model.onnx.data",)
        assert all(t.offset % 4096 == 0 for t in external.tensors)  # mappable
        spans[version] = external
    old = (models / "1.0.0/model.onnx.data").read_bytes()
    new = (models / "1.1.0/model.onnx.data").read_bytes()
    same = [t for t in spans["1.1.0"].tensors if old[t.offset : t.offset + t.length]
            == new[t.offset : t.offset + t.length]]  # fmt: skip
    assert 0 < len(same) < len(spans["1.1.0"].tensors)
    assert ensure_models(0.001, width=128, root=tmp_path / "models") == models  # reused


def test_ci_pr_check_and_growth_rows() -> None:
    """ci pr may fail only at fetching the changed artifact; growth rows print one line each."""
    import json as _json

    from benchmarks import registry_scale as rs

    rs.only_the_artifact_fetch_fails(b'{"ok": true, "problems": []}')
    rs.only_the_artifact_fetch_fails(
        _json.dumps(
            {"ok": False, "problems": ["models/a.onnx: dvc pull failed: no remote"]}
        ).encode()
    )
    with pytest.raises(_util.BenchmarkError, match="other problems"):
        rs.only_the_artifact_fetch_fails(b'{"ok": false, "problems": ["manifests/a: bad"]}')
    timings = {
        key: _util.Timing.of([seconds])
        for key, seconds in [
            (rs.VALIDATE_COLD, 0.8), (rs.VALIDATE_WARM, 0.4), (rs.STATUS_COLD, 1.0),
            (rs.STATUS_WARM, 0.5), (rs.GTO_SHOW, 30.0),
        ]
    }  # fmt: skip
    row = rs._growth_row(10_000, timings)
    assert row["gto show / slowest modelreg"] == 30.0
    (line,) = rs._growth_notes([row])
    assert line.startswith("growth at 10,000 versions: validate 0.800 s cold / 0.400 s warm")


def test_fleet_status_benchmark_times_what_a_device_writes(tmp_path: Path) -> None:
    """The fleet written by the device's encoder reads back whole, within the size cap,
    with a rollout under way (failures, a cohort) for the aggregation to count."""
    from benchmarks.fleet_status import measure
    from registry.device_report import LIMITS

    result = measure(300, tmp_path, runs=1)
    assert result["reports"]["count"] == 300
    assert result["reports"]["bytes_max"] <= LIMITS.max_bytes
    assert set(result["measurements"]) == {
        "json.loads of every file (no checks)", "load_reports (strict)", "summarize",
        "load_reports + summarize", "modelreg fleet status --json (process)",
    }  # fmt: skip
    channels = {(c["model"], c["channel"]): c for c in result["fleet"]["channels"]}
    production = channels[("mlp", "production")]
    assert 0 < production["on_target"] < production["cohort"]
    assert production["failed"] > 0
    assert measure(300, tmp_path, runs=1)["generation"]["reused"] is True
