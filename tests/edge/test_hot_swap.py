"""Hot-swap under load, on real HTTP on loopback with the load generator in its own
process (``modelreg.loadgen``):

* 200 requests kept in flight across 24 swaps (each built beside the serving engine
  and self-tested on its goldens, as the updater does): no request fails, and every
  answer equals what the version it names computes;
* a daemon that installs a version which answers right but slowly rolls it back by
  its health gate, under load, without a failed request.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_sync.engine.base import LoadRequest
from edge_sync.engine.host import InProcessHost
from edge_sync.engine.selftest import GoldenArrays, self_test
from edge_sync.serve.app import create_app
from edge_sync.serve.recorder import Recorder
from modelreg.loadgen import LoadResult, run_load_subprocess
from tests.edge import models
from tests.edge.conftest import EdgeRig

pytestmark = pytest.mark.integration

_EXPECTED_ENV = "MODELREG_TEST_EXPECTED"
_expected: dict[str, np.ndarray] = {}


def check(doc: Mapping[str, Any]) -> str | None:
    """The load generator's check (it runs in the generator's process): the answer
    equals what the version it names computes."""
    if not _expected:
        for version, values in json.loads(Path(os.environ[_EXPECTED_ENV]).read_text()).items():
            _expected[version] = np.asarray(values, np.float32)
    want = _expected.get(str(doc.get("model_version")))
    if want is None:
        return f"an answer from version {doc.get('model_version')!r}"
    got = np.asarray(doc["outputs"][0]["data"], np.float32).reshape(want.shape)
    if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
        return f"{doc['model_version']}: max error {float(np.abs(got - want).max()):.3g}"
    return None


@pytest.fixture
def server() -> Iterator[tuple[InProcessHost, Recorder, str]]:
    """The OIP app over an in-process host, on uvicorn in a thread on loopback."""
    import uvicorn

    host, recorder = InProcessHost(prepack="off"), Recorder()
    app = create_app(host, ["mlp"], dict, "test", recorder=recorder)
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                       lifespan="off", access_log=False))  # fmt: skip
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    port = uv.servers[0].sockets[0].getsockname()[1]
    yield host, recorder, f"http://127.0.0.1:{port}"
    uv.should_exit = True
    thread.join(timeout=30)


def test_two_hundred_requests_in_flight_across_twenty_four_swaps(
    server: tuple[InProcessHost, Recorder, str], tmp_path: Path, monkeypatch: Any
) -> None:
    host, recorder, url = server
    x = models.sample()
    requests, cases, expected = [], [], {}
    for version, changed in (("1.0.0", ()), ("1.1.0", (1,))):
        path = models.save(models.mlp(changed=changed), tmp_path / version / "m.onnx")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        requests.append(LoadRequest("mlp", version, path, digest))
        reference = InProcessHost(prepack="on").build(requests[-1])
        expected[version] = reference.run({"x": x})["y"]
        cases.append([GoldenArrays("sample", {"x": x}, {"y": expected[version]}, 1e-4, 1e-5)])
    out = tmp_path / "expected.json"
    out.write_text(json.dumps({v: a.tolist() for v, a in expected.items()}))
    monkeypatch.setenv(_EXPECTED_ENV, str(out))
    host.swap("mlp", host.build(requests[0]))
    body = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}]}).encode()  # fmt: skip
    swaps: list[float] = []

    def swapper() -> None:
        deadline = time.monotonic() + 60
        while recorder.window("mlp", "1.0.0", 0, time.monotonic() + 1).requests < 500:
            assert time.monotonic() < deadline
            time.sleep(0.05)  # the load is on
        for i in range(24):
            engine = host.build(requests[(i + 1) % 2])
            self_test(engine, cases[(i + 1) % 2])
            old = host.swap("mlp", engine)
            assert old is not None
            host.retire(old)
            swaps.append(time.monotonic())
            time.sleep(0.1)

    thread = threading.Thread(target=swapper)
    thread.start()
    result: LoadResult = run_load_subprocess(
        f"{url}/v2/models/mlp/infer", body, concurrency=200, duration_s=10,
        check="tests.edge.test_hot_swap:check",
    )  # fmt: skip
    thread.join()
    assert len(swaps) == 24
    after_last = recorder.window("mlp", "1.0.0", swaps[-1], time.monotonic() + 1).requests
    assert after_last > 0  # the load outlasted the swaps
    assert result.failures == {}
    counts = result.version_counts()
    assert set(counts) == {"1.0.0", "1.1.0"}
    assert result.requests > 2000
    assert len(host.loaded()) == 1  # every replaced engine drained and released
    from edge_sync.serve.metrics import Metrics

    text = Metrics(host).text().decode()
    shared = models.WIDTH**2 * 4 * (models.LAYERS - 1)  # one layer changed
    assert (
        f'modelreg_engine_weight_bytes{{model="mlp",shared="true",version="1.0.0"}} {shared:.1f}'
        in text
    )
    assert 'modelreg_engine_cache_hits_total{model="mlp"}' in text


def _status(config: Path) -> dict[str, Any]:
    """The document ``modelreg edge status --json`` prints, read in this process (a
    process a poll took a second of the CPU the daemon and its load share, and
    test_daemon runs the command itself)."""
    from edge_sync.config import load_edge_config
    from edge_sync.daemon import status_document

    return status_document(load_edge_config(config))


def _wait(config: Path, what: str, test: Any, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status = _status(config)
        if test(status):
            return status
        assert time.monotonic() < deadline, f"waited for {what}: {status}"
        time.sleep(0.2)


def _run_s(path: Path, x: np.ndarray) -> float:
    """The median run of the model at ``path`` on ``x``, as the daemon builds it."""
    host = InProcessHost(prepack="off")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    engine = host.build(LoadRequest("timing", path.parent.name, path, digest))
    try:
        runs = []
        for i in range(600):
            start = time.perf_counter()
            engine.run({"input": x})
            if i >= 100:  # warmed up
                runs.append(time.perf_counter() - start)
        return float(np.median(runs))
    finally:
        engine.close()


def _slower(base: Path, out: Path, extra_s: float) -> tuple[Path, float]:
    """``base`` made about ``extra_s`` slower a run at batch 2 (same answers: extra
    64 x 64 products added times zero), and the extra time measured here."""
    import onnx

    model = onnx.load(str(base))
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
    fast = _run_s(base, x)
    matmuls, extra, path = 16, 0.0, base
    for attempt in range(6):  # a few secant steps on the number of products
        path = models.save(models.slowed(model, matmuls, width=64), out / f"{attempt}/m.onnx")
        extra = _run_s(path, x) - fast
        if abs(extra - extra_s) < extra_s * 0.15:
            break
        matmuls = max(1, round(matmuls * extra_s / max(extra, 1e-6)))
    return path, extra


def test_a_slow_version_is_rolled_back_under_load_without_a_failed_request(
    rig: EdgeRig, tmp_path: Path
) -> None:
    # one poll in 10 minutes: the sync is asked for, and the rollback is committed
    # while the gate is watched, not at the next poll
    config = rig.config(
        serve={"listen": "127.0.0.1:0", "prepack": "off",
               "health_gate": {"window": "2s", "min_requests": 20, "max_latency_ratio": 2}},
        repository={"url": str(rig.root), "branch": "main", "poll_interval": "10m",
                    "jitter": 0.1, "max_backoff": "10m"},
    )  # fmt: skip
    import onnx

    slow = models.slowed(onnx.load(str(rig.models / "mlp/1.1.0.onnx")), matmuls=96)
    slow_path = models.save(slow, tmp_path / "slow" / "1.1.0.onnx")
    log = (tmp_path / "daemon.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "modelreg", "edge", "run", "--config", str(config)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        status = _wait(config, "1.0.0", lambda s: (s["models"]["mlp"]["serving"] or {}).get(
            "version") == "1.0.0" and s["daemon"]["listen"])  # fmt: skip
        url = f"http://{status['daemon']['listen']}/v2/models/mlp/infer"
        x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
        body = json.dumps({"inputs": [{"name": "input", "shape": [2, 16], "datatype": "FP32",
                                       "data": x.reshape(-1).tolist()}]}).encode()  # fmt: skip
        results: list[LoadResult] = []
        stop = threading.Event()

        def bursts() -> None:  # load until told to stop, however long the release takes
            while not stop.is_set():
                results.append(run_load_subprocess(url, body, concurrency=32, duration_s=3))

        load = threading.Thread(target=bursts)
        load.start()
        time.sleep(2)  # the baseline: 1.0.0 under this load
        rig.release_version("1.1.0", "1.0.0", artifact=slow_path)
        base = url.rsplit("/v2/", 1)[0]
        asked = urllib.request.Request(f"{base}/v2/repository/sync", b"", method="POST")  # noqa: S310
        with urllib.request.urlopen(asked, timeout=30) as response:  # noqa: S310
            assert response.status == 200
        try:
            status = _wait(config, "the rollback", lambda s: s["models"]["mlp"]["rejected"])
        except AssertionError:
            log.flush()
            raise AssertionError((tmp_path / "daemon.log").read_text()[-3000:]) from None
        model = status["models"]["mlp"]
        assert model["serving"]["version"] == "1.0.0"
        assert model["rejected"][0]["version"] == "1.1.0"
        reason = model["rejected"][0]["reason"]
        assert "health gate: median latency" in reason
        assert "in two windows in a row" in reason  # a latency failure is retried once
        assert model["last_update"]["result"] == "rejected"
        bursts_then = len(results)
        deadline = time.monotonic() + 60
        while len(results) < bursts_then + 2:  # a whole burst after the rollback
            assert time.monotonic() < deadline
            time.sleep(0.2)
        stop.set()
        load.join()
        assert [r.failures for r in results if r.failed] == []
        served = [r.version_counts() for r in results]
        assert any("1.1.0" in v for v in served)  # it served, then went
        assert set(served[-1]) == {"1.0.0"}
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as response:  # noqa: S310
            metrics = response.read().decode()
        assert 'modelreg_rollbacks_total{model="mlp"} 1.0' in metrics
        assert 'modelreg_updates_total{model="mlp",result="rejected"} 1.0' in metrics
        assert 'modelreg_engine_loaded{model="mlp",version="1.0.0"} 1.0' in metrics
        with urllib.request.urlopen(f"{base}/status", timeout=30) as response:  # noqa: S310
            live = json.loads(response.read())
        assert live["models"]["mlp"]["serving"]["version"] == "1.0.0"
        assert live["gates"] == {}
        (engine,) = live["engines"]["mlp"]  # the rejected one released
        assert (engine["version"], engine["serving"], engine["shared_weights"]) == (
            "1.0.0", True, True)  # fmt: skip
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def test_one_kill_during_a_gate_reopens_it_and_a_second_rejects_the_version(
    rig: EdgeRig, tmp_path: Path
) -> None:
    """SIGKILL (a power cut, the OOM killer) while 1.1.0's gate watches: the restart
    watches 1.1.0 again, counted; a second SIGKILL during that gate rejects it and the
    device serves 1.0.0."""
    config = rig.config(serve={"listen": "127.0.0.1:0", "health_gate": {"window": "10m"}})
    argv = [sys.executable, "-m", "modelreg", "edge", "run", "--config", str(config)]
    log = (tmp_path / "daemon.log").open("w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(config, "1.0.0", lambda s: (s["models"]["mlp"]["serving"] or {}).get(
            "version") == "1.0.0")  # fmt: skip
        rig.release_version("1.1.0", "1.0.0")
        status = _wait(config, "1.1.0", lambda s: (s["models"]["mlp"]["serving"] or {}).get(
            "version") == "1.1.0")  # fmt: skip
        assert status["models"]["mlp"]["gate"]["version"] == "1.1.0"
        proc.kill()  # as a power cut would
        proc.wait(timeout=60)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        status = _wait(config, "the restart", lambda s: s["daemon"].get("pid") == proc.pid)
        base = f"http://{status['daemon']['listen']}"
        live = _wait_live(base, lambda doc: "mlp" in doc["gates"])
        assert live["gates"]["mlp"]["version"] == "1.1.0"  # watched again, 1.0.0 loaded
        model = live["models"]["mlp"]
        assert model["serving"]["version"] == "1.1.0"
        assert model["rejected"] == []
        gate = rig.state().models["mlp"].gate  # counted in the state
        assert (gate.version, gate.unclean_stops) == ("1.1.0", 1)
        proc.kill()  # as a crash on its first requests would, again
        proc.wait(timeout=60)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        status = _wait(config, "the rejection", lambda s: s["models"]["mlp"]["rejected"])
        model = status["models"]["mlp"]
        assert model["serving"]["version"] == "1.0.0"
        assert model["rejected"][0]["version"] == "1.1.0"
        assert "stopped unexpectedly twice during its health gate" in model["rejected"][0]["reason"]
        assert model["gate"] is None
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def _wait_live(base: str, test: Any, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{base}/status", timeout=30) as response:  # noqa: S310
                doc: dict[str, Any] = json.loads(response.read())
        except OSError:
            doc = {}
        if doc and test(doc):
            return doc
        assert time.monotonic() < deadline, f"waited for {base}/status: {doc}"
        time.sleep(0.2)


def _post(url: str, batch: int) -> tuple[int, str]:
    """An inference request of ``batch`` rows; (status, the version that answered)."""
    x = np.linspace(-1, 1, batch * 16, dtype=np.float32)
    body = json.dumps({"inputs": [{"name": "input", "shape": [batch, 16], "datatype": "FP32",
                                   "data": x.tolist()}]}).encode()  # fmt: skip
    request = urllib.request.Request(  # noqa: S310 - a loopback URL the test made
        url, body, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
            return response.status, response.headers.get("x-model-version", "")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("x-model-version", "")


def test_large_requests_after_the_swap_eject_no_good_version_and_a_slow_one_still_goes(
    rig: EdgeRig, tmp_path: Path
) -> None:
    """The attack of issue 23: a client sees the swap in ``x-model-version`` and sends
    25 valid, large requests; the gate compares latency size for size, so the good
    version passes (before, its p99 was theirs, against the small requests' before).
    Then a version about 5x slower (more layers, same answers) is rejected, through the
    same server and clients."""
    config = rig.config(
        serve={"listen": "127.0.0.1:0", "prepack": "off",
               "health_gate": {"window": "2s", "min_requests": 20, "max_latency_ratio": 2},
               # batches of 2000 are valid for this device: the attack is within its caps
               "limits": {"model": {"max_batch": 4096}}},
    )  # fmt: skip
    log = (tmp_path / "daemon.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "modelreg", "edge", "run", "--config", str(config)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    stop = threading.Event()
    answered: list[tuple[int, str]] = []

    def users(url: str) -> None:  # the other clients: small requests, all along
        while not stop.is_set():
            answered.append(_post(url, 2))
            time.sleep(0.02)

    try:
        status = _wait(config, "1.0.0", lambda s: (s["models"]["mlp"]["serving"] or {}).get(
            "version") == "1.0.0" and s["daemon"]["listen"])  # fmt: skip
        url = f"http://{status['daemon']['listen']}/v2/models/mlp/infer"
        background = threading.Thread(target=users, args=(url,))
        background.start()
        while sum(1 for _, v in answered if v == "1.0.0") < 60:  # the baseline
            time.sleep(0.1)
        rig.release_version("1.1.0", "1.0.0")
        deadline = time.monotonic() + 120
        while _post(url, 2)[1] != "1.1.0":  # the attacker watches for the swap
            assert time.monotonic() < deadline
            time.sleep(0.02)
        attack = [_post(url, 2000) for _ in range(25)]
        assert {code for code, _ in attack} == {200}
        assert {v for _, v in attack} == {"1.1.0"}
        try:
            status = _wait(config, "the gate's verdict", lambda s: (
                s["models"]["mlp"]["last_known_good"] or {}).get("version") == "1.1.0"
                or s["models"]["mlp"]["rejected"])  # fmt: skip
        except AssertionError:
            log.flush()
            raise AssertionError((tmp_path / "daemon.log").read_text()[-3000:]) from None
        model = status["models"]["mlp"]
        assert model["rejected"] == [], model["rejected"]
        assert (model["serving"]["version"], model["last_known_good"]["version"]) == (
            "1.1.0", "1.1.0")  # fmt: skip
        log.flush()
        said = (tmp_path / "daemon.log").read_text()
        assert "1.1.0 kept: health gate passed" in said
        assert "median latency" in said  # the small requests compared, the large left out
        # and a version that really is about 5x slower, as this server runs 1.1.0, is
        # still rejected
        served_s = float(said.split("1.1.0 kept:")[1].split("answers, median ")[1].split()[0])
        served_s /= 1000
        slow_path, extra = _slower(rig.models / "mlp/1.1.0.onnx", tmp_path / "slow", 4 * served_s)
        ratio = (served_s + extra) / served_s
        # calibrated on a shared machine: anywhere well past the 2x threshold will do
        assert 3 < ratio < 12, (served_s, extra)
        rig.release_version("1.2.0", "1.1.0", artifact=slow_path)
        try:
            status = _wait(config, "1.2.0's verdict", lambda s: s["models"]["mlp"]["rejected"],
                           timeout=180)  # fmt: skip
        except AssertionError:
            log.flush()
            raise AssertionError((tmp_path / "daemon.log").read_text()[-3000:]) from None
        model = status["models"]["mlp"]
        assert (model["serving"]["version"], model["rejected"][0]["version"]) == (
            "1.1.0", "1.2.0")  # fmt: skip
        reason = model["rejected"][0]["reason"]
        assert "in two windows in a row" in reason
        seen = float(reason.split("median latency ")[1].split("x")[0])
        print(f"1.2.0: {ratio:.2f}x slower here, {seen:.2f}x by the daemon's gate")
        assert {code for code, _ in answered} == {200}  # no request failed meanwhile
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
