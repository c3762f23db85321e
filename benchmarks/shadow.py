"""What a shadow comparison costs the requests it samples from (issue 29, point 5).

Our server (the daemon's serving core over REST, ``benchmarks._serving_runner serve``)
serves the MLP example's 1.1.0 with 1.0.0 kept loaded, as during a health gate, in three
configurations, each in its own process pinned to the same CPU (the load generator on
another), under the same load (``modelreg.loadgen``: the golden request, every answer
checked):

* **gate, no shadow**: the baseline (its answers offered to nothing, timed as the
  others' offers are: it pays the same instrument);
* **shadow 5 %**: a 5 % sample compared, within 10 % of the CPU (the defaults);
* **shadow at its cap**: every request sampled, within 2 % of the CPU: the budget runs
  out at once, so the comparisons run at their cap and the rest is dropped.

The rounds rotate the order.  This machine's speed drifts by more than the effect
measured (one configuration's throughput ranged over 0.8x to 1.35x of another's from
one round to the next, with nothing changed): each ratio is the median over the rounds
of the ratio within a round (runs seconds apart), many short rounds rather than a few
long ones.  Per configuration and concurrency (16 and 1 in flight):
throughput, p50/p99, the server's CPU per request, and from its ``/metrics`` the requests
compared and dropped, the comparisons' CPU time, and what each *offer* (the only thing
a request does for the shadow: a draw, a copy into a queue) cost the request's thread.
A request is delayed by the shadow when it waits for it (a lock it holds, room in its
queue, its budget): the offer takes none of these blocking (a sample that finds the lock
held is dropped), so the figures are the offers that took over 1 ms of the request
thread's CPU, and the p99 at the cap against none (the offers' wall time, which a switch
of Python's GIL to any other thread lengthens, is shown beside).

Goals at 16 in flight: throughput with a 5 % sample >= 0.95x the baseline's, p99 <= 1.1x;
at the cap, no request delayed (no offer over 1 ms of CPU, p99 <= 1.1x) and the
comparisons' CPU time within their share.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, Final

from benchmarks._serving_fixture import EXPECTED_ENV, make_models
from benchmarks._serving_process import Server, tree_cpu_s
from benchmarks._serving_runner import start_ours
from benchmarks._util import BENCH_DIR, BenchmarkError, busy_warning, machine_info
from modelreg.loadgen import LoadError, run_load_subprocess

NAME: Final = "shadow"
CONCURRENCY: Final = (16, 1)
CONFIGS: Final = {
    "gate, no shadow": None,
    "shadow 5%": (0.05, 0.1),
    "shadow at its cap": (1.0, 0.02),
}
"""Label: (sample, max_cpu_share), None for no shadow."""

_METRIC = re.compile(r"^(modelreg_(?:shadow|bench)_\w+?)(?:\{[^}]*\})? ([0-9.e+-]+)$", re.M)


def _metrics(server: Server) -> dict[str, float]:
    """The shadow and offer figures at the server's ``/metrics`` (summed over labels)."""
    with urllib.request.urlopen(f"{server.base}/metrics", timeout=30) as response:  # noqa: S310
        text = response.read().decode()
    found: dict[str, float] = {}
    for name, value in _METRIC.findall(text):
        if name == "modelreg_bench_offer_max_seconds":
            found[name] = float(value)
        else:
            found[name] = found.get(name, 0.0) + float(value)
    return found


def _run(
    server: Server, body: bytes, concurrency: int, seconds: float, cpus: set[int] | None
) -> dict[str, Any]:
    """One steady run: the generator's summary, the server's CPU per request, and what
    the shadow did meanwhile."""
    before, cpu = _metrics(server), tree_cpu_s(server.proc.pid)
    try:
        result = run_load_subprocess(
            server.url("rest"), body, concurrency=concurrency, duration_s=seconds, cpus=cpus,
            check="benchmarks._serving_fixture:check_answer",
        )  # fmt: skip
    except LoadError as e:
        raise BenchmarkError(f"{server.label}: {e}") from None
    used = tree_cpu_s(server.proc.pid) - cpu
    after = _metrics(server)
    summary = result.summary()
    summary["server_cpu_us_per_request"] = round(used / max(result.requests, 1) * 1e6, 1)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    shadow_cpu = delta("modelreg_shadow_cpu_seconds_total")
    summary["shadow"] = {
        "compared": int(delta("modelreg_shadow_compared_total")),
        "dropped": int(delta("modelreg_shadow_dropped_total")),
        "cpu_s": round(shadow_cpu, 4),
        "cpu_share": round(shadow_cpu / max(result.elapsed_s, 1e-9) / len(cpus or {0}), 5),
        "offers": int(delta("modelreg_bench_offers_total")),
        "offers_over_1ms_cpu": int(delta("modelreg_bench_offer_over_1ms_total")),
        "offer_cpu_us": round(
            delta("modelreg_bench_offer_cpu_seconds_total")
            / max(delta("modelreg_bench_offers_total"), 1)
            * 1e6,
            2,
        ),
        "longest_offer_ms": round(after.get("modelreg_bench_offer_max_seconds", 0.0) * 1000, 3),
    }
    return summary


def _median(runs: Sequence[Mapping[str, Any]], key: str) -> float:
    return round(statistics.median(float(r[key]) for r in runs), 3)


def _paired(
    runs: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]], key: str
) -> float:
    """The median over the rounds of ``key``'s ratio to the baseline's in the same round."""
    return round(
        statistics.median(float(r[key]) / float(b[key]) for r, b in zip(runs, base, strict=True)), 4
    )


def _figures(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One configuration's runs at one concurrency: medians, and the shadow's totals."""
    shadow = [r["shadow"] for r in runs]
    return {
        "throughput_rps": _median(runs, "throughput_rps"),
        "p50_ms": _median(runs, "p50_ms"),
        "p99_ms": _median(runs, "p99_ms"),
        "server_cpu_us_per_request": _median(runs, "server_cpu_us_per_request"),
        "failed": sum(r["failed"] for r in runs),
        "compared": sum(x["compared"] for x in shadow),
        "dropped": sum(x["dropped"] for x in shadow),
        "shadow_cpu_share": max(x["cpu_share"] for x in shadow),
        "offers_over_1ms_cpu": sum(x["offers_over_1ms_cpu"] for x in shadow),
        "offer_cpu_us": max(x["offer_cpu_us"] for x in shadow),
        "longest_offer_ms": max(x["longest_offer_ms"] for x in shadow),
    }


def _goal(name: str, value: float, comparison: str, target: float, quick: bool) -> dict[str, Any]:
    passed = value >= target if comparison == ">=" else value <= target
    return {"name": name, "value": round(value, 4), "target": target,
            "comparison": comparison, "passed": passed, "indicative": quick}  # fmt: skip


def _table(figures: Mapping[str, Any]) -> dict[str, Any]:
    rows = [
        [f"{c} in flight", label, f"{f['throughput_rps']:,.0f}", f"{f['p50_ms']:.3f}",
         f"{f['p99_ms']:.3f}", f"{f['server_cpu_us_per_request']:.0f}", str(f["compared"]),
         str(f["dropped"]), f"{f['shadow_cpu_share']:.2%}", f"{f['offer_cpu_us']:.1f}",
         str(f["offers_over_1ms_cpu"]), f"{f['longest_offer_ms']:.3f}"]
        for c, by in figures.items()
        for label, f in by.items()
    ]  # fmt: skip
    headers = ["load", "server", "req/s", "p50 ms", "p99 ms", "CPU us/req", "compared",
               "dropped", "shadow CPU", "offer CPU us", "offers > 1 ms CPU",
               "longest offer ms (wall)"]  # fmt: skip
    return {"title": "shadow comparison: cost to the sampled requests", "headers": headers,
            "rows": rows}  # fmt: skip


def run(quick: bool) -> dict[str, Any]:
    """The three configurations under the same load; ratios and goals.

    Raises:
        BenchmarkError: a server or the generator failed.
    """
    seconds, rounds = (1.5, 1) if quick else (1.5, 13)
    work = BENCH_DIR / NAME
    work.mkdir(parents=True, exist_ok=True)
    small = make_models(work, "small")
    usable = sorted(os.sched_getaffinity(0))
    server_cpus, load_cpus = ({usable[0]}, {usable[1]}) if len(usable) >= 2 else (None, None)
    expected = work / "expected.json"
    expected.write_text(json.dumps(small.expected()))
    saved = os.environ.get(EXPECTED_ENV)
    os.environ[EXPECTED_ENV] = str(expected)
    servers: list[Server] = []
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        f"{c}": {label: [] for label in CONFIGS} for c in CONCURRENCY
    }
    try:
        for label, shadow in CONFIGS.items():
            servers.append(start_ours(small, work, server_cpus, gated=True, shadow=shadow,
                                      label=label))  # fmt: skip
        body = small.body()
        for server in servers:
            server.wait_ready()
            run_load_subprocess(server.url("rest"), body, concurrency=16, duration_s=1.0,
                                cpus=load_cpus)  # warm-up  # fmt: skip
        for r in range(rounds):
            order = [*servers[r % len(servers) :], *servers[: r % len(servers)]]
            for c in CONCURRENCY:
                for server in order:
                    runs[f"{c}"][server.label].append(_run(server, body, c, seconds, load_cpus))
                    time.sleep(0.2)
    finally:
        for server in servers:
            server.stop()
        if saved is None:
            os.environ.pop(EXPECTED_ENV, None)
        else:
            os.environ[EXPECTED_ENV] = saved
    figures = {c: {label: _figures(found) for label, found in by.items()} for c, by in runs.items()}
    _, five, cap = (figures["16"][label] for label in CONFIGS)
    by_round = runs["16"]
    none, sampled, capped = (by_round[label] for label in CONFIGS)
    ratios = {
        "throughput, shadow 5% / none, 16 in flight": _paired(sampled, none, "throughput_rps"),
        "p99, shadow 5% / none, 16 in flight": _paired(sampled, none, "p99_ms"),
        "throughput, shadow at its cap / none, 16 in flight": (
            _paired(capped, none, "throughput_rps")
        ),
        "p99, shadow at its cap / none, 16 in flight": _paired(capped, none, "p99_ms"),
        "server CPU per request, shadow 5% / none, 16 in flight": (
            _paired(sampled, none, "server_cpu_us_per_request")
        ),
    }
    delayed = sum(figures[c]["shadow at its cap"]["offers_over_1ms_cpu"] for c in figures)
    share = max(figures[c]["shadow at its cap"]["shadow_cpu_share"] for c in figures)
    cap_share = 0.02  # CONFIGS["shadow at its cap"]
    goals = [
        _goal("throughput, shadow 5% / none (16 in flight)",
              ratios["throughput, shadow 5% / none, 16 in flight"], ">=", 0.95, quick),
        _goal("p99, shadow 5% / none (16 in flight)",
              ratios["p99, shadow 5% / none, 16 in flight"], "<=", 1.1, quick),
        _goal("client requests delayed by the shadow at its cap", delayed, "<=", 0, quick),
        _goal("p99, shadow at its cap / none (16 in flight)",
              ratios["p99, shadow at its cap / none, 16 in flight"], "<=", 1.1, quick),
        _goal("comparisons' CPU share at the cap (of 2 %)", share, "<=", cap_share * 1.5, quick),
        _goal("failed requests", sum(f["failed"] for by in figures.values()
                                     for f in by.values()), "<=", 0, quick),
    ]  # fmt: skip
    notes = [
        f"small MLP, {rounds} round(s) of {seconds:g} s per configuration and concurrency",
        f"servers pinned to CPU {sorted(server_cpus)}, generator to CPU {sorted(load_cpus)}"
        if server_cpus and load_cpus
        else "one usable CPU: nothing pinned",
        (
            f"16 in flight: compared {five['compared']} / dropped {five['dropped']} at 5 %; "
            f"at the cap compared {cap['compared']} / dropped {cap['dropped']}"
        ),
        (
            f"1 in flight: compared {figures['1']['shadow 5%']['compared']} at 5 %, "
            f"{figures['1']['shadow at its cap']['compared']} at the cap"
        ),
    ]
    if warning := busy_warning():
        notes.append(warning)
    return {
        "name": NAME,
        "quick": quick,
        "summary": "what a shadow comparison costs the requests it samples from",
        "params": {
            "seconds": seconds,
            "rounds": rounds,
            "concurrency": list(CONCURRENCY),
            "configs": {k: list(v) if v else None for k, v in CONFIGS.items()},
        },
        "measurements": {},
        "figures": figures,
        "tables": [_table(figures)],
        "load": runs,
        "ratios": ratios,
        "goals": goals,
        "notes": notes,
        "environment": machine_info(),
    }
