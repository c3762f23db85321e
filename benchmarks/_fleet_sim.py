"""One run of the fleet simulation: servers, devices, the releases, and what was seen.

:func:`simulate` starts the loopback servers (``benchmarks._fleet_servers``: the HTTP
artifact server, and a counting proxy in front of one ``git daemon``), installs the
``start`` release on one template device with the real updater, gives every simulated
device a copy of that state dir (its own id written into it) and its own ``edge.yaml``,
and runs the devices in worker processes (``benchmarks._fleet_worker``).  It then plays
the scenario by the wall clock: an idle period, the canary release, the production
release, and stops once every device serves the new version (or at a time limit).

At every boundary it takes a :class:`Snapshot` of the servers' counters and CPU time;
the analysis (``benchmarks.fleet``) works from the snapshots and the devices' events.
Every process it starts runs in a session of its own and is ended, with its group, on
the way out, also on failure.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from benchmarks._fleet_repo import CHANNEL, MODEL, NEW, OLD, Served
from benchmarks._fleet_servers import cpu_seconds, read_control
from benchmarks._util import REPO_ROOT, BenchmarkError, git_daemon_process, isolated_env

DEVICES_PER_WORKER: Final = 200
"""Most devices in one worker process.  The daemon sleeps in ``select.select``, which
refuses descriptors numbered 1024 and over (``FD_SETSIZE``), and each daemon holds
three (its state dir's lock and a wake-up pipe): a process of 500 daemons stopped some
of them with "filedescriptor out of range in select()"."""

Mode = Literal["git", "artifacts"]
"""Where devices follow the signed metadata (``repository.source`` in ``edge.yaml``)."""


@dataclass(frozen=True)
class RunParams:
    """One run of the scenario.

    Attributes:
        devices: fleet size.
        poll_s: every device's ``repository.poll_interval``.
        jitter: every device's ``repository.jitter``.
        mode: ``git`` or ``artifacts`` (gitless).
        workers: processes the devices are spread over (at least one per
            :data:`DEVICES_PER_WORKER` devices).
        link_rate: bytes/s at which the artifact server sends a model file or delta to
            one device (None: loopback speed).
        idle_polls: length of the idle period before the canary release, in poll
            intervals.
        settle_polls: least time after the canary release before the production one.
        timeout_polls: most time a release may take to reach its devices.
    """

    devices: int
    poll_s: float
    jitter: float
    mode: Mode
    workers: int = 2
    link_rate: int | None = None
    idle_polls: float = 2.0
    settle_polls: float = 1.5
    timeout_polls: float = 4.0

    @property
    def label(self) -> str:
        """``git, jitter 0.2``."""
        return f"{'git' if self.mode == 'git' else 'gitless'}, jitter {self.jitter:g}"


@dataclass(frozen=True)
class Snapshot:
    """The servers' cumulative counters and CPU seconds at one moment."""

    t: float
    http: dict[str, Any]
    git: dict[str, Any]
    http_cpu_s: float
    git_cpu_s: float
    fleet_cpu_s: float = 0.0
    """The simulated devices' own CPU seconds (workers and their git children)."""


@dataclass
class RunRecord:
    """What one run saw: marks (snapshots at the scenario's boundaries: ``up``,
    ``canary``, ``canary_end``, ``production``, ``end``), every sync of every device,
    the artifact downloads, and what each device served at the end."""

    params: RunParams
    devices: list[str]
    marks: dict[str, Snapshot] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    started: float = 0.0
    final: dict[str, str | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def downloads(self) -> list[tuple[float, float]]:
        """(start, end) of every model download the artifact server saw."""
        return [(a, b) for a, b in self.marks["end"].http.get("downloads", [])]


@dataclass(frozen=True)
class _Servers:
    http_port: int
    http_control: int
    http_pid: int
    git_port: int
    git_control: int
    git_pid: int

    def snapshot(self) -> Snapshot:
        return Snapshot(
            time.time(), read_control(self.http_control), read_control(self.git_control),
            cpu_seconds(self.http_pid), cpu_seconds(self.git_pid),
        )  # fmt: skip


def _env(work: Path) -> dict[str, str]:
    return isolated_env(work / "home", {"PYTHONPATH": str(REPO_ROOT)})


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """End a process started in a session of its own, and its group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # whatever it left behind (git children)
    proc.wait(timeout=30)


@contextmanager
def _server(args: list[str], work: Path, name: str) -> Iterator[dict[str, int]]:
    ready = work / f"{name}.ready"
    with (work / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._fleet_servers", *args, "--ready", str(ready)],
            env=_env(work), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                log_text = (work / f"{name}.log").read_text(errors="replace")[-2000:]
                raise BenchmarkError(f"the {name} server did not start:\n{log_text}")
            time.sleep(0.05)
        yield json.loads(ready.read_text())
    finally:
        _stop(proc)


@contextmanager
def _servers(served: Served, rate: int | None, work: Path) -> Iterator[_Servers]:
    with ExitStack() as stack:
        http = stack.enter_context(_server(
            ["http", str(served.http_root), *(["--rate", str(rate)] if rate else [])],
            work, "http",
        ))  # fmt: skip
        url, daemon = stack.enter_context(git_daemon_process(served.git_base, max_connections=0))
        proxy = stack.enter_context(_server(["proxy", url.rsplit(":", 1)[1]], work, "proxy"))
        yield _Servers(http["port"], http["control"], http["pid"],
                       proxy["port"], proxy["control"], daemon.pid)  # fmt: skip


def _config(folder: Path, device: str, params: RunParams, servers: _Servers, root: Path) -> Path:
    """Write a device's ``edge.yaml``; returns its path."""
    repository: dict[str, Any] = {
        "poll_interval": f"{params.poll_s:g}s", "jitter": params.jitter,
    }  # fmt: skip
    if params.mode == "git":
        repository |= {"url": f"git://127.0.0.1:{servers.git_port}/fleet.git", "branch": "main"}
    else:
        repository["source"] = "artifacts"
    doc = {
        "apiVersion": "modelreg/v1", "kind": "EdgeConfig",
        "device": {"id": device, "labels": {"arch": "x86_64"}},
        "repository": repository,
        "trust": {"root": str(root)},
        "artifacts": {"url": f"http://127.0.0.1:{servers.http_port}/modelreg"},
        "models": [{"name": MODEL, "channel": CHANNEL}],
        "state_dir": "state",
        # no inference server here; and no prepacking measurement, which only serving needs
        "serve": {"prepack": "off", "health_gate": {"window": "0s"}},
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "edge.yaml"
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")  # JSON is YAML
    return path


def _template(folder: Path, params: RunParams, servers: _Servers, root: Path) -> Path:
    """A state dir serving the ``start`` release, made by one real sync; its path.

    Raises:
        BenchmarkError: the sync did not install the old version.
    """
    from edge_sync.config import load_edge_config
    from edge_sync.daemon import provision
    from edge_sync.engine.host import InProcessHost
    from edge_sync.state.store import StateDir
    from edge_sync.sync.updater import Updater

    config = load_edge_config(_config(folder, "template", params, servers, root))
    state = StateDir(config.state_path)
    with state.locked():
        provision(config, state)
        report = Updater(config, state, InProcessHost(prepack="off")).sync()
    update = report.updates.get(MODEL)
    if update is None or update.result != "installed" or update.version != OLD:
        raise BenchmarkError(f"the template device did not install {MODEL} {OLD}: {report}")
    return config.state_path


def _device_dirs(
    devices: list[str], template: Path, params: RunParams, servers: _Servers, *, root: Path,
    where: Path,
) -> list[Path]:  # fmt: skip
    """Each device's folder: a copy of the template's state dir with its own id in it,
    and its own ``edge.yaml``; their config paths."""
    from edge_sync.state.store import StateDir

    configs = []
    for device in devices:
        folder = where / device
        shutil.copytree(template, folder / "state", symlinks=True)
        state = StateDir(folder / "state")
        with state.locked():
            state.commit(state.load().model_copy(update={"device": device}))
        configs.append(_config(folder, device, params, servers, root))
    return configs


class _Fleet:
    """The worker processes, and the events they write."""

    def __init__(self, configs: list[Path], workers: int, work: Path) -> None:
        self.work = work
        self.procs: list[subprocess.Popen[bytes]] = []
        self.files: list[Path] = []
        self._offsets: list[int] = []
        self.events: list[dict[str, Any]] = []
        for i in range(workers):
            mine = configs[i::workers]
            if not mine:
                continue
            spec = work / f"worker-{i}.json"
            events, final = work / f"worker-{i}.events", work / f"worker-{i}.final"
            spec.write_text(json.dumps({"configs": [str(p) for p in mine],
                                        "events": str(events), "final": str(final)}))  # fmt: skip
            events.touch()
            self.files.append(events)
            self._offsets.append(0)
            with (work / f"worker-{i}.log").open("wb") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "benchmarks._fleet_worker", str(spec)],
                    env=_env(work), stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                ))  # fmt: skip

    def read(self, *, alive: bool = True) -> list[dict[str, Any]]:
        """The events written since the last call (complete lines only).

        Raises:
            BenchmarkError: a worker died (with ``alive``: they should all run).
        """
        new: list[dict[str, Any]] = []
        for i, path in enumerate(self.files):
            with path.open("rb") as fh:
                fh.seek(self._offsets[i])
                data = fh.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._offsets[i] += len(complete)
            new += [json.loads(line) for line in complete.splitlines()]
        for i, proc in enumerate(self.procs):
            if alive and proc.poll() is not None:
                log = (self.work / f"worker-{i}.log").read_text(errors="replace")[-3000:]
                raise BenchmarkError(f"fleet worker {i} exited {proc.returncode}:\n{log}")
        self.events += new
        return new

    def stop(self) -> tuple[dict[str, str | None], list[str]]:
        """Stop every worker; what each device served at the end, and problems."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        serving: dict[str, str | None] = {}
        problems: list[str] = []
        for i, proc in enumerate(self.procs):
            _stop(proc, timeout_s=120)
            final = self.work / f"worker-{i}.final"
            if not final.exists():
                problems.append(f"worker {i} wrote no final state (exit {proc.returncode})")
                continue
            doc = json.loads(final.read_text())
            serving |= doc["serving"]
            problems += [f"did not start: {f}" for f in doc["failed"]]
            problems += [f"did not stop: {d}" for d in doc["stuck"]]
        return serving, problems

    def cpu_s(self) -> float:
        """CPU seconds of the workers so far (with the git commands they ran)."""
        total = 0.0
        for proc in self.procs:
            with contextlib.suppress(OSError):
                total += cpu_seconds(proc.pid)
        return total

    def kill(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def simulate(served: Served, params: RunParams, work: Path, cohort: set[str]) -> RunRecord:
    """Play the scenario once (see the module doc); ``cohort``: the devices the canary
    release should reach (the wait for it ends once they have it).

    Raises:
        BenchmarkError: a server or a worker failed.
    """
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    devices = [f"dev-{i:04d}" for i in range(1, params.devices + 1)]
    record = RunRecord(params, devices)
    poll = params.poll_s
    served.release("start")
    with _servers(served, params.link_rate, work) as servers:
        template = _template(work / "template", params, servers, served.fleet.root)
        configs = _device_dirs(devices, template, params, servers, root=served.fleet.root,
                               where=work / "devices")  # fmt: skip
        workers = max(params.workers, math.ceil(params.devices / DEVICES_PER_WORKER))
        fleet = _Fleet(configs, workers, work)

        def snapshot() -> Snapshot:
            return replace(servers.snapshot(), fleet_cpu_s=fleet.cpu_s())

        try:
            record.started = time.time()
            synced: set[str] = set()
            on_new: set[str] = set()

            def wait(done: Callable[[], bool], until: float, *, fail: str | None) -> None:
                while not done():
                    if time.time() > until:
                        if fail:
                            raise BenchmarkError(fail)
                        return
                    time.sleep(0.25)
                    for event in fleet.read():
                        synced.add(event["d"])
                        update = event["u"].get(MODEL)
                        if update and update[0] == "installed" and update[1] == NEW:
                            on_new.add(event["d"])

            up_by = record.started + 120 + params.devices * 0.5
            wait(lambda: len(synced) == params.devices, up_by,
                 fail=f"not every device synced by {up_by - record.started:.0f} s")  # fmt: skip
            record.marks["up"] = snapshot()
            idle_end = time.time() + params.idle_polls * poll
            wait(lambda: False, idle_end, fail=None)
            record.marks["canary"] = snapshot()
            served.release("canary")
            t1 = time.time()
            wait(lambda: on_new >= cohort and time.time() >= t1 + params.settle_polls * poll,
                 t1 + params.timeout_polls * poll, fail=None)  # fmt: skip
            record.marks["canary_end"] = snapshot()
            served.release("production")
            t2 = time.time()
            seen_by = t2 + (1 + params.jitter) * poll + 1.0  # every device polled since
            wait(lambda: len(on_new) == params.devices and time.time() >= seen_by,
                 t2 + params.timeout_polls * poll, fail=None)  # fmt: skip
            record.marks["end"] = snapshot()
            record.final, record.problems = fleet.stop()
            fleet.read(alive=False)
            record.events = fleet.events
        finally:
            fleet.kill()
    # device state dirs are large (a checkout each): the figures are in the record
    shutil.rmtree(work / "devices", ignore_errors=True)
    return record
