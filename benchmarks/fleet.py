"""Fleet simulation (issue 14, point 5): a thousand devices running the daemon's real
sync code against one ``git daemon`` and one HTTP artifact server on loopback, following
the metadata in git and then gitless (mirrored to the artifact remote).

**Devices.** Each simulated device is the real :class:`edge_sync.daemon.Daemon` loop
(``serving=False``: no inference server) with its own ``edge.yaml``, device id and state
dir, in threads spread over a few worker processes (``benchmarks._fleet_worker``):
the real watcher (git, or the metadata mirror), :class:`~edge_sync.sync.trust.DeviceTrust`,
downloads, verification, delta, state commits, and the daemon's own waits
(``next_delay``: ``poll_interval * (1 +- jitter)`` after each sync, so the jitter is
the product's, not a copy).  Each device holds a real ONNX Runtime session of the small
example MLP (30 KB) in an :class:`~edge_sync.engine.host.InProcessHost`, built and self-tested
on its signed goldens at every install: measured at about 0.6 MB of memory per device,
a thousand fit easily, so no stand-in engine host is needed.  Devices start from a copy
of one template device's state dir (one real install of 1.0.0; each copy gets its own
id) instead of a thousand identical first installs; their daemons then all start at
once.

**Scenario** (``benchmarks._fleet_repo``).  All devices follow ``production`` at mlp
1.0.0.  The canary is a rollout share, as the product defines it (docs/reference/repository.md: a
device is in the cohort when hash(device id, model, version) falls under
``rollout.percent``): ``production`` gets 1.1.0 at 10 %, then at 100 %.  A ``canary``
channel of its own would reach only the devices configured to follow it, a share fixed
when they are provisioned, not by the release.

**Servers** (``benchmarks._fleet_servers``), each in a process of its own: the HTTP
artifact server counts requests and bytes, answers conditional requests (ETag,
If-Modified-Since) and ranges, and sends model files at a device's link rate, so that a
download lasts as in the field and concurrent downloads can be counted: the delta a
device fetches lasts a tenth of a poll interval, or less where that rate would be under
4x the device's own slowest accepted rate (``TrustLimits.min_bytes_per_s``, which
would cut it off); metadata goes at loopback speed.  Git traffic passes a counting TCP
proxy (one connection per git request).  Server CPU is read from ``/proc``: the git
daemon with the upload-packs it forked and reaped, the HTTP server's own process.

**Figures.**  Per run: devices on each version over time; requests, bytes and server
CPU per idle poll, per *refresh* (a poll that verifies new metadata and installs
nothing) and per *update* (a poll that installs), solved from the idle, canary and
production windows (see :func:`_costs`); concurrent downloads; the canary's reach and
the convergence time in poll intervals.  Runs: git and gitless at jitter 0.2, and at
jitter 0 for the download peak.

The simulated devices share this machine's cores, which a real fleet does not: the
poll interval is chosen so that one round of the fleet's polls takes well under one
interval of CPU here; each run reports the simulator's own CPU share, and a run over
80 % in any window says so.  The same sharing spreads a fleet that polls in the same
instant (jitter 0) over the seconds its syncs take here, and ``git daemon``, which
accepts 5 connections at a time, spreads it further: the measured jitter-0 download
peak is a floor.  :func:`herd_model` gives the peak without either, from the daemon's
own waits, as a second (indicative) figure.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final

from benchmarks._fleet_repo import CANARY_PERCENT, MODEL, NEW, FleetRepo, build, serve
from benchmarks._fleet_sim import Mode, RunParams, RunRecord, Snapshot, simulate
from benchmarks._util import BENCH_DIR, REPO_ROOT, BenchmarkError, busy_warning, machine_info

NAME: Final = "fleet"
RESULTS: Final = REPO_ROOT / "benchmarks" / "results"
KB: Final = 1000
WINDOWS: Final = {
    "idle": ("up", "canary"),
    "canary": ("canary", "canary_end"),
    "production": ("canary_end", "end"),
}
"""The scenario's windows, between the marks of a run (``_fleet_sim.RunRecord``)."""


@dataclass(frozen=True)
class Size:
    """A fleet size and the timing that keeps this machine ahead of it."""

    devices: int
    poll_s: float
    workers: int


FULL: Final = Size(devices=1000, poll_s=60.0, workers=2)
"""At 60 s the simulated devices used at most 38 % of 2 cores (an update wave in git mode)
and every run took 6 to 7 minutes (four runs, with the releases: 26 minutes)."""
QUICK: Final = Size(devices=50, poll_s=8.0, workers=2)
SATURATED: Final = 0.8
"""The simulator's share of the CPUs over which a window's timings are its own pace."""
DOWNLOAD_SHARE: Final = 0.1
"""A download of the delta lasts this share of a poll interval (the emulated link)."""


def gitless_available() -> bool:
    """Whether this checkout's daemon can follow metadata mirrored to the artifact
    remote (``repository.source: artifacts``)."""
    from edge_sync.config import RepositoryConfig

    return "source" in RepositoryConfig.model_fields


def expected_cohort(devices: Sequence[str]) -> set[str]:
    """The devices the canary release should reach (the daemon's own cohort test)."""
    from edge_sync.sync.updater import in_cohort

    return {d for d in devices if in_cohort(d, MODEL, NEW, CANARY_PERCENT)}


# --- analysis ----------------------------------------------------------------------------


def _totals(a: Snapshot, b: Snapshot) -> dict[str, float]:
    """What both servers did between two snapshots."""

    def delta(side: str, key: str) -> float:
        before, after = getattr(a, side).get(key, 0), getattr(b, side).get(key, 0)
        return float(after - before)

    http_bytes = delta("http", "bytes_in") + delta("http", "bytes_out")
    return {
        "requests": delta("http", "requests") + delta("git", "connections"),
        "bytes": http_bytes + delta("git", "bytes"),
        "cpu_ms": (b.http_cpu_s - a.http_cpu_s + b.git_cpu_s - a.git_cpu_s) * 1000,
        "http_requests": delta("http", "requests"),
        "http_bytes": http_bytes,
        "http_304": delta("http", "status_304"),
        "git_requests": delta("git", "connections"),
        "git_bytes": delta("git", "bytes"),
        "http_cpu_ms": (b.http_cpu_s - a.http_cpu_s) * 1000,
        "git_cpu_ms": (b.git_cpu_s - a.git_cpu_s) * 1000,
    }


def _in(events: list[dict[str, Any]], a: float, b: float) -> list[dict[str, Any]]:
    return [e for e in events if a < e["t"] <= b]


def _installs(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if (u := e["u"].get(MODEL)) and u[0] == "installed" and u[1] == NEW]


def _costs(record: RunRecord) -> dict[str, dict[str, float]]:
    """Server cost per idle poll, per refresh and per update.

    The idle window gives the idle poll (its totals over the syncs in it).  In each
    release window every device makes one poll that sees the new metadata, an update
    when it installs and a refresh when not, and its other polls are idle; with the
    idle cost known, the canary window (few updates, many refreshes) and the production
    window (the reverse) are two equations in the refresh and update costs.
    """
    marks, events, n = record.marks, record.events, record.params.devices
    idle_polls = len(_in(events, marks["up"].t, marks["canary"].t))
    idle = _totals(marks["up"], marks["canary"])
    per_idle = {k: v / max(idle_polls, 1) for k, v in idle.items()}
    rows = []
    for a, b in (("canary", "canary_end"), ("canary_end", "end")):
        window = _in(events, marks[a].t, marks[b].t)
        installs = len(_installs(window))
        spare = max(len(window) - n, 0)
        totals = _totals(marks[a], marks[b])
        net = {k: v - spare * per_idle[k] for k, v in totals.items()}
        rows.append((n - installs, installs, net))
    (r1, u1, t1), (r2, u2, t2) = rows
    det = r1 * u2 - r2 * u1
    refresh, update = {}, {}
    for key in idle:
        if det:
            refresh[key] = max((t1[key] * u2 - t2[key] * u1) / det, 0.0)
            update[key] = max((r1 * t2[key] - r2 * t1[key]) / det, 0.0)
        else:  # no install in one window: its polls were all refreshes
            refresh[key] = t1[key] / max(r1, 1)
            update[key] = t2[key] / max(u2, 1)
    return {"idle_poll": per_idle, "refresh": refresh, "update": update,
            "counts": {"idle_polls": idle_polls, "canary_installs": u1,
                       "production_installs": u2}}  # fmt: skip


def _share(a: Snapshot, b: Snapshot) -> float:
    """The simulated devices' share of this machine's CPUs between two snapshots."""
    cpus = len(os.sched_getaffinity(0))
    return round((b.fleet_cpu_s - a.fleet_cpu_s) / max(b.t - a.t, 1e-9) / cpus, 3)


def peak(intervals: Sequence[tuple[float, float]], a: float, b: float) -> int:
    """Most intervals open at once among those that start in (a, b]."""
    edges = sorted(
        [(s, 1) for s, e in intervals if a < s <= b] + [(e, -1) for s, e in intervals if a < s <= b]
    )
    best = now = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def herd_model(
    devices: int, poll_s: float, jitter: float, *, release_s: float, download_s: float
) -> int:
    """Peak concurrent downloads of a model fleet: daemons that all start at 0 and wait
    between polls exactly as the daemon does (:func:`edge_sync.daemon.next_delay`), with
    syncs that take no time, each downloading for ``download_s`` from its first poll
    after ``release_s``.  What the simulation would show without sharing its CPUs."""
    from edge_sync.decide.schedule import next_delay

    rng = random.Random(14)  # a model: a fixed seed, the same figure every run
    starts = []
    for _ in range(devices):
        t = 0.0
        while t <= release_s:
            t += next_delay(poll_s, jitter, rng)
        starts.append(t)
    return peak([(t, t + download_s) for t in starts], -math.inf, math.inf)


def analyse(record: RunRecord, cohort: set[str]) -> dict[str, Any]:
    """The figures of one run (see the module doc)."""
    p, marks, events = record.params, record.marks, record.events
    n = p.devices
    canary = {e["d"] for e in _installs(_in(events, marks["canary"].t, marks["canary_end"].t))}
    installs = _installs(events)
    converged = sum(v == NEW for v in record.final.values()) == n
    last = max((e["t"] for e in installs), default=math.inf)
    t2 = marks["canary_end"].t
    downloads = record.downloads
    mean_s = sum(e - s for s, e in downloads) / max(len(downloads), 1)
    failed = [e for e in events if e["r"] == "failed"]
    times = sorted((e["t"] - record.started) for e in installs)
    return {
        "label": p.label,
        "params": asdict(p),
        "canary": {
            "devices": len(canary),
            "share_percent": round(100 * len(canary) / n, 2),
            "expected_cohort": len(cohort),
            "outside_cohort": sorted(canary - cohort),
            "cohort_missing": sorted(cohort - canary),
        },
        "convergence": {
            "all_on_new": converged,
            "seconds": round(last - t2, 3) if converged else None,
            "poll_intervals": round((last - t2) / p.poll_s, 3) if converged else None,
        },
        "downloads": {
            "total": len(downloads),
            "canary": sum(marks["canary"].t < s <= t2 for s, _ in downloads),
            "production": sum(t2 < s <= marks["end"].t for s, _ in downloads),
            "peak_canary": peak(downloads, marks["canary"].t, t2),
            "peak_production": peak(downloads, t2, marks["end"].t),
            "mean_s": round(mean_s, 3),
            "model_peak_production": herd_model(
                n, p.poll_s, p.jitter, release_s=t2 - record.started, download_s=mean_s
            ),
            "model_peak_unjittered": herd_model(
                n, p.poll_s, 0.0, release_s=t2 - record.started, download_s=mean_s
            ),
        },
        "costs": _costs(record),
        "simulator_cpu_share": {
            name: _share(marks[a], marks[b]) for name, (a, b) in WINDOWS.items()
        },
        "syncs": len(events),
        "failed_syncs": len(failed),
        "failure_reasons": sorted({str(e["why"]) for e in failed})[:5],
        "problems": record.problems,
        "timeline": {
            "releases_s": {
                "canary": round(marks["canary"].t - record.started, 3),
                "production": round(t2 - record.started, 3),
            },
            "installs_s": [round(t, 3) for t in times],
            "end_s": round(marks["end"].t - record.started, 3),
            "downloads_s": [
                [round(s - record.started, 3), round(e - record.started, 3)] for s, e in downloads
            ],
        },
    }


# --- goals -------------------------------------------------------------------------------


def _goal(name: str, value: float, target: float, *, indicative: bool) -> dict[str, Any]:
    return {"name": name, "value": round(value, 4), "target": target, "comparison": "<=",
            "passed": value <= target, "indicative": indicative}  # fmt: skip


def goals(runs: dict[str, dict[str, Any]], *, indicative: bool) -> list[dict[str, Any]]:
    """The issue's goals over the runs made (a goal whose runs are missing is left out)."""
    out = []
    by = {(r["params"]["mode"], r["params"]["jitter"]): r for r in runs.values()}
    gitless = [r for (mode, _), r in by.items() if mode == "artifacts"]
    if gitless:
        idle = max(r["costs"]["idle_poll"]["requests"] for r in gitless)
        idle_b = max(r["costs"]["idle_poll"]["bytes"] for r in gitless)
        out += [
            _goal("gitless idle poll: requests per device", idle, 1, indicative=indicative),
            _goal("gitless idle poll: KB per device", idle_b / KB, 1, indicative=indicative),
        ]
    for run in runs.values():
        c, conv, label = run["canary"], run["convergence"], run["label"]
        out += [
            _goal(f"{label}: canary share, points from {CANARY_PERCENT:g} %",
                  abs(c["share_percent"] - CANARY_PERCENT), 3, indicative=indicative),
            _goal(f"{label}: devices outside the cohort on {NEW} in canary",
                  len(c["outside_cohort"]), 0, indicative=indicative),
            _goal(f"{label}: production reaches all, in poll intervals",
                  conv["poll_intervals"] if conv["all_on_new"] else math.inf, 2,
                  indicative=indicative),
        ]  # fmt: skip
    for run in runs.values():
        if run["params"]["jitter"] == 0.2:
            d = run["downloads"]
            out.append(_goal(
                f"{run['label']}: download peak / jitter 0, the daemon's waits (model)",
                d["model_peak_production"] / max(d["model_peak_unjittered"], 1), 0.3,
                indicative=True,
            ))  # fmt: skip
    for mode in ("git", "artifacts"):
        if (mode, 0.0) in by and (mode, 0.2) in by:
            jittered = by[(mode, 0.2)]["downloads"]["peak_production"]
            flat = max(by[(mode, 0.0)]["downloads"]["peak_production"], 1)
            name = "git" if mode == "git" else "gitless"
            out.append(_goal(f"{name}: download peak, jitter 0.2 / jitter 0", jittered / flat,
                             0.3, indicative=indicative))  # fmt: skip
    return out


# --- running -----------------------------------------------------------------------------


def plan(size: Size, fleet: FleetRepo, modes: Sequence[Mode]) -> list[RunParams]:
    """The runs of one benchmark: every mode at jitter 0.2, then at jitter 0."""
    from edge_sync.sync.limits import TrustLimits

    slowest = 4 * TrustLimits().min_bytes_per_s
    rate = max(math.ceil(fleet.delta_bytes / (DOWNLOAD_SHARE * size.poll_s)), slowest)
    base = RunParams(size.devices, size.poll_s, 0.2, "git", size.workers, link_rate=rate)
    return [replace(base, mode=m, jitter=j) for j in (0.2, 0.0) for m in modes]


def simulate_fleet(
    size: Size, work: Path, *, modes: Sequence[Mode] | None = None, jitters: Sequence[float] = ()
) -> dict[str, dict[str, Any]]:
    """Build the releases, and play the scenario once per run (see :func:`plan`);
    ``jitters`` keeps only runs at those jitters.  Results by run label.

    Raises:
        BenchmarkError: the repository, a server or a worker failed.
    """
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    fleet = build(work / "repo")
    served = serve(fleet, work / "served")
    if modes is None:
        modes = ["git", "artifacts"] if gitless_available() else ["git"]
    runs = [r for r in plan(size, fleet, modes) if not jitters or r.jitter in jitters]
    results = {}
    for params in runs:
        devices = [f"dev-{i:04d}" for i in range(1, params.devices + 1)]
        cohort = expected_cohort(devices)
        slug = params.label.replace(", jitter ", "-j")
        record = simulate(served, params, work / f"run-{slug}", cohort)
        results[params.label] = analyse(record, cohort)
    return results


def run(quick: bool) -> dict[str, Any]:
    """The fleet benchmark at its full size (1,000 devices) or ``quick`` (50).

    Returns:
        JSON-ready figures, goals and the plot's path.

    Raises:
        BenchmarkError: the simulation could not run.
    """
    size = QUICK if quick else FULL
    warning = busy_warning()
    runs = simulate_fleet(size, BENCH_DIR / NAME / ("quick" if quick else "full"))
    notes = [] if warning is None else [warning]
    if not gitless_available():
        notes.append("gitless mode is not in this checkout (repository.source): git runs only")
    for label, r in runs.items():
        cost = r["costs"]
        notes.append(
            f"{label}: idle poll {cost['idle_poll']['requests']:.2f} req "
            f"{cost['idle_poll']['bytes']:.0f} B {cost['idle_poll']['cpu_ms']:.2f} ms; update "
            f"{cost['update']['requests']:.1f} req {cost['update']['bytes'] / KB:.1f} KB "
            f"{cost['update']['cpu_ms']:.1f} ms; canary {r['canary']['share_percent']} %; "
            f"converged in {r['convergence']['poll_intervals']} intervals; download peak "
            f"{r['downloads']['peak_production']}; failed syncs {r['failed_syncs']}"
        )
    for label, r in runs.items():
        busy = {w: v for w, v in r["simulator_cpu_share"].items() if v >= SATURATED}
        if busy:
            notes.append(f"{label}: the simulated devices used {busy} of the CPUs: "
                         "the figures of those windows are the simulator's pace")  # fmt: skip
    plot = None
    try:
        from benchmarks._fleet_plot import plot_runs
    except ImportError:
        notes.append("matplotlib is not installed (pip install -e '.[dev]'): no plot")
    else:
        plot = plot_runs(runs, size, RESULTS / ("fleet-quick.png" if quick else "fleet.png"))
    return {
        "name": NAME,
        "quick": quick,
        "summary": f"{size.devices} devices, poll {size.poll_s:g} s, "
        f"{len(runs)} runs ({', '.join(runs)})",
        "params": asdict(size),
        "measurements": {},
        "runs": runs,
        "plot": str(plot) if plot else None,
        "notes": notes,
        "goals": goals(runs, indicative=quick),
        "environment": machine_info(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.fleet``: one size, chosen modes and jitters (development)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet")
    parser.add_argument("--devices", type=int, default=QUICK.devices)
    parser.add_argument("--poll", type=float, default=QUICK.poll_s)
    parser.add_argument("--workers", type=int, default=QUICK.workers)
    parser.add_argument("--mode", choices=["git", "artifacts"], action="append")
    parser.add_argument("--jitter", type=float, action="append", default=[])
    args = parser.parse_args(argv)
    size = Size(args.devices, args.poll, args.workers)
    try:
        runs = simulate_fleet(size, BENCH_DIR / NAME / "dev", modes=args.mode, jitters=args.jitter)
    except BenchmarkError as e:
        print(f"fleet: {e}", file=sys.stderr)
        return 1
    import json

    out = BENCH_DIR / NAME / "dev" / "runs.json"
    out.write_text(json.dumps(runs, indent=1), encoding="utf-8")
    print(f"runs written to {out}")
    with contextlib.suppress(ImportError):
        from benchmarks._fleet_plot import plot_runs

        print(f"plot: {plot_runs(runs, size, RESULTS / 'fleet-dev.png')}")
    for label, r in runs.items():
        print(label)
        for key, value in r.items():
            if key != "timeline":
                print(f"  {key}: {json.dumps(value)}")
    for g in goals(runs, indicative=True):
        print(("PASS" if g["passed"] else "FAIL"), g["name"], g["value"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
