"""``modelreg ci release`` for one ~100 MB version, wall time by stage.

A fresh model repository (``modelreg init``, the large MLP example 1.0.0 released, then
its 1.1.0 fine-tune declared and promoted to canary) is released by the real command
line, as the release workflow would.  The second release is the one measured: it
builds the new version (checker, ONNX Runtime load, ORT-optimized engine), publishes it
(DVC push, OMS bundle, an ONNX-aware delta from 1.0.0, TUF targets and metadata),
commits the signed metadata and mirrors it into a local sqlite MLflow.  The stages are
``ci release``'s own ``timings_ms``; the total is the subprocess wall time.

Reference (SPEC section 9): MLflow ``log_model`` + registration of a 100 MB model
against a local ``mlflow server``: 4.0 s.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from typing import Any, Final

from benchmarks._util import BENCH_DIR, isolated_env, load_average, machine_info, run_checked
from modelreg.examples import write_examples

NAME: Final = "release"


def run(quick: bool) -> dict[str, Any]:
    """Release 1.1.0 of the large MLP (quick: the small one) and time each stage.

    Returns:
        JSON-ready figures: total wall time, per-stage milliseconds, sizes.
    """
    size = "small" if quick else "large"
    work = BENCH_DIR / NAME / size
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    examples = work / "examples"
    built = write_examples(examples, size=size, models=["mlp"], goldens=False)
    files = {f.version: f.path for f in built}
    env = isolated_env(work / "home", {"MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"})
    cli = [sys.executable, "-m", "modelreg"]
    repo = work / "fleet"
    load_before = load_average()

    def modelreg(*args: str) -> bytes:
        return run_checked([*cli, *args], cwd=repo if repo.exists() else work, env=env).stdout

    modelreg("init", str(repo))
    modelreg("model", "add", "mlp", "--channel-order", "canary,production")
    modelreg("version", "add", "mlp", "1.0.0", "--artifact", str(files["1.0.0"]),
             "--target", "cpu=onnxruntime")  # fmt: skip
    modelreg("promote", "mlp", "1.0.0", "-c", "canary")
    run_checked(["git", "add", "-A"], cwd=repo, env=env)
    run_checked(["git", "commit", "-qm", "mlp 1.0.0"], cwd=repo, env=env)
    modelreg("ci", "release")
    modelreg("version", "add", "mlp", "1.1.0", "--artifact", str(files["1.1.0"]),
             "--target", "cpu=onnxruntime")  # fmt: skip
    modelreg("promote", "mlp", "1.1.0", "-c", "canary")
    run_checked(["git", "add", "-A"], cwd=repo, env=env)
    run_checked(["git", "commit", "-qm", "mlp 1.1.0"], cwd=repo, env=env)
    start = time.perf_counter()
    report = json.loads(modelreg("ci", "release", "--json"))
    total = time.perf_counter() - start
    machine = machine_info()
    return {
        "name": NAME,
        "quick": quick,
        "summary": f"ci release of mlp 1.1.0 ({files['1.1.0'].stat().st_size / 1e6:.1f} MB)",
        "params": {"size": size},
        "measurements": {},
        "stages_ms": report["timings_ms"],
        "total_s": round(total, 3),
        "published": report["published"],
        "notes": [
            "stages: "
            + ", ".join(f"{k} {v / 1000:.2f} s" for k, v in report["timings_ms"].items()),
            f"total wall time (process start to exit): {total:.2f} s",
        ],
        "goals": [],
        "environment": {**machine, "load_average_before": load_before},
    }
