"""Model deltas: ``registry.delta`` against ``zstd --patch-from`` and ``bsdiff``.

Two updates of the ~100 MB example MLP (``modelreg.examples``, size ``large``), written
once under ``.bench/delta/`` and reused:

* fine-tune ``1.0.0 -> 1.1.0``: same graph, ~17% of the weight bytes changed;
* graph change ``1.1.0 -> 2.0.0``: a layer inserted, the head retrained.

For each, side by side: our delta (encode in-process from the files, decode to a file,
median of 3), ``zstd --patch-from`` at levels 3 and 19 with ``--long`` (window spanning
base and new file), and ``bsdiff``/``bspatch``.  Every patch is applied and the result
compared with the new file.  Tools missing from PATH are reported as not installed.
Level 19 and bsdiff take minutes, so they run once (``--quick`` skips them and the graph
change, and times our delta once).

Goals: our delta at most 0.85x the ``zstd -3 --patch-from`` patch; encoding at least 10x
faster than ``zstd -19 --patch-from``; decoding at least 200 MB/s (new-file bytes per
second, page cache warm, output fsynced).

Memory: the same fine-tune of a ~1 GiB MLP (size ``huge``, built once under
``.bench/delta/``) is encoded and decoded to a file in a fresh interpreter whose peak
RSS is read from ``/proc``; goal: decoding adds less than 300 MB (not in ``--quick``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from benchmarks._util import (
    BENCH_DIR,
    BenchmarkError,
    Command,
    Timing,
    busy_warning,
    decode_peak_rss,
    load_average,
    machine_info,
    time_interleaved,
    tool_version,
)
from registry import delta

NAME: Final = "delta"
RUNS: Final = 3
SLOW_S: Final = 20.0
GOAL_SIZE_VS_ZSTD3: Final = 0.85
GOAL_ENCODE_VS_ZSTD19: Final = 10.0
GOAL_DECODE_MB_S: Final = 200.0
GOAL_DECODE_EXTRA_RSS_MB: Final = 300.0
VERSIONS: Final = ("1.0.0", "1.1.0", "2.0.0")
CASES: Final = {"fine-tune": ("1.0.0", "1.1.0"), "graph change": ("1.1.0", "2.0.0")}


@dataclass(frozen=True)
class _Tool:
    """An external delta tool: how to make and apply a patch, and whether it is slow."""

    name: str
    encode: Callable[[Path, Path, Path], list[str]]
    decode: Callable[[Path, Path, Path], list[str]]
    slow: bool


def _zstd(level: int, window_log: int) -> _Tool:
    long = f"--long={window_log}"
    return _Tool(
        f"zstd -{level} --patch-from",
        lambda base, new, patch: [
            "zstd", "-q", "-f", f"-{level}", long, f"--patch-from={base}", str(new), "-o",
            str(patch),
        ],
        lambda base, patch, out: [
            "zstd", "-q", "-f", "-d", long, f"--patch-from={base}", str(patch), "-o", str(out),
        ],
        slow=level > 9,
    )  # fmt: skip


_BSDIFF: Final = _Tool(
    "bsdiff",
    lambda base, new, patch: ["bsdiff", str(base), str(new), str(patch)],
    lambda base, patch, out: ["bspatch", str(base), str(out), str(patch)],
    slow=True,
)


def ensure_models(folder: Path = BENCH_DIR / NAME) -> tuple[dict[str, Path], bool, float]:
    """The large example MLP of every version, written unless present.

    Returns:
        Paths by version, whether all were reused, and the seconds spent building.
    """
    from modelreg.examples import model_bytes

    folder.mkdir(parents=True, exist_ok=True)
    paths = {v: folder / f"mlp-{v}-large.onnx" for v in VERSIONS}
    start = time.perf_counter()
    reused = True
    for version, path in paths.items():
        if path.is_file() and path.stat().st_size > 0:
            continue
        reused = False
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(model_bytes("mlp", version, size="large"))
        tmp.replace(path)
    return paths, reused, time.perf_counter() - start


def _memory_case(folder: Path = BENCH_DIR / NAME) -> dict[str, Any]:
    """Fine-tune delta of the ~1 GiB MLP: sizes, encode/decode seconds, decode peak RSS.

    Raises:
        BenchmarkError: the decoded file differs from the new one, or /proc is missing.
    """
    from modelreg.examples import model_bytes

    paths = {v: folder / f"mlp-{v}-huge.onnx" for v in CASES["fine-tune"]}
    for version, path in paths.items():
        if not (path.is_file() and path.stat().st_size > 0):
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(model_bytes("mlp", version, size="huge"))
            tmp.replace(path)
    base, new = paths["1.0.0"], paths["1.1.0"]
    patch, out = folder / "work" / "huge.mrdelta", folder / "work" / "huge.out.onnx"
    patch.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    patch.write_bytes(delta.encode(base, new))
    encode_s = time.perf_counter() - start
    start = time.perf_counter()
    extra = decode_peak_rss(base, patch, out)
    decode_s = time.perf_counter() - start  # includes the interpreter start-up
    if not _same_file(out, new):
        raise BenchmarkError("1 GiB model: the decoded file differs from the new one")
    sizes = {"new file": new.stat().st_size, "ours": patch.stat().st_size}
    out.unlink()
    return {
        "sizes": sizes,
        "encode_s": round(encode_s, 3),
        "decode_s": round(decode_s, 3),
        "decode_extra_rss_mb": round(extra / 1e6, 1),
    }


def _median_of(runs: int, fn: Callable[[], object]) -> Timing:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return Timing.of(samples)


def _same_file(a: Path, b: Path) -> bool:
    return a.stat().st_size == b.stat().st_size and _sha256(a) == _sha256(b)


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _goal(
    name: str, value: float, target: float, comparison: str, *, quick: bool
) -> dict[str, Any]:
    passed = value >= target if comparison == ">=" else value <= target
    return {
        "name": name,
        "value": round(value, 4),
        "target": target,
        "comparison": comparison,
        "passed": passed,
        "indicative": quick,
    }


def _run_case(
    case: str, base: Path, new: Path, tools: list[_Tool], work: Path, *, quick: bool
) -> dict[str, Any]:
    """Time every contender on one update; sizes, timings and the tools' absence."""
    runs = 1 if quick else RUNS
    ours = work / f"{case}.mrdelta"
    out = work / f"{case}.out"
    encoded: list[bytes] = []
    measurements = {
        "ours encode": _median_of(runs, lambda: encoded.append(delta.encode(base, new))),
    }
    ours.write_bytes(encoded[-1])
    encoded.clear()
    measurements["ours decode"] = _median_of(runs, lambda: delta.decode(base, ours, out))
    if not _same_file(out, new):
        raise BenchmarkError(f"{case}: our decoded file differs from the new file")
    sizes = {"new file": new.stat().st_size, "ours": ours.stat().st_size}
    missing: dict[str, str] = {}
    env = dict(os.environ)
    for tool in tools:
        argv0 = tool.encode(base, new, work)[0]
        if shutil.which(argv0) is None:
            missing[tool.name] = "not installed"
            continue
        if quick and tool.slow:
            missing[tool.name] = "skipped in --quick"
            continue
        patch = work / f"{case}-{tool.name.replace(' ', '_')}.patch"
        tool_out = work / f"{case}-{tool.name.replace(' ', '_')}.out"
        stop = SLOW_S if tool.slow else None
        timed = time_interleaved(
            {
                "encode": Command(tool.encode(base, new, patch), work, stop_after_s=stop),
                "decode": Command(tool.decode(base, patch, tool_out), work, stop_after_s=stop),
            },
            env=env,
            runs=runs,
        )
        if not _same_file(tool_out, new):
            raise BenchmarkError(f"{case}: {tool.name} rebuilt a different file")
        sizes[tool.name] = patch.stat().st_size
        measurements[f"{tool.name} encode"] = timed["encode"]
        measurements[f"{tool.name} decode"] = timed["decode"]
        tool_out.unlink()
    out.unlink()
    return {"sizes": sizes, "measurements": measurements, "missing": missing}


def run(quick: bool) -> dict[str, Any]:
    """Build (or reuse) the models and time every contender on each update.

    Args:
        quick: only the fine-tune, one run each, without the slow tools (zstd -19,
            bsdiff); goals are then indicative.

    Returns:
        JSON-ready figures: sizes, measurements, throughput, ratios, goals, environment.

    Raises:
        BenchmarkError: a tool fails or a rebuilt file differs from the new one.
    """
    paths, reused, build_s = ensure_models()
    work = BENCH_DIR / NAME / "work"
    work.mkdir(parents=True, exist_ok=True)
    cases = {"fine-tune": CASES["fine-tune"]} if quick else CASES
    load_before = load_average()
    if warning := busy_warning():
        print(warning, flush=True)
    measurements: dict[str, Timing] = {}
    sizes: dict[str, dict[str, int]] = {}
    ratios: dict[str, float] = {}
    throughput: dict[str, float] = {}
    goals: list[dict[str, Any]] = []
    missing: dict[str, str] = {}
    for case, (base_v, new_v) in cases.items():
        base, new = paths[base_v], paths[new_v]
        window_log = (base.stat().st_size + new.stat().st_size).bit_length()
        tools = [_zstd(3, window_log), _zstd(19, window_log), _BSDIFF]
        print(f"delta {case} ({base_v} -> {new_v}) ...", flush=True)
        got = _run_case(case, base, new, tools, work, quick=quick)
        missing.update(got["missing"])
        sizes[case] = got["sizes"]
        median = {name: t.median_s for name, t in got["measurements"].items()}
        measurements.update({f"{case}: {k}": v for k, v in got["measurements"].items()})
        new_mb = sizes[case]["new file"] / 1e6
        throughput.update({f"{case}: {k}": round(new_mb / v, 1) for k, v in median.items()})
        decode_mb_s = new_mb / median["ours decode"]
        goals.append(
            _goal(
                f"{case}: decode >= {GOAL_DECODE_MB_S:g} MB/s",
                decode_mb_s,
                GOAL_DECODE_MB_S,
                ">=",
                quick=quick,
            )
        )
        if "zstd -3 --patch-from" in sizes[case]:
            size_ratio = sizes[case]["ours"] / sizes[case]["zstd -3 --patch-from"]
            ratios[f"{case}: size ours / zstd -3 patch"] = size_ratio
            goals.append(
                _goal(
                    f"{case}: size <= {GOAL_SIZE_VS_ZSTD3:g}x zstd -3 --patch-from",
                    size_ratio,
                    GOAL_SIZE_VS_ZSTD3,
                    "<=",
                    quick=quick,
                )
            )
        if "zstd -19 --patch-from encode" in median:
            speed = median["zstd -19 --patch-from encode"] / median["ours encode"]
            ratios[f"{case}: encode speed ours / zstd -19"] = speed
            goals.append(
                _goal(
                    f"{case}: encode >= {GOAL_ENCODE_VS_ZSTD19:g}x zstd -19 --patch-from speed",
                    speed,
                    GOAL_ENCODE_VS_ZSTD19,
                    ">=",
                    quick=quick,
                )
            )
        for name in ("zstd -19 --patch-from", "bsdiff"):
            if name in sizes[case]:
                ratios[f"{case}: size ours / {name}"] = sizes[case]["ours"] / sizes[case][name]
    memory = None
    if not quick:
        print("delta memory: fine-tune of a ~1 GiB model ...", flush=True)
        memory = _memory_case()
        goals.append(
            _goal(
                f"1 GiB model: decode adds <= {GOAL_DECODE_EXTRA_RSS_MB:g} MB RSS",
                memory["decode_extra_rss_mb"],
                GOAL_DECODE_EXTRA_RSS_MB,
                "<=",
                quick=quick,
            )
        )
    machine = machine_info()
    load_after = machine.pop("load_average")
    notes = [f"{name}: {why}" for name, why in sorted(missing.items())]
    notes += [
        f"{case}: sizes " + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in s.items())
        for case, s in sizes.items()
    ]
    return {
        "name": NAME,
        "quick": quick,
        "summary": "ONNX-aware deltas of a ~100 MB MLP vs zstd --patch-from and bsdiff",
        "notes": notes,
        "params": {"runs": 1 if quick else RUNS, "cases": {k: list(v) for k, v in cases.items()}},
        "generation": {
            "reused": reused,
            "seconds": {"build_models": round(build_s, 3)},
            "path": str(BENCH_DIR / NAME),
        },
        "sizes_bytes": sizes,
        "measurements": {k: v.to_json() for k, v in measurements.items()},
        "throughput_mb_s": throughput,
        "memory_1gib": memory,
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "goals": goals,
        "missing_tools": missing,
        "environment": {
            **machine,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "zstd": tool_version(["zstd", "--version"]),
            "bsdiff": "installed" if shutil.which("bsdiff") else "unavailable",
        },
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(quick=True), indent=2))
