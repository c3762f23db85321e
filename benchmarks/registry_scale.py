"""``modelreg validate`` and ``modelreg status``, cold and warm, against ``gto show``.

Two repositories hold the same registry, M models x V versions (default 1,000 x 10 =
10,000 versions; ``--quick``: 100 x 10): a modelreg one and a GTO one with the tags
gto itself writes (see ``benchmarks._scale_repos``).  Both are generated under
``.bench/registry_scale/<M>x<V>/`` and reused while the generator parameters (kept
in ``stamp.json``) match; each is checked once after generation
(``benchmarks._scale_fixtures``).

modelreg keeps a parse cache in the repository (``.modelreg/cache/manifests.json``,
keyed by each file's stat) and the results of ``validate`` and ``status`` of an
unchanged tree (``registry.result_cache``), so every modelreg command is timed two ways:

* cold, with ``--no-cache``: every manifest is parsed, as in a fresh CI clone, which
  has no cache.  ``modelreg validate --no-cache`` and ``status --no-cache`` use the
  default workers (one process per core), each loading and checking whole models
  (``registry.repository.map_models``); ``--jobs 1`` does it all in the main process.
* warm: the caches are filled by an untimed ``modelreg validate`` first, as for a
  developer repeating commands.  Cold runs neither read nor write them.  Beside
  them, ``validate`` after one edit (in a clone of its own): the whole validation
  again, one file parsed.

Timed, as subprocesses, median of 3 runs taken round-robin (so a burst of other work
hits every command alike): the five modelreg commands and ``gto show`` (one run when
the first takes over 20 s); output goes to a pipe.  The files themselves are in the
OS page cache for cold and warm runs alike.  Goals at 10,000 versions (issue 12):
validate and status within 1 s cold and 0.5 s warm, list, show and history within
2 s, and the commands that list everything at least 10x faster than ``gto show``.

Also timed, beside them: ``modelreg ci pr`` on a clone whose last commit changes one
version (what it costs beyond the parse is its ratio to a cold validate); and, in a
full run, validate and status cold and warm beside ``gto show`` at 1,000 and 50,000
versions too (``GROWTH``), to show how the cost grows.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

from benchmarks._scale_fixtures import (
    GtoTool,
    cache_entries,
    ensure_gto,
    manifest_count,
    modelreg_argv,
    prepare,
    warm_cache,
)
from benchmarks._scale_repos import ScaleParams, model_name
from benchmarks._util import (
    BENCH_DIR,
    BenchmarkError,
    Command,
    Timing,
    busy_warning,
    isolated_env,
    load_average,
    machine_info,
    run_checked,
    time_interleaved,
    tool_version,
)

NAME: Final = "registry_scale"
FULL: Final = (1000, 10)
QUICK: Final = (100, 10)
RUNS: Final = 3
GTO_SINGLE_RUN_AFTER_S: Final = 20.0
GOAL_SECONDS: Final = 2.0
"""Time goal of the commands about one model, and of ``list``."""
GOAL_COLD_S: Final = 1.0
GOAL_WARM_S: Final = 0.5
"""Time goals of ``validate`` and ``status`` at 10,000 versions (issue 12), cold and warm."""
GOAL_SPEEDUP: Final = 10.0
GROWTH: Final = ((100, 10), (5000, 10))
"""Further sizes timed in a full run (1,000 and 50,000 versions), to show how cost grows."""
GOAL_VERSIONS: Final = 10_000
SPEC_GTO_SHOW_10K_S: Final = 28.1
"""``gto show`` on 10,000 versions (docs/guide/benchmarks.md: a reference, not a measurement)."""

VALIDATE_COLD: Final = "modelreg validate --no-cache (cold)"
VALIDATE_COLD_JOBS1: Final = "modelreg validate --no-cache --jobs 1 (cold)"
VALIDATE_WARM: Final = "modelreg validate (warm cache)"
VALIDATE_EDITED: Final = "modelreg validate, one manifest edited (warm cache)"
STATUS_COLD: Final = "modelreg status --no-cache (cold)"
STATUS_WARM: Final = "modelreg status (warm cache)"
LIST_COLD: Final = "modelreg list --no-cache (cold)"
LIST_WARM: Final = "modelreg list (warm cache)"
SHOW_COLD: Final = "modelreg show MODEL --no-cache (cold)"
HISTORY_COLD: Final = "modelreg history MODEL --no-cache (cold)"
GTO_SHOW: Final = "gto show"
CI_PR: Final = "modelreg ci pr, one version changed"

COLD: Final = "cold: --no-cache, as a fresh CI clone"
WARM: Final = "warm: cache filled, as repeated commands"

WARM_NOTE: Final = (
    "warm = caches filled by an earlier untimed run: what a developer sees on "
    "repeated commands; validate of an unchanged tree prints its stored result "
    "(registry.result_cache), status parses nothing but loads and checks everything"
)
EDITED_NOTE: Final = (
    "one manifest edited = touch -d '1 hour ago' on one version file before each run: "
    "the whole validation runs again, that file parsed, the others from the parse cache"
)

GOALS: Final = (
    ("modelreg validate", COLD, VALIDATE_COLD),
    ("modelreg status", COLD, STATUS_COLD),
    ("modelreg validate", WARM, VALIDATE_WARM),
    ("modelreg status", WARM, STATUS_WARM),
    ("modelreg list", COLD, LIST_COLD),
    ("modelreg list", WARM, LIST_WARM),
)
"""(command, which case, measurement) that the goals are checked on."""
TIME_ONLY_GOALS: Final = (
    ("modelreg show MODEL", COLD, SHOW_COLD),
    ("modelreg history MODEL", COLD, HISTORY_COLD),
)
"""Commands about one model: held to the time goal only (gto show lists everything)."""


def _contains(*needles: str) -> Callable[[bytes], None]:
    def check(out: bytes) -> None:
        text = out.decode(errors="replace")
        missing = [n for n in needles if n not in text]
        if missing:
            raise BenchmarkError(f"output lacks {missing}: {text[:500]!r}")

    return check


def _lines(expected: int) -> Callable[[bytes], None]:
    def check(out: bytes) -> None:
        got = len(out.splitlines())
        if got != expected:
            raise BenchmarkError(f"expected {expected} output lines, got {got}")

    return check


def _goal(name: str, value: float, target: float, *, at_most: bool, quick: bool) -> dict[str, Any]:
    passed = value <= target if at_most else value >= target
    return {
        "name": name,
        "value": round(value, 4),
        "target": target,
        "comparison": "<=" if at_most else ">=",
        "passed": passed,
        "indicative": quick,
    }


def goals(
    medians: dict[str, float], ratios: dict[str, float], *, total: int, quick: bool
) -> list[dict[str, Any]]:
    """The time and speed-up goals, cold and warm, of each goal command in ``GOALS``."""
    scale = f"at {total:,} versions" + (" (quick: goals are set for 10,000)" if quick else "")
    out: list[dict[str, Any]] = []
    for command, case, key in (*GOALS, *TIME_ONLY_GOALS):
        target = GOAL_SECONDS
        if command in ("modelreg validate", "modelreg status"):
            target = GOAL_COLD_S if case == COLD else GOAL_WARM_S
        out.append(
            _goal(
                f"{command} ({case}) <= {target:g} s {scale}",
                medians[key],
                target,
                at_most=True,
                quick=quick,
            )
        )
    for command, case, key in GOALS:
        out.append(
            _goal(
                f"{command} ({case}) >= {GOAL_SPEEDUP:g}x faster than gto show",
                ratios[f"{GTO_SHOW} / {key}"],
                GOAL_SPEEDUP,
                at_most=False,
                quick=quick,
            )
        )
    return out


def run(quick: bool) -> dict[str, Any]:
    """Generate (or reuse) the registries and time modelreg, cold and warm, against gto.

    Args:
        quick: 100 x 10 versions instead of 1,000 x 10; goals are then indicative.

    Returns:
        JSON-ready figures: measurements, ratios, goals, cache, generation and
        environment.

    Raises:
        BenchmarkError: generation, a check, the cache warm-up or a timed command
            failed.
    """
    models, versions = QUICK if quick else FULL
    params = ScaleParams(models, versions)
    env = isolated_env(BENCH_DIR / "home")
    gto = ensure_gto(env)
    base = BENCH_DIR / NAME / f"{models}x{versions}"
    stamp = prepare(params, base, env, gto)
    mr_repo, gto_repo = base / "modelreg", base / "gto"
    modelreg = modelreg_argv()
    total = params.total
    manifests = manifest_count(params)
    valid = _contains(f"{total} versions")
    rows = _lines(total + 1)
    last = model_name(models - 1)
    listed = _contains(model_name(0), last)

    warm_up = warm_cache(mr_repo, env, manifests)
    run_checked([*modelreg, "status"], cwd=mr_repo, env=env)  # stores status's result too
    print(f"timing on {total:,} versions (cold and warm) ...", flush=True)
    load_before = load_average()
    if warning := busy_warning():
        print(warning, flush=True)
    validate, status = [*modelreg, "validate"], [*modelreg, "status"]
    commands = {
        VALIDATE_COLD: Command([*validate, "--no-cache"], mr_repo, check_output=valid),
        VALIDATE_COLD_JOBS1: Command(
            [*validate, "--no-cache", "--jobs", "1"], mr_repo, check_output=valid
        ),
        VALIDATE_WARM: Command(validate, mr_repo, check_output=valid),
        STATUS_COLD: Command([*status, "--no-cache"], mr_repo, check_output=rows),
        STATUS_WARM: Command(status, mr_repo, check_output=rows),
        LIST_COLD: Command([*modelreg, "list", "--no-cache"], mr_repo, check_output=listed),
        LIST_WARM: Command([*modelreg, "list"], mr_repo, check_output=listed),
        SHOW_COLD: Command(
            [*modelreg, "show", last, "--no-cache"], mr_repo, check_output=_contains(last)
        ),
        HISTORY_COLD: Command(
            [*modelreg, "history", last, "--no-cache"],
            mr_repo,
            check_output=_contains("version 1.0.0 added"),
        ),
        GTO_SHOW: Command(
            [str(gto.exe), "show"],
            gto_repo,
            check_output=_contains(model_name(0), model_name(models - 1)),
            stop_after_s=GTO_SINGLE_RUN_AFTER_S,
        ),
    }
    # In a clone of its own: after an edit the next validate of the tree runs in full,
    # which must not land on the warm figures of the main repository.
    edit_repo = clone_once(mr_repo, base / "edited", env)
    warm_cache(edit_repo, env, manifests)
    edited = edit_repo / "manifests" / last / "versions" / "1.0.0.yaml"
    commands[VALIDATE_EDITED] = Command(
        ["sh", "-c", 'touch -d "1 hour ago" "$0" && exec "$@"', str(edited), *validate],
        edit_repo,
        check_output=valid,
    )
    pr_repo = pull_request_clone(mr_repo, base / "ci_pr", env)
    commands[CI_PR] = Command(
        [*modelreg, "ci", "pr", "--base", "HEAD~1", "--json"],
        pr_repo,
        check_output=only_the_artifact_fetch_fails,
        ok_exit=(0, 1),
    )
    measurements = time_interleaved(commands, env=env, runs=RUNS)
    held_after = cache_entries(mr_repo)
    if held_after < manifests:
        raise BenchmarkError(
            f"the parse cache lost entries while timing ({held_after} of {manifests}): "
            "the warm figures are not warm"
        )
    medians = {name: t.median_s for name, t in measurements.items()}
    ratios = {
        f"{GTO_SHOW} / {k}": medians[GTO_SHOW] / v
        for k, v in medians.items()
        if k not in (GTO_SHOW, CI_PR)
    }
    ratios[f"{CI_PR} / {VALIDATE_COLD}"] = medians[CI_PR] / medians[VALIDATE_COLD]
    growth = [] if quick else [_growth(ScaleParams(m, v), env, gto) for m, v in GROWTH]
    growth.insert(1 if growth else 0, _growth_row(total, measurements))
    machine = machine_info()
    load_after = machine.pop("load_average")
    environment = {
        **machine,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "modelreg": tool_version([*modelreg, "--version"], env),
        "modelreg_default_jobs": os.cpu_count() or 1,
        "gto": gto.version,
        "gto_source": gto.source,
    }
    cold_note = (
        f"cold = --no-cache: all {manifests:,} manifests parsed, what a fresh CI clone "
        f"sees; default workers = one per core ({environment['modelreg_default_jobs']} here)"
    )
    return {
        "name": NAME,
        "quick": quick,
        "summary": f"{models:,} models x {versions} versions = {total:,} versions",
        "notes": [cold_note, WARM_NOTE, EDITED_NOTE, CI_PR_NOTE, *_growth_notes(growth)],
        "params": asdict(params),
        "versions": {"modelreg": stamp["modelreg"]["versions"], "gto": stamp["gto"]["versions"]},
        "generation": {
            "reused": stamp["reused"],
            "seconds": stamp["generation_s"],
            "modelreg_files": stamp["modelreg"]["files"],
            "gto_tags": stamp["gto"]["tags"],
            "path": str(base),
        },
        "cache": {
            "manifests": manifests,
            "warm_up_runs": warm_up["runs"],
            "entries": warm_up["entries"],
            "entries_after_timing": held_after,
            "bytes": warm_up["bytes"],
        },
        "measurements": {k: v.to_json() for k, v in measurements.items()},
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "goals": goals(medians, ratios, total=total, quick=quick),
        "growth": growth,
        "reference": {
            "spec_gto_show_10000_versions_s": SPEC_GTO_SHOW_10K_S,
            "goal_versions": GOAL_VERSIONS,
        },
        "environment": environment,
    }


CI_PR_NOTE: Final = (
    "ci pr = a clone whose last commit edits one version's description, checked with "
    "--base HEAD~1 and no parse cache, as in CI; the repository has no DVC remote, so the "
    "changed version's artifact fetch fails (exit 1, the only problem allowed): the rest "
    "(load, validate, base policies, changed versions, build and diff of that version) is "
    "timed; the ratio to a cold validate is what it costs beyond the parse"
)


def clone_once(repo: Path, where: Path, env: dict[str, str]) -> Path:
    """A clone of ``repo`` at ``where`` (made once, then reused)."""
    if (where / ".git").is_dir():
        return where
    shutil.rmtree(where, ignore_errors=True)
    run_checked(["git", "clone", "-q", "--local", str(repo), str(where)], cwd=repo, env=env)
    return where


def pull_request_clone(repo: Path, where: Path, env: dict[str, str]) -> Path:
    """A clone of ``repo`` whose last commit changes one version (made once, then reused)."""
    if (where / ".git").is_dir():
        return where
    clone_once(repo, where, env)
    changed = where / "manifests" / model_name(0) / "versions" / "1.0.0.yaml"
    text = changed.read_text(encoding="utf-8")
    changed.write_text(text + "# touched by the ci pr benchmark\n", encoding="utf-8")
    run_checked(["git", "commit", "-qam", "change one version"], cwd=where, env=env)
    return where


def only_the_artifact_fetch_fails(out: bytes) -> None:
    """``ci pr --json`` passed, or failed only at fetching the one changed artifact."""
    report = json.loads(out)
    others = [p for p in report.get("problems", []) if "dvc pull failed" not in p]
    if others or (not report.get("problems") and not report.get("ok")):
        raise BenchmarkError(f"ci pr reported other problems: {others[:5]}")


def _growth_row(total: int, timings: dict[str, Timing]) -> dict[str, Any]:
    row: dict[str, Any] = {"versions": total}
    for key in (VALIDATE_COLD, VALIDATE_WARM, STATUS_COLD, STATUS_WARM, GTO_SHOW):
        row[key] = round(timings[key].median_s, 4)
    row["gto show / slowest modelreg"] = round(
        row[GTO_SHOW] / max(row[k] for k in (VALIDATE_COLD, STATUS_COLD)), 2
    )
    return row


def _growth(params: ScaleParams, env: dict[str, str], gto: GtoTool) -> dict[str, Any]:
    """validate and status, cold and warm, beside gto show, at another size."""
    base = BENCH_DIR / NAME / f"{params.models}x{params.versions}"
    prepare(params, base, env, gto)
    mr_repo, gto_repo = base / "modelreg", base / "gto"
    modelreg = modelreg_argv()
    warm_cache(mr_repo, env, manifest_count(params))
    run_checked([*modelreg, "status"], cwd=mr_repo, env=env)
    print(f"timing on {params.total:,} versions (growth) ...", flush=True)
    valid = _contains(f"{params.total} versions")
    rows = _lines(params.total + 1)
    validate, status = [*modelreg, "validate"], [*modelreg, "status"]
    commands = {
        VALIDATE_COLD: Command([*validate, "--no-cache"], mr_repo, check_output=valid),
        VALIDATE_WARM: Command(validate, mr_repo, check_output=valid),
        STATUS_COLD: Command([*status, "--no-cache"], mr_repo, check_output=rows),
        STATUS_WARM: Command(status, mr_repo, check_output=rows),
        GTO_SHOW: Command(
            [str(gto.exe), "show"],
            gto_repo,
            check_output=_contains(model_name(0)),
            stop_after_s=GTO_SINGLE_RUN_AFTER_S,
        ),
    }
    return _growth_row(params.total, time_interleaved(commands, env=env, runs=RUNS))


def _growth_notes(growth: list[dict[str, Any]]) -> list[str]:
    """One line per size: medians of validate and status, cold/warm, and gto show."""
    return [
        f"growth at {row['versions']:,} versions: validate {row[VALIDATE_COLD]:.3f} s "
        f"cold / {row[VALIDATE_WARM]:.3f} s warm, status {row[STATUS_COLD]:.3f} s cold "
        f"/ {row[STATUS_WARM]:.3f} s warm, gto show {row[GTO_SHOW]:.3f} s "
        f"({row['gto show / slowest modelreg']:.1f}x the slowest cold modelreg)"
        for row in growth
    ]
