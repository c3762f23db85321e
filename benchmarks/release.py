"""``modelreg ci release`` for one ~100 MB version, wall time by stage, on two setups.

A fresh model repository (``modelreg init``, the large MLP example 1.0.0 released, then
its 1.1.0 fine-tune declared and promoted to canary) is released by the real command
line, as the release workflow would.  The second release is the one measured: it
builds the new version (checker, ONNX Runtime load, ORT-optimized engine), publishes it
(DVC push, OMS bundle, an ONNX-aware delta from 1.0.0, TUF targets and metadata),
commits the signed metadata and mirrors it into MLflow.  The stages are ``ci
release``'s own ``timings_ms``; the total is the subprocess wall time.  It runs on:

- ``local``: the embedded defaults, a sqlite MLflow and a local folder as DVC remote;
- ``team``: as a team runs it (``tests/services.py``, all on loopback): the DVC remote
  in S3 (moto's server), MLflow a ``mlflow server`` on PostgreSQL whose artifacts go
  to the same S3 through the server (``--artifacts-destination``).

The team setup needs PostgreSQL (``apt-get install postgresql``); where it cannot start,
or with ``MODELREG_BENCH_SERVICES=0``, that half is skipped and the note says why.

Reference (docs/guide/benchmarks.md): MLflow ``log_model`` + registration of a 100 MB model
against a local ``mlflow server``: 4.0 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from benchmarks._util import BENCH_DIR, isolated_env, load_average, machine_info, run_checked
from modelreg.examples import write_examples

NAME: Final = "release"
BUCKET: Final = "bench-team"


def _release(work: Path, files: Mapping[str, Path], env: dict[str, str],
             remote: str | None, endpoint: str | None) -> tuple[dict[str, Any], float]:  # fmt: skip
    """Release 1.0.0, then time the release of 1.1.0; its report and wall time."""
    cli = [sys.executable, "-m", "modelreg"]
    repo = work / "fleet"

    def modelreg(*args: str) -> bytes:
        return run_checked([*cli, *args], cwd=repo if repo.exists() else work, env=env).stdout

    modelreg("init", str(repo), *(["--remote", remote] if remote else []))
    if endpoint is not None:
        # Where the S3 API is; the credentials stay in the environment.
        dvc = str(Path(sys.executable).with_name("dvc"))
        run_checked(
            [dvc, "remote", "modify", "storage", "endpointurl", endpoint], cwd=repo, env=env
        )
        run_checked(["git", "add", "-A"], cwd=repo, env=env)
        run_checked(["git", "commit", "-qm", "S3 endpoint"], cwd=repo, env=env)
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
    return report, time.perf_counter() - start


@contextlib.contextmanager
def _team_services(work: Path) -> Iterator[tuple[str, str]]:
    """(S3 endpoint, MLflow tracking URI) of the team setup, stopped on exit.

    Raises:
        ServiceUnavailable: a service cannot start here.
    """
    # The launchers the team-scale tests use: one way to start these services.
    from tests.services import mlflow_servers, postgres, s3_server

    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(postgres())
        pg.create_database("mlflow")
        s3 = stack.enter_context(s3_server(BUCKET))
        servers = stack.enter_context(
            mlflow_servers(pg.url("mlflow"), s3, {"proxied": f"s3://{BUCKET}/mlflow"}, work)
        )
        yield s3, servers["proxied"].url


def _team(work: Path, files: Mapping[str, Path]) -> tuple[dict[str, Any], float] | str:
    """The team setup's report and wall time, or why it did not run."""
    if os.environ.get("MODELREG_BENCH_SERVICES") == "0":
        return "skipped: MODELREG_BENCH_SERVICES=0"
    from tests.services import S3_CREDENTIALS, ServiceUnavailable

    try:
        with _team_services(work / "services") as (s3, tracking):
            env = isolated_env(work / "home", {**S3_CREDENTIALS, "MLFLOW_TRACKING_URI": tracking})
            return _release(work, files, env, f"s3://{BUCKET}/store", s3)
    except ServiceUnavailable as e:
        return f"skipped: the services cannot start here ({e})"


def run(quick: bool) -> dict[str, Any]:
    """Release 1.1.0 of the large MLP (quick: the small one) on both setups, by stage.

    Returns:
        JSON-ready figures: per setup, total wall time and per-stage milliseconds.
    """
    size = "small" if quick else "large"
    base = BENCH_DIR / NAME / size
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    built = write_examples(base / "examples", size=size, models=["mlp"], goldens=False)
    files = {f.version: f.path for f in built}
    load_before = load_average()
    local = base / "local"
    local.mkdir()
    env = isolated_env(local / "home", {"MLFLOW_TRACKING_URI": f"sqlite:///{local / 'mlflow.db'}"})
    runs: dict[str, tuple[dict[str, Any], float] | str] = {}
    runs["local"] = _release(local, files, env, None, None)
    (base / "team").mkdir()
    runs["team"] = _team(base / "team", files)
    setups: dict[str, Any] = {}
    notes = [
        (
            "local: sqlite MLflow + local folder DVC remote; team: mlflow server on "
            "PostgreSQL with artifacts proxied to S3 + S3 DVC remote (moto), all on loopback"
        )
    ]
    for setup, outcome in runs.items():
        if isinstance(outcome, str):
            setups[setup] = {"skipped": outcome}
            notes.append(f"{setup}: {outcome}")
            continue
        report, total = outcome
        setups[setup] = {
            "stages_ms": report["timings_ms"],
            "total_s": round(total, 3),
            "published": report["published"],
        }
        notes.append(
            f"{setup}: "
            + ", ".join(f"{k} {v / 1000:.2f} s" for k, v in report["timings_ms"].items())
            + f"; total wall time (process start to exit) {total:.2f} s"
        )
    local_run = setups["local"]
    return {
        "name": NAME,
        "quick": quick,
        "summary": f"ci release of mlp 1.1.0 ({files['1.1.0'].stat().st_size / 1e6:.1f} MB), "
        "local vs team setup",
        "params": {"size": size},
        "measurements": {},
        "stages_ms": local_run["stages_ms"],
        "total_s": local_run["total_s"],
        "published": local_run["published"],
        "setups": setups,
        "notes": notes,
        "goals": [],
        "environment": {**machine_info(), "load_average_before": load_before},
    }
