"""Server processes of the ``serving`` benchmark: started, pinned, probed and stopped.

A :class:`Server` is a process in a session of its own (so that stopping it stops its
workers too), its OIP base URL and how it swaps versions; :func:`spawn` starts one,
pinned to some CPUs (:func:`pinned`); :func:`tree_cpu_s` reads the CPU time of its process tree.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from benchmarks._serving_fixture import MODEL
from benchmarks._util import BenchmarkError

_PIN: Final = (
    "import os, sys; os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')}); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)


def pinned(argv: Sequence[str], cpus: set[int] | None) -> list[str]:
    """``argv`` run on ``cpus`` only (as it is where ``cpus`` is None or empty)."""
    if not cpus:
        return list(argv)
    return [sys.executable, "-c", _PIN, ",".join(map(str, sorted(cpus))), *argv]


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree_cpu_s(pid: int) -> float:
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
class Swaps:
    """What a server reported of the swaps made while a ``swapping`` context lasted."""

    durations_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class Server:
    """A server process, its OIP base URL and how it swaps versions."""

    label: str
    proc: subprocess.Popen[bytes]
    base: str
    swapping: Callable[[], contextlib.AbstractContextManager[Swaps]]
    """Swap versions every :data:`~benchmarks._serving_fixture.SWAP_EVERY_S` while the
    context lasts (filled at its end)."""
    grpc: str | None = None
    """host:port of the protocol over gRPC (None: REST only)."""
    batching: bool = False
    """Whether it batches concurrent requests (ours: ``serve.batching``; MLServer: its
    adaptive batching)."""

    def url(self, protocol: str) -> str:
        """Where the load goes: the model's REST ``infer`` or its gRPC ``grpc://`` URL."""
        if protocol == "grpc":
            return f"grpc://{self.grpc}/{MODEL}"
        return f"{self.base}/v2/models/{MODEL}/infer"

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


def spawn(
    argv: Sequence[str], cpus: set[int] | None, cwd: Path, log: Path, env: Mapping[str, str]
) -> subprocess.Popen[bytes]:
    """Start ``argv`` (pinned to ``cpus``) in a session of its own, its output to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            pinned(argv, cpus),
            cwd=cwd,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
