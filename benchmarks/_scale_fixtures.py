"""The tools and fixtures of the ``registry_scale`` benchmark.

gto 1.10.1 (found or installed into ``.bench``), the modelreg CLI of this
interpreter, the checks run on freshly generated repositories, their reuse while
``stamp.json`` matches, and the modelreg parse cache (``.modelreg/cache/``) that the
warm measurements need filled.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from benchmarks._scale_repos import ScaleParams, generate_gto_repo, generate_modelreg_repo
from benchmarks._util import BENCH_DIR, REPO_ROOT, BenchmarkError, run_checked, tool_version
from registry.cache import CACHE_FILE
from registry.result_cache import RESULTS_DIR

GTO_VERSION: Final = "1.10.1"
_RACY_WAIT_S: Final = 2.5
"""Longer than the age a file needs before modelreg caches it (``registry.cache``)."""


@dataclass(frozen=True)
class GtoTool:
    """The gto used for the comparison."""

    exe: Path
    python: Path
    version: str
    source: str


def ensure_gto(env: Mapping[str, str]) -> GtoTool:
    """Find gto 1.10.1 in this interpreter's environment, or install it into ``.bench``.

    Args:
        env: environment for pip (isolated HOME).

    Returns:
        Paths of its executable and interpreter, and its version.

    Raises:
        BenchmarkError: it cannot be installed.
    """
    bindir = Path(sys.executable).parent
    try:
        here = importlib.metadata.version("gto")
    except importlib.metadata.PackageNotFoundError:
        here = None
    if here == GTO_VERSION and (bindir / "gto").exists():
        return GtoTool(bindir / "gto", Path(sys.executable), here, "benchmark interpreter")
    venv = BENCH_DIR / "gto-venv"
    python, exe = venv / "bin" / "python", venv / "bin" / "gto"
    probe = [str(python), "-c", "import importlib.metadata as m; print(m.version('gto'))"]
    if not exe.exists() or tool_version(probe, env) != GTO_VERSION:
        print(f"installing gto=={GTO_VERSION} into {venv} ...", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        run_checked([sys.executable, "-m", "venv", str(venv)], cwd=REPO_ROOT, env=env)
        run_checked(
            [str(python), "-m", "pip", "install", "-q", f"gto=={GTO_VERSION}"],
            cwd=REPO_ROOT,
            env=env,
            timeout=1800,
        )
    version = tool_version(probe, env)
    if version != GTO_VERSION:
        raise BenchmarkError(f"gto {GTO_VERSION} wanted, {venv} has {version}")
    return GtoTool(exe, python, version, str(venv))


def modelreg_argv() -> list[str]:
    """How to run the modelreg CLI of this interpreter (its console script)."""
    script = Path(sys.executable).parent / "modelreg"
    return [str(script)] if script.exists() else [sys.executable, "-m", "modelreg"]


def validate_report(repo: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """``modelreg validate --json`` in ``repo``.

    Raises:
        BenchmarkError: it exits non-zero (the repository is invalid).
    """
    proc = subprocess.run(
        [*modelreg_argv(), "validate", "--json"],
        cwd=repo,
        env=dict(env),
        capture_output=True,
        check=False,
    )
    try:
        report: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        report = {}
    if proc.returncode != 0 or not report.get("ok"):
        shown = [p.get("text", p) for p in report.get("problems", [])[:20]]
        detail = "\n".join(map(str, shown)) or proc.stderr.decode(errors="replace")[-2000:]
        raise BenchmarkError(
            f"generated repository {repo} is not valid "
            f"(modelreg validate exited {proc.returncode}):\n{detail}"
        )
    return report


_GTO_COUNT: Final = """\
import json, sys
from gto.registry import GitRegistry
with GitRegistry.from_url(sys.argv[1]) as reg:
    state = reg.get_state()
arts = state.get_artifacts()
versions = sum(1 for a in arts.values() for v in a.versions if v.is_registered)
stages = sum(len(v.get_vstages()) for a in arts.values() for v in a.versions)
print(json.dumps({"artifacts": len(arts), "versions": versions, "assignments": stages}))
"""


def gto_counts(gto: GtoTool, repo: Path, env: Mapping[str, str]) -> dict[str, int]:
    """Artifacts, registered versions and stage assignments that gto itself sees.

    Raises:
        BenchmarkError: gto fails on the repository.
    """
    proc = run_checked([str(gto.python), "-c", _GTO_COUNT, str(repo)], cwd=repo, env=env)
    counts: dict[str, int] = json.loads(proc.stdout)
    return counts


def _expect(counts: Mapping[str, int], wanted: Mapping[str, int], what: str) -> None:
    wrong = {k: (counts.get(k), v) for k, v in wanted.items() if counts.get(k) != v}
    if wrong:
        detail = ", ".join(f"{k}: got {got}, expected {exp}" for k, (got, exp) in wrong.items())
        raise BenchmarkError(f"{what}: {detail}")


def prepare(
    params: ScaleParams, base: Path, env: Mapping[str, str], gto: GtoTool
) -> dict[str, Any]:
    """Generate and check both repositories, or reuse them when the stamp matches.

    Args:
        params: sizes and seed.
        base: folder for this size (``modelreg/``, ``gto/``, ``stamp.json``).
        env: isolated environment.
        gto: the gto to check the GTO repository with.

    Returns:
        The stamp: parameters, counts and generation times.

    Raises:
        BenchmarkError: a generated repository fails its check.
    """
    stamp_file = base / "stamp.json"
    wanted = asdict(params)
    try:
        stamp: dict[str, Any] = json.loads(stamp_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        stamp = {}
    if (
        stamp.get("params") == wanted
        and (base / "modelreg" / ".git").is_dir()
        and (base / "gto" / ".git").is_dir()
    ):
        return {**stamp, "reused": True}
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    print(f"generating {params.models} x {params.versions} registries in {base} ...", flush=True)
    t0 = time.perf_counter()
    files = generate_modelreg_repo(
        base / "modelreg", params.models, params.versions, env, seed=params.seed
    )
    t1 = time.perf_counter()
    tags = generate_gto_repo(
        base / "gto",
        params.models,
        params.versions,
        env,
        seed=params.seed,
        layout=params.gto_layout,
    )
    t2 = time.perf_counter()
    report = validate_report(base / "modelreg", env)
    _expect(report, {"models": params.models, "versions": params.total}, "modelreg validate")
    t3 = time.perf_counter()
    counts = gto_counts(gto, base / "gto", env)
    _expect(
        counts,
        {"artifacts": params.models, "versions": params.total, "assignments": 2 * params.models},
        "gto state",
    )
    t4 = time.perf_counter()
    stamp = {
        "params": wanted,
        "modelreg": {"files": files, "versions": report["versions"], "models": report["models"]},
        "gto": {"tags": tags, **counts, "gto_version": gto.version},
        "generation_s": {
            "modelreg_repo": round(t1 - t0, 3),
            "gto_repo": round(t2 - t1, 3),
            "check_modelreg": round(t3 - t2, 3),
            "check_gto": round(t4 - t3, 3),
        },
    }
    stamp_file.write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    return {**stamp, "reused": False}


def manifest_count(params: ScaleParams) -> int:
    """Manifests modelreg parses (and caches) in the modelreg repository."""
    return params.models + params.total


def cache_entries(repo: Path) -> int:
    """Files held in the parse cache of the modelreg repository ``repo`` (0 if none)."""
    try:
        raw = json.loads((repo / CACHE_FILE).read_bytes())
        # a version's DVC pointer check is kept beside it, under "<manifest>#pointer"
        return sum(not key.endswith("#pointer") for key in raw["entries"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return 0


def warm_cache(
    repo: Path, env: Mapping[str, str], manifests: int, *, tries: int = 3
) -> dict[str, Any]:
    """Run ``modelreg validate`` (untimed) until the parse cache holds every manifest
    and the result of the unchanged tree is stored (``registry.result_cache``).

    modelreg does not cache a file modified within the last two seconds, so right
    after generation a second run, after a pause, may be needed.

    Args:
        repo: the modelreg repository.
        env: environment of the runs.
        manifests: files the cache must hold.
        tries: runs before giving up.

    Returns:
        Runs made, entries held and the cache file's size in bytes.

    Raises:
        BenchmarkError: a run fails, or the cache is still incomplete after ``tries``.
    """
    held = 0
    for attempt in range(1, tries + 1):
        run_checked([*modelreg_argv(), "validate"], cwd=repo, env=env)
        held = cache_entries(repo)
        if held >= manifests and (repo / RESULTS_DIR / "validate.json").is_file():
            size = (repo / CACHE_FILE).stat().st_size
            return {"runs": attempt, "entries": held, "bytes": size}
        time.sleep(_RACY_WAIT_S)
    raise BenchmarkError(
        f"the parse cache of {repo} holds {held} of {manifests} manifests "
        f"after {tries} runs of modelreg validate"
    )
