"""``modelreg fleet status`` over 10,000 device reports in a folder (``--quick``: 1,000).

The reports are written once under ``.bench/fleet_status/<count>/`` by the device's own
encoder (``registry.device_report.encode_report``) and reused while the count matches:
two models, a canary and a production channel with a rollout of 1.1.0 under way, some
devices failed or rolled back with their reasons, some silent for an hour, each report
1 to 3 KB as a daemon sends it.  The files are read once to warm the page cache.  Then,
round-robin so that drift hits all alike, median of 5:

* ``json.loads`` of every file: the floor of reading that many JSON files in Python,
  with no check of any kind;
* ``fleet.reports.load_reports``: the same files as untrusted input (no links, a size
  cap before reading, the strict schema, the name matching the device);
* ``fleet.summary.summarize`` over what was read (versions, each channel's cohort drawn
  with ``in_cohort``, staleness);
* ``modelreg fleet status --reports DIR --json`` as a process: what a user waits for,
  interpreter start and imports included.

Goals (full run): load and summarize within 1 s in process; the command within 2 s.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from benchmarks._util import (
    BENCH_DIR,
    REPO_ROOT,
    BenchmarkError,
    Timing,
    busy_warning,
    load_average,
    machine_info,
    time_command,
)
from fleet.reports import load_reports
from fleet.summary import ChannelTarget, summarize
from registry.cohort import in_cohort
from registry.device_report import encode_report

NAME: Final = "fleet_status"
FULL_COUNT: Final = 10_000
QUICK_COUNT: Final = 1_000
RUNS: Final = 5
GOAL_IN_PROCESS_S: Final = 1.0
GOAL_COMMAND_S: Final = 2.0
CHANNELS: Final = {
    "mlp": {"canary": ChannelTarget("1.1.0"), "production": ChannelTarget("1.1.0", 25.0)},
    "det": {"production": ChannelTarget("2.0.0")},
}
_SHA: Final = {v: f"{n:x}" * 64 for n, v in enumerate(["1.0.0", "1.1.0", "2.0.0"], start=1)}


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _model(
    device: str, name: str, channel: str, now: datetime, rng: random.Random
) -> dict[str, Any]:
    """One model of a device, as its state would be during the rollout."""
    target = CHANNELS[name][channel]
    old = "1.0.0" if name == "mlp" else "2.0.0"
    held = {"version": old, "sha256": _SHA[old], "target": "cpu", "kind": "artifact"}
    stages = {"detect": 1.2, "verify_metadata": 3.4, "plan": 0.1, "fetch": 120.0,
              "verify_bytes": 5.0, "apply_delta": 40.0, "build": 20.0, "self_test": 3.0,
              "swap": 0.2, "commit": 1.0}  # fmt: skip
    update: dict[str, Any] = {"result": "installed", "version": old, "method": "full",
                              "bytes_fetched": 4_200_000, "reason": None, "stages_ms": stages,
                              "finished": _stamp(now - timedelta(days=2))}  # fmt: skip
    entry: dict[str, Any] = {"channel": channel, "serving": held, "previous": None,
                             "last_known_good": held, "last_update": update, "rejected": [],
                             "gate": None}  # fmt: skip
    if in_cohort(device, name, target.version, target.percent) and target.version != old:
        roll = rng.random()
        new = {"version": target.version, "sha256": _SHA[target.version], "target": "cpu",
               "kind": "artifact"}  # fmt: skip
        if roll < 0.85:
            entry.update(serving=new, previous=held)
            entry["last_update"] = {**update, "version": target.version, "method": "delta",
                                    "bytes_fetched": 712_000, "finished": _stamp(now)}  # fmt: skip
        elif roll < 0.92:
            entry["last_update"] = {**update, "result": "failed", "version": target.version,
                                    "reason": "fetch: connection reset by peer after 1.2 MB",
                                    "finished": _stamp(now)}  # fmt: skip
        elif roll < 0.95:
            reason = "health gate: error rate 0.31 over 20 requests (allowed 0.05)"
            entry["last_update"] = {**update, "result": "rejected", "version": target.version,
                                    "reason": reason, "finished": _stamp(now)}  # fmt: skip
            entry["rejected"] = [{"version": target.version, "sha256": _SHA[target.version],
                                  "reason": reason, "at": _stamp(now)}]  # fmt: skip
    return entry


def _report(i: int, now: datetime, rng: random.Random) -> dict[str, Any]:
    device = f"cam-{i:05d}"
    models = {"mlp": _model(device, "mlp", "canary" if i % 10 == 0 else "production", now, rng)}
    if i % 3 == 0:
        models["det"] = _model(device, "det", "production", now, rng)
    silent = rng.random() < 0.02
    reported = now - timedelta(seconds=3600 if silent else rng.uniform(0, 300))
    return {
        "kind": "DeviceReport", "format": 1, "device": device,
        "labels": {"arch": "x86_64", "accelerator": "none", "site": f"plant-{i % 40}"},
        "reported": _stamp(reported),
        "daemon": {"running": True, "pid": 1000 + i, "listen": "127.0.0.1:8000",
                   "started": _stamp(now - timedelta(days=3)), "version": "0.1.0"},
        "trust": {"timestamp_version": 412, "timestamp_expires": _stamp(now + timedelta(days=1)),
                  "stale": False},
        "sync": {"last_checked": _stamp(reported), "result": "current", "reason": None,
                 "commit": "3f" * 20},
        "models": models,
    }  # fmt: skip


def ensure_reports(count: int, folder: Path = BENCH_DIR / NAME) -> tuple[Path, bool, float]:
    """``count`` reports as ``<device>.json`` files, written unless already there.

    Their times are relative to when they were written: reused reports grow stale, so
    they are written again when over an hour old (staleness is part of what is timed).

    Returns:
        The folder, whether it was reused, and the seconds spent writing it.
    """
    target = folder / str(count)
    marker = target / ".complete"
    if marker.is_file() and time.time() - marker.stat().st_mtime < 3600:
        return target, True, 0.0
    start = time.perf_counter()
    target.mkdir(parents=True, exist_ok=True)
    for old in target.iterdir():
        old.unlink()
    rng = random.Random(14)  # a reproducible fleet
    now = datetime.now(UTC)
    for i in range(count):
        (target / f"cam-{i:05d}.json").write_bytes(encode_report(_report(i, now, rng)))
    marker.write_text("")
    return target, False, time.perf_counter() - start


def _plain_json(folder: Path) -> int:
    """The floor: every file read and parsed by ``json.loads``, nothing checked."""
    count = 0
    for entry in os.scandir(folder):
        if entry.name.endswith(".json"):
            with open(entry.path, "rb") as fh:  # noqa: PTH123 - the plainest read
                json.loads(fh.read())
            count += 1
    return count


def measure(count: int, folder: Path, runs: int = RUNS) -> dict[str, Any]:
    """Time each contender on ``count`` reports in ``folder`` (see the module docstring).

    Raises:
        BenchmarkError: a contender reads another number of reports than were written,
            or the command fails.
    """
    path, reused, write_s = ensure_reports(count, folder)
    _plain_json(path)  # warm the page cache
    loaded_now: list[Any] = []

    def load() -> int:
        loaded_now[:] = [load_reports(str(path))]
        return len(loaded_now[0].reports)

    def aggregate() -> int:
        return summarize(loaded_now[0].reports, CHANNELS).devices

    def both() -> int:
        return summarize(load_reports(str(path)).reports, CHANNELS).devices

    contenders: dict[str, Callable[[], int]] = {
        "json.loads of every file (no checks)": lambda: _plain_json(path),
        "load_reports (strict)": load,
        "summarize": aggregate,
        "load_reports + summarize": both,
    }
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(runs):
        for name, fn in contenders.items():
            start = time.perf_counter()
            got = fn()
            samples[name].append(time.perf_counter() - start)
            if got != count:
                raise BenchmarkError(f"{name}: {got} reports, {count} written")
    measurements = {name: Timing.of(s) for name, s in samples.items()}

    def check(out: bytes) -> None:
        if json.loads(out)["devices"] != count:
            raise BenchmarkError("fleet status --json did not count every device")

    argv = [sys.executable, "-m", "modelreg", "fleet", "status", "--reports", str(path), "--json"]
    measurements["modelreg fleet status --json (process)"] = time_command(
        argv, cwd=REPO_ROOT, env=dict(os.environ), runs=runs, check_output=check
    )
    sizes = [e.stat().st_size for e in os.scandir(path) if e.name.endswith(".json")]
    summary = summarize(load_reports(str(path)).reports, CHANNELS)
    return {
        "measurements": measurements,
        "generation": {
            "reused": reused,
            "seconds": {"write": round(write_s, 3)},
            "path": str(path),
        },
        "reports": {
            "count": count,
            "bytes_total": sum(sizes),
            "bytes_mean": round(sum(sizes) / len(sizes)),
            "bytes_max": max(sizes),
        },
        "fleet": {
            "stale": len(summary.stale),
            "channels": [
                {
                    "model": c.model,
                    "channel": c.channel,
                    "cohort": c.cohort,
                    "on_target": c.on_target,
                    "failed": len(c.failed),
                }
                for c in summary.channels
            ],
        },
    }


def _goal(name: str, value: float, target: float, *, quick: bool) -> dict[str, Any]:
    return {"name": name, "value": round(value, 4), "target": target, "comparison": "<=",
            "passed": value <= target, "indicative": quick}  # fmt: skip


def run(quick: bool) -> dict[str, Any]:
    """Write (or reuse) the reports and time reading and summarizing them.

    Args:
        quick: 1,000 reports instead of 10,000; goals are then indicative.

    Returns:
        JSON-ready figures: measurements, ratios, goals and environment.

    Raises:
        BenchmarkError: a contender miscounts, or the command fails.
    """
    count = QUICK_COUNT if quick else FULL_COUNT
    print(f"fleet status over {count} reports ({RUNS} rounds) ...", flush=True)
    load_before = load_average()
    if warning := busy_warning():
        print(warning, flush=True)
    result = measure(count, BENCH_DIR / NAME)
    measurements: dict[str, Timing] = result.pop("measurements")
    median = {name: t.median_s for name, t in measurements.items()}
    in_process = median["load_reports + summarize"]
    command = median["modelreg fleet status --json (process)"]
    ratios = {
        "strict load / json.loads": median["load_reports (strict)"]
        / median["json.loads of every file (no checks)"],
    }
    goals = [
        _goal(f"load + summarize {count} reports <= {GOAL_IN_PROCESS_S:g} s", in_process,
              GOAL_IN_PROCESS_S, quick=quick),
        _goal(f"fleet status --json on {count} reports <= {GOAL_COMMAND_S:g} s", command,
              GOAL_COMMAND_S, quick=quick),
    ]  # fmt: skip
    machine = machine_info()
    load_after = machine.pop("load_average")
    return {
        "name": NAME,
        "quick": quick,
        "summary": f"fleet status over {count} device reports in a folder (page cache warm)",
        "params": {"count": count, "runs": RUNS},
        **result,
        "measurements": {k: v.to_json() for k, v in measurements.items()},
        "per_report_us": {k: round(v / count * 1e6, 1) for k, v in median.items()},
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "goals": goals,
        "environment": {
            **machine,
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
    }


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
