"""A model over 2 GB (ONNX external data) through ``version add``, build, publish and delta.

``python -m benchmarks.large_model [--gib N] [--quick]`` (or within ``python -m
benchmarks``; ``--skip large_model`` leaves it out there).  The project's own script
(``scripts/make_example_models.py --large-external``) writes an MLP of 16 -> 8192 x N ->
4 whose weights (2.25 GiB by default) are one external data file beside the ``.onnx``,
for 1.0.0 and a fine-tune 1.1.0 (last hidden layer and head changed, about 11 % of the
bytes); the pair is written once under ``.bench/large_model/`` and reused.

Each stage runs as its own process in a fresh repository, timed, with its peak RSS read
from ``wait4`` (the process and every child it waited for: DVC, git):

* ``version add 1.0.0`` and ``version add 1.1.0 --parent 1.0.0`` (copy in, ``dvc add``);
* ``build mlp 1.1.0`` (fetch and verify every file, ONNX checker and shape inference,
  an ONNX Runtime session: the one stage that must hold the weights);
* ``publish`` (signed targets for both versions and their data files, OMS bundles over
  every file, the streaming tensor-aware delta of the data file);
* ``delta decode`` on the device side: the published delta applied to 1.0.0's data file,
  verified against 1.1.0's signed SHA-256.

Goals (indicative): every stage but build peaks below a quarter of the model's size
(streamed or memory-mapped, never read whole); the delta is under a quarter of the
data file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from benchmarks._util import BENCH_DIR, REPO_ROOT, BenchmarkError, isolated_env, machine_info

NAME: Final = "large_model"
GIB: Final = 2.25
QUICK_GIB: Final = 0.3
GOAL_RSS_FRACTION: Final = 0.25
GOAL_DELTA_FRACTION: Final = 0.25

_DECODE: Final = """
import sys
from pathlib import Path
from registry.delta import decode
decode(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), expected_sha256=sys.argv[4])
"""


_LAUNCHER: Final = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""
"""Runs a stage from a small process.  Linux records the memory high-water mark of the
process a child was forked from as the child's own at ``exec``: forked from this
benchmark (or a test worker) it would report at least their size.  Forked from this
launcher, it starts from a few MiB."""


def stage(argv: list[str], *, cwd: Path, env: dict[str, str]) -> tuple[float, int]:
    """Run one stage; (seconds, peak RSS in bytes of it and its waited-for children).

    Raises:
        BenchmarkError: it exits non-zero.
    """
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="modelreg-stage-") as tmp:
        report = Path(tmp) / "maxrss"
        # wait4, not RUSAGE_CHILDREN: the stage's own usage (with the children it
        # waited for), where RUSAGE_CHILDREN would mix every stage's peak.
        launcher = [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(report), *argv]
        proc = subprocess.run(launcher, cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, check=False)  # fmt: skip
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            tail = proc.stdout.decode(errors="replace").strip()[-2000:]
            raise BenchmarkError(f"`{' '.join(argv)}` exited {proc.returncode}:\n{tail}")
        return seconds, int(report.read_text()) * 1024  # Linux reports KiB


def ensure_models(gib: float, width: int | None = None, root: Path | None = None) -> Path:
    """The large pair under ``root`` (default ``.bench/large_model/models-<gib>``),
    written by the project's script unless already there."""
    folder = root or BENCH_DIR / NAME / f"models-{gib:g}"
    done = folder / "done"
    if done.exists():
        return folder / "mlp-large"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if width is None:
        argv = [sys.executable, str(REPO_ROOT / "scripts/make_example_models.py"),
                "--out", str(folder), "--large-external", str(gib)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        stage(argv, cwd=folder, env=env)
    else:  # tests: a narrow model, in-process
        from modelreg.examples import write_large_external

        for version in ("1.0.0", "1.1.0"):
            write_large_external(folder / "mlp-large" / version, version, gib, width=width)
    done.touch()
    return folder / "mlp-large"


def run(
    quick: bool, *, gib: float | None = None, width: int | None = None, work: Path | None = None
) -> dict[str, Any]:
    """Make (or reuse) the model and time each stage of its release.

    Args:
        quick: a 0.3 GiB model instead of 2.25 GiB (figures indicative).
        gib: the model's size in GiB (overrides ``quick``).
        width: hidden width (tests make a tiny model; default 8192).
        work: scratch folder (default ``.bench/large_model/work``, emptied first).

    Returns:
        JSON-ready figures: seconds and peak RSS per stage, sizes, goals.

    Raises:
        BenchmarkError: a stage fails.
    """
    size = gib if gib is not None else QUICK_GIB if quick else GIB
    started = time.perf_counter()
    models = ensure_models(size, width, work / "models" if work is not None else None)
    generate_s = time.perf_counter() - started
    work = work or BENCH_DIR / NAME / "work"
    repo = work / "repo"
    shutil.rmtree(repo, ignore_errors=True)
    env = isolated_env(work / "home", {"PYTHONPATH": str(REPO_ROOT), "DVC_NO_ANALYTICS": "1"})
    cli = [sys.executable, "-m", "modelreg"]
    stage([*cli, "init", str(repo)], cwd=work, env=env)
    stage([*cli, "model", "add", "mlp"], cwd=repo, env=env)
    onnx_v1, onnx_v2 = models / "1.0.0/model.onnx", models / "1.1.0/model.onnx"
    data_bytes = (models / "1.1.0/model.onnx.data").stat().st_size
    model_bytes = data_bytes + onnx_v2.stat().st_size
    stages: dict[str, tuple[float, int]] = {}
    stages["version add 1.0.0"] = stage(
        [*cli, "version", "add", "mlp", "1.0.0", "--artifact", str(onnx_v1)], cwd=repo, env=env
    )
    stages["version add 1.1.0"] = stage(
        [*cli, "version", "add", "mlp", "1.1.0", "--artifact", str(onnx_v2), "--parent", "1.0.0"],
        cwd=repo, env=env,
    )  # fmt: skip
    stage(["git", "add", "-A"], cwd=repo, env=env)
    stage(["git", "commit", "-qm", "mlp 1.0.0 and 1.1.0"], cwd=repo, env=env)
    stages["build 1.1.0"] = stage([*cli, "build", "mlp", "1.1.0"], cwd=repo, env=env)
    stages["publish"] = stage([*cli, "publish"], cwd=repo, env=env)
    targets = repo / ".modelreg/remote/modelreg/targets"
    (delta,) = (targets / "deltas/mlp/1.1.0.from-1.0.0.data").glob("*.1.1.0.onnx.data.delta")
    new = repo / "models/mlp/1.1.0.onnx.data"
    (stored,) = (targets / "models/mlp/1.1.0.data").glob("*.1.1.0.onnx.data")
    want = stored.name.split(".", 1)[0]  # consistent-snapshot name: <sha256>.<file>
    out = work / "rebuilt.data"
    stages["delta decode"] = stage(
        [sys.executable, "-c", _DECODE, str(repo / "models/mlp/1.0.0.onnx.data"), str(delta),
         str(out), want],
        cwd=work, env=env,
    )  # fmt: skip
    if out.stat().st_size != new.stat().st_size:
        raise BenchmarkError("the rebuilt data file differs in size from 1.1.0's")
    out.unlink()
    delta_bytes = delta.stat().st_size
    goals = [
        {
            "name": f"{name}: peak RSS <= {GOAL_RSS_FRACTION:g}x model size",
            "value": rss / model_bytes,
            "target": GOAL_RSS_FRACTION,
            "comparison": "<=",
            "passed": rss / model_bytes <= GOAL_RSS_FRACTION,
            "indicative": quick or size < 2,
        }
        for name, (_s, rss) in stages.items()
        if not name.startswith("build")
    ]
    goals.append(
        {
            "name": f"delta <= {GOAL_DELTA_FRACTION:g}x the data file",
            "value": delta_bytes / data_bytes,
            "target": GOAL_DELTA_FRACTION,
            "comparison": "<=",
            "passed": delta_bytes / data_bytes <= GOAL_DELTA_FRACTION,
            "indicative": quick or size < 2,
        }
    )
    notes = [
        f"{name}: {secs:.2f} s, peak RSS {rss / 2**20:.0f} MiB "
        f"({rss / model_bytes:.1%} of the model)"
        for name, (secs, rss) in stages.items()
    ]
    notes.append(
        f"delta {delta_bytes / 2**20:.1f} MiB for a {data_bytes / 2**30:.2f} GiB data file"
    )
    return {
        "name": NAME,
        "quick": quick,
        "summary": f"a {model_bytes / 2**30:.2f} GiB ONNX external-data model, stage by stage",
        "notes": notes,
        "generation": {"reused": generate_s < 1, "seconds": {"make_models": round(generate_s, 3)}},
        "sizes_bytes": {"model": model_bytes, "data_file": data_bytes, "delta": delta_bytes},
        "stages": {
            name: {"seconds": round(secs, 3), "peak_rss_bytes": rss}
            for name, (secs, rss) in stages.items()
        },
        "goals": goals,
        "environment": machine_info(),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.large_model``: run it, print the report, write its JSON.

    Returns:
        0, or 1 when a stage failed.
    """
    from benchmarks.__main__ import render

    parser = argparse.ArgumentParser(prog="python -m benchmarks.large_model")
    parser.add_argument("--quick", action="store_true", help=f"a {QUICK_GIB} GiB model")
    parser.add_argument("--gib", type=float, default=None, help=f"model size (default {GIB})")
    parser.add_argument(
        "--json-out", type=Path, default=REPO_ROOT / "benchmarks/results" / f"{NAME}.json"
    )
    args = parser.parse_args(argv)
    try:
        result = run(args.quick, gib=args.gib)
    except BenchmarkError as e:
        print(f"benchmark {NAME} failed: {e}", file=sys.stderr)
        return 1
    print(render(result))
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"results written to {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
