"""SIGKILL a device at random times across install, health gate and idle; and run
versions that kill it themselves (issue 23, point 1).

Run as ``python -m tests.edge.fault_driver CONFIG SNAPSHOT RUNS SEED OUT`` (by
``test_fault_runs.py`` with a handful of runs; by hand with 50 or more, as the
module's ``main`` prints the figures).  ``SNAPSHOT`` is a device state dir that serves
mlp 1.0.0 while the repository assigns 1.1.0.

Each *life* is a forked child that does what the daemon does, in its order: take the
lock, tell an unclean stop by the announcement the last life left
(``state.daemon_info()``, as ``Daemon.run``), announce itself, resume (with no
network), answer requests on the version served (the previous version's baseline),
sync (install 1.1.0, whose health gate opens), answer requests until the gate closes,
idle and answer some more, then stop cleanly (the announcement goes).  Requests run on
the real engines (``InProcessHost``) and are recorded as the server records them.

*Random runs*: a life from the snapshot is SIGKILLed by this process at a random time
into a phase (``install``, ``gate`` or ``idle``, in turn), drawn within that phase's
length in a dry run; the phase it really was in is read back from what the life wrote.  Then a whole life
restarts the device, and the state dir is checked: the state file loads, every blob
hashes to its name and every blob it names exists, 1.1.0 is served and known good with
no gate or attempt left, and *no version is rejected* (none caused a crash).

*Crashing versions*: 1.1.0 kills the process while it loads (``load``) or on its first
request (``requests``); lives run from the snapshot until one ends cleanly: 1.1.0 must
be rejected after at most two restarts, and the device must serve 1.0.0, its last known
good version.

ONNX Runtime, numpy and edge_sync are imported once, before any fork (a life that
imported them itself spent a good part of its run doing so), but no session is made in
this process.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import random
import shutil
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime  # noqa: F401 - imported once, before the forks

from edge_sync.clock import now_iso
from edge_sync.config import load_edge_config
from edge_sync.daemon import provision
from edge_sync.decide.health import GatePolicy
from edge_sync.engine.host import InProcessHost
from edge_sync.errors import StateError
from edge_sync.serve.recorder import Recorder
from edge_sync.state.models import DaemonInfo, DeviceState
from edge_sync.state.store import StateDir
from edge_sync.sync.updater import Updater

GATE_WINDOW_S = 0.3
BASELINE_REQUESTS = 40
IDLE_S = 0.3
PHASES = ("install", "gate", "idle")


def _life(config_path: Path, log: Path, crash: str | None = None) -> None:
    """One run of the device, as the daemon's start, loop and clean stop (see above)."""
    out = log.open("a", buffering=1)
    start = time.monotonic()

    def mark(phase: str) -> None:
        out.write(f"{time.monotonic() - start:.4f} {phase}\n")

    config = load_edge_config(config_path)
    state = StateDir(config.state_path)
    state.lock()
    unclean = state.daemon_info() is not None  # as Daemon.run tells
    state.announce(DaemonInfo(pid=os.getpid(), listen=None, started=now_iso()))
    provision(config, state)
    host = InProcessHost(prepack="off")
    if crash == "load":
        build = host.build

        def dying_build(request: Any) -> Any:
            if request.version == "1.1.0":
                os.kill(os.getpid(), signal.SIGKILL)
            return build(request)

        host.build = dying_build  # type: ignore[method-assign]
    recorder = Recorder()
    # The latency verdict is not what these runs test (test_health and test_hot_swap
    # do): a 0.3 s window on a busy shared machine is noise, and a good version failing
    # its gate on noise would read as a crash blaming it.  Errors still fail it.
    gate = GatePolicy(window_s=GATE_WINDOW_S, min_requests=5, max_latency_ratio=50.0)

    def observer(stage: str, event: str) -> None:
        if event == "start":
            mark(f"install {stage}")  # where in the sync a kill lands

    updater = Updater(config, state, host, gate=gate, recorder=recorder, observer=observer)
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)

    def answer(n: int) -> None:
        for _ in range(n):
            with host.lease("mlp") as engine:
                if crash == "requests" and engine.version == "1.1.0":
                    os.kill(os.getpid(), signal.SIGKILL)
                began = time.perf_counter()
                engine.run({"input": x})
                ran = time.perf_counter() - began
            recorder.record("mlp", engine.version, error=False, seconds=ran, units=x.size)

    mark(f"resume unclean={unclean}")
    updater.resume(unclean=unclean)
    mark("baseline")
    answer(BASELINE_REQUESTS)
    mark("install")
    updater.sync()
    mark("gate")
    deadline = time.monotonic() + 30
    while updater.gates and time.monotonic() < deadline:
        answer(5)
        updater.check_gates()
    mark("idle")
    time.sleep(IDLE_S)
    answer(10)
    served = host.current("mlp")
    mark(f"served {served.version if served else None}")
    state.unlock()  # a clean stop: the announcement goes
    mark("stopped")


def _fork(work: Any) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - reported through the exit code
            sys.stderr.write(f"{type(e).__name__}: {e}\n")
            code = 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def _killed_at(config_path: Path, log: Path, phase: str, after_s: float) -> tuple[bool, str]:
    """A life SIGKILLed ``after_s`` after it entered ``phase`` (a phase, or a stage of
    the install: ``install build``); (killed, where it really was when it died, as it
    wrote)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            _life(config_path, log)
        except BaseException as e:  # noqa: BLE001
            sys.stderr.write(f"{type(e).__name__}: {e}\n")
            code = 4
        finally:
            os._exit(code)
    entered = None
    while entered is None or time.monotonic() < entered + after_s:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False, "stopped"
        if entered is None and any(phase in (p, p.split()[0]) for _, p in _marks(log)):
            entered = time.monotonic()
        time.sleep(0.001)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    marks = _marks(log)
    return killed, (marks[-1][1] if marks else "start")


def _marks(log: Path) -> list[tuple[float, str]]:
    found = []
    for line in log.read_text().splitlines() if log.exists() else []:
        at, _, phase = line.partition(" ")
        with contextlib.suppress(ValueError):
            found.append((float(at), phase))
    return found


def drive(module: str, args: list[str], out: Path) -> dict[str, Any]:
    """Run a fault driver (``python -m module ARGS``) from a test, and its JSON report
    (written to ``out``); its figures go to stdout (``pytest -s``).

    Raises:
        AssertionError: the driver failed.
    """
    import subprocess

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=root, capture_output=True, text=True,
        timeout=540, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stdout)
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def loaded_with_sound_blobs(state_root: Path) -> tuple[StateDir, DeviceState] | str:
    """The state dir and its state when the state file loads and every blob hashes to
    its name; else why not."""
    state_dir = StateDir(state_root)
    try:
        state = state_dir.load()
    except StateError as e:
        return f"state file: {e}"
    blobs = state_dir.blobs.folder
    for blob in blobs.glob("*") if blobs.is_dir() else []:
        if hashlib.sha256(blob.read_bytes()).hexdigest() != blob.name:
            return f"blob {blob.name[:12]} does not hash to its name"
    return state_dir, state


def _consistency(state_root: Path) -> str | None:
    """Why the state dir is inconsistent (None when it is not)."""
    loaded = loaded_with_sound_blobs(state_root)
    if isinstance(loaded, str):
        return loaded
    state_dir, state = loaded
    for sha in state.referenced_blobs():
        if not state_dir.blobs.has(sha):
            return f"the state names blob {sha[:12]}, which is missing"
    return None


def _check(state_root: Path) -> tuple[str | None, list[str]]:
    """Why the state dir is inconsistent after a whole life (None when it is not), and
    the versions it rejected (with why)."""
    problem = _consistency(state_root)
    if problem is not None:
        return problem, []
    state_dir = StateDir(state_root)
    model = state_dir.load().models.get("mlp")
    if model is None:
        return "no state for mlp", []
    rejected = [f"{r.version}: {r.reason}" for r in model.rejected]
    serving = model.serving.version if model.serving else None
    good = model.last_known_good.version if model.last_known_good else None
    if (serving, good, model.gate, model.attempt) != ("1.1.0", "1.1.0", None, None):
        return (
            f"after a restart: serving {serving}, known good {good}, gate {model.gate}, "
            f"attempt {model.attempt}"
        ), rejected
    if state_dir.daemon_info() is not None:
        return "a clean stop left its announcement", rejected
    return None, rejected


def random_runs(
    config_path: Path, snapshot: Path, runs: int, seed: int, work: Path
) -> dict[str, Any]:
    """SIGKILL at random times in each phase in turn, restart, check (see above)."""
    state_root = load_edge_config(config_path).state_path
    shutil.rmtree(state_root, ignore_errors=True)
    shutil.copytree(snapshot, state_root, symlinks=True)
    for attempt in range(2):  # the second as the runs go (the first warms the caches)
        shutil.rmtree(state_root, ignore_errors=True)
        shutil.copytree(snapshot, state_root, symlinks=True)
        dry = work / f"dry-{attempt}.log"
        if _fork(lambda dry=dry: _life(config_path, dry)) != 0:
            raise SystemExit("a dry run failed")
    timeline = _marks(dry)
    starts: dict[str, float] = {}
    for at, phase in timeline:
        starts.setdefault(phase.split()[0], at)
    spans = {"install": (starts["install"], starts["gate"]),
             "gate": (starts["gate"], starts["idle"]), "idle": (starts["idle"], starts["served"])}  # fmt: skip
    # the install is drawn stage by stage (its last stages, where a version is loaded,
    # swapped and committed, take a few ms of its time)
    stages = [(phase, ends[0] - at) for (at, phase), ends in itertools.pairwise(timeline)
              if phase.startswith("install ")]  # fmt: skip
    rng = random.Random(seed)
    results = []
    for run in range(runs):
        planned = PHASES[run % len(PHASES)]
        if planned == "install":
            enter, length = rng.choice(stages)
        else:
            enter, length = planned, spans[planned][1] - spans[planned][0]
            # within most of the phase's length in the dry run (a phase runs a little
            # shorter or longer each time: the phase it died in is read back)
            length *= 0.6
        after = rng.uniform(0, length)
        shutil.rmtree(state_root, ignore_errors=True)
        shutil.copytree(snapshot, state_root, symlinks=True)
        log = work / f"run-{run}.log"
        killed, phase = _killed_at(config_path, log, enter, after)
        restart = work / f"run-{run}.restart.log"
        status = _fork(lambda restart=restart: _life(config_path, restart))
        problem, rejected = _check(state_root)
        if status != 0:
            problem = f"the restart exited with {status}" + (f"; {problem}" if problem else "")
        results.append({"run": run, "planned": enter, "after_s": round(after, 4),
                        "phase": phase.split()[0], "at": phase,
                        "killed": killed, "rejected": rejected, "problem": problem})  # fmt: skip
    return {"spans": spans, "runs": results}


def crashing_version(config_path: Path, snapshot: Path, crash: str, work: Path) -> dict[str, Any]:
    """Lives with a 1.1.0 that kills the process (``crash``) until one stops cleanly."""
    state_root = load_edge_config(config_path).state_path
    shutil.rmtree(state_root, ignore_errors=True)
    shutil.copytree(snapshot, state_root, symlinks=True)
    restarts = 0
    for life in range(5):
        status = _fork(lambda life=life: _life(config_path, work / f"{crash}-{life}.log", crash))
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            break
        restarts += 1
    problem = _consistency(state_root)
    model = StateDir(state_root).load().models["mlp"]
    return {
        "crash": crash,
        "problem": problem,
        "restarts": restarts,
        "last_life_exit": status,
        "serving": model.serving.version if model.serving else None,
        "last_known_good": model.last_known_good.version if model.last_known_good else None,
        "rejected": [(r.version, r.reason) for r in model.rejected],
    }


def main(argv: list[str]) -> None:
    config_path, snapshot, runs, seed, out = (
        Path(argv[0]), Path(argv[1]), int(argv[2]), int(argv[3]), Path(argv[4])
    )  # fmt: skip
    work = out.parent / f"{out.stem}-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    began = time.monotonic()
    report = random_runs(config_path, snapshot, runs, seed, work)
    report["crashing"] = [crashing_version(config_path, snapshot, c, work)
                          for c in ("load", "requests")]  # fmt: skip
    report["seconds"] = round(time.monotonic() - began, 1)
    out.write_text(json.dumps(report, indent=1))
    done = report["runs"]
    kills = Counter(r["phase"] for r in done if r["killed"])
    stages = Counter(
        ([*r["at"].split(), "-"])[1] for r in done if r["killed"] and r["phase"] == "install"
    )
    print(
        f"{len(done)} runs in {report['seconds']} s; SIGKILLs by phase: {dict(kills)}; "
        f"versions rejected: {sum(len(r['rejected']) for r in done)}; inconsistent states: "
        f"{sum(1 for r in done if r['problem'])}; install kills by stage: {dict(stages)}"
    )
    for c in report["crashing"]:
        print(f"1.1.0 crashing at {c['crash']}: {c['restarts']} restarts, serving "
              f"{c['serving']}, rejected {c['rejected']}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
