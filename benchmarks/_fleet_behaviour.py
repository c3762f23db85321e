"""The fleet simulation's behaviour scenario (issue 29): a staged rollout judged on how
the new version's answers agree with the previous version's, played twice.

**Repository.**  Made once by the real ``modelreg`` command line, as the fleet
simulation's (``benchmarks._fleet_repo``): the small example ``mlp`` (class scores,
output ``probs``), 1.0.0 on ``production`` and 1.1.0 (parent 1.0.0) registered, released
by ``ci release``; then ``promote mlp 1.1.0 -c production --waves 10:1h,50:1h,100
--stop-failures 5% --min-reports N``, the behaviour stop conditions (``min_agreement``,
``max_output_drift``, ``max_p99_ratio``, ``min_compared``) and ``shadow:`` added to
the channel (no ``promote`` option writes them), committed and released by ``ci
release``: the first wave.  Each run starts from a copy of it.

**Devices.**  Each simulated device follows ``production`` and falls in a wave by the
devices' own cohort rule (``registry.cohort.in_cohort``).  A device of the current
wave installs 1.1.0 a few minutes after the wave's release (its poll), then, while
its health gate is open and for ``shadow.after`` more, compares a share of its live
traffic with 1.0.0: its rate of compared requests, its own top-1 agreement (drawn
around the run's, per device: devices see different traffic), its drift and its run
times are drawn per device, and its sums grow by draws at each step (Poisson requests,
binomial top-1 agreement, gamma-distributed differences, log-normal run times into the
log-spaced histogram of ``registry.agreement``).  Its report is a real format-4
document (``registry.device_report.encode_report``: checked against the schema) with
the sums in ``shadow``, written as ``<device>.json`` in a folder; devices outside the
wave report 1.0.0 and no comparison.  The repository enrolls no device here, so every
readable report counts (``fleet status`` says the reports are not authenticated).

**Clock.**  The scenario has a clock of its own that starts two days before the run:
the release of each wave is committed at its simulated time (the commit dates are how
``fleet advance`` finds when a wave started), and every ``step_s`` the devices' reports
are written and ``fleet advance`` decides at that time, in process, on the reports read
back by ``fleet.reports.load_reports`` and counted by ``fleet.advance.progress_from_reports``
(exactly the command's path, with ``now`` given).  An advance is released
``release_delay_s`` later (the release job); a stop ends the run with the hold
committed; the last wave ends it with ``done``.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import yaml

from benchmarks._util import BenchmarkError, isolated_env, run_checked
from modelreg.examples import write_examples

if TYPE_CHECKING:
    from registry.device_report import DeviceReport

MODEL: Final = "mlp"
CHANNEL: Final = "production"
OLD, NEW = "1.0.0", "1.1.0"
OUTPUT: Final = "probs"
CLASSES: Final = 4
"""The example MLP's output: class scores ``[batch, 4]``, each row summing to 1."""
WAVES: Final = "10:1h,50:1h,100"


@dataclass(frozen=True)
class Behaviour:
    """How a candidate version's answers differ from the previous version's.

    Attributes:
        label: the run's name.
        agreement: the fleet's top-1 agreement (each device's is drawn around it).
        spread: the standard deviation of the devices' own agreement.
        drift: the relative L1 difference of the answers (devices: 0.5x to 1.5x).
        latency: the new version's run time over the previous one's.
    """

    label: str
    agreement: float
    spread: float
    drift: float
    latency: float


DISAGREEING: Final = Behaviour("disagreeing", 0.80, 0.03, 0.12, 1.05)
"""About one row in five changes its top class."""
FAITHFUL: Final = Behaviour("faithful", 0.999, 0.0005, 0.002, 1.0)


@dataclass(frozen=True)
class Params:
    """One run of the scenario.

    Attributes:
        devices: fleet size.
        behaviour: the candidate's answers.
        min_agreement, max_output_drift, max_p99_ratio, min_compared: the channel's
            behaviour stop conditions.
        failure_share: the channel's failure stop condition.
        min_reports: devices of a wave that must run the version before the next.
        sample: the channel's ``shadow.sample`` (reported; the request rates below are
            of compared requests already).
        compared_per_h: each device's rate of compared requests, drawn uniformly in it.
        gate_s: a device's health gate window; ``after_s``: ``shadow.after``.
        install_s: a device installs a wave's version within this of its release.
        step_s: simulated time between two ``fleet advance`` runs.
        release_delay_s: from an advance to its release (the release job).
        limit_s: the simulated time a run may take.
        seed: the random draws' seed.
    """

    devices: int
    behaviour: Behaviour
    min_agreement: float = 0.95
    max_output_drift: float = 0.05
    max_p99_ratio: float = 1.5
    min_compared: int = 1000
    failure_share: float = 0.05
    min_reports: int = 20
    sample: float = 0.05
    compared_per_h: tuple[float, float] = (200.0, 600.0)
    gate_s: float = 600.0
    after_s: float = 3600.0
    install_s: float = 600.0
    step_s: float = 300.0
    release_delay_s: float = 300.0
    limit_s: float = 12 * 3600.0
    seed: int = 29


@dataclass
class _Device:
    """One simulated device: its draws, and the sums of its comparison so far."""

    id: str
    rate_per_s: float
    agreement: float
    drift: float
    old_ms: float
    install_delay_s: float
    installed_at: float | None = None
    compared_until: float = 0.0
    sums: dict[str, Any] = field(default_factory=dict)
    new_hist: np.ndarray[Any, Any] = field(default_factory=lambda: np.zeros(256, np.int64))
    old_hist: np.ndarray[Any, Any] = field(default_factory=lambda: np.zeros(256, np.int64))


@dataclass(frozen=True)
class Template:
    """The repository every run starts from (its first wave released at ``epoch``),
    what devices serve, and the rollout's conditions."""

    repo: Path
    sha256: dict[str, str]
    epoch: datetime
    params: Params


def _modelreg(env: Mapping[str, str], cwd: Path, *args: str) -> None:
    run_checked([sys.executable, "-m", "modelreg", *args], cwd=cwd, env=env)


def build(work: Path, params: Params) -> Template:
    """The repository every run copies, at its first wave (see the module doc), with
    the stop conditions of ``params``.

    Raises:
        BenchmarkError: a command fails.
    """
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    examples = work / "examples"
    write_examples(examples, size="small", models=[MODEL], goldens=True)
    env = isolated_env(work / "home", {"MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"})
    repo = work / "fleet"
    _modelreg(env, work, "init", str(repo))
    _modelreg(env, repo, "model", "add", MODEL, "--channel-order", CHANNEL)
    for version, parent in ((OLD, None), (NEW, OLD)):
        args = ["version", "add", MODEL, version,
                "--artifact", str(examples / f"{MODEL}/{version}.onnx"),
                "--golden-inputs", str(examples / f"{MODEL}/{version}.inputs.npz")]  # fmt: skip
        _modelreg(env, repo, *args, *(["--parent", parent] if parent else []))
    epoch = (datetime.now(UTC) - timedelta(days=2)).replace(microsecond=0)
    before = _dated(env, epoch - timedelta(days=1))
    _modelreg(env, repo, "promote", MODEL, OLD, "-c", CHANNEL)
    run_checked(["git", "add", "-A"], cwd=repo, env=env)
    run_checked(["git", "commit", "-qm", f"{MODEL} {OLD} on {CHANNEL}"], cwd=repo, env=before)
    _modelreg(before, repo, "ci", "release")
    _stage(repo, params, env, epoch)
    sha = {
        v: hashlib.sha256((examples / f"{MODEL}/{v}.onnx").read_bytes()).hexdigest()
        for v in (OLD, NEW)
    }
    return Template(repo, sha, epoch, params)


# --- the devices -------------------------------------------------------------------------


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _buckets(seconds: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``registry.agreement.bucket`` of many run times at once."""
    from registry.agreement import BUCKET_BASE_S, BUCKET_FACTOR, BUCKETS

    index = np.floor(np.log(np.maximum(seconds, BUCKET_BASE_S) / BUCKET_BASE_S)
                     / math.log(BUCKET_FACTOR))  # fmt: skip
    found: np.ndarray[Any, Any] = np.clip(index, 0, BUCKETS - 1).astype(np.int64)
    return found


def _devices(params: Params, rng: np.random.Generator) -> list[_Device]:
    b = params.behaviour
    found = []
    for i in range(1, params.devices + 1):
        agreement = float(np.clip(rng.normal(b.agreement, b.spread), 0.0, 1.0))
        found.append(_Device(
            id=f"dev-{i:04d}", rate_per_s=float(rng.uniform(*params.compared_per_h)) / 3600,
            agreement=agreement, drift=b.drift * float(rng.uniform(0.5, 1.5)),
            old_ms=float(rng.uniform(5.0, 15.0)),
            install_delay_s=float(rng.uniform(0, params.install_s)),
            sums={"compared": 0, "dropped": 0, "rows": 0, "top1": 0, "topk": 0, "values": 0,
                  "abs_sum": 0.0, "abs_max": 0.0, "ref_sum": 0.0, "rel_sum": 0.0,
                  "rel_max": 0.0, "new_s": 0.0, "old_s": 0.0},
        ))  # fmt: skip
    return found


def _compare(device: _Device, until: float, params: Params, rng: np.random.Generator) -> None:
    """Add the device's comparisons up to simulated time ``until`` to its sums."""
    assert device.installed_at is not None, "called for installed devices"
    end = min(until, device.installed_at + params.gate_s + params.after_s)
    span = end - max(device.compared_until, device.installed_at)
    device.compared_until = max(device.compared_until, end)
    if span <= 0:
        return
    n = int(rng.poisson(device.rate_per_s * span))
    if not n:
        return
    s, b = device.sums, params.behaviour
    top1 = int(rng.binomial(n, device.agreement))
    s["compared"] += n
    s["dropped"] += int(rng.binomial(n, 0.02))  # the device was busy: never waited for
    s["rows"] += n
    s["top1"] += top1
    s["topk"] += top1 + int(rng.binomial(n - top1, 0.9))
    s["values"] += n * CLASSES
    diff = float(rng.gamma(4.0 * n, device.drift / 4.0))  # each row's L1 difference
    s["abs_sum"] += diff
    s["ref_sum"] += float(n)  # each row of probabilities sums to 1
    s["rel_sum"] += diff * CLASSES  # values of about 1/CLASSES each
    # one value's difference is never more than the batch's summed differences
    s["abs_max"] = max(s["abs_max"], min(1.0, 6 * device.drift, diff))
    s["rel_max"] = max(s["rel_max"], min(1e3, 6 * device.drift * CLASSES, diff * CLASSES))
    old = rng.lognormal(math.log(device.old_ms / 1000), 0.25, n)
    new = old * b.latency * rng.lognormal(0.0, 0.05, n)
    s["old_s"] += float(old.sum())
    s["new_s"] += float(new.sum())
    device.old_hist += np.bincount(_buckets(old), minlength=256)
    device.new_hist += np.bincount(_buckets(new), minlength=256)


def _histogram(counts: np.ndarray[Any, Any]) -> list[list[int]]:
    return [[int(i), int(counts[i])] for i in np.flatnonzero(counts)]


def _shadow(device: _Device, now: float, params: Params) -> dict[str, Any] | None:
    s = device.sums
    if device.installed_at is None or not s["compared"]:
        return None
    closes = device.installed_at + params.gate_s + params.after_s
    output = {k: s[k] for k in ("rows", "top1", "topk", "values", "abs_sum", "abs_max",
                                "ref_sum", "rel_sum", "rel_max")}  # fmt: skip
    return {
        "version": NEW, "against": OLD, "compared": s["compared"], "dropped": s["dropped"],
        "new_s": s["new_s"], "old_s": s["old_s"],
        "new_hist": _histogram(device.new_hist), "old_hist": _histogram(device.old_hist),
        "outputs": {OUTPUT: {**output, "k": 3}},
        "open": now < closes,
    }  # fmt: skip


def _report(
    device: _Device, now: float, epoch: datetime, params: Params, sha: Mapping[str, str]
) -> bytes:
    """The device's report at simulated time ``now`` (validated by ``encode_report``)."""
    from registry.device_report import encode_report

    at = epoch + timedelta(seconds=now)

    def held(version: str) -> dict[str, Any]:
        return {"version": version, "sha256": sha[version], "target": "cpu", "kind": "artifact"}

    installed = device.installed_at is not None
    serving = NEW if installed else OLD
    done = epoch + timedelta(seconds=device.installed_at if device.installed_at else -86400)
    entry: dict[str, Any] = {
        "channel": CHANNEL, "serving": held(serving),
        "previous": held(OLD) if installed else None, "last_known_good": held(serving),
        "last_update": {"result": "installed", "version": serving,
                        "method": "delta" if installed else "full", "bytes_fetched": 4096,
                        "reason": None, "finished": _stamp(done), "stages_ms": {}},
        "rejected": [], "gate": None, "shadow": _shadow(device, now, params),
    }  # fmt: skip
    doc = {
        "kind": "DeviceReport", "format": 4, "device": device.id, "labels": {"arch": "x86_64"},
        "reported": _stamp(at),
        "daemon": {"running": True, "pid": 4242, "listen": "127.0.0.1:8000",
                   "started": _stamp(epoch - timedelta(days=1)), "version": "0.1.0"},
        "trust": {"timestamp_version": 7, "timestamp_expires": _stamp(at + timedelta(days=1)),
                  "stale": False},
        "sync": {"last_checked": _stamp(at), "result": "current", "reason": None,
                 "commit": "5e" * 20},
        "models": {MODEL: entry},
    }  # fmt: skip
    return encode_report(doc)


# --- the repository ----------------------------------------------------------------------


@contextlib.contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` for the in-process ``fleet advance`` (its git
    commits: the identity and the simulated dates), restored after."""
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _dated(env: Mapping[str, str], at: datetime) -> dict[str, str]:
    stamp = at.isoformat()
    return {**env, "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}


def _stage(repo: Path, params: Params, env: Mapping[str, str], at: datetime) -> None:
    """Promote 1.1.0 to the first wave with the behaviour conditions; commit, release."""
    _modelreg(env, repo, "promote", MODEL, NEW, "-c", CHANNEL, "--waves", WAVES,
              "--stop-failures", f"{params.failure_share:g}",
              "--min-reports", str(params.min_reports))  # fmt: skip
    path = repo / f"manifests/{MODEL}/model.yaml"
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    channel = doc["spec"]["channels"][CHANNEL]
    channel["rollout"]["stop"] |= {
        "min_agreement": params.min_agreement, "max_output_drift": params.max_output_drift,
        "max_p99_ratio": params.max_p99_ratio, "min_compared": params.min_compared,
    }  # fmt: skip
    channel["shadow"] = {"sample": params.sample, "after": f"{params.after_s:g}s"}
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    run_checked(["git", "add", "-A"], cwd=repo, env=env)
    message = f"{MODEL} {NEW} to {CHANNEL} in waves {WAVES}, judged on its answers"
    run_checked(["git", "commit", "-qm", message], cwd=repo, env=_dated(env, at))
    _modelreg(_dated(env, at), repo, "ci", "release")


def _rollout(repo: Path) -> dict[str, Any]:
    doc = yaml.safe_load((repo / f"manifests/{MODEL}/model.yaml").read_text(encoding="utf-8"))
    rollout: dict[str, Any] = doc["spec"]["channels"][CHANNEL]["rollout"]
    return rollout


def _git(repo: Path, env: Mapping[str, str], *args: str) -> str:
    return run_checked(["git", *args], cwd=repo, env=env).stdout.decode().strip()


# --- a run -------------------------------------------------------------------------------


def play(template: Template, behaviour: Behaviour, work: Path) -> dict[str, Any]:
    """One run: the rollout of 1.1.0 from its first wave, its answers as ``behaviour``
    says, ``fleet advance`` every ``step_s`` of simulated time, until it stops, is
    done, or ``limit_s`` passed.

    Returns:
        JSON-ready figures: where the rollout ended, the hold and its commit, each
        decision with the wave's comparison figures, the times taken.

    Raises:
        BenchmarkError: a command fails, or ``fleet advance`` meets an error.
    """
    from fleet.advance import advance, progress_from_reports
    from fleet.reports import load_reports
    from fleet.summary import channel_progress
    from fleet.trust import repository_trust
    from registry.cohort import in_cohort
    from registry.errors import RegistryError

    started = time.perf_counter()
    params = replace(template.params, behaviour=behaviour)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    repo, reports = work / "fleet", work / "reports"
    shutil.copytree(template.repo, repo, symlinks=True)
    with contextlib.suppress(FileNotFoundError):  # the registry the releases mirror into
        shutil.copy(template.repo.parent / "mlflow.db", work / "mlflow.db")
    reports.mkdir()
    env = isolated_env(work / "home", {"MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"})
    epoch = template.epoch
    rng = np.random.default_rng(params.seed)
    devices = _devices(params, rng)
    releases_s = 0.0
    percent, released_at, now = 10.0, 0.0, 0.0
    decisions: list[dict[str, Any]] = []
    written = 0
    advance_s = report_s = 0.0
    for device in devices:  # everyone reports 1.0.0 before the rollout
        (reports / f"{device.id}.json").write_bytes(_report(device, 0.0, epoch, params,
                                                            template.sha256))  # fmt: skip
    final = None

    def tick(at_s: float) -> int:
        """The wave's devices install and compare up to ``at_s``; they report."""
        sent = 0
        for device in devices:
            if not in_cohort(device.id, MODEL, NEW, percent):
                continue
            if device.installed_at is None and at_s >= released_at + device.install_delay_s:
                device.installed_at = released_at + device.install_delay_s
            if device.installed_at is not None:
                _compare(device, at_s, params, rng)
                data = _report(device, at_s, epoch, params, template.sha256)
                (reports / f"{device.id}.json").write_bytes(data)
                sent += 1
        return sent

    def read(at: datetime) -> list[DeviceReport]:
        _, trust = repository_trust(repo, required=True)
        loaded = load_reports(str(reports), trust=trust)
        if loaded.unreadable:
            raise BenchmarkError(f"unreadable reports: {loaded.unreadable[:3]}")
        return loaded.reports

    while now < params.limit_s:
        now += params.step_s
        t0 = time.perf_counter()
        written += tick(now)
        t1 = time.perf_counter()
        at = epoch + timedelta(seconds=now)
        try:
            with _environ(_dated(env, at)):
                (step,) = advance(repo, progress_from_reports(read(at), at), now=at)
        except RegistryError as e:
            raise BenchmarkError(f"fleet advance: {e}") from e
        report_s += t1 - t0
        advance_s += time.perf_counter() - t1
        found = step.progress.behaviour
        decisions.append({
            "at_h": round(now / 3600, 3), "percent": percent, "action": step.action,
            "reason": step.decision.reason, "cohort": step.progress.cohort,
            "on_target": step.progress.on_target,
            "behaviour": None if found is None else found.figures() | {"outputs": None},
            "commit": step.commit,
        })  # fmt: skip
        if step.action in ("stop", "done", "held"):
            final = step.action
            break
        if step.action == "advance":
            percent = float(_rollout(repo)["percent"])
            released_at = now + params.release_delay_s
            t2 = time.perf_counter()
            _modelreg(_dated(env, epoch + timedelta(seconds=released_at)), repo, "ci", "release")
            releases_s += time.perf_counter() - t2
    # the last wave's devices install (a held one's installed already); what fleet
    # status then counts
    settled = max(now, released_at + params.install_s)
    written += tick(settled)
    at = epoch + timedelta(seconds=settled)
    status = channel_progress(read(at), MODEL, CHANNEL, NEW, percent, now=at)
    behaviour_line = None if status.behaviour is None else status.behaviour.text()
    rollout = _rollout(repo)
    hold = rollout.get("hold")
    commit = None
    if final == "stop":
        sha = decisions[-1]["commit"]
        commit = {
            "sha": sha,
            "subject": _git(repo, env, "log", "-1", "--format=%s", sha),
            "body": _git(repo, env, "log", "-1", "--format=%b", sha),
            "files": _git(repo, env, "show", "--name-only", "--format=", sha).split(),
        }
    reached = sorted({d["percent"] for d in decisions})
    return {
        "label": params.behaviour.label,
        "params": asdict(params),
        "devices": params.devices,
        "final": final or "timed out",
        "percent": rollout["percent"],
        "waves_reached": reached,
        "hold": hold,
        "hold_commit": commit,
        "devices_on_new": status.on_target,
        "status": {
            "percent": percent,
            "cohort": status.cohort,
            "on_target": status.on_target,
            "failed": len(status.failed),
            "behaviour": behaviour_line,
        },
        "simulated_hours": round(now / 3600, 3),
        "decisions": decisions,
        "reports_written": written + params.devices,
        "seconds": {
            "total": round(time.perf_counter() - started, 3),
            "releases": round(releases_s, 3),
            "reports": round(report_s, 3),
            "fleet_advance": round(advance_s, 3),
        },
    }


def simulate(devices: int, work: Path, *, seed: int = 29) -> dict[str, dict[str, Any]]:
    """Build the repository, then play the rollout twice: a version whose answers
    disagree on about one row in five, then a faithful one.  Results by run label.

    Raises:
        BenchmarkError: a command fails.
    """
    t0 = time.perf_counter()
    params = Params(devices, DISAGREEING, min_reports=max(1, devices // 50), seed=seed)
    template = build(work / "template", params)
    built_s = time.perf_counter() - t0
    runs = {}
    for behaviour in (DISAGREEING, FAITHFUL):
        runs[behaviour.label] = play(template, behaviour, work / behaviour.label)
    for run in runs.values():
        run["seconds"]["repository_and_first_wave"] = round(built_s, 3)
    return runs


def summary_lines(runs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per run, to quote."""
    lines = []
    for label, r in runs.items():
        end = f"held at {r['percent']:g}%: {r['hold']}" if r["hold"] else f"at {r['percent']:g}%"
        status, took = r["status"], r["seconds"]
        lines.append(
            f"behaviour, {label}: {r['devices']:,} devices, waves reached "
            f"{', '.join(f'{p:g}%' for p in r['waves_reached'])}; {r['final']} after "
            f"{r['simulated_hours'] * 60:.0f} simulated minutes, {end}; fleet status: "
            f"{status['on_target']:,} of {status['cohort']:,} devices of the wave on {NEW}; "
            f"{took['total']:.1f} s (fleet advance {took['fleet_advance']:.1f} s, releases "
            f"{took['releases']:.1f} s; the repository and first wave before: "
            f"{took['repository_and_first_wave']:.1f} s)"
        )
    return lines
