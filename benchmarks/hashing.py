"""SHA-256 of one large file: ``signing.hashing`` against ``sha256sum`` and ``openssl``.

A file of random bytes, 1 GiB (``--quick``: 128 MiB), is kept under
``.bench/hashing/`` and reused while its size matches.  It is read once to warm the
page cache, so every contender hashes from memory, as when a device verifies a model
it has just downloaded.  Then, round-robin so that drift hits all alike, median of 3:

* ``sha256sum FILE`` (GNU coreutils) and ``openssl dgst -sha256 FILE``, as subprocesses;
* ``hashlib.file_digest`` (plain Python, one thread);
* ``sha256_file`` with ``workers=1`` (sequential) and ``workers=2`` (a reader thread
  overlapping the hashing thread).

Every digest is checked against the first one.  Goals: ``workers=1`` at least 0.95x
the speed of ``sha256sum``, ``workers=2`` at least 1.6x.  ``openssl`` (which uses the
CPU's SHA extensions when present) is the practical ceiling for one stream.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable
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
    tool_version,
)
from signing.hashing import DEFAULT_CHUNK, sha256_file

NAME: Final = "hashing"
FULL_MIB: Final = 1024
QUICK_MIB: Final = 128
RUNS: Final = 3
GOAL_ONE_WORKER: Final = 0.95
GOAL_TWO_WORKERS: Final = 1.6
_WRITE_BLOCK: Final = 16 << 20


def ensure_file(size_mib: int, folder: Path = BENCH_DIR / NAME) -> tuple[Path, bool, float]:
    """The random test file of ``size_mib`` MiB, created unless present at that size.

    Returns:
        The path, whether it was reused, and the seconds spent writing it.
    """
    path = folder / f"random-{size_mib}MiB.bin"
    size = size_mib << 20
    if path.is_file() and path.stat().st_size == size:
        return path, True, 0.0
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as fh:
        for offset in range(0, size, _WRITE_BLOCK):
            fh.write(os.urandom(min(_WRITE_BLOCK, size - offset)))
    tmp.replace(path)
    return path, False, time.perf_counter() - start


def warm(path: Path) -> float:
    """Read ``path`` once so that it is in the page cache; the seconds it took."""
    start = time.perf_counter()
    buf = bytearray(8 << 20)
    with path.open("rb", buffering=0) as fh:
        while fh.readinto(buf):
            pass
    return time.perf_counter() - start


def _hashlib_file_digest(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _first_word(out: bytes) -> str:
    return out.decode().split()[0]


def _last_word(out: bytes) -> str:
    return out.decode().split()[-1]


def _tool_check(parse: Callable[[bytes], str], expected: str) -> Callable[[bytes], None]:
    def check(out: bytes) -> None:
        got = parse(out)
        if got != expected:
            raise BenchmarkError(f"digest {got} differs from hashlib's {expected}")

    return check


def _goal(name: str, value: float, target: float, *, quick: bool) -> dict[str, Any]:
    return {
        "name": name,
        "value": round(value, 4),
        "target": target,
        "comparison": ">=",
        "passed": value >= target,
        "indicative": quick,
    }


def run(quick: bool) -> dict[str, Any]:
    """Create (or reuse) the file, warm the cache and time every contender on it.

    Args:
        quick: 128 MiB instead of 1 GiB; goals are then indicative.

    Returns:
        JSON-ready figures: measurements, throughput, ratios, goals and environment.

    Raises:
        BenchmarkError: a tool is missing or fails, or a digest is wrong.
    """
    size_mib = QUICK_MIB if quick else FULL_MIB
    for tool in ("sha256sum", "openssl"):
        if shutil.which(tool) is None:
            raise BenchmarkError(f"{tool}: not found on PATH")
    path, reused, write_s = ensure_file(size_mib)
    warm_s = warm(path)
    expected = _hashlib_file_digest(path)
    env = dict(os.environ)

    in_process: dict[str, Callable[[], str]] = {
        "python hashlib.file_digest": lambda: _hashlib_file_digest(path),
        "sha256_file workers=1": lambda: sha256_file(path, workers=1),
        "sha256_file workers=2": lambda: sha256_file(path, workers=2),
    }
    tools = {
        "sha256sum": (["sha256sum", str(path)], _first_word),
        "openssl dgst -sha256": (["openssl", "dgst", "-sha256", "-r", str(path)], _first_word),
    }
    print(f"hashing {size_mib} MiB ({RUNS} rounds) ...", flush=True)
    load_before = load_average()
    if warning := busy_warning():
        print(warning, flush=True)
    samples: dict[str, list[float]] = {name: [] for name in [*tools, *in_process]}
    for _ in range(RUNS):
        for name, (argv, parse) in tools.items():
            t = time_command(
                argv, cwd=REPO_ROOT, env=env, runs=1, check_output=_tool_check(parse, expected)
            )
            samples[name].append(t.median_s)
        for name, fn in in_process.items():
            start = time.perf_counter()
            got = fn()
            samples[name].append(time.perf_counter() - start)
            if got != expected:
                raise BenchmarkError(f"{name}: digest {got} differs from hashlib's {expected}")
    measurements = {name: Timing.of(s) for name, s in samples.items()}
    median = {name: t.median_s for name, t in measurements.items()}
    w1, w2 = median["sha256_file workers=1"], median["sha256_file workers=2"]
    sha256sum, openssl = median["sha256sum"], median["openssl dgst -sha256"]
    ratios = {
        "speed workers=1 / sha256sum": sha256sum / w1,
        "speed workers=2 / sha256sum": sha256sum / w2,
        "speed workers=1 / openssl": openssl / w1,
        "speed workers=2 / openssl": openssl / w2,
        "speed workers=2 / workers=1": w1 / w2,
        "speed workers=1 / hashlib.file_digest": median["python hashlib.file_digest"] / w1,
    }
    size_mb = (size_mib << 20) / 1e6
    throughput = {name: round(size_mb / s, 1) for name, s in median.items()}
    goals = [
        _goal(
            f"sha256_file workers=1 >= {GOAL_ONE_WORKER:g}x sha256sum speed",
            ratios["speed workers=1 / sha256sum"],
            GOAL_ONE_WORKER,
            quick=quick,
        ),
        _goal(
            f"sha256_file workers=2 >= {GOAL_TWO_WORKERS:g}x sha256sum speed",
            ratios["speed workers=2 / sha256sum"],
            GOAL_TWO_WORKERS,
            quick=quick,
        ),
    ]
    machine = machine_info()
    load_after = machine.pop("load_average")
    return {
        "name": NAME,
        "quick": quick,
        "summary": f"SHA-256 of {size_mib} MiB from the page cache",
        "params": {"size_mib": size_mib, "runs": RUNS, "chunk": DEFAULT_CHUNK},
        "generation": {
            "reused": reused,
            "seconds": {"write": round(write_s, 3), "warm_read": round(warm_s, 3)},
            "path": str(path),
        },
        "digest": expected,
        "measurements": {k: v.to_json() for k, v in measurements.items()},
        "throughput_mb_s": throughput,
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "goals": goals,
        "environment": {
            **machine,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "sha256sum": tool_version(["sha256sum", "--version"]),
            "openssl": tool_version(["openssl", "version"]),
            "cpu_sha_extensions": _cpu_has_sha(),
        },
    }


def _cpu_has_sha() -> bool | None:
    """Whether the CPU advertises SHA instructions (x86 ``sha_ni``, Arm ``sha2``)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    flags = set(text.split())
    return "sha_ni" in flags or "sha2" in flags


if __name__ == "__main__":
    import json

    print(json.dumps(run(quick=True), indent=2))
