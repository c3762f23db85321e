"""The edge daemon's update latency, full and by delta, against the floor (issue 9).

A fleet repository (``modelreg init``) releases the large MLP example 1.0.0, then its
1.1.0 fine-tune (17 % of the weights changed, parent 1.0.0, so a delta is published),
through the real ``modelreg ci release``.  A device then runs the real
:class:`~edge_sync.sync.updater.Updater` in this process:

* **full**: a fresh device installs 1.1.0 (fetch, verify, build, self-test, swap, commit);
* **delta**: a device that serves 1.0.0 installs 1.1.0 (fetch the delta, apply, verify,
  build a session that shares the unchanged weights with the serving one ...); and the
  same with private prepacked sessions (``serve.prepack: on``), side by side.

The latency is from "new metadata seen" (the end of the git detect stage) to the end of
the commit stage.  The **floor**, measured in the same run, is what any verified install
of those bytes costs: reading the artifact with its SHA-256, plus creating the ONNX
Runtime session with the daemon's options.  Goals: full <= 1.3x the floor, delta <=
0.15x full, bytes fetched for the delta <= 1.05x the signed delta.

The idle poll (nothing new) is measured against a ``git daemon`` on 127.0.0.1 through a
counting TCP proxy: round trips (connections) and bytes both ways.  Goal: one round
trip, under 2 KB.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any, Final

from benchmarks._util import (
    BENCH_DIR,
    BenchmarkError,
    git_daemon,
    isolated_env,
    machine_info,
    run_checked,
)
from modelreg.examples import write_examples

NAME: Final = "edge_update"


def _goal(name: str, value: float, target: float, *, quick: bool) -> dict[str, Any]:
    return {
        "name": name,
        "value": round(value, 4),
        "target": target,
        "comparison": "<=",
        "passed": value <= target,
        "indicative": quick,
    }


class _CountingProxy:
    """A TCP proxy on 127.0.0.1 that counts connections and bytes to one port."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self.bytes = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    self.bytes += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            src.close()  # each socket is read by one pipe, which closes it

    def reset(self) -> None:
        with self._lock:
            self.connections = self.bytes = 0

    def close(self) -> None:
        """Stop accepting (the pipes close their sockets as their peers hang up)."""
        self.server.close()


def _release(work: Path, size: str) -> tuple[Path, dict[str, Path]]:
    examples = work / "examples"
    built = write_examples(examples, size=size, models=["mlp"], goldens=True)
    files: dict[str, Path] = {}
    for f in built:
        files[f.path.name] = f.path
        if f.golden_inputs is not None:
            files[f.golden_inputs.name] = f.golden_inputs
    env = isolated_env(work / "home", {"MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"})
    repo = work / "fleet"
    cli = [sys.executable, "-m", "modelreg"]

    def modelreg(*args: str) -> None:
        run_checked([*cli, *args], cwd=repo if repo.exists() else work, env=env)

    def commit_release(message: str) -> None:
        run_checked(["git", "add", "-A"], cwd=repo, env=env)
        run_checked(["git", "commit", "-qm", message], cwd=repo, env=env)
        modelreg("ci", "release")

    modelreg("init", str(repo))
    modelreg("model", "add", "mlp", "--channel-order", "canary,production")
    for version, parent in (("1.0.0", None), ("1.1.0", "1.0.0")):
        args = ["version", "add", "mlp", version, "--artifact", str(files[f"{version}.onnx"]),
                "--golden-inputs", str(files[f"{version}.inputs.npz"])]  # fmt: skip
        modelreg(*args, *(["--parent", parent] if parent else []))
        modelreg("promote", "mlp", version, "-c", "canary")
        commit_release(f"mlp {version}")
    return repo, files


def _config(device: Path, repo_url: str, remote: Path, root: Path) -> Path:
    device.mkdir(parents=True, exist_ok=True)
    shutil.copy(root, device / "1.root.json")
    path = device / "edge.yaml"
    path.write_text(json.dumps({
        "apiVersion": "modelreg/v1", "kind": "EdgeConfig",
        "device": {"id": "bench-0001", "labels": {}},
        "repository": {"url": repo_url, "branch": "main", "poll_interval": "1h"},
        "trust": {"root": "1.root.json"}, "artifacts": {"url": str(remote)},
        "models": [{"name": "mlp", "channel": "canary"}], "state_dir": "state",
    }))  # fmt: skip
    return path


def _update(config_path: Path, state_from: Path | None, prepack: str = "off") -> dict[str, Any]:
    """One sync of a device (its state dir copied from ``state_from``, and what that
    state serves loaded first, as a running daemon holds it), timed from "new metadata
    seen" to "committed"."""
    from edge_sync.config import load_edge_config
    from edge_sync.daemon import provision
    from edge_sync.engine.host import InProcessHost
    from edge_sync.state.store import StateDir
    from edge_sync.sync.updater import Updater

    config = load_edge_config(config_path)
    shutil.rmtree(config.state_path, ignore_errors=True)
    if state_from is not None:
        shutil.copytree(state_from, config.state_path)
    marks: dict[str, float] = {}

    def observer(stage: str, phase: str) -> None:
        marks[f"{stage}:{phase}"] = time.perf_counter()

    state = StateDir(config.state_path)
    host = InProcessHost(prepack=prepack)
    with state.locked():
        provision(config, state)
        updater = Updater(config, state, host, observer=observer)
        updater.resume()
        marks.clear()
        report = updater.sync()
    update = report.updates.get("mlp")
    if update is None or update.result != "installed":
        raise BenchmarkError(f"the device did not install: {report}")
    return {
        "latency_s": marks["commit:end"] - marks["detect:end"],
        "method": update.method,
        "bytes_fetched": update.bytes_fetched,
        "stages_ms": update.stages_ms,
    }


def _floor(artifact: Path) -> float:
    """Read + SHA-256 of the bytes + an ONNX Runtime session with the daemon's options."""
    import onnxruntime as ort

    start = time.perf_counter()
    hasher = hashlib.sha256()
    with artifact.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            hasher.update(chunk)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    ort.InferenceSession(str(artifact), options, providers=["CPUExecutionProvider"])
    return time.perf_counter() - start


def run(quick: bool) -> dict[str, Any]:
    """Release, then time device updates against the floor (quick: the small model).

    Returns:
        JSON-ready figures: latencies, stage timings, bytes, ratios and goals.
    """
    size = "small" if quick else "large"
    runs = 3 if quick else 5
    work = BENCH_DIR / NAME / size
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    repo, files = _release(work, size)
    remote = repo / ".modelreg/remote/modelreg"
    root = repo / "trust/metadata/1.root.json"
    # a device that holds 1.0.0: install it while the channel still pointed there
    base_state = work / "holds-1.0.0"
    old = subprocess.run(["git", "rev-parse", "HEAD~1"], cwd=repo, capture_output=True,
                         text=True, check=True).stdout.strip()  # fmt: skip
    past = work / "past.git"
    run_checked(["git", "clone", "-q", "--bare", str(repo), str(past)], cwd=work, env={})
    run_checked(["git", "update-ref", "refs/heads/main", old], cwd=past, env={})
    _update(_config(work / "device-old", str(past), remote, root), None)
    shutil.copytree(work / "device-old/state", base_state)
    shutil.rmtree(base_state / "checkout")  # it follows another repository now
    config = _config(work / "device", str(repo), remote, root)
    full, delta, floor, private = [], [], [], []
    for _ in range(runs):  # interleaved, so that load spreads over all of them
        full.append(_update(config, None))
        delta.append(_update(config, base_state))
        private.append(_update(config, base_state, prepack="on"))
        floor.append(_floor(files["1.1.0.onnx"]))
    (delta_file,) = (remote / "targets/deltas/mlp").glob("*.1.1.0.from-1.0.0.delta")
    idle = _idle_poll(work, repo)
    f_s = statistics.median(r["latency_s"] for r in full)
    d_s = statistics.median(r["latency_s"] for r in delta)
    p_s = statistics.median(r["latency_s"] for r in private)
    floor_s = statistics.median(floor)
    fetched = statistics.median(r["bytes_fetched"] for r in delta)
    quick_flag = quick
    artifact_mb = files["1.1.0.onnx"].stat().st_size / 1e6
    goals = [
        _goal("full update / floor", f_s / floor_s, 1.3, quick=quick_flag),
        _goal("delta update / full update", d_s / f_s, 0.15, quick=quick_flag),
        _goal(
            "delta bytes fetched / signed delta",
            fetched / delta_file.stat().st_size,
            1.05,
            quick=quick_flag,
        ),
        _goal("idle poll round trips", idle["connections"], 1, quick=quick_flag),
        _goal("idle poll KB on the git host", idle["bytes"] / 1024, 2.0, quick=quick_flag),
    ]
    return {
        "name": NAME,
        "quick": quick,
        "summary": f"device update of mlp 1.1.0 ({artifact_mb:.1f} MB), full and by delta",
        "params": {"size": size, "runs": runs},
        "measurements": {},
        "latency_s": {
            "full": round(f_s, 4),
            "delta": round(d_s, 4),
            "floor": round(floor_s, 4),
            "delta_private_sessions": round(p_s, 4),
        },
        "stages_ms": {
            "full": full[len(full) // 2]["stages_ms"],
            "delta": delta[len(delta) // 2]["stages_ms"],
        },
        "bytes": {
            "delta_fetched": fetched,
            "delta_signed": delta_file.stat().st_size,
            "full_fetched": statistics.median(r["bytes_fetched"] for r in full),
        },
        "idle_poll": idle,
        "ratios": {"full / floor": f_s / floor_s, "full / delta": f_s / d_s},
        "notes": [
            f"full {f_s:.3f} s, delta {d_s:.3f} s, floor {floor_s:.3f} s (medians of {runs})",
            "full stages (ms): "
            + ", ".join(f"{k} {v:.1f}" for k, v in full[len(full) // 2]["stages_ms"].items()),
            "delta stages (ms): "
            + ", ".join(f"{k} {v:.1f}" for k, v in delta[len(delta) // 2]["stages_ms"].items()),
            f"delta with private prepacked sessions (serve.prepack: on, no weights shared): "
            f"{p_s:.3f} s; stages (ms): "
            + ", ".join(f"{k} {v:.1f}" for k, v in private[len(private) // 2]["stages_ms"].items()),
            f"idle poll: {idle['connections']} connection(s), {idle['bytes']} bytes",
        ],
        "goals": goals,
        "environment": machine_info(),
    }


def _idle_poll(work: Path, repo: Path) -> dict[str, int]:
    """Connections and bytes of one idle poll (the checkout already current)."""
    from edge_sync.sync.watcher import GitWatcher

    served = work / "served"
    shutil.rmtree(served, ignore_errors=True)
    served.mkdir()
    run_checked(["git", "clone", "-q", "--bare", str(repo), str(served / "fleet.git")],
                cwd=work, env={})  # fmt: skip
    with git_daemon(served) as url:
        proxy = _CountingProxy(int(url.rsplit(":", 1)[1]))
        try:
            watcher = GitWatcher(
                f"git://127.0.0.1:{proxy.port}/fleet.git", "main", work / "idle-co"
            )
            watcher.sync()  # the first poll fetches
            time.sleep(0.2)
            proxy.reset()
            head = watcher.sync()
            time.sleep(0.2)  # let the pipes count the last bytes
            if head.changed:
                raise BenchmarkError("the idle poll fetched")
            return {"connections": proxy.connections, "bytes": proxy.bytes}
        finally:
            proxy.close()
