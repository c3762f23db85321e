"""A fleet repository and an in-process device for ``benchmarks.edge_update``.

:func:`release` releases versions of one model through the real ``modelreg`` CLI (all
declared and built by one ``modelreg ci release``, then each promoted to ``canary`` and
released in a commit of its own);
:func:`pinned` serves the repository as it was at one version's commit, so a device can
hold any version; :func:`update` runs the real :class:`~edge_sync.sync.updater.Updater`
in this process and times one sync from "new metadata seen" to "committed", with the
process's RSS sampled meanwhile (:class:`RssSampler`).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._util import BenchmarkError, isolated_env, run_checked

__all__ = ["Fleet", "Release", "RssSampler", "device_holding", "pinned", "release", "update"]


@dataclass(frozen=True)
class Release:
    """One version to release: its ONNX file, golden inputs, and parent (None: none)."""

    version: str
    artifact: Path
    inputs: Path
    parent: str | None = None


@dataclass
class Fleet:
    """A released fleet repository: where its objects are, and each version's commit."""

    work: Path
    model: str
    repo: Path
    commits: dict[str, str] = field(default_factory=dict)

    @property
    def remote(self) -> Path:
        """The artifact remote (``artifacts.url`` of a device)."""
        return self.repo / ".modelreg/remote/modelreg"

    @property
    def root(self) -> Path:
        """The trust root a device is provisioned with."""
        return self.repo / "trust/metadata/1.root.json"

    def manifest(self, version: str) -> dict[str, Any]:
        """The tensor manifest CI signed for ``version`` (``graph``, ``tensors``)."""
        folder = self.remote / "targets/versions" / self.model
        (path,) = folder.glob(f"*.{version}.json")
        tensors = json.loads(path.read_text()).get("tensors")
        if not isinstance(tensors, dict):
            raise BenchmarkError(f"{self.model} {version} has no tensor manifest")
        return tensors

    def object_file(self, sha256: str) -> Path:
        """The remote's file of the object (skeleton or tensor) ``sha256``."""
        from signing.target_names import object_path

        return self.remote / "targets" / object_path(sha256)


def release(work: Path, model: str, versions: Sequence[Release]) -> Fleet:
    """``modelreg init`` a fleet repository in ``work/fleet`` and release ``versions``
    of ``model``: one commit declares them all (``canary`` on the first), one release
    builds and signs them, then ``canary`` moves to each of the others in order, a
    released commit each (one MLflow mirror and build per version, not per commit)."""
    env = isolated_env(work / "home", {"MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"})
    fleet = Fleet(work, model, work / "fleet")
    cli = [sys.executable, "-m", "modelreg"]

    def modelreg(*args: str) -> None:
        run_checked([*cli, *args], cwd=fleet.repo if fleet.repo.exists() else work, env=env)

    modelreg("init", str(fleet.repo))
    modelreg("model", "add", model, "--channel-order", "canary,production")
    for r in versions:
        parent = ["--parent", r.parent] if r.parent else ["--no-parent"]
        modelreg("version", "add", model, r.version, "--artifact", str(r.artifact),
                 "--golden-inputs", str(r.inputs), *parent)  # fmt: skip
    for r in versions:
        modelreg("promote", model, r.version, "-c", "canary")
        run_checked(["git", "add", "-A"], cwd=fleet.repo, env=env)
        run_checked(["git", "commit", "-qm", f"{model} {r.version}"], cwd=fleet.repo, env=env)
        modelreg("ci", "release")
        fleet.commits[r.version] = _head(fleet.repo)
    return fleet


def _head(repo: Path) -> str:
    import subprocess

    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip


def pinned(fleet: Fleet, version: str) -> Path:
    """A bare clone of the fleet repository whose ``main`` is ``version``'s commit."""
    bare = fleet.work / "pinned" / f"{version}.git"
    if not bare.exists():
        run_checked(["git", "clone", "-q", "--bare", str(fleet.repo), str(bare)],
                    cwd=fleet.work, env={})  # fmt: skip
        run_checked(["git", "update-ref", "refs/heads/main", fleet.commits[version]],
                    cwd=bare, env={})  # fmt: skip
    return bare


def config(fleet: Fleet, device: Path, version: str) -> Path:
    """A device's ``edge.yaml`` following ``fleet`` as it was at ``version``."""
    device.mkdir(parents=True, exist_ok=True)
    shutil.copy(fleet.root, device / "1.root.json")
    path = device / "edge.yaml"
    path.write_text(json.dumps({
        "apiVersion": "modelreg/v1", "kind": "EdgeConfig",
        "device": {"id": "bench-0001", "labels": {}},
        "repository": {"url": str(pinned(fleet, version)), "branch": "main",
                       "poll_interval": "1h"},
        "trust": {"root": "1.root.json"}, "artifacts": {"url": str(fleet.remote)},
        "models": [{"name": fleet.model, "channel": "canary"}], "state_dir": "state",
    }))  # fmt: skip
    return path


def device_holding(fleet: Fleet, version: str) -> Path:
    """The state of a device that installed ``version`` (its checkout removed: the
    devices that start from it follow other pinned clones)."""
    state = fleet.work / "holds" / version
    if not state.exists():
        device = fleet.work / "devices" / f"install-{version}"
        update(config(fleet, device, version), None, fleet.model)
        shutil.copytree(device / "state", state)
        shutil.rmtree(state / "checkout")
        shutil.rmtree(device)
    return state


def _copy_state(src: Path, dst: Path) -> None:
    """Copy a device's state; its large blobs (immutable, replaced only by rename or
    unlink) are hard-linked, so that a 1 GB device is ready at once."""

    def link_or_copy(a: str, b: str) -> object:
        if Path(a).stat().st_size >= 1 << 20:
            os.link(a, b)
            return b
        return shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link_or_copy)


def _status(key: str) -> int:
    with Path("/proc/self/status").open(encoding="ascii") as fh:
        for line in fh:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise BenchmarkError(f"no {key} in /proc/self/status")


class RssSampler:
    """The process's resident set sampled every ``interval_s`` by a thread, and its
    kernel high-water mark (reset at the start where the kernel lets it): ``growth``
    is the peak over the RSS at the start."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.baseline = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _status("VmRSS:"))
            time.sleep(self.interval_s)

    def __enter__(self) -> RssSampler:
        try:  # 5: reset VmHWM to the current RSS (Linux >= 4.0)
            Path("/proc/self/clear_refs").write_text("5")
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self.baseline = self.peak = _status("VmRSS:")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _status("VmRSS:"))
        if self.hwm_reset:
            self.peak = max(self.peak, _status("VmHWM:"))

    @property
    def growth(self) -> int:
        """Bytes the peak RSS rose over the RSS at the start."""
        return self.peak - self.baseline

    def growth_so_far(self) -> int:
        """Bytes the peak RSS rose over the RSS at the start, until now."""
        peak = max(self.peak, _status("VmRSS:"))
        if self.hwm_reset:
            peak = max(peak, _status("VmHWM:"))
        return peak - self.baseline


def update(
    config_path: Path, state_from: Path | None, model: str, prepack: str = "off"
) -> dict[str, Any]:
    """One sync of a device (its state copied from ``state_from``, and what that state
    serves loaded and run once first, as a running daemon holds it), timed from "new
    metadata seen" to "committed" (``latency_s``: the version serves from its swap, and
    a restart serves it from its commit); the ``confirm`` after it, which checks a
    version that replaced another in its other session setups, is timed apart
    (``confirm_s``).  RSS is sampled over the sync: its growth until the commit
    (``rss_growth``) and over the whole sync (``rss_growth_sync``)."""
    from edge_sync.config import load_edge_config
    from edge_sync.daemon import provision
    from edge_sync.engine.host import InProcessHost
    from edge_sync.state.store import StateDir
    from edge_sync.sync.updater import Updater

    gc.collect()  # the engines of the last sync go now, not during this one
    cfg = load_edge_config(config_path)
    shutil.rmtree(cfg.state_path, ignore_errors=True)
    if state_from is not None:
        _copy_state(state_from, cfg.state_path)
    marks: dict[str, float] = {}
    grown: dict[str, int] = {}
    sampler: list[RssSampler] = []

    def observer(stage: str, phase: str) -> None:
        marks[f"{stage}:{phase}"] = time.perf_counter()
        if (stage, phase) == ("commit", "end") and sampler:
            grown["commit"] = sampler[0].growth_so_far()

    state = StateDir(cfg.state_path)
    host = InProcessHost(prepack=prepack)
    with state.locked():
        provision(cfg, state)
        updater = Updater(cfg, state, host, observer=observer)
        updater.resume()
        _warm(host, model)
        marks.clear()
        with RssSampler() as rss:
            sampler.append(rss)
            report = updater.sync()
    result = report.updates.get(model)
    if result is None or result.result != "installed":
        raise BenchmarkError(f"the device did not install: {report}")
    stages = dict(result.stages_ms)
    return {
        "latency_s": marks["commit:end"] - marks["detect:end"],
        "method": result.method,
        "path": _path(str(result.method), stages),
        "bytes_fetched": result.bytes_fetched,
        "stages_ms": stages,
        "confirm_s": stages.get("confirm", 0.0) / 1000,
        "rss_growth": grown.get("commit", rss.growth),
        "rss_growth_sync": rss.growth,
    }


def _warm(host: Any, model: str) -> None:
    """Run the serving engine once (its weight pages resident, as on a serving device)."""
    if host.current(model) is None:
        return
    with host.lease(model) as engine:
        engine.run(engine.sample_inputs())


def _path(method: str, stages: dict[str, float]) -> str:
    """The install path taken: ``tensors`` is said as ``delta`` (SPEC); a delta applies."""
    if method == "delta" and "apply_delta" not in stages:
        return "tensors"
    return method
