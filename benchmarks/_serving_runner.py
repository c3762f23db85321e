"""The runner of the ``serving`` benchmark: our server, the ceiling and the memory figures.

Each runs in a process of its own, ``python -m benchmarks._serving_runner COMMAND``:

* ``serve``: the daemon's serving core (``edge_sync.serve.core``) over an
  ``InProcessHost`` (shared-weight sessions, ``prepack="off"``), REST on the daemon's
  uvicorn listener and gRPC beside it, optionally with dynamic batching; SIGUSR1 starts
  swapping 1.0.0 <-> 1.1.0 every 0.5 s (build beside the serving engine, self-test on
  the signed goldens, swap, retire), SIGUSR2 stops it and writes the timings;
* ``ceiling``: ``session.run`` on the golden input in a loop;
* ``memory``: RSS across one swap while requests run, then the timings of more swaps.

:func:`start_ours` and :func:`run_runner` are the benchmark's side: they start these.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from benchmarks._serving_fixture import MODEL, ORT_SETTINGS, SWAP_EVERY_S, V1, V2, Models
from benchmarks._serving_process import Server, Swaps, free_port, pinned, spawn
from benchmarks._util import REPO_ROOT, BenchmarkError

_RUNNER: Final = (sys.executable, "-m", "benchmarks._serving_runner")
BATCH_SIZE: Final = 32
"""Both servers' batch bounds when batching: at most this many rows ..."""
BATCH_DELAY_S: Final = 0.002
"""... gathered for at most this long (MLServer's ``max_batch_time``, ours
``max_queue_delay``)."""

# --- the runner: our server, the ceiling and the memory figures, each in a process ----


def _ort_options() -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = ORT_SETTINGS["intra_op_threads"]
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.add_session_config_entry("session.disable_prepacking", "1")
    return options


@dataclass
class _Swapper:
    """Swaps the served version back and forth as the updater would install it."""

    host: Any
    models: Models
    requests: dict[str, Any] = field(default_factory=dict)
    timings: list[dict[str, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for version in (V1, V2):  # read once, before anything is measured
            self.requests[version] = (self.models.request(version), self.models.cases(version))

    def swap_to(self, version: str) -> dict[str, float]:
        from edge_sync.engine.selftest import self_test

        request, cases = self.requests[version]
        start = time.perf_counter()
        engine = self.host.build(request)
        built = time.perf_counter()
        self_test(engine, cases)
        verified = time.perf_counter()
        old = self.host.swap(MODEL, engine)
        swapped = time.perf_counter()
        if old is not None:
            self.host.retire(old)
        weights = getattr(engine, "weights", None)
        timing = {
            "build_ms": (built - start) * 1000,
            "self_test_ms": (verified - built) * 1000,
            "swap_ms": (swapped - verified) * 1000,
            "retire_ms": (time.perf_counter() - swapped) * 1000,
            "shared_mb": getattr(weights, "shared_bytes", 0) / 1e6,
            "own_mb": getattr(weights, "own_bytes", 0) / 1e6,
        }
        self.timings.append(timing)
        return timing

    def loop(self, go: threading.Event, stop: threading.Event, stats: Path) -> None:
        """On ``go``, swap every :data:`SWAP_EVERY_S` until ``stop``; then write the
        timings to ``stats`` and wait for the next ``go``."""
        while go.wait():
            self.timings, self.errors = [], []
            while not stop.is_set():
                start = time.perf_counter()
                version = V2 if self.host.current(MODEL).version == V1 else V1
                try:
                    self.swap_to(version)
                except Exception as e:  # noqa: BLE001 - reported, and the server serves on
                    self.errors.append(f"{type(e).__name__}: {e}")
                stop.wait(max(0.0, SWAP_EVERY_S - (time.perf_counter() - start)))
            go.clear()
            stop.clear()
            partial = stats.with_suffix(".tmp")
            partial.write_text(json.dumps({"timings": self.timings, "errors": self.errors}))
            partial.replace(stats)


def _gated(host: Any, swapper: _Swapper, metrics: Any, shadow: tuple[float, float] | None) -> Any:
    """V2 served, V1 kept loaded as a health gate keeps it; with ``shadow`` (sample,
    max_cpu_share) a shadow comparison of the two running.  Every request's offer is
    timed (``modelreg_bench_offer_*`` at ``/metrics``), without ``shadow`` an offer to
    nothing: the baseline pays the same instrument (two CPU clock reads per request,
    a system call each) as the configurations it is compared with."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    from edge_sync.decide.shadow import ShadowPolicy
    from edge_sync.serve.shadow import ShadowRunner

    request, _ = swapper.requests[V2]
    new = host.build(request)
    old = host.swap(MODEL, new)
    runner: Any = _NoComparison()
    if shadow is not None:
        runner = ShadowRunner(host)
        runner.begin(MODEL, new, old, ShadowPolicy(sample=shadow[0], max_cpu_share=shadow[1]))
        metrics.watch_shadow(runner, [MODEL])
    # plain numbers, no lock: the instrument must not cost what it measures (a
    # prometheus Counter takes a lock on every request); read at each scrape
    offers, offer_cpu, slow, peak = [0], [0.0], [0], [0.0]

    class _Offers(Collector):
        def collect(self) -> Any:
            for name, value in (("offers", offers[0]), ("offer_cpu_seconds", offer_cpu[0]),
                                ("offer_over_1ms", slow[0])):  # fmt: skip
                family = CounterMetricFamily(f"modelreg_bench_{name}", name)
                family.add_metric([], value)
                yield family
            longest = GaugeMetricFamily("modelreg_bench_offer_max_seconds", "longest")
            longest.add_metric([], peak[0])
            yield longest

    metrics.registry.register(_Offers())
    offer, clock = runner.offer, time.thread_time

    def timed(*args: Any) -> None:
        wall, cpu = time.perf_counter(), clock()
        offer(*args)
        used, took = clock() - cpu, time.perf_counter() - wall
        offers[0] += 1
        offer_cpu[0] += used
        peak[0] = max(peak[0], took)
        if used > 0.001:
            slow[0] += 1

    runner.offer = timed
    return runner


class _NoComparison:
    """What the baseline offers its answers to: nothing (``Inference`` only offers)."""

    def offer(self, *args: Any) -> None:
        pass


def _serve(  # noqa: PLR0917 - the runner's arguments
    models: Models,
    port: int,
    stats: Path,
    grpc_port: int,
    batching: bool,
    gated: bool = False,
    shadow: tuple[float, float] | None = None,
) -> None:
    from edge_sync.engine.host import InProcessHost
    from edge_sync.serve.app import create_rest_app
    from edge_sync.serve.batching import BatchPolicy
    from edge_sync.serve.core import Inference
    from edge_sync.serve.grpc_server import GrpcServer
    from edge_sync.serve.listeners import ConnectionLimits, connection_cap, server
    from edge_sync.serve.metrics import Metrics

    host = InProcessHost(intra_op_threads=ORT_SETTINGS["intra_op_threads"], prepack="off")
    swapper = _Swapper(host, models)
    swapper.swap_to(V1)
    metrics = Metrics(host)
    runner = _gated(host, swapper, metrics, shadow) if gated else None
    go, stop = threading.Event(), threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: go.set())
    signal.signal(signal.SIGUSR2, lambda *_: stop.set())
    threading.Thread(target=swapper.loop, args=(go, stop, stats), daemon=True).start()
    # the daemon's serving core (the default serve.limits), REST and gRPC over it
    policy = {MODEL: BatchPolicy(BATCH_SIZE, BATCH_DELAY_S)} if batching else None
    core = Inference(host, [MODEL], metrics, batching=policy, shadow=runner)
    GrpcServer(core, "bench", f"127.0.0.1:{grpc_port}").start()
    app = create_rest_app(core, dict, "bench")
    server(app, "127.0.0.1", port, ConnectionLimits(connection_cap(None))).run()


def _ceiling(models: Models, seconds: float) -> dict[str, float]:
    """``session.run`` on the golden input in a loop, in one thread: what the model
    costs with nothing around it."""
    import onnxruntime as ort

    session = ort.InferenceSession(
        str(models.path(V1)), _ort_options(), providers=["CPUExecutionProvider"]
    )
    inputs = models.golden(V1, "inputs")
    latencies: list[float] = []
    clock = time.perf_counter
    end = clock() + 0.3
    while clock() < end:  # warm-up
        session.run(None, inputs)
    start = clock()
    end = start + seconds
    while (now := clock()) < end:
        session.run(None, inputs)
        latencies.append(clock() - now)
    latencies.sort()
    return {
        "throughput_rps": len(latencies) / (clock() - start),
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
    }


def _trim_heap() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)


def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _memory(models: Models, prepack: str, swaps: int, settle_s: float) -> dict[str, Any]:
    """RSS before and at its peak across one swap 1.0.0 -> 1.1.0 while requests run,
    then the timings of ``swaps`` swaps back and forth (Linux: ``/proc/self``)."""
    from edge_sync.engine.host import InProcessHost

    host = InProcessHost(intra_op_threads=ORT_SETTINGS["intra_op_threads"], prepack=prepack)
    swapper = _Swapper(host, models)
    swapper.swap_to(V1)
    inputs = models.golden(V1, "inputs")
    stop = threading.Event()
    served = [0]

    def serve() -> None:
        while not stop.is_set():
            with host.lease(MODEL) as engine:
                engine.run(inputs)
            served[0] += 1

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    time.sleep(settle_s)
    _trim_heap()  # as the host does after each release: what V1's build left is not steady
    steady = _status_bytes("VmRSS:")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    swapper.timings.clear()
    swapper.swap_to(V2)
    time.sleep(settle_s)
    peak, after = _status_bytes("VmHWM:"), _status_bytes("VmRSS:")
    for i in range(swaps - 1):
        swapper.swap_to(V1 if i % 2 == 0 else V2)
    stop.set()
    thread.join()
    return {
        "prepack": prepack,
        "steady_rss_mb": steady / 1e6,
        "peak_rss_mb": peak / 1e6,
        "after_rss_mb": after / 1e6,
        "model_mb": models.path(V2).stat().st_size / 1e6,
        "requests_served": served[0],
        "swaps": swapper.timings,
    }


# --- the benchmark's side: starting the runner ------------------------------------------


def start_ours(
    models: Models,
    work: Path,
    cpus: set[int] | None,
    *,
    batching: bool = False,
    gated: bool = False,
    shadow: tuple[float, float] | None = None,
    label: str | None = None,
) -> Server:
    """Our server (``serve``, pinned to ``cpus``), REST and gRPC, batching when asked;
    it swaps on SIGUSR1 until SIGUSR2.  ``gated``: V2 serves with V1 loaded, as during a
    health gate, and ``shadow`` (sample, max_cpu_share) compares them."""
    port, grpc_port = free_port(), free_port()
    name = (label or ("ours-batching" if batching else "ours")).replace(" ", "-")
    stats = work / f"{name}-swaps.json"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = [*_RUNNER, "serve", "--models", str(models.folder), "--port", str(port),
            "--grpc-port", str(grpc_port), *(["--batching"] if batching else []),
            *(["--gated"] if gated or shadow else []),
            *(["--shadow", f"{shadow[0]},{shadow[1]}"] if shadow else [])]  # fmt: skip
    proc = spawn([*argv, "--stats", str(stats)], cpus, REPO_ROOT, work / f"{name}.log", env)

    @contextlib.contextmanager
    def swapping() -> Iterator[Swaps]:
        stats.unlink(missing_ok=True)
        found = Swaps()
        os.kill(proc.pid, signal.SIGUSR1)
        try:
            yield found
        finally:
            os.kill(proc.pid, signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while not stats.exists():  # written once the swap under way is done
                if time.monotonic() > deadline:
                    raise BenchmarkError("our server did not report its swaps")
                time.sleep(0.02)
            doc = json.loads(stats.read_text())
            found.durations_ms += [
                t["build_ms"] + t["self_test_ms"] + t["swap_ms"] for t in doc["timings"]
            ]
            found.errors += doc["errors"]

    label = label or ("ours (batching)" if batching else "ours")
    return Server(label, proc, f"http://127.0.0.1:{port}", swapping, f"127.0.0.1:{grpc_port}",
                  batching)  # fmt: skip


def run_runner(models: Models, command: str, *args: str, cpus: set[int] | None) -> Any:
    """Run ``python -m benchmarks._serving_runner COMMAND`` (pinned) and read its JSON answer.

    Raises:
        BenchmarkError: it failed.
    """
    argv = pinned([*_RUNNER, command, "--models", str(models.folder), *args], cpus)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False, timeout=600
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BenchmarkError(f"serving {command} failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    """The runner: ``serve``, ``ceiling`` or ``memory`` (the benchmark starts these).

    Returns:
        The exit code.
    """
    parser = argparse.ArgumentParser(prog="python -m benchmarks._serving_runner")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="our server; SIGUSR1/SIGUSR2 start/stop swapping")
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--grpc-port", type=int, required=True)
    serve.add_argument("--batching", action="store_true")
    serve.add_argument("--gated", action="store_true", help="V2 serves, V1 kept loaded")
    serve.add_argument("--shadow", default=None, help="SAMPLE,MAX_CPU_SHARE: compare them")
    serve.add_argument("--stats", type=Path, required=True)
    ceiling = sub.add_parser("ceiling", help="session.run in a loop")
    ceiling.add_argument("--seconds", type=float, default=5.0)
    memory = sub.add_parser("memory", help="RSS and timings across swaps")
    memory.add_argument("--prepack", choices=("off", "on"), required=True)
    memory.add_argument("--swaps", type=int, default=5)
    memory.add_argument("--settle", type=float, default=1.0)
    for p in (serve, ceiling, memory):
        p.add_argument("--models", type=Path, required=True)
    args = parser.parse_args(argv)
    models = Models(args.models)
    if args.command == "serve":
        shadow = tuple(float(v) for v in args.shadow.split(",")) if args.shadow else None
        _serve(models, args.port, args.stats, args.grpc_port, args.batching, args.gated,
               shadow)  # type: ignore[arg-type]  # fmt: skip
    elif args.command == "ceiling":
        print(json.dumps(_ceiling(models, args.seconds)))
    else:
        print(json.dumps(_memory(models, args.prepack, args.swaps, args.settle)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
