"""The device server against MLServer, under the same load on the same machine.

Two servers answer the Open Inference Protocol v2 (REST) for the MLP example, each in its
own process:

* **ours**: ``edge_sync.serving.create_app`` over an ``InProcessHost`` (shared-weight
  sessions, ``prepack="off"``) on uvicorn, run by this module (``python -m
  benchmarks.serving serve``); SIGUSR1 starts swapping 1.0.0 <-> 1.1.0 every 0.5 s in the
  server process (build beside the serving engine, self-test on the signed goldens,
  swap, retire), SIGUSR2 stops it and writes the timings;
* **MLServer** 1.7.1 (its own venv, ``make bench`` builds ``.bench/mlserver-venv``) with a
  custom runtime around one ONNX Runtime session with the same settings (1 intra-op and
  1 inter-op thread, graph optimizations and prepacking off: what our shared-weight
  sessions use), in two configurations: ``parallel_workers=0`` (inference in the server
  process, as ours) and its default ``parallel_workers=1`` (a worker process); it swaps
  by its repository API (the model's settings rewritten, then ``POST
  /v2/repository/models/mlp/load``, every 0.5 s).

The load comes from ``benchmarks.loadgen`` in its own process (16 and 200 requests in
flight, the golden input of 2 x 16 floats; every answer is checked against the goldens of
the version it names).  With two or more CPUs, the servers are pinned to the first, the
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
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import hashlib
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from benchmarks._util import BENCH_DIR, REPO_ROOT, BenchmarkError, busy_warning, machine_info
from benchmarks.loadgen import LoadError, LoadResult, run_load_subprocess

NAME: Final = "serving"
MODEL: Final = "mlp"
V1, V2 = "1.0.0", "1.1.0"
CONCURRENCY: Final = (16, 200)
SWAP_EVERY_S: Final = 0.5
MLSERVER_VENV: Final = BENCH_DIR / "mlserver-venv"
EXPECTED_ENV: Final = "MODELREG_BENCH_EXPECTED"
ORT_SETTINGS: Final = {"intra_op_threads": 1, "optimization": 0, "disable_prepacking": True}
"""ONNX Runtime settings of every session here: those of our shared-weight sessions."""


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


_MLSERVER_RUNTIME: Final = '''"""One ONNX Runtime session as an MLServer runtime."""
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OrtRuntime(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra or {}
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = int(extra["intra_op_threads"])
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel(int(extra["optimization"]))
        if extra["disable_prepacking"]:
            options.add_session_config_entry("session.disable_prepacking", "1")
        uri = await get_model_uri(self.settings)
        self._session = ort.InferenceSession(uri, options, providers=["CPUExecutionProvider"])
        self._outputs = [o.name for o in self._session.get_outputs()]
        self._served = str(extra["served_version"])
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inputs = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        results = self._session.run(self._outputs, inputs)
        return InferenceResponse(
            model_name=self.name, model_version=self._served, id=payload.id,
            outputs=[NumpyCodec.encode_output(n, r) for n, r in zip(self._outputs, results)],
        )
'''
_RUNNER: Final = (sys.executable, "-m", "benchmarks.serving")
_PIN: Final = (
    "import os, sys; os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')}); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)

# --- the check, run in the load generator's process -----------------------------------

_expected: dict[str, list[float]] = {}


def check_answer(doc: Mapping[str, Any]) -> str | None:
    """The answer equals the golden output of the version it names (the goldens of the
    fixture named by ``$MODELREG_BENCH_EXPECTED``; rtol 1e-4, atol 1e-5)."""
    if not _expected:
        _expected.update(json.loads(Path(os.environ[EXPECTED_ENV]).read_text()))
    version = doc.get("model_version")
    want = _expected.get(str(version))
    if want is None:
        return f"an answer from version {version!r}"
    try:
        got = doc["outputs"][0]["data"]
    except (KeyError, IndexError, TypeError):
        return "an answer without output data"
    if len(got) != len(want) or any(
        abs(g - w) > 1e-5 + 1e-4 * abs(w) for g, w in zip(got, want, strict=True)
    ):
        return f"{version}: not its golden output"
    return None


# --- the fixture: the models, their goldens and the request ---------------------------


@dataclass(frozen=True)
class _Models:
    """One size of the MLP example: 1.0.0 and 1.1.0 with their goldens."""

    folder: Path

    def path(self, version: str) -> Path:
        return self.folder / MODEL / f"{version}.onnx"

    def golden(self, version: str, kind: str) -> dict[str, Any]:
        import numpy as np

        with np.load(self.folder / MODEL / f"{version}.{kind}.npz") as held:
            return {k: held[k] for k in held.files}

    def request(self, version: str) -> Any:
        from edge_sync.engine import LoadRequest

        path, digest = self.path(version), hashlib.sha256()
        with path.open("rb") as fh:  # a block at a time: no 100 MB in the measured RSS
            while block := fh.read(1 << 20):
                digest.update(block)
        return LoadRequest(MODEL, version, path, digest.hexdigest())

    def cases(self, version: str) -> list[Any]:
        from edge_sync.engine import GoldenCase

        inputs, outputs = self.golden(version, "inputs"), self.golden(version, "outputs")
        return [GoldenCase("golden", inputs, outputs, 1e-4, 1e-5)]

    def body(self) -> bytes:
        ((name, x),) = self.golden(V1, "inputs").items()
        tensor = {
            "name": name,
            "shape": list(x.shape),
            "datatype": "FP32",
            "data": x.reshape(-1).tolist(),
        }
        return json.dumps({"inputs": [tensor]}).encode()

    def expected(self) -> dict[str, list[float]]:
        return {
            v: next(iter(self.golden(v, "outputs").values())).reshape(-1).tolist() for v in (V1, V2)
        }


def _make_models(work: Path, size: str) -> _Models:
    from modelreg.examples import write_examples

    folder = work / f"models-{size}"
    write_examples(folder, size=size, models=[MODEL], goldens=True)
    return _Models(folder)


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
    models: _Models
    requests: dict[str, Any] = field(default_factory=dict)
    timings: list[dict[str, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for version in (V1, V2):  # read once, before anything is measured
            self.requests[version] = (self.models.request(version), self.models.cases(version))

    def swap_to(self, version: str) -> dict[str, float]:
        from edge_sync.engine import self_test

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


def _serve(models: _Models, port: int, stats: Path) -> None:
    import uvicorn

    from edge_sync.engine import InProcessHost
    from edge_sync.serving import create_app

    host = InProcessHost(intra_op_threads=ORT_SETTINGS["intra_op_threads"], prepack="off")
    swapper = _Swapper(host, models)
    swapper.swap_to(V1)
    go, stop = threading.Event(), threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: go.set())
    signal.signal(signal.SIGUSR2, lambda *_: stop.set())
    threading.Thread(target=swapper.loop, args=(go, stop, stats), daemon=True).start()
    app = create_app(host, [MODEL], dict, "bench")
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off"
    )


def _ceiling(models: _Models, seconds: float) -> dict[str, float]:
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


def _memory(models: _Models, prepack: str, swaps: int, settle_s: float) -> dict[str, Any]:
    """RSS before and at its peak across one swap 1.0.0 -> 1.1.0 while requests run,
    then the timings of ``swaps`` swaps back and forth (Linux: ``/proc/self``)."""
    from edge_sync.engine import InProcessHost

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


# --- the benchmark: servers, load, swaps -------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its living descendants (MLServer's
    workers are child processes)."""
    stats: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone
            stats[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += stats.get(p, (0, 0))[1]
        todo += [child for child, (parent, _) in stats.items() if parent == p]
    return total / os.sysconf("SC_CLK_TCK")


@dataclass
class _Swaps:
    """What a server reported of the swaps made while a ``swapping`` context lasted."""

    durations_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class _Server:
    """A server process, its OIP base URL and how it swaps versions."""

    label: str
    proc: subprocess.Popen[bytes]
    base: str
    swapping: Callable[[], contextlib.AbstractContextManager[_Swaps]]
    """Swap versions every :data:`SWAP_EVERY_S` while the context lasts (filled at its end)."""

    def wait_ready(self, timeout_s: float = 120) -> None:
        """Wait until the model answers ready.

        Raises:
            BenchmarkError: the server exited, or was not ready in time.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError):
                url = f"{self.base}/v2/models/{MODEL}/ready"
                with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback
                    if r.status == 200:
                        return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchmarkError(f"{self.label} did not start (see its log)")
            time.sleep(0.2)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: MLServer's workers too
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def _spawn(
    argv: Sequence[str], cpus: set[int] | None, cwd: Path, log: Path, env: Mapping[str, str]
) -> subprocess.Popen[bytes]:
    if cpus:
        argv = [sys.executable, "-c", _PIN, ",".join(map(str, sorted(cpus))), *argv]
    with log.open("wb") as out:
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _start_ours(models: _Models, work: Path, cpus: set[int] | None) -> _Server:
    port, stats = _free_port(), work / "ours-swaps.json"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = [*_RUNNER, "serve", "--models", str(models.folder), "--port", str(port)]
    proc = _spawn([*argv, "--stats", str(stats)], cpus, REPO_ROOT, work / "ours.log", env)

    @contextlib.contextmanager
    def swapping() -> Iterator[_Swaps]:
        stats.unlink(missing_ok=True)
        found = _Swaps()
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

    return _Server("ours", proc, f"http://127.0.0.1:{port}", swapping)


def _mlserver_settings(folder: Path, models: _Models, version: str) -> None:
    settings = {
        "name": MODEL,
        "implementation": "ort_runtime.OrtRuntime",
        "parameters": {
            "uri": str(models.path(version)),
            "extra": {**ORT_SETTINGS, "served_version": version},
        },
    }
    path = folder / MODEL / "model-settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_text(json.dumps(settings))
    path.with_suffix(".tmp").replace(path)


def _start_mlserver(models: _Models, work: Path, workers: int, cpus: set[int] | None) -> _Server:
    folder = work / f"mlserver-pw{workers}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ort_runtime.py").write_text(_MLSERVER_RUNTIME)
    port, grpc, metrics = _free_port(), _free_port(), _free_port()
    settings = {
        "debug": False,
        "host": "127.0.0.1",
        "http_port": port,
        "grpc_port": grpc,
        "metrics_port": metrics,
        "parallel_workers": workers,
    }
    (folder / "settings.json").write_text(json.dumps(settings))
    _mlserver_settings(folder, models, V1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    argv = [str(MLSERVER_VENV / "bin" / "mlserver"), "start", "."]
    proc = _spawn(argv, cpus, folder, work / f"mlserver-pw{workers}.log", env)
    base = f"http://127.0.0.1:{port}"

    @contextlib.contextmanager
    def swapping() -> Iterator[_Swaps]:
        """Its repository API: the settings name the other version, then load."""
        found, stop = _Swaps(), threading.Event()
        url = f"{base}/v2/repository/models/{MODEL}/load"

        def reload() -> None:
            while not stop.is_set():
                start = time.perf_counter()
                current = _mlserver_settings_version(folder)
                _mlserver_settings(folder, models, V2 if current == V1 else V1)
                try:
                    request = urllib.request.Request(url, data=b"", method="POST")  # noqa: S310
                    with urllib.request.urlopen(request, timeout=60) as r:  # noqa: S310
                        r.read()
                    found.durations_ms.append((time.perf_counter() - start) * 1000)
                except OSError as e:  # urllib's HTTPError included
                    found.errors.append(str(e))
                stop.wait(max(0.0, SWAP_EVERY_S - (time.perf_counter() - start)))

        thread = threading.Thread(target=reload, daemon=True)
        thread.start()
        try:
            yield found
        finally:
            stop.set()
            thread.join(timeout=120)

    return _Server(f"MLServer (parallel_workers={workers})", proc, base, swapping)


def _mlserver_settings_version(folder: Path) -> str:
    doc = json.loads((folder / MODEL / "model-settings.json").read_text())
    return str(doc["parameters"]["extra"]["served_version"])


def _mlserver_versions() -> dict[str, str] | None:
    """mlserver's and onnxruntime's versions in the MLServer venv (None: no venv)."""
    python = MLSERVER_VENV / "bin" / "python"
    if not python.exists():
        return None
    code = (
        "import importlib.metadata as m, json; "
        "print(json.dumps({p: m.version(p) for p in ('mlserver', 'onnxruntime', 'uvloop')}))"
    )
    proc = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def _generate(
    server: _Server, body: bytes, concurrency: int, seconds: float, cpus: set[int] | None
) -> LoadResult:
    """Raises:
    BenchmarkError: the load could not be generated at all."""
    try:
        return run_load_subprocess(
            f"{server.base}/v2/models/{MODEL}/infer",
            body,
            concurrency=concurrency,
            duration_s=seconds,
            cpus=cpus,
            check=f"{__name__}:check_answer",
        )
    except LoadError as e:
        raise BenchmarkError(f"{server.label}: {e}") from None


def _steady(
    server: _Server, body: bytes, concurrency: int, seconds: float, cpus: set[int] | None
) -> dict[str, Any]:
    """(a): the generator's summary of a steady run, and the server's CPU per request."""
    cpu = _tree_cpu_s(server.proc.pid)
    result = _generate(server, body, concurrency, seconds, cpus)
    summary = result.summary()
    used = _tree_cpu_s(server.proc.pid) - cpu
    summary["server_cpu_us_per_request"] = round(used / max(result.requests, 1) * 1e6, 1)
    return summary


def _percentile_ms(latencies: list[float], q: float) -> float:
    latencies.sort()
    return latencies[max(0, math.ceil(q / 100 * len(latencies)) - 1)] * 1000 if latencies else 0.0


def _alternating(
    server: _Server, body: bytes, concurrency: int, plan: _Plan, cpus: set[int] | None
) -> dict[str, Any]:
    """(b): one run with swapping on in every other window of ``window_s`` (off first).
    A request in flight at any moment of a swapping window counts as during swaps; the
    others are steady.  Both come from the same run, so other work on the machine weighs
    on both alike."""
    found: list[LoadResult | BenchmarkError] = []

    def generate() -> None:
        try:
            found.append(_generate(server, body, concurrency, plan.window_s * plan.windows, cpus))
        except BenchmarkError as e:
            found.append(e)

    thread = threading.Thread(target=generate)
    thread.start()
    on: list[tuple[float, float]] = []
    swaps = _Swaps()
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


def _runner(models: _Models, command: str, *args: str, cpus: set[int] | None) -> Any:
    """Run ``python -m benchmarks.serving COMMAND`` (pinned) and read its JSON answer.

    Raises:
        BenchmarkError: it failed.
    """
    argv = [*_RUNNER, command, "--models", str(models.folder), *args]
    if cpus:
        argv = [sys.executable, "-c", _PIN, ",".join(map(str, sorted(cpus))), *argv]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False, timeout=600
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BenchmarkError(f"serving {command} failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
    servers: Sequence[_Server],
    body: bytes,
    plan: _Plan,
    cpus: tuple[set[int] | None, set[int] | None],
    ceiling: Callable[[], dict[str, float]],
) -> tuple[dict[str, Any], dict[str, float]]:
    """Steady and alternating runs of every server at every concurrency; the rounds
    rotate the servers' order."""
    for server in servers:
        server.wait_ready()
        _generate(server, body, CONCURRENCY[-1], min(plan.seconds, 2.0), cpus[1])  # warm-up
    runs: dict[str, dict[str, dict[str, list[Any]]]] = {
        f"{c}": {s.label: {"steady": [], "alternating": []} for s in servers} for c in CONCURRENCY
    }
    ceilings = []
    for r in range(plan.rounds):
        ceilings.append(ceiling())
        order = [*servers[r % len(servers) :], *servers[: r % len(servers)]]
        for c in CONCURRENCY:
            for s in order:
                runs[f"{c}"][s.label]["steady"].append(_steady(s, body, c, plan.seconds, cpus[1]))
                runs[f"{c}"][s.label]["alternating"].append(_alternating(s, body, c, plan, cpus[1]))
    out = {c: {label: _aggregate(entry) for label, entry in by.items()} for c, by in runs.items()}
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


def _load_goals(
    runs: Mapping[str, Any], ceiling: Mapping[str, float], quick: bool
) -> tuple[dict[str, float], list[dict[str, Any]], list[str]]:
    ratios: dict[str, float] = {}
    goals: list[dict[str, Any]] = []
    notes: list[str] = []
    for c, by_server in runs.items():
        for label, entry in by_server.items():
            st, alt = entry["steady"], entry["alternating"]
            swap_ratio = alt["swapping_p99_ms"] / max(alt["steady_p99_ms"], 1e-9)
            ratios[f"p99 swapping / steady, {label}, {c} in flight"] = swap_ratio
            notes.append(
                f"{c} in flight, {label}: {st['throughput_rps']:,.0f} req/s, p50 "
                f"{st['p50_ms']:.1f} ms, p99 {st['p99_ms']:.1f} ms, server CPU "
                f"{st['server_cpu_us_per_request']:.0f} us/req; alternating run: p99 steady "
                f"{alt['steady_p99_ms']:.1f} ms, swapping {alt['swapping_p99_ms']:.1f} ms, "
                f"{alt['swaps']} swaps of {alt['swap_median_ms']:.1f} ms (median), failed: "
                f"{alt['failed_swapping']} requests while swapping, {alt['failed_steady']} "
                f"steady, {alt['failed_swaps']} swaps"
                + (f"; {entry['failures']}" if entry["failures"] else "")
            )
        ours = by_server["ours"]
        ratios[f"session.run ceiling / ours, throughput, {c} in flight"] = (
            ceiling["throughput_rps"] / ours["steady"]["throughput_rps"]
        )
        alt = ours["alternating"]
        goals.append(
            _goal(
                f"p99 swapping / steady, ours, {c} in flight",
                ratios[f"p99 swapping / steady, ours, {c} in flight"],
                "<=",
                1.5,
                quick,
            )
        )
        goals.append(
            _goal(
                f"failed requests + swaps, alternating run, ours, {c} in flight",
                alt["failed_swapping"] + alt["failed_steady"] + alt["failed_swaps"],
                "<=",
                0,
                quick,
            )
        )
        others = [v["steady"] for k, v in by_server.items() if k != "ours"]
        if not others:
            continue
        rps = ours["steady"]["throughput_rps"] / max(o["throughput_rps"] for o in others)
        p99 = ours["steady"]["p99_ms"] / min(o["p99_ms"] for o in others)
        cpu = min(o["server_cpu_us_per_request"] for o in others)
        ratios[f"throughput ours / MLServer best, {c} in flight"] = rps
        ratios[f"p99 ours / MLServer best, {c} in flight"] = p99
        ratios[f"server CPU per request, MLServer best / ours, {c} in flight"] = (
            cpu / ours["steady"]["server_cpu_us_per_request"]
        )
        goals.append(_goal(f"throughput ours / MLServer, {c} in flight", rps, ">=", 2.0, quick))
        goals.append(_goal(f"p99 ours / MLServer, {c} in flight", p99, "<=", 0.5, quick))
    return ratios, goals, notes


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
    small = _make_models(work, "small")
    large = small if quick else _make_models(work, "large")
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
    versions = _mlserver_versions()
    workers = [] if versions is None else [0] if quick else [0, 1]
    if versions is None:
        notes.append(f"MLServer not measured: no venv at {MLSERVER_VENV} (make bench makes it)")
    elif versions["onnxruntime"] != ort.__version__:
        notes.append(
            f"MLServer not measured: its onnxruntime {versions['onnxruntime']} is not "
            f"ours ({ort.__version__}); rebuild {MLSERVER_VENV}"
        )
        workers = []
    expected = work / "expected.json"
    expected.write_text(json.dumps(small.expected()))
    saved = os.environ.get(EXPECTED_ENV)
    os.environ[EXPECTED_ENV] = str(expected)  # the generator's check reads it
    servers = [_start_ours(small, work, server_cpus)]
    try:
        servers += [_start_mlserver(small, work, w, server_cpus) for w in workers]
        runs, ceiling = _measure(
            servers,
            small.body(),
            plan,
            (server_cpus, load_cpus),
            lambda: _runner(small, "ceiling", "--seconds", str(plan.seconds), cpus=server_cpus),
        )
    finally:
        for server in servers:
            server.stop()
        if saved is None:
            os.environ.pop(EXPECTED_ENV, None)
        else:
            os.environ[EXPECTED_ENV] = saved
    memory = {
        mode: _runner(
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


def main(argv: Sequence[str] | None = None) -> int:
    """The runner: ``serve``, ``ceiling`` or ``memory`` (the benchmark starts these).

    Returns:
        The exit code.
    """
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serving")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="our server; SIGUSR1/SIGUSR2 start/stop swapping")
    serve.add_argument("--port", type=int, required=True)
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
    models = _Models(args.models)
    if args.command == "serve":
        _serve(models, args.port, args.stats)
    elif args.command == "ceiling":
        print(json.dumps(_ceiling(models, args.seconds)))
    else:
        print(json.dumps(_memory(models, args.prepack, args.swaps, args.settle)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
