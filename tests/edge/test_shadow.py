"""Shadow comparison on the device (issue 29, points 1, 2 and 4): a sampled share of a new
version's answered requests run on the version it replaced too, off the request path,
within a CPU budget; the gate fails a version whose answers disagree; the figures in
``/status``, ``/metrics``, ``edge status`` and the device's report.

The runner on real ONNX Runtime engines first, then the updater's gate, then a daemon on
loopback under a client's traffic: a version that disagrees on a fifth of its inputs is
rolled back by its gate and a faithful fine-tune is kept, with no failed request.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_sync.decide.health import GatePolicy
from edge_sync.decide.shadow import ShadowPolicy
from edge_sync.engine.base import Engine, LoadRequest
from edge_sync.engine.host import InProcessHost
from edge_sync.serve.recorder import Recorder
from edge_sync.serve.shadow import MAX_OBJECTS, MAX_QUEUED, MAX_QUEUED_BYTES, ShadowRunner
from edge_sync.sync import gates
from modelreg.examples import build_model
from tests.conftest import git
from tests.edge import models
from tests.edge.conftest import EdgeRig


def _engine(host: InProcessHost, tmp: Path, version: str, model: Any) -> Engine:
    path = models.save(model, tmp / version / "m.onnx")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return host.build(LoadRequest("mlp", version, path, digest))


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[InProcessHost, Engine, Engine]]:
    """1.0.0 and a version that rotates its classes on a fifth of the inputs, the second
    serving and the first loaded (as during a gate)."""
    host = InProcessHost(prepack="off")
    base = build_model("mlp", "1.0.0")
    old = _engine(host, tmp_path, "1.0.0", base)
    new = _engine(host, tmp_path, "1.1.0", models.disagreeing(base))
    host.swap("mlp", old)
    host.swap("mlp", new)
    yield host, new, old
    for engine in (new, old):
        host.retire(engine)


def _inputs(seed: int, rows: int = 4) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((rows, 16)).astype(np.float32)
    return {"input": x}


def _answer(runner: ShadowRunner, engine: Engine, seed: int) -> None:
    inputs = _inputs(seed)
    runner.offer(engine, inputs, None, engine.run(inputs), 0.0001)
    inputs["input"][:] = np.nan  # the server reuses its buffers and empties the dict:
    inputs.clear()  # a sample holds its own copy


def _settled(runner: ShadowRunner, want: int, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = runner.current("mlp")
        if found is not None and found.compared + found.dropped >= want:
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.01)


def test_a_disagreeing_version_reads_as_such_and_a_sample_is_a_sample(pair: Any) -> None:
    host, new, old = pair
    runner = ShadowRunner(host, seed=7)
    runner._budget = 1e9  # a budget that never runs out: the sample alone decides
    try:
        runner.begin("mlp", new, old, ShadowPolicy(sample=1.0, max_cpu_share=1.0))
        for seed in range(150):
            _answer(runner, new, seed)
            time.sleep(0.001)  # a client's pace: the queue keeps up
        found = _settled(runner, 150)
        assert found.compared > 100
        assert found.agreement == pytest.approx(0.8, abs=0.06)  # 600 rows, a fifth rotated
        assert (found.version, found.against, found.open) == ("1.1.0", "1.0.0", True)
        assert found.outputs["probs"].k == 4
        final = runner.end("mlp")
        assert final is not None
        assert not final.open
        _answer(runner, new, 999)  # no comparison: not sampled, not counted
        assert runner.current("mlp") is None
        assert runner.latest("mlp") == final

        runner.begin("mlp", new, old, ShadowPolicy(sample=0.25, max_cpu_share=1.0))
        for seed in range(400):
            _answer(runner, new, seed)
            time.sleep(0.001)
        sampled = _settled(runner, 1)
        time.sleep(0.2)
        sampled = runner.current("mlp")
        assert sampled is not None
        assert 60 <= sampled.compared + sampled.dropped <= 140  # a quarter of 400
        _answer(runner, old, 1)  # the previous engine's own answers are not offered
        assert runner.current("mlp").compared == sampled.compared  # type: ignore[union-attr]
    finally:
        runner.close()


def test_an_offer_never_waits_and_a_busy_runner_drops_first(pair: Any) -> None:
    host, new, old = pair
    runner = ShadowRunner(host, seed=1)
    runner._budget = 1e9
    try:
        runner.begin("mlp", new, old, ShadowPolicy(sample=1.0, max_cpu_share=1.0))
        with runner._offers:  # another request is offering: this one does not wait
            start = time.perf_counter()
            _answer(runner, new, 1)
            assert time.perf_counter() - start < 0.5
        assert runner.current("mlp").dropped == 1  # type: ignore[union-attr]
        # a comparison thread that cannot keep up: the queue holds MAX_QUEUED, the rest
        # is dropped at once
        blocker = threading.Event()
        real_run = old.run

        def stalled(*args: Any, **kwargs: Any) -> Any:
            blocker.wait(10)
            return real_run(*args, **kwargs)

        old.run = stalled
        try:
            for seed in range(MAX_QUEUED + 20):
                _answer(runner, new, seed)
            busy = runner.current("mlp")
            assert busy is not None
            assert busy.dropped >= 20
        finally:
            blocker.set()
            old.run = real_run
        _settled(runner, MAX_QUEUED + 21)
    finally:
        runner.close()


def test_an_offer_never_waits_for_the_sums_and_a_sample_counts_until_compared(
    pair: Any,
) -> None:
    host, new, old = pair
    runner = ShadowRunner(host, seed=7)
    runner._budget = 1e9
    try:
        runner.begin("mlp", new, old, ShadowPolicy(sample=1.0, max_cpu_share=1.0))
        found = runner._active["mlp"]
        # the comparison thread merging a burst's sums (or a reader reporting them) while
        # another request offers: this one drops its sample, it does not wait for either
        with found.lock, runner._offers:
            offered = threading.Thread(target=_answer, args=(runner, new, 1))
            offered.start()
            offered.join(2)
            assert not offered.is_alive()
        assert runner.current("mlp").dropped == 1  # type: ignore[union-attr]
        # a sample's bytes stay counted against MAX_QUEUED_BYTES until it was compared
        stalled, release = threading.Event(), threading.Event()
        real_run = old.run

        def slow(*args: Any, **kwargs: Any) -> Any:
            stalled.set()
            release.wait(10)
            return real_run(*args, **kwargs)

        old.run = slow
        try:
            _answer(runner, new, 2)
            assert stalled.wait(5)
            assert runner._queued_bytes > 0
        finally:
            release.set()
            old.run = real_run
        assert _settled(runner, 2).compared == 1
        deadline = time.monotonic() + 5
        while runner._queued_bytes:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        runner.close()


def test_a_sample_too_big_to_queue_is_dropped_before_it_is_copied(pair: Any) -> None:
    host, new, old = pair
    runner = ShadowRunner(host, seed=9)
    runner._budget = 1e9
    try:
        runner.begin("mlp", new, old, ShadowPolicy(sample=1.0, max_cpu_share=1.0))
        big = np.zeros(MAX_QUEUED_BYTES // 4 + 1, np.float32)
        many = np.array([b"x"] * (MAX_OBJECTS + 1), dtype=object)  # not sized one by one
        for inputs in ({"input": big}, {"input": many}):
            runner.offer(new, inputs, None, {"probs": np.zeros((1, 4), np.float32)}, 0.001)
        found = runner.current("mlp")
        assert found is not None
        assert (found.dropped, runner._waiting, runner._queued_bytes) == (2, 0, 0)
    finally:
        runner.close()


def test_a_request_run_in_a_batch_is_compared_not_timed(pair: Any) -> None:
    host, new, old = pair
    runner = ShadowRunner(host, seed=8)
    runner._budget = 1e9
    try:
        runner.begin("mlp", new, old, ShadowPolicy(sample=1.0, max_cpu_share=1.0))
        inputs = _inputs(3)
        runner.offer(new, inputs, None, new.run(inputs), None)  # a batch's run time
        found = _settled(runner, 1)
        assert found.compared == 1
        assert found.outputs["probs"].rows == 4
        assert (found.new_hist, found.p99_ratio) == ([], None)
    finally:
        runner.close()


def test_the_cpu_budget_holds_the_comparisons_to_their_share(pair: Any) -> None:
    host, new, old = pair
    runner = ShadowRunner(host, cpus=1, seed=3)
    try:
        # 0.1 % of one core: about a millisecond of comparisons a second
        runner.begin("mlp", new, old, ShadowPolicy(sample=1.0, max_cpu_share=0.001))
        start = time.monotonic()
        for seed in range(300):
            _answer(runner, new, seed)
            time.sleep(0.002)
        elapsed = time.monotonic() - start
        found = _settled(runner, 300)
        assert found.dropped > 150  # the budget ran out: sampled requests dropped
        assert found.compared >= 1
        # what the thread took stays within its rate, plus one comparison's overdraft
        assert runner.cpu_s <= 0.001 * elapsed + 0.001 + 0.02
    finally:
        runner.close()


def test_a_previous_version_that_fails_on_the_request_is_counted_not_compared(
    pair: Any,
) -> None:
    host, new, old = pair
    runner = ShadowRunner(host, seed=2)
    runner._budget = 1e9

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("not in this version")

    old.run = broken
    try:
        runner.begin("mlp", new, old, ShadowPolicy(sample=1.0, max_cpu_share=1.0))
        _answer(runner, new, 1)
        found = _settled(runner, 1)
        assert found.compared == 1
        assert found.outputs["probs"].incomparable == 1
        assert found.agreement is None
    finally:
        runner.close()


def _gated(rig: EdgeRig, shadow: dict[str, Any], window_s: float = 0.3) -> tuple[Recorder, Any]:
    recorder = Recorder()
    rig.updater_options = {
        "gate": GatePolicy(window_s=window_s, min_requests=5, max_latency_ratio=50.0),
        "recorder": recorder,
    }
    config = {"models": [{"name": "mlp", "channel": "canary", "shadow": shadow}]}
    return recorder, config


def _traffic(up: Any, recorder: Recorder, runner: ShadowRunner, n: int) -> None:
    """``n`` answers of the serving engine, offered and recorded as the server does."""
    for seed in range(n):
        with up.host.lease("mlp") as engine:
            inputs = _inputs(seed)
            outputs = engine.run(inputs)
            runner.offer(engine, inputs, None, outputs, 0.0001)
            recorder.record("mlp", engine.version, error=False, seconds=0.0001, units=64)
        time.sleep(0.002)


def test_the_gate_rolls_back_a_disagreeing_version_and_keeps_the_comparison(
    rig: EdgeRig, tmp_path: Path
) -> None:
    recorder, overrides = _gated(
        rig, {"sample": 1.0, "max_cpu_share": 1.0, "min_agreement": 0.9, "min_compared": 40}
    )
    base = build_model("mlp", "1.0.0")
    wrong = models.save(models.disagreeing(base), tmp_path / "wrong/1.1.0.onnx")
    with rig.updater(**overrides) as up:
        runner = ShadowRunner(up.host, seed=5)
        runner._budget = 1e9
        up.health.shadow = runner
        try:
            assert up.sync().updates["mlp"].result == "installed"
            _traffic(up, recorder, runner, 30)
            rig.release_version("1.1.0", "1.0.0", artifact=wrong)
            assert up.sync().updates["mlp"].result == "installed"
            assert up.gates["mlp"].shadow is not None
            _traffic(up, recorder, runner, 60)
            _settled(runner, 60)
            # a rollback whose commit fails is kept, and committed by the next check
            commit_rollback, calls = up.health._commit_rollback, []

            def flaky(*args: Any) -> Any:
                calls.append(args)
                if len(calls) == 1:
                    raise RuntimeError("the first commit fails")
                return commit_rollback(*args)

            up.health._commit_rollback = flaky
            with pytest.raises(RuntimeError, match="first commit"):
                up.check_gates()
            rolled = up.check_gates()
            assert rolled["mlp"].result == "rejected"
            reason = rolled["mlp"].reason or ""
            assert reason.startswith("health gate: agreement ")
            assert "over 60 compared requests" in reason
            assert "at least 90.0% agreement required" in reason
            model = rig.state().models["mlp"]
            assert model.serving.version == "1.0.0"
            assert model.shadow is not None
            assert (model.shadow.version, model.shadow.against) == ("1.1.0", "1.0.0")
            assert model.shadow.agreement == pytest.approx(0.8, abs=0.08)
            shown = rig.cli("edge", "status", "--config", str(rig.config(**overrides)), cwd=rig.tmp)
            assert "  shadow: 1.1.0 against 1.0.0: agreement " in shown.out
        finally:
            runner.close()


def test_a_faithful_version_is_kept_and_compared_on_after_its_gate(
    rig: EdgeRig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gates, "SHADOW_SAVE_S", 0.0)
    recorder, overrides = _gated(
        rig, {"sample": 1.0, "max_cpu_share": 1.0, "min_agreement": 0.9, "min_compared": 20,
              "after": "1s"},
    )  # fmt: skip
    base = build_model("mlp", "1.0.0")
    faithful = models.save(models.nudged(base), tmp_path / "ok/1.1.0.onnx")
    with rig.updater(**overrides) as up:
        runner = ShadowRunner(up.host, seed=6)
        runner._budget = 1e9
        up.health.shadow = runner
        try:
            up.sync()
            _traffic(up, recorder, runner, 30)
            rig.release_version("1.1.0", "1.0.0", artifact=faithful)
            up.sync()
            _traffic(up, recorder, runner, 40)
            _settled(runner, 40)
            time.sleep(0.35)
            closed = up.check_gates()
            assert closed["mlp"].result == "installed"
            assert "agreement 100% over" in (closed["mlp"].reason or "")
            assert up.host.versions("mlp") == ["1.1.0", "1.0.0"]  # compared on, for 1 s
            assert up.next_gate_s() is not None
            _traffic(up, recorder, runner, 10)
            _settled(runner, 50)
            up.check_gates()  # the sums after the gate are committed as they run
            running = rig.state().models["mlp"].shadow
            assert running is not None
            assert running.open
            assert running.compared >= 45
            time.sleep(1.1)
            up.check_gates()
            assert up.host.versions("mlp") == ["1.1.0"]  # the comparison ended: released
            model = rig.state().models["mlp"]
            assert model.last_known_good.version == "1.1.0"
            assert model.shadow is not None
            assert not model.shadow.open
            assert model.shadow.compared >= 45  # the answers after the gate counted too
            assert model.shadow.drift is not None
            assert model.shadow.drift < 0.01
        finally:
            runner.close()


# --- a daemon on loopback --------------------------------------------------------------


def _status(config: Path) -> dict[str, Any]:
    from edge_sync.config import load_edge_config
    from edge_sync.daemon import status_document

    return status_document(load_edge_config(config))


def _wait(config: Path, what: str, test: Any, log: Path, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status = _status(config)
        if test(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"waited for {what}: {status}\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


class _Client:
    """A client sending standard normal inputs, four rows a request, until stopped."""

    def __init__(self, url: str) -> None:
        self.url, self.failures, self.answers = url, [], 0  # type: ignore[var-annotated]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        rng = np.random.default_rng(11)
        while not self.stop.is_set():
            x = rng.standard_normal((4, 16)).astype(np.float32)
            body = json.dumps(
                {
                    "inputs": [
                        {
                            "name": "input",
                            "shape": [4, 16],
                            "datatype": "FP32",
                            "data": x.ravel().tolist(),
                        }
                    ]
                }
            )
            request = urllib.request.Request(self.url, body.encode(), method="POST")  # noqa: S310
            try:
                with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
                    response.read()
                    self.answers += 1
            except (urllib.error.URLError, OSError) as e:
                self.failures.append(str(e))
            time.sleep(0.003)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


@pytest.mark.integration
def test_a_daemon_rolls_back_a_disagreeing_version_and_keeps_a_faithful_one(
    rig: EdgeRig, tmp_path: Path
) -> None:
    shadow = {"sample": 0.5, "max_cpu_share": 0.5, "min_agreement": 0.9, "min_compared": 60}
    config = rig.config(
        serve={"listen": "127.0.0.1:0", "prepack": "off",
               "health_gate": {"window": "2s", "min_requests": 20, "max_latency_ratio": 20}},
        repository={"url": str(rig.root), "branch": "main", "poll_interval": "10m",
                    "jitter": 0.1, "max_backoff": "10m"},
        models=[{"name": "mlp", "channel": "canary", "shadow": shadow}],
    )  # fmt: skip
    base = build_model("mlp", "1.0.0")
    wrong = models.save(models.disagreeing(base), tmp_path / "wrong/1.1.0.onnx")
    faithful = models.save(models.nudged(base), tmp_path / "ok/1.2.0.onnx")
    log_path = tmp_path / "daemon.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "modelreg", "edge", "run", "--config", str(config)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    client = None
    try:
        status = _wait(config, "1.0.0", lambda s: (s["models"]["mlp"]["serving"] or {}).get(
            "version") == "1.0.0" and s["daemon"]["listen"], log_path)  # fmt: skip
        base_url = f"http://{status['daemon']['listen']}"
        client = _Client(f"{base_url}/v2/models/mlp/infer")
        time.sleep(1.5)  # the previous version's baseline

        def sync() -> None:
            asked = urllib.request.Request(f"{base_url}/v2/repository/sync", b"", method="POST")  # noqa: S310
            with urllib.request.urlopen(asked, timeout=30) as response:  # noqa: S310
                assert response.status == 200

        rig.release_version("1.1.0", "1.0.0", artifact=wrong)
        sync()
        status = _wait(config, "the rollback", lambda s: s["models"]["mlp"]["rejected"], log_path)
        model = status["models"]["mlp"]
        assert model["serving"]["version"] == "1.0.0"
        assert model["rejected"][0]["version"] == "1.1.0"
        assert "health gate: agreement" in model["rejected"][0]["reason"]
        compared = model["shadow"]
        assert (compared["version"], compared["against"]) == ("1.1.0", "1.0.0")
        rows = compared["outputs"]["probs"]
        assert 0.65 < rows["top1"] / rows["rows"] < 0.9  # a fifth of the rows rotated

        rig.release_version("1.2.0", "1.0.0", artifact=faithful)
        sync()
        status = _wait(
            config,
            "1.2.0 known good",
            lambda s: (s["models"]["mlp"]["last_known_good"] or {}).get("version") == "1.2.0",
            log_path,
        )
        compared = status["models"]["mlp"]["shadow"]
        assert compared["version"] == "1.2.0"
        assert compared["compared"] >= 60
        rows = compared["outputs"]["probs"]
        assert rows["top1"] / rows["rows"] > 0.99
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as response:  # noqa: S310
            metrics = response.read().decode()
        assert 'modelreg_shadow_agreement{against="1.0.0",model="mlp",version="1.2.0"}' in metrics
        assert "modelreg_shadow_cpu_seconds_total" in metrics
        client.close()
        assert client.failures == []  # the comparisons never failed a client's request
        assert client.answers > 100
    finally:
        if client is not None:
            client.close()
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def test_a_channels_shadow_reaches_its_devices_signed_and_edge_yaml_wins(
    rig: EdgeRig, tmp_path: Path
) -> None:
    """``shadow:`` on a channel in model.yaml travels in the signed channels document;
    a device's own ``shadow`` in edge.yaml wins, ``false`` turns it off."""
    manifest = rig.root / "manifests/mlp/model.yaml"
    text = manifest.read_text()
    assert "canary: 1.0.0" in text
    manifest.write_text(text.replace(
        "canary: 1.0.0",
        "canary: {version: 1.0.0, shadow: {sample: 0.5, min_agreement: 0.9, after: 2s}}"))  # fmt: skip
    rig.run("validate")
    git(rig.root, "commit", "-qam", "compare on canary")
    rig.run("ci", "release")
    signed = sorted(rig.remote.rglob("*channels.json"), key=lambda p: p.stat().st_mtime)
    channels = json.loads(signed[-1].read_text())
    assert channels["models"]["mlp"]["canary"]["shadow"]["sample"] == 0.5
    _gated(rig, {})  # the gate on; each device's own models below
    own = {"models": [{"name": "mlp", "channel": "canary", "shadow": {"sample": 0.2}}]}
    off = {"models": [{"name": "mlp", "channel": "canary", "shadow": False}]}
    for name, overrides in (("follows", {}), ("own", own), ("off", off)):
        with rig.updater(name, **overrides) as up:
            up.sync()
    rig.release_version("1.1.0", "1.0.0")
    assert "shadow:" in manifest.read_text()  # promote kept the channel's shadow
    found = {}
    for name, overrides in (("follows", {}), ("own", own), ("off", off)):
        with rig.updater(name, **overrides) as up:
            up.sync()
            found[name] = up.gates["mlp"].shadow
    assert found["follows"] == ShadowPolicy(sample=0.5, min_agreement=0.9, after_s=2.0)
    assert found["own"] == ShadowPolicy(sample=0.2)
    assert found["off"] is None
