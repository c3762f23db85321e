"""SIGKILL a device at every stage of an install by tensors (issue 25), in its health
gate and idle, and check what each kill left (``tests/edge/fault_driver.py``'s lives,
with checks for versions held as tensors).

Run as ``python -m tests.edge.tensor_fault_driver CONFIG SNAPSHOT RUNS SEED OUT FROM TO``
(by ``test_tensor_attacks.py`` with a handful of runs; by hand with 50 or more, as
``main`` prints the figures).  ``SNAPSHOT`` is a device state dir serving ``FROM``
(installed whole, so held as spans of its file) while the repository assigns ``TO``, a
version that shares some tensors with it: the install takes the tensor path (fetch the
skeleton and missing tensors, verify each, lay the version out, build from them).

Each run copies the snapshot, starts a life (``fault_driver._life``: lock, resume,
requests, sync, gate, idle, clean stop) and SIGKILLs it, in turn:

* **at a stage boundary**: the life kills itself as a stage of the install starts or
  ends (the n-th time: the skeleton's fetch and the tensor's are both boundaries),
  each boundary of the dry run in turn, the tensor path's own first (``layout``,
  ``build``, ``swap``, ``commit``, ``confirm``, ``fetch``, ``verify_bytes``, ``self_test``, then
  ``plan``, ``detect``, ``verify_metadata``): stages of a few milliseconds, which a
  kill from outside rarely lands in;
* **at a random time**: this process kills it a random time into a stage of the
  install (each stage in turn), or (one run in four of these) into its gate or idle.

Then:

* **after the kill**, the state dir as it was left must be consistent: the state file
  loads, every blob hashes to its name, and each version the state names is whole (a
  version held as tensors: its layout is kept, names the skeleton the state names,
  and every span it maps is held and hashes to its tensor's digest; a version held as
  a file: its blob);
* **after a restart** (a whole life), the same, and the device serves ``TO`` as the
  state says (serving and known good, no gate or attempt left; the life's last mark
  names the version its host served), and no version is rejected.
"""

from __future__ import annotations

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
from typing import Any, Final

from edge_sync.config import load_edge_config
from edge_sync.state.models import Installed
from edge_sync.state.store import StateDir
from edge_sync.sync import tensors as held_tensors
from edge_sync.sync.updater import Updater
from tests.edge import fault_driver
from tests.edge.fault_driver import GATE_WINDOW_S, _fork, _killed_at, _life, _marks

MODEL = "mlp"
FIRST: Final = (
    "layout", "build", "swap", "commit", "confirm", "fetch", "verify_bytes", "self_test",
)  # fmt: skip
"""The stages whose boundaries are killed first (then the others, in the dry run's
order)."""


def _dying_life(config_path: Path, log: Path, boundary: tuple[str, str, int]) -> None:
    """A life (``fault_driver._life``) that SIGKILLs itself at ``boundary``: (stage,
    ``start`` or ``end``, the how-manyth time).  Runs in a forked child."""
    stage, event, nth = boundary
    seen = Counter[str]()

    class Dying(Updater):
        def __init__(self, *args: Any, observer: Any = None, **kwargs: Any) -> None:
            def watch(at: str, what: str) -> None:
                if observer is not None:
                    observer(at, what)  # the mark first: where it died is read back
                if (at, what) == (stage, event):
                    seen[at] += 1
                    if seen[at] == nth:
                        os.kill(os.getpid(), signal.SIGKILL)

            super().__init__(*args, observer=watch, **kwargs)

    fault_driver.Updater = Dying  # type: ignore[attr-defined]  # _life makes it by this name
    _life(config_path, log)


def _boundaries(timeline: list[tuple[float, str]]) -> list[tuple[str, str, int]]:
    """Each stage boundary of the install in the dry run's ``timeline``, those of
    :data:`FIRST` first."""
    seen = Counter[str]()
    found = []
    for _, phase in timeline:
        if phase.startswith("install "):
            stage = phase.split()[1]
            seen[stage] += 1
            found += [(stage, "start", seen[stage]), (stage, "end", seen[stage])]
    rank = {stage: i for i, stage in enumerate(FIRST)}
    return sorted(found, key=lambda b: (rank.get(b[0], len(FIRST)), b[2]))


def _whole(state_dir: StateDir, installed: Installed) -> str | None:
    """Why ``installed`` cannot be built from what the state dir holds (None: it can)."""
    blobs = state_dir.blobs
    for digest in installed.external.values():
        if not blobs.has(digest):
            return f"{installed.version}: data file blob {digest[:12]} is missing"
    if installed.graph is None:
        if not blobs.has(installed.sha256):
            return f"{installed.version}: blob {installed.sha256[:12]} is missing"
        return None
    try:
        graph, placed = held_tensors.load_layout(state_dir.root, MODEL, installed.version)
    except OSError as e:
        return f"{installed.version}: no layout ({e})"
    if graph != installed.graph:
        return f"{installed.version}: the layout's skeleton is not the one the state names"
    if not blobs.has(graph):
        return f"{installed.version}: skeleton {graph[:12]} is missing"
    files: dict[str, bytes] = {}
    for p in placed:
        if not blobs.has(p.blob):
            return f"{installed.version}: tensor {p.name} lies in missing blob {p.blob[:12]}"
        data = files.setdefault(p.blob, blobs.path(p.blob).read_bytes())
        span = data[p.offset : p.offset + p.length]
        if len(span) != p.length or hashlib.sha256(span).hexdigest() != p.sha256:
            return f"{installed.version}: tensor {p.name} does not hash to its digest"
    return None


def consistency(state_root: Path) -> str | None:
    """Why the state dir is inconsistent (None when it is not)."""
    loaded = fault_driver.loaded_with_sound_blobs(state_root)
    if isinstance(loaded, str):
        return loaded
    state_dir, state = loaded
    for model in state.models.values():
        for installed in model.held():
            problem = _whole(state_dir, installed)
            if problem is not None:
                return problem
    return None


def _check(state_root: Path, restart_log: Path, want: str) -> tuple[str | None, list[str]]:
    """After a whole life: why the state dir is wrong (None when it is not), and the
    versions it rejected (with why)."""
    problem = consistency(state_root)
    if problem is not None:
        return problem, []
    state_dir = StateDir(state_root)
    model = state_dir.load().models.get(MODEL)
    if model is None:
        return f"no state for {MODEL}", []
    rejected = [f"{r.version}: {r.reason}" for r in model.rejected]
    serving = model.serving.version if model.serving else None
    good = model.last_known_good.version if model.last_known_good else None
    if (serving, good, model.gate, model.attempt) != (want, want, None, None):
        return (
            f"after a restart: serving {serving}, known good {good}, gate {model.gate}, "
            f"attempt {model.attempt}"
        ), rejected
    served = [p for _, p in _marks(restart_log) if p.startswith("served ")]
    if served != [f"served {serving}"]:
        return f"the state names {serving}, the host served {served}", rejected
    if model.serving is not None and model.serving.graph is None:
        return f"{want} was not installed as tensors", rejected
    if state_dir.daemon_info() is not None:
        return "a clean stop left its announcement", rejected
    return None, rejected


def _dry_run(config_path: Path, snapshot: Path, state_root: Path, work: Path) -> Path:
    """Two lives from the snapshot that run to their end (the first warms the caches);
    the second's log, whose marks time each stage."""
    log = work / "dry.log"
    for attempt in range(2):
        shutil.rmtree(state_root, ignore_errors=True)
        shutil.copytree(snapshot, state_root, symlinks=True)
        log = work / f"dry-{attempt}.log"
        if _fork(lambda log=log: _life(config_path, log)) != 0:
            raise SystemExit("a dry run failed")
    return log


def random_runs(  # noqa: PLR0917 - the command line's arguments
    config_path: Path, snapshot: Path, runs: int, seed: int, work: Path, want: str
) -> dict[str, Any]:
    """SIGKILL at each stage of the install in turn, and in the gate and idle; check
    after each kill and after a restart (see the module doc)."""
    state_root = load_edge_config(config_path).state_path
    dry = _dry_run(config_path, snapshot, state_root, work)
    dry_state = StateDir(state_root).load().models[MODEL]
    method = dry_state.last_update.method if dry_state.last_update else None
    timeline = _marks(dry)
    starts: dict[str, float] = {}
    for at, phase in timeline:
        starts.setdefault(phase.split()[0], at)
    spans = {"gate": starts["idle"] - starts["gate"], "idle": starts["served"] - starts["idle"]}
    stages: dict[str, float] = {}
    for (at, phase), ends in itertools.pairwise(timeline):
        if phase.startswith("install "):
            stages[phase] = stages.get(phase, 0.0) + ends[0] - at
    order = list(stages)
    boundaries = _boundaries(timeline)
    rng = random.Random(seed)
    results = []
    for run in range(runs):
        log = work / f"run-{run}.log"
        shutil.rmtree(state_root, ignore_errors=True)
        shutil.copytree(snapshot, state_root, symlinks=True)
        after: float | None = None
        if run % 2 == 0:
            boundary = boundaries[run // 2 % len(boundaries)]
            enter = "{} {} #{}".format(*boundary)
            status = _fork(lambda log=log, b=boundary: _dying_life(config_path, log, b))
            killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            marks = _marks(log)
            phase = marks[-1][1] if marks else "start"
        else:
            random_run = run // 2
            if random_run % 4 == 3:
                enter = ("gate", "idle")[(random_run // 4) % 2]
                length = spans[enter] * 0.6
            else:
                enter = order[random_run % len(order)]
                length = stages[enter]
            after = rng.uniform(0, length)
            killed, phase = _killed_at(config_path, log, enter, after)
        at_kill = consistency(state_root)
        restart = work / f"run-{run}.restart.log"
        status = _fork(lambda restart=restart: _life(config_path, restart))
        problem, rejected = _check(state_root, restart, want)
        if at_kill is not None:
            problem = f"as the kill left it: {at_kill}" + (f"; {problem}" if problem else "")
        if status != 0:
            problem = f"the restart exited with {status}" + (f"; {problem}" if problem else "")
        results.append({"run": run, "planned": enter,
                        "after_s": None if after is None else round(after, 4),
                        "phase": phase.split()[0], "at": phase, "killed": killed,
                        "inconsistent_at_kill": at_kill is not None,
                        "rejected": rejected, "problem": problem})  # fmt: skip
    return {"dry_run_method": method, "stages": stages, "gate_window_s": GATE_WINDOW_S,
            "runs": results}  # fmt: skip


def main(argv: list[str]) -> None:
    config_path, snapshot, runs, seed, out, _from, want = (
        Path(argv[0]), Path(argv[1]), int(argv[2]), int(argv[3]), Path(argv[4]), argv[5],
        argv[6],
    )  # fmt: skip
    work = out.parent / f"{out.stem}-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    began = time.monotonic()
    report = random_runs(config_path, snapshot, runs, seed, work, want)
    report["seconds"] = round(time.monotonic() - began, 1)
    out.write_text(json.dumps(report, indent=1))
    done = report["runs"]
    kills = Counter(r["phase"] for r in done if r["killed"])
    stages = Counter(
        ([*r["at"].split(), "-"])[1] for r in done if r["killed"] and r["phase"] == "install"
    )
    bounds = Counter(r["planned"].rsplit(" #", 1)[0] for r in done
                     if r["killed"] and r["after_s"] is None)  # fmt: skip
    print(
        f"{len(done)} runs in {report['seconds']} s (dry run: {want} by "
        f"{report['dry_run_method']}); SIGKILLs by phase: {dict(kills)}; install kills by "
        f"stage: {dict(stages)}; of them at boundaries: {dict(bounds)}; versions rejected: {sum(len(r['rejected']) for r in done)}; "
        f"inconsistent states: {sum(1 for r in done if r['problem'])} "
        f"({sum(1 for r in done if r['inconsistent_at_kill'])} as a kill left them)"
    )
    for r in done:
        if r["problem"]:
            print(f"run {r['run']} ({r['at']}): {r['problem']}")


if __name__ == "__main__":
    main(sys.argv[1:])
