"""The device server against MLServer, under the same load on the same machine.

Both answer the Open Inference Protocol v2 over REST and over gRPC for the MLP example,
each server in its own process:

* **ours**: the daemon's serving core (``edge_sync.serve.core``) over an
  ``InProcessHost`` (shared-weight sessions, ``prepack="off"``), REST on the daemon's
  bounded uvicorn listener (``edge_sync.serve.listeners``) and gRPC
  (``edge_sync.serve.grpc_server``), run by ``benchmarks._serving_runner`` (``python -m
  benchmarks._serving_runner serve``), without and with dynamic batching (``ours
  (batching)``); SIGUSR1 starts swapping 1.0.0 <-> 1.1.0 every 0.5 s in the server
  process (build beside the serving engine, self-test on the signed goldens, swap,
  retire), SIGUSR2 stops it and writes the timings;
* **MLServer** 1.7.1 (its own venv, ``make bench`` builds ``.bench/mlserver-venv``) with a
  custom runtime around one ONNX Runtime session with the same settings (1 intra-op and
  1 inter-op thread, graph optimizations and prepacking off: what our shared-weight
  sessions use), in three configurations: ``parallel_workers=0`` (inference in the server
  process, as ours), its default ``parallel_workers=1`` (a worker process), and
  ``parallel_workers=0`` with its adaptive batching (the same batch bounds as ours:
  ``_serving_runner.BATCH_SIZE`` rows, ``BATCH_DELAY_S``); it swaps by its repository
  API (the model's settings rewritten, then ``POST /v2/repository/models/mlp/load``,
  every 0.5 s).

The load comes from ``modelreg.loadgen`` in its own process (16 and 200 requests in
flight, the golden input of 2 x 16 floats; every answer is checked against the goldens of
the version it names), over REST and over gRPC (``grpc://``: the same request as raw
contents, a few HTTP/2 channels).  Batching servers are compared with batching servers,
the others with the others.  With two or more CPUs, the servers are pinned to the first, the
generator to the second: each server gets one core, the generator never takes it.  The
rounds rotate the servers' order, so that other work on the machine spreads over all;
the server's CPU time per request (its process tree, from ``/proc``) is reported beside
the throughput, as other work on a shared machine moves it much less.

Each round has, per concurrency and server, a steady run for (a) and an alternating run
for (b): swapping is on in every other window of 1.5 s, and a request in flight at any
moment of a swapping window counts as during swaps, the others as steady.  Both p99s of
(b) come from the same run, so a burst of other work weighs on both alike.

Model sizes: the small MLP (30 KB: a run costs ~20 us) for (a) and (b), so that the
figures are what the serving stack costs (on 2 cores a 100 MB model makes both servers
wait on ONNX Runtime alike); the large one (100 MB, its 1.1.0 fine-tune changes 17 % of
the weight bytes) for (c) and (d), in a process of its own with requests running on it.

Figures and goals: (a) throughput and p50/p99, ours / MLServer's best configuration (goal
>= 2x throughput, p99 <= 0.5x) and against ``session.run`` in-process (the ceiling);
(b) p99 while swapping / p99 steady (goal <= 1.5 for ours, with no failed request);
(c) peak / steady RSS across the swap (goal <= 1.25 shared-weight; a full swap with
``prepack="on"`` beside it); (d) build and swap times of the fine-tune (goals <= 100 ms
build shared-weight, <= 10 ms swap) and what is between them, the self-test on the
goldens and warm-up runs.  ``--quick``: the small model throughout, shorter runs, one
round, MLServer with ``parallel_workers=0`` only (under 30 s here).

This module runs the rounds and reports; beside it, ``_serving_fixture`` (the models,
goldens and the answer check), ``_serving_process`` (a server process: started, pinned,
probed, stopped), ``_serving_runner`` (our server, the ceiling and the memory figures,
each in a process) and ``_mlserver`` (its venv, custom runtime and process).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

from benchmarks._mlserver import MLSERVER_VENV, mlserver_versions, start_mlserver
from benchmarks._serving_fixture import (
    EXPECTED_ENV,
    ORT_SETTINGS,
    SWAP_EVERY_S,
    V1,
    V2,
    make_models,
)
from benchmarks._serving_process import Server, Swaps, tree_cpu_s
from benchmarks._serving_runner import BATCH_DELAY_S, BATCH_SIZE, run_runner, start_ours
from benchmarks._util import BENCH_DIR, BenchmarkError, busy_warning, machine_info
from modelreg.loadgen import LoadError, LoadResult, run_load_subprocess

NAME: Final = "serving"
CONCURRENCY: Final = (16, 200)
PROTOCOLS: Final = ("rest", "grpc")


@dataclass(frozen=True)
class _Plan:
    """How long and how often: ``seconds`` per steady run, ``windows`` of ``window_s``
    per alternating run (swapping in every other), ``rounds`` of both, ``swaps`` timed
    for (d), ``settle_s`` of requests before and after the measured swap."""

    seconds: float
    window_s: float
    windows: int
    rounds: int
    swaps: int
    settle_s: float


def _generate(  # noqa: PLR0917 - one private call per run kind
    server: Server,
    body: bytes,
    concurrency: int,
    seconds: float,
    cpus: set[int] | None,
    protocol: str = "rest",
) -> LoadResult:
    """Raises:
    BenchmarkError: the load could not be generated at all."""
    try:
        return run_load_subprocess(
            server.url(protocol),
            body,
            concurrency=concurrency,
            duration_s=seconds,
            cpus=cpus,
            check="benchmarks._serving_fixture:check_answer",
        )
    except LoadError as e:
        raise BenchmarkError(f"{server.label}, {protocol}: {e}") from None


def _steady(  # noqa: PLR0917 - one private call per run
    server: Server,
    body: bytes,
    concurrency: int,
    seconds: float,
    cpus: set[int] | None,
    protocol: str,
) -> dict[str, Any]:
    """(a): the generator's summary of a steady run, and the server's CPU per request."""
    cpu = tree_cpu_s(server.proc.pid)
    result = _generate(server, body, concurrency, seconds, cpus, protocol)
    summary = result.summary()
    used = tree_cpu_s(server.proc.pid) - cpu
    summary["server_cpu_us_per_request"] = round(used / max(result.requests, 1) * 1e6, 1)
    return summary


def _percentile_ms(latencies: list[float], q: float) -> float:
    latencies.sort()
    return latencies[max(0, math.ceil(q / 100 * len(latencies)) - 1)] * 1000 if latencies else 0.0


def _alternating(  # noqa: PLR0917 - one private call per run
    server: Server,
    body: bytes,
    concurrency: int,
    plan: _Plan,
    cpus: set[int] | None,
    protocol: str,
) -> dict[str, Any]:
    """(b): one run with swapping on in every other window of ``window_s`` (off first).
    A request in flight at any moment of a swapping window counts as during swaps; the
    others are steady.  Both come from the same run, so other work on the machine weighs
    on both alike."""
    found: list[LoadResult | BenchmarkError] = []

    def generate() -> None:
        try:
            seconds = plan.window_s * plan.windows
            found.append(_generate(server, body, concurrency, seconds, cpus, protocol))
        except BenchmarkError as e:
            found.append(e)

    thread = threading.Thread(target=generate)
    thread.start()
    on: list[tuple[float, float]] = []
    swaps = Swaps()
    while thread.is_alive():
        thread.join(plan.window_s)
        if not thread.is_alive():
            break
        with server.swapping() as made:
            start = time.time()
            thread.join(plan.window_s)
        on.append((start, time.time()))
        swaps.durations_ms += made.durations_ms
        swaps.errors += made.errors
    if isinstance(found[0], BenchmarkError):
        raise found[0]
    result = found[0]
    parts: dict[str, tuple[list[float], list[str]]] = {"steady": ([], []), "swapping": ([], [])}
    for lat, fin, error in zip(result.latencies_s, result.finished_s, result.errors, strict=True):
        done = result.started_unix_s + fin
        during = any(done - lat < off and done > at for at, off in on)
        latencies, errors = parts["swapping" if during else "steady"]
        latencies.append(lat)
        if error is not None:
            errors.append(error)
    out: dict[str, Any] = {
        name: {
            "requests": len(lat),
            "p50_ms": round(_percentile_ms(lat, 50), 3),
            "p99_ms": round(_percentile_ms(lat, 99), 3),
            "failed": len(err),
            "failures": dict(Counter(err)),
        }
        for name, (lat, err) in parts.items()
    }
    out.update(
        swaps=len(swaps.durations_ms),
        failed_swaps=len(swaps.errors),
        swap_errors=swaps.errors[:3],
        swap_durations_ms=[round(d, 2) for d in swaps.durations_ms],
        versions={str(k): v for k, v in result.version_counts().items()},
    )
    return out


def _cpus() -> tuple[set[int] | None, set[int] | None]:
    """CPUs for the servers and for the load generator (None: not pinned, with one)."""
    usable = sorted(os.sched_getaffinity(0))
    return ({usable[0]}, {usable[1]}) if len(usable) >= 2 else (None, None)


def _median(samples: Sequence[Mapping[str, Any]], *path: str) -> float:
    """The median of the figure at ``path`` in each sample."""
    values = []
    for sample in samples:
        value: Any = sample
        for key in path:
            value = value[key]
        values.append(float(value))
    return round(statistics.median(values), 3)


def _measure(
    servers: Sequence[Server],
    body: bytes,
    plan: _Plan,
    cpus: tuple[set[int] | None, set[int] | None],
    ceiling: Callable[[], dict[str, float]],
) -> tuple[dict[str, Any], dict[str, float]]:
    """Steady and alternating runs of every server at every concurrency, over each
    protocol; the rounds rotate the servers' order."""
    for server in servers:
        server.wait_ready()
        for protocol in PROTOCOLS:  # warm-up
            _generate(server, body, CONCURRENCY[-1], min(plan.seconds, 2.0), cpus[1], protocol)
    runs: dict[str, dict[str, dict[str, dict[str, list[Any]]]]] = {
        p: {f"{c}": {s.label: {"steady": [], "alternating": []} for s in servers}
            for c in CONCURRENCY}
        for p in PROTOCOLS
    }  # fmt: skip
    ceilings = []
    for r in range(plan.rounds):
        ceilings.append(ceiling())
        order = [*servers[r % len(servers) :], *servers[: r % len(servers)]]
        for p in PROTOCOLS:
            for c in CONCURRENCY:
                for s in order:
                    entry = runs[p][f"{c}"][s.label]
                    entry["steady"].append(_steady(s, body, c, plan.seconds, cpus[1], p))
                    entry["alternating"].append(_alternating(s, body, c, plan, cpus[1], p))
    out = {
        p: {c: {label: _aggregate(entry) for label, entry in by.items()} for c, by in per.items()}
        for p, per in runs.items()
    }
    return out, {k: _median(ceilings, k) for k in ceilings[0]}


def _aggregate(entry: Mapping[str, list[Any]]) -> dict[str, Any]:
    """Medians over the rounds; failures summed."""
    st, alt = entry["steady"], entry["alternating"]
    keys = (
        "throughput_rps",
        "p50_ms",
        "p99_ms",
        "server_cpu_us_per_request",
        "client_cpu_us_per_request",
    )
    failures: Counter[str] = Counter()
    for run in (*st, *(a[p] for a in alt for p in ("steady", "swapping"))):
        failures.update(run["failures"])
    return {
        "steady": {k: _median(st, k) for k in keys},
        "alternating": {
            "steady_p99_ms": _median(alt, "steady", "p99_ms"),
            "swapping_p99_ms": _median(alt, "swapping", "p99_ms"),
            "failed_steady": sum(a["steady"]["failed"] for a in alt),
            "failed_swapping": sum(a["swapping"]["failed"] for a in alt),
            "swaps": sum(a["swaps"] for a in alt),
            "failed_swaps": sum(a["failed_swaps"] for a in alt),
            "swap_median_ms": round(
                statistics.median([d for a in alt for d in a["swap_durations_ms"]] or [0.0]), 2
            ),
        },
        "failures": dict(failures),
        "rounds": {"steady": st, "alternating": alt},
    }


def _goal(name: str, value: float, comparison: str, target: float, quick: bool) -> dict[str, Any]:
    passed = value >= target if comparison == ">=" else value <= target
    return {
        "name": name,
        "value": round(value, 4),
        "target": target,
        "comparison": comparison,
        "passed": passed,
        "indicative": quick,
    }


def _best(by_server: Mapping[str, Any], batching: bool) -> dict[str, Any] | None:
    """MLServer's best steady figures among its configurations that batch (or not):
    the highest throughput, the lowest p99 and CPU per request, each of any."""
    others = [v["steady"] for k, v in by_server.items()
              if k.startswith("MLServer") and ("batching" in k) == batching]  # fmt: skip
    if not others:
        return None
    return {
        "throughput_rps": max(o["throughput_rps"] for o in others),
        "p99_ms": min(o["p99_ms"] for o in others),
        "server_cpu_us_per_request": min(o["server_cpu_us_per_request"] for o in others),
    }


def _load_goals(
    runs: Mapping[str, Any], ceiling: Mapping[str, float], quick: bool
) -> tuple[dict[str, float], list[dict[str, Any]], list[str]]:
    """The ratios and goals of issue 26, per protocol and concurrency."""
    ratios: dict[str, float] = {}
    goals: list[dict[str, Any]] = []
    notes: list[str] = []
    for protocol, per in runs.items():
        for c, by_server in per.items():
            where = f"{protocol.upper()}, {c} in flight"
            _swap_goals(by_server, where, ratios, goals, notes, quick)
            ours = by_server.get("ours")
            if ours is not None:
                ratios[f"session.run ceiling / ours, {where}"] = (
                    ceiling["throughput_rps"] / ours["steady"]["throughput_rps"]
                )
            for batching in (False, True):
                mine = by_server.get("ours (batching)" if batching else "ours")
                best = _best(by_server, batching)
                if mine is None or best is None:
                    continue
                tag = f"{where}{', both batching' if batching else ''}"
                rps = mine["steady"]["throughput_rps"] / best["throughput_rps"]
                p99 = mine["steady"]["p99_ms"] / best["p99_ms"]
                ratios[f"throughput ours / MLServer best, {tag}"] = rps
                ratios[f"p99 ours / MLServer best, {tag}"] = p99
                ratios[f"server CPU per request, MLServer best / ours, {tag}"] = (
                    best["server_cpu_us_per_request"] / mine["steady"]["server_cpu_us_per_request"]
                )
                goals.extend(
                    _goal(f"{name}, {tag}", value, comparison, target, quick)
                    for name, value, comparison, target in _issue_goals(
                        protocol, int(c), batching, rps, p99
                    )
                )
            if protocol == "rest" and c == f"{CONCURRENCY[0]}" and ours is not None:
                cpu = ours["steady"]["server_cpu_us_per_request"]
                goals.append(
                    _goal(f"server CPU per request (us), ours, {where}", cpu, "<=", 100, quick)
                )
                ceiling_ratio = ratios[f"session.run ceiling / ours, {where}"]
                goals.append(
                    _goal(f"session.run ceiling / ours, {where}", ceiling_ratio, "<=", 5, quick)
                )
    return ratios, goals, notes


def _issue_goals(
    protocol: str, concurrency: int, batching: bool, rps: float, p99: float
) -> list[tuple[str, float, str, float]]:
    """Issue 26's goals for one comparison: (name, value, comparison, target)."""
    if batching:
        if concurrency != CONCURRENCY[-1]:
            return []
        return [
            ("throughput ours / MLServer", rps, ">=", 2.0),
            ("p99 ours / MLServer", p99, "<=", 1.0),
        ]
    if protocol == "grpc":
        return (
            [("throughput ours / MLServer", rps, ">=", 2.0)]
            if concurrency == CONCURRENCY[-1]
            else []
        )
    if concurrency == CONCURRENCY[-1]:
        return [
            ("throughput ours / MLServer", rps, ">=", 2.5),
            ("p99 ours / MLServer", p99, "<=", 0.5),
        ]
    return [("p99 ours / MLServer", p99, "<=", 0.5)]


def _swap_goals(  # noqa: PLR0917 - fills the caller's lists
    by_server: Mapping[str, Any],
    where: str,
    ratios: dict[str, float],
    goals: list[dict[str, Any]],
    notes: list[str],
    quick: bool,
) -> None:
    """Each server's line, and for ours the swap goals: no failed request, p99 while
    swapping <= 1.5x steady."""
    for label, entry in by_server.items():
        st, alt = entry["steady"], entry["alternating"]
        swap_ratio = alt["swapping_p99_ms"] / max(alt["steady_p99_ms"], 1e-9)
        ratios[f"p99 swapping / steady, {label}, {where}"] = swap_ratio
        notes.append(
            f"{where}, {label}: {st['throughput_rps']:,.0f} req/s, p50 "
            f"{st['p50_ms']:.1f} ms, p99 {st['p99_ms']:.1f} ms, server CPU "
            f"{st['server_cpu_us_per_request']:.0f} us/req; alternating run: p99 steady "
            f"{alt['steady_p99_ms']:.1f} ms, swapping {alt['swapping_p99_ms']:.1f} ms, "
            f"{alt['swaps']} swaps of {alt['swap_median_ms']:.1f} ms (median), failed: "
            f"{alt['failed_swapping']} requests while swapping, {alt['failed_steady']} "
            f"steady, {alt['failed_swaps']} swaps"
            + (f"; {entry['failures']}" if entry["failures"] else "")
        )
        if not label.startswith("ours"):
            continue
        goals.append(_goal(f"p99 swapping / steady, {label}, {where}", swap_ratio, "<=", 1.5,
                           quick))  # fmt: skip
        failed = alt["failed_swapping"] + alt["failed_steady"] + alt["failed_swaps"]
        failed += sum(entry["failures"].values()) if entry["failures"] else 0
        goals.append(_goal(f"failed requests + swaps, {label}, {where}", failed, "<=", 0, quick))


def _memory_goals(
    memory: Mapping[str, Any], quick: bool
) -> tuple[dict[str, float], list[dict[str, Any]], list[str]]:
    ratios: dict[str, float] = {}
    goals: list[dict[str, Any]] = []
    notes: list[str] = []
    for mode, label in (("off", "shared-weight"), ("on", "full (prepack on)")):
        m = memory[mode]
        rss = m["peak_rss_mb"] / m["steady_rss_mb"]
        ratios[f"peak / steady RSS, {label} swap"] = rss

        def med(key: str, m: Mapping[str, Any] = m) -> float:
            return float(statistics.median(t[key] for t in m["swaps"]))

        build, test, swap = med("build_ms"), med("self_test_ms"), med("swap_ms")
        m["median_ms"] = {
            "build": build,
            "self_test": test,
            "swap": swap,
            "retire": med("retire_ms"),
            "verified_to_serving": build + test + swap,
        }
        first = m["swaps"][0]
        how = (f"shares {first['shared_mb']:.0f} MB, maps {first['own_mb']:.0f} MB new"
               if mode == "off" else "loads a private session of the whole file")  # fmt: skip
        notes.append(
            f"{label}, {m['model_mb']:.1f} MB model: RSS steady {m['steady_rss_mb']:.0f} MB, "
            f"peak {m['peak_rss_mb']:.0f} MB, after {m['after_rss_mb']:.0f} MB; "
            f"1.0.0 -> 1.1.0 {how}; median of {len(m['swaps'])} swaps: build {build:.1f} ms, "
            f"self-test {test:.1f} ms, swap {swap:.3f} ms (verified -> serving "
            f"{build + test + swap:.1f} ms)"
        )
        goals.append(_goal(f"swap, {label} (ms)", swap, "<=", 10, quick))
        if mode == "off":
            goals.append(_goal(f"peak / steady RSS, {label} swap", rss, "<=", 1.25, quick))
            goals.append(_goal(f"build, {label} (ms)", build, "<=", 100, quick))
    return ratios, goals, notes


def run(quick: bool) -> dict[str, Any]:
    """Both servers under the same load, then the memory and swap timings.

    Returns:
        JSON-ready figures: per concurrency and server, steady and alternating runs; the
        ceiling; RSS and swap timings; ratios and goals.

    Raises:
        BenchmarkError: a server, the generator or a runner failed.
    """
    import onnxruntime as ort

    plan = (
        _Plan(seconds=1.5, window_s=1.0, windows=3, rounds=1, swaps=2, settle_s=0.3)
        if quick
        else _Plan(seconds=5.0, window_s=1.5, windows=6, rounds=2, swaps=7, settle_s=1.0)
    )
    work = BENCH_DIR / NAME
    work.mkdir(parents=True, exist_ok=True)
    small = make_models(work, "small")
    large = small if quick else make_models(work, "large")
    server_cpus, load_cpus = _cpus()
    kb, mb = small.path(V1).stat().st_size / 1e3, large.path(V2).stat().st_size / 1e6
    notes = [
        f"(a)/(b) small MLP ({kb:.0f} KB), (c)/(d) {mb:.1f} MB MLP, {plan.rounds} round(s)",
        f"servers pinned to CPU {sorted(server_cpus)}, generator to CPU {sorted(load_cpus)}"
        if server_cpus and load_cpus
        else "one usable CPU: nothing pinned",
    ]
    if warning := busy_warning():
        notes.append(warning)
    versions = mlserver_versions()
    workers = [] if versions is None else [0] if quick else [0, 1]
    batching_workers = workers[:1]  # its adaptive batching, in the server process as ours
    if versions is None:
        notes.append(f"MLServer not measured: no venv at {MLSERVER_VENV} (make bench makes it)")
    elif versions["onnxruntime"] != ort.__version__:
        notes.append(
            f"MLServer not measured: its onnxruntime {versions['onnxruntime']} is not "
            f"ours ({ort.__version__}); rebuild {MLSERVER_VENV}"
        )
        workers = batching_workers = []
    expected = work / "expected.json"
    expected.write_text(json.dumps(small.expected()))
    saved = os.environ.get(EXPECTED_ENV)
    os.environ[EXPECTED_ENV] = str(expected)  # the generator's check reads it
    servers = [start_ours(small, work, server_cpus)]
    try:
        servers.append(start_ours(small, work, server_cpus, batching=True))
        servers += [start_mlserver(small, work, w, server_cpus) for w in workers]
        servers += [start_mlserver(small, work, w, server_cpus, batching=True)
                    for w in batching_workers]  # fmt: skip
        runs, ceiling = _measure(
            servers,
            small.body(),
            plan,
            (server_cpus, load_cpus),
            lambda: run_runner(small, "ceiling", "--seconds", str(plan.seconds), cpus=server_cpus),
        )
    finally:
        for server in servers:
            server.stop()
        if saved is None:
            os.environ.pop(EXPECTED_ENV, None)
        else:
            os.environ[EXPECTED_ENV] = saved
    memory = {
        mode: run_runner(
            large,
            "memory",
            "--prepack",
            mode,
            "--swaps",
            str(plan.swaps),
            "--settle",
            str(plan.settle_s),
            cpus=None,
        )
        for mode in ("off", "on")
    }
    ratios, goals, load_notes = _load_goals(runs, ceiling, quick)
    mem_ratios, mem_goals, mem_notes = _memory_goals(memory, quick)
    notes.append(
        f"session.run ceiling: {ceiling['throughput_rps']:,.0f} req/s, "
        f"p50 {ceiling['p50_ms'] * 1000:.0f} us"
    )
    return {
        "name": NAME,
        "quick": quick,
        "summary": "our OIP server against MLServer, same model, ONNX Runtime settings and load",
        "params": {
            **asdict(plan),
            "concurrency": list(CONCURRENCY),
            "protocols": list(PROTOCOLS),
            "batching": {"max_batch_size": BATCH_SIZE, "max_queue_delay_s": BATCH_DELAY_S},
            "swap_every_s": SWAP_EVERY_S,
            "ort_settings": ORT_SETTINGS,
            "onnxruntime": ort.__version__,
            "mlserver": versions,
            "mlserver_parallel_workers": workers,
            "cpus": {"servers": sorted(server_cpus or []), "generator": sorted(load_cpus or [])},
        },
        "measurements": {},
        "load": runs,
        "ceiling": ceiling,
        "memory": memory,
        "ratios": {**ratios, **mem_ratios},
        "goals": goals + mem_goals,
        "notes": notes + load_notes + mem_notes,
        "environment": machine_info(),
    }
