"""Run the benchmark suite: ``python -m benchmarks [--only NAME] [--skip NAME] [--quick]
[--json-out PATH]``.

Every module in ``BENCHMARKS`` runs in turn; a table of its timings, ratios and goals
is printed, and all results go to one JSON file (``benchmarks/results/latest.json`` by
default, a git-ignored folder).  Missed goals are reported, not fatal: the exit code
is 0 unless a benchmark could not run at all (1) or the arguments are wrong (2).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from benchmarks._util import REPO_ROOT, BenchmarkError, fmt_seconds, machine_info

BENCHMARKS: Final = (
    "registry_scale", "hashing", "delta", "release", "edge_update", "serving", "serving_attacks",
    "shadow", "large_model",
    "fleet_status", "fleet", "fleet_behaviour",
)  # fmt: skip
"""Modules of this package run by default, in order; each has ``run(quick) -> dict``."""

DEFAULT_JSON: Final = REPO_ROOT / "benchmarks" / "results" / "latest.json"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description="modelreg side-by-side benchmarks"
    )
    parser.add_argument(
        "--only", choices=BENCHMARKS, action="append", help="run only this benchmark (repeatable)"
    )
    parser.add_argument(
        "--skip",
        choices=BENCHMARKS,
        action="append",
        default=[],
        help="leave this benchmark out (repeatable; large_model needs ~25 GB of disk, "
        "fleet runs 1,000 devices for about half an hour)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller inputs: a fast check, not the figures"
    )
    parser.add_argument(
        "--json-out",
        type=Path,
        default=DEFAULT_JSON,
        help=f"where to write the JSON results (default: {DEFAULT_JSON.relative_to(REPO_ROOT)})",
    )
    return parser.parse_args(argv)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def fmt(row: Sequence[str]) -> str:
        cells = [
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(headers), rule, *(fmt(r) for r in rows)])


def render(result: Mapping[str, Any]) -> str:
    """The human-readable report of one benchmark result."""
    out = [f"== {result['name']}: {result.get('summary', '')}"]
    generation = result.get("generation")
    if generation:
        secs = generation.get("seconds", {})
        how = "reused" if generation.get("reused") else "generated"
        detail = ", ".join(f"{k} {v:.2f} s" for k, v in secs.items())
        out.append(f"fixtures {how} ({detail})")
    out += [f"note: {note}" for note in result.get("notes", [])]
    for table in result.get("tables", []):
        out += ["", table["title"], _table(table["headers"], table["rows"])]
    rows = [
        [
            name,
            fmt_seconds(t["median_s"]),
            fmt_seconds(t["min_s"]),
            fmt_seconds(t["max_s"]),
            str(t["runs"]),
        ]
        for name, t in result.get("measurements", {}).items()
    ]
    if rows:
        out += ["", _table(["command", "median", "min", "max", "runs"], rows)]
    ratios = result.get("ratios", {})
    if ratios:
        out += ["", _table(["ratio", "value"], [[k, f"{v:.1f}x"] for k, v in ratios.items()])]
    goals = result.get("goals", [])
    if goals:
        goal_rows = [
            [
                g["name"],
                f"{g['value']:.3f}",
                f"{g['comparison']} {g['target']:g}",
                ("PASS" if g["passed"] else "FAIL") + (" (indicative)" if g["indicative"] else ""),
            ]
            for g in goals
        ]
        out += ["", _table(["goal", "value", "target", "result"], goal_rows)]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected benchmarks, print their tables and write the JSON file.

    Returns:
        The exit code: 0, or 1 when a benchmark failed to run.
    """
    args = _parse(argv)
    names = tuple(n for n in (args.only or BENCHMARKS) if n not in args.skip)
    report: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": machine_info(),
        "results": {},
        "errors": {},
    }
    failed = False
    for name in names:
        module = importlib.import_module(f"benchmarks.{name}")
        start = time.perf_counter()
        try:
            result: dict[str, Any] = module.run(args.quick)
        except BenchmarkError as e:
            print(f"benchmark {name} failed: {e}", file=sys.stderr)
            report["errors"][name] = str(e)
            failed = True
            continue
        result["elapsed_s"] = round(time.perf_counter() - start, 3)
        report["results"][name] = result
        print(render(result))
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"results written to {args.json_out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
