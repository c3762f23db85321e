"""What each attack of issue 23's review on the inference port costs the device now.

A server process (``benchmarks._attack_server``: the daemon's OIP app and bounded
listener with the default ``serve.limits``, over real ONNX Runtime sessions of the
example MLP and CNN and a BYTES identity graph, at 256 descriptors as the review ran
it) is attacked in turn by:

* ``gzip_x3``: three 60 KiB gzip requests inflating to 61 MiB of JSON (on main: the
  health check waited up to 4.5 s);
* ``gzip_x4``: four of them at once (on main: +2.0 to 2.6 GiB);
* ``bytes``: 63 KiB of gzip holding 16.8 M empty BYTES strings (+1.3 GiB, 13.5 s);
* ``cnn_batch``: the CNN asked for a batch of 21,399 (a 1.9 GiB peak, +1.75 GiB held
  10 s later);
* ``burst``: 16 large requests within the caps (the CNN at batch 64, 4 at a time):
  what ONNX Runtime gives back;
* ``idle_300``: 300 idle connections, then a new inference request (refused on main,
  and the next sync failed with ``EMFILE``);
* ``header_64mib``: a 64 MiB header line (read whole, 200 after 4 s of CPU).

While each runs, two other clients poll: ``GET /v2/health/live`` and a small MLP
inference.  Per attack: the answer codes, the server's resident set before (steady),
at its peak and 10 s after (retained; 2 s with ``--quick``), its CPU seconds, and the
other clients' worst latency and failures.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import httpx

from benchmarks._attack_payloads import bytes_bomb, cnn_batch, header_line, json_bomb
from benchmarks._serving_process import tree_cpu_s
from benchmarks._util import BENCH_DIR, BenchmarkError

NAME: Final = "serving_attacks"
FD_LIMIT: Final = 256
_SMALL: Final = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                             "data": [0.5] * 16}]}  # fmt: skip


def _rss(pid: int) -> int:
    statm = Path(f"/proc/{pid}/statm").read_text(encoding="ascii")
    return int(statm.split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def _server(work: Path) -> Iterator[tuple[int, str]]:
    """The attacked server process: its pid and base URL."""
    port_file = work / "port"
    port_file.unlink(missing_ok=True)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    log = (work / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks._attack_server", str(work / "models"), str(port_file)],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit,  # noqa: PLW1509
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists() or not port_file.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchmarkError(f"the attacked server did not start: see {work}/server.log")
            time.sleep(0.05)
        yield proc.pid, f"http://127.0.0.1:{port_file.read_text()}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class _Bystander(threading.Thread):
    """Another client, polling one request in a loop: its worst latency, failures."""

    def __init__(self, base: str, send: Callable[[httpx.Client], httpx.Response]) -> None:
        super().__init__(daemon=True)
        self.base, self.send = base, send
        self.worst, self.count, self.failures = 0.0, 0, 0
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=60) as client:
            while not self.stop.is_set():
                start = time.perf_counter()
                try:
                    ok = self.send(client).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.worst = max(self.worst, time.perf_counter() - start)
                self.count += 1
                self.failures += not ok
                time.sleep(0.01)


def _post_all(  # noqa: PLR0917 - one request's parts
    base: str, path: str, body: bytes, headers: dict[str, str], n: int, at_once: int
) -> list[int]:
    """``n`` requests, ``at_once`` in flight; their status codes (0: no answer)."""
    codes: list[int] = []
    lock = threading.Lock()
    left = [n]

    def worker() -> None:
        with httpx.Client(base_url=base, timeout=300) as client:
            while True:
                with lock:
                    if not left[0]:
                        return
                    left[0] -= 1
                try:
                    code = client.post(path, content=body, headers=headers).status_code
                except httpx.HTTPError:
                    code = 0
                with lock:
                    codes.append(code)

    threads = [threading.Thread(target=worker) for _ in range(at_once)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(codes)


def _idle(base: str, pid: int) -> dict[str, Any]:
    host, port = base.removeprefix("http://").split(":")
    socks: list[socket.socket] = []
    try:
        socks.extend(socket.create_connection((host, int(port)), timeout=30) for _ in range(300))
        time.sleep(0.5)
        held = len(list(Path(f"/proc/{pid}/fd").iterdir()))
        code = httpx.post(f"{base}/v2/models/mlp/infer", json=_SMALL, timeout=30).status_code
    finally:
        for s in socks:
            s.close()
    return {"codes": [code], "descriptors_held": held, "descriptor_limit": FD_LIMIT}


def _header(base: str) -> dict[str, Any]:
    host, port = base.removeprefix("http://").split(":")
    reply = b""
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        with contextlib.suppress(ConnectionError):
            sock.sendall(header_line())
        with contextlib.suppress(ConnectionError, TimeoutError):
            while chunk := sock.recv(65536):
                reply += chunk
    code = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0
    return {"codes": [code]}


def _attacks(base: str, pid: int) -> dict[str, Callable[[], dict[str, Any]]]:
    bomb = json_bomb()
    gz = {"Content-Encoding": "gzip"}
    strings, strings_headers = bytes_bomb()
    batch, batch_headers = cnn_batch()
    large, large_headers = cnn_batch(64)
    return {
        "gzip_x3": lambda: {"codes": _post_all(base, "/v2/models/mlp/infer", bomb, gz, 3, 3),
                            "wire_bytes": len(bomb)},
        "gzip_x4": lambda: {"codes": _post_all(base, "/v2/models/mlp/infer", bomb, gz, 4, 4),
                            "wire_bytes": len(bomb)},
        "bytes": lambda: {"codes": _post_all(base, "/v2/models/id_bytes/infer", strings,
                                             strings_headers, 1, 1), "wire_bytes": len(strings)},
        "cnn_batch": lambda: {"codes": _post_all(base, "/v2/models/cnn/infer", batch,
                                                 batch_headers, 1, 1), "wire_bytes": len(batch)},
        "burst": lambda: {"codes": _post_all(base, "/v2/models/cnn/infer", large, large_headers,
                                             16, 4), "wire_bytes": len(large)},
        "idle_300": lambda: _idle(base, pid),
        "header_64mib": lambda: _header(base),
    }  # fmt: skip


def _replay(
    base: str, pid: int, attack: Callable[[], dict[str, Any]], settle_s: float
) -> dict[str, Any]:
    with httpx.Client(base_url=base, timeout=60) as warm:
        for _ in range(20):
            warm.post("/v2/models/mlp/infer", json=_SMALL)
    time.sleep(0.5)
    steady = _rss(pid)
    peak = [steady]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            with contextlib.suppress(OSError):
                peak[0] = max(peak[0], _rss(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    health = _Bystander(base, lambda c: c.get("/v2/health/live"))
    infer = _Bystander(base, lambda c: c.post("/v2/models/mlp/infer", json=_SMALL))
    for t in (sampler, health, infer):
        t.start()
    time.sleep(0.2)
    cpu = tree_cpu_s(pid)
    start = time.perf_counter()
    figures = attack()
    took = time.perf_counter() - start
    cpu = tree_cpu_s(pid) - cpu
    time.sleep(0.2)
    for b in (health, infer):
        b.stop.set()
        b.join()
    done.set()
    sampler.join()
    time.sleep(settle_s)
    retained = _rss(pid)
    mib = 1 << 20
    return {
        **figures,
        "seconds": round(took, 3),
        "server_cpu_s": round(cpu, 3),
        "steady_mib": round(steady / mib, 1),
        "peak_mib": round(peak[0] / mib, 1),
        "peak_over_steady_mib": round((peak[0] - steady) / mib, 1),
        "retained_mib": round(retained / mib, 1),
        "retained_over_steady": round(retained / steady, 3),
        "health_worst_ms": round(health.worst * 1000, 1),
        "health_failures": health.failures,
        "infer_worst_ms": round(infer.worst * 1000, 1),
        "infer_failures": infer.failures,
    }


def run(quick: bool) -> dict[str, Any]:
    """Replay every attack on a fresh server process.

    Returns:
        JSON-ready figures per attack, and goals: no attack succeeds (every answer a
        refusal, 2xx only where the request was within the caps), retained memory
        within 1.25x of steady, the other clients answered within 1 s.
    """
    from benchmarks._attack_server import identity_bytes
    from modelreg.examples import write_examples

    work = BENCH_DIR / NAME
    shutil.rmtree(work, ignore_errors=True)
    (work / "models").mkdir(parents=True)
    write_examples(work / "models", size="small")
    identity_bytes(work / "models/id_bytes.onnx")
    settle = 2.0 if quick else 10.0
    attacks: dict[str, Any] = {}
    with _server(work) as (pid, base):
        for name, attack in _attacks(base, pid).items():
            attacks[name] = _replay(base, pid, attack, settle)
    retained = max(a["retained_over_steady"] for a in attacks.values())
    worst = max(max(a["health_worst_ms"], a["infer_worst_ms"]) for a in attacks.values())
    failures = sum(a["health_failures"] + a["infer_failures"] for a in attacks.values())
    goals = [
        _goal("retained RSS / steady, 10 s after (worst attack)", retained, 1.25, quick),
        _goal("other clients' worst latency (s)", worst / 1000, 1.0, quick),
        _goal("other clients' failed requests", failures, 0, quick),
    ]
    return {
        "name": NAME,
        "quick": quick,
        "summary": "the review's attacks on the inference port, against the bounded server",
        "params": {"descriptor_limit": FD_LIMIT, "settle_s": settle},
        "attacks": attacks,
        "notes": [
            f"{n}: codes {a['codes']}, peak +{a['peak_over_steady_mib']} MiB, retained "
            f"{a['retained_over_steady']}x of {a['steady_mib']} MiB, health worst "
            f"{a['health_worst_ms']} ms, inference worst {a['infer_worst_ms']} ms"
            for n, a in attacks.items()
        ],
        "goals": goals,
    }


def _goal(name: str, value: float, target: float, quick: bool) -> dict[str, Any]:
    return {"name": name, "value": round(value, 4), "target": target, "comparison": "<=",
            "passed": value <= target, "indicative": quick}  # fmt: skip
