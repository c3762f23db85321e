"""The health gate: the pure decision (``edge_sync.health.judge``), the recorder, and
the updater's gate after a real install (the previous engine kept loaded, swapped back
and the version rejected on failure; made last known good on success)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from edge_sync.health import GatePolicy, Recorder, Window, judge

POLICY = GatePolicy(window_s=10, min_requests=20, max_error_rate=0.05, max_latency_ratio=2.0)
STEADY = Window(requests=500, errors=0, p99_s=0.010)


@pytest.mark.parametrize(
    ("new", "elapsed", "decision", "says"),
    [
        (Window(40, 0, 0.011), 3, "wait", ""),
        (Window(40, 0, 0.011), 10, "pass", "40 requests, 0 failed, p99 11.0 ms"),
        (Window(40, 3, 0.011), 3, "fail", "3 of 40 requests failed"),  # errors: at once
        (Window(10, 3, 0.011), 3, "wait", ""),  # too few to judge errors yet
        (Window(40, 2, 0.011), 10, "pass", ""),  # 5 %: within
        (Window(40, 0, 0.025), 3, "wait", ""),  # latency waits for the window
        (Window(40, 0, 0.025), 10, "fail", "2.5x the previous version's"),
        (Window(5, 0, 0.900), 10, "wait", ""),  # too few: the window is extended
        (Window(5, 0, 0.900), 40, "pass", "not judged: 5 requests in 40 s"),  # 4x: no more
        (Window(0, 0, None), 40, "pass", "not judged: 0 requests"),
        (Window(19, 19, 0.01), 10, "fail", "19 of 19 requests failed"),  # few, all failed
        (Window(2, 2, 0.01), 10, "wait", ""),  # two errors: not yet evidence
    ],
)
def test_judge(new: Window, elapsed: float, decision: str, says: str) -> None:
    verdict = judge(POLICY, new, STEADY, elapsed)
    assert verdict.decision == decision
    assert says in verdict.reason


def test_latency_is_not_judged_without_a_baseline() -> None:
    before = Window(requests=3, errors=0, p99_s=0.001)
    verdict = judge(POLICY, Window(100, 0, 1.0), before, 11)
    assert verdict.decision == "pass"
    assert "not compared: the previous version answered 3" in verdict.reason


def test_the_recorder_windows_by_time_and_version() -> None:
    recorder = Recorder(keep=100)
    t0 = time.monotonic()
    for i in range(100):
        recorder.record("m", "1", error=i % 10 == 0, seconds=i / 1000)
    recorder.record("m", "2", error=False, seconds=5.0)
    window = recorder.window("m", "1", t0, time.monotonic() + 1)
    assert (window.requests, window.errors) == (100, 10)
    assert window.p99_s == pytest.approx(0.099)  # errors carry no latency
    assert recorder.window("m", "1", time.monotonic() + 1, time.monotonic() + 2).requests == 0
    assert recorder.window("m", "2", t0, time.monotonic() + 1).p99_s == 5.0
    recorder.forget("m", "1")
    assert recorder.window("m", "1", t0, time.monotonic() + 1).requests == 0


def _gated(rig: Any, window_s: float = 0.3) -> Recorder:
    recorder = Recorder()
    rig.updater_options = {
        "gate": GatePolicy(window_s=window_s, min_requests=5, max_latency_ratio=2.0),
        "recorder": recorder,
    }
    return recorder


def _answers(recorder: Recorder, version: str, n: int, seconds: float, error: bool = False) -> None:
    for _ in range(n):
        recorder.record("mlp", version, error=error, seconds=seconds)


def test_a_slow_version_is_swapped_back_and_rejected(rig: Any) -> None:
    recorder = _gated(rig)
    with rig.updater() as up:
        assert up.sync().updates["mlp"].result == "installed"  # 1.0.0: nothing to gate
        assert up.gates == {}
        _answers(recorder, "1.0.0", 50, 0.002)
        rig.release_version("1.1.0", "1.0.0")
        assert up.sync().updates["mlp"].result == "installed"
        host = up.host
        assert host.versions("mlp") == ["1.1.0", "1.0.0"]  # the previous one kept loaded
        assert rig.state().models["mlp"].last_known_good.version == "1.0.0"
        _answers(recorder, "1.1.0", 50, 0.020)
        assert up.check_gates() == {}  # the window has not passed
        time.sleep(0.35)
        rolled = up.check_gates()
        assert rolled["mlp"].result == "rejected"
        assert "p99 latency" in (rolled["mlp"].reason or "")
        assert host.current("mlp").version == "1.0.0"
        assert host.versions("mlp") == ["1.0.0"]  # the rejected engine released
        model = rig.state().models["mlp"]
        assert model.serving.version == "1.0.0"
        assert model.last_update.result == "rejected"
        assert [r.version for r in model.rejected] == ["1.1.0"]
        assert "health gate" in model.rejected[0].reason
        # not tried again while its signed metadata is the same
        assert "mlp" not in up.sync().updates
        assert host.current("mlp").version == "1.0.0"


def test_server_errors_fail_the_gate_before_its_window_ends(rig: Any) -> None:
    recorder = _gated(rig, window_s=60)
    with rig.updater() as up:
        up.sync()
        rig.release_version("1.1.0", "1.0.0")
        up.sync()
        _answers(recorder, "1.1.0", 10, 0.001, error=True)
        rolled = up.check_gates()
        assert "10 of 10 requests failed" in (rolled["mlp"].reason or "")
        assert up.host.current("mlp").version == "1.0.0"


def test_a_healthy_version_becomes_last_known_good_and_the_old_engine_goes(rig: Any) -> None:
    recorder = _gated(rig)
    with rig.updater() as up:
        up.sync()
        _answers(recorder, "1.0.0", 50, 0.002)
        rig.release_version("1.1.0", "1.0.0")
        up.sync()
        old = next(e for e in up.host.loaded() if e.version == "1.0.0")
        _answers(recorder, "1.1.0", 50, 0.0025)
        time.sleep(0.35)
        closed = up.check_gates()
        assert closed["mlp"].result == "installed"
        assert "health gate passed: 50 requests" in (closed["mlp"].reason or "")
        assert up.gates == {}
        assert up.host.versions("mlp") == ["1.1.0"]
        assert not old.loaded
        model = rig.state().models["mlp"]
        assert (model.serving.version, model.last_known_good.version) == ("1.1.0", "1.1.0")


def test_a_newer_version_during_a_gate_replaces_it_unjudged_keeping_the_fallback(
    rig: Any,
) -> None:
    """1.1.0 is swapped in and watched; 2.0.0 arrives before the gate decided: 1.1.0 is
    neither kept as known good nor rejected, and if 2.0.0 fails its gate the device goes
    back to 1.0.0, the last version known good."""
    recorder = _gated(rig, window_s=0.3)
    with rig.updater() as up:
        up.sync()
        _answers(recorder, "1.0.0", 50, 0.002)
        rig.release_version("1.1.0", "1.0.0")
        up.sync()
        assert up.gates["mlp"].version == "1.1.0"
        rig.release_version("2.0.0", "1.1.0")
        assert up.sync().updates["mlp"].result == "installed"  # 1.1.0 had no answers yet
        gate = up.gates["mlp"]
        assert (gate.version, gate.old.version) == ("2.0.0", "1.0.0")
        assert up.host.versions("mlp") == ["2.0.0", "1.0.0"]  # 1.1.0 released
        assert rig.state().models["mlp"].last_known_good.version == "1.0.0"
        _answers(recorder, "2.0.0", 50, 0.050)
        time.sleep(0.35)
        assert up.check_gates()["mlp"].result == "rejected"
        model = rig.state().models["mlp"]
        assert model.serving.version == "1.0.0"
        assert up.host.current("mlp").version == "1.0.0"
        assert [r.version for r in model.rejected] == ["2.0.0"]


def test_a_failed_commit_after_a_swap_releases_the_new_engine_once_drained(
    rig: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state cannot be saved after the swap (a full disk): the old engine serves
    again, and the new one is released only when the requests on it are done (it was
    closed under them before, and a run on freed weights crashes the process)."""
    with rig.updater() as up:
        up.sync()
        rig.release_version("1.1.0", "1.0.0")
        host = up.host
        held: list[Any] = []
        real_swap = host.swap

        def swap_and_hold(model: str, engine: Any) -> Any:
            old = real_swap(model, engine)
            if engine.version == "1.1.0":
                lease = host.lease(model)  # a request arrives on the new engine
                held.append((lease, lease.__enter__()))
            return old

        def full_disk(_state: Any) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(host, "swap", swap_and_hold)
        monkeypatch.setattr(up.state, "commit", full_disk)
        assert up.sync().updates["mlp"].result == "failed"
        monkeypatch.undo()
        ((lease, engine),) = held
        assert host.current("mlp").version == "1.0.0"
        assert engine.loaded  # a request still runs on it
        assert host.versions("mlp") == ["1.0.0"]  # but no new request reaches it
        lease.__exit__(None, None, None)
        assert not engine.loaded


def _gate_open_on_1_1_0(rig: Any) -> None:
    with rig.updater() as up:
        up.sync()
        rig.release_version("1.1.0", "1.0.0")
        up.sync()
        assert up.gates["mlp"].version == "1.1.0"
    gate = rig.state().models["mlp"].gate  # kept in the state while it watches
    assert gate is not None
    assert (gate.version, gate.restore_serving.version) == ("1.1.0", "1.0.0")


def test_a_version_watched_when_the_daemon_died_is_rejected_at_restart(rig: Any) -> None:
    """A version that crashes the daemon (a native fault, memory) must not be served
    again and again by a restart loop: its gate never closed, so it is not trusted."""
    from edge_sync.host import InProcessHost

    _gated(rig, window_s=60)
    _gate_open_on_1_1_0(rig)
    rig.hosts["device"] = InProcessHost()  # a new process
    with rig.updater() as up:
        assert up.resume(unclean=True) == {}
        assert up.host.current("mlp").version == "1.0.0"
        model = rig.state().models["mlp"]
        assert (model.serving.version, model.gate) == ("1.0.0", None)
        assert model.last_update.result == "rejected"
        assert "stopped unexpectedly while the health gate watched" in model.rejected[0].reason
        assert "mlp" not in up.sync().updates  # not tried again
        assert up.host.current("mlp").version == "1.0.0"


def test_a_clean_restart_watches_the_version_again(rig: Any) -> None:
    from edge_sync.host import InProcessHost

    recorder = _gated(rig, window_s=0.3)
    _gate_open_on_1_1_0(rig)
    rig.hosts["device"] = InProcessHost()
    with rig.updater() as up:
        up.resume(unclean=False)
        assert up.host.current("mlp").version == "1.1.0"
        assert up.gates["mlp"].old.version == "1.0.0"  # loaded to fall back to
        _answers(recorder, "1.1.0", 50, 0.002)
        time.sleep(0.35)
        assert up.check_gates()["mlp"].result == "installed"
        model = rig.state().models["mlp"]
        assert (model.last_known_good.version, model.gate) == ("1.1.0", None)


def test_the_watcher_swaps_a_failing_version_back_at_once_and_the_loop_commits_it(
    rig: Any,
) -> None:
    """The daemon's watcher thread swaps back as soon as a gate fails (a sync busy with
    a long download must not keep it serving); the loop commits the state after."""
    import threading

    recorder = _gated(rig, window_s=60)
    with rig.updater() as up:
        up.sync()
        rig.release_version("1.1.0", "1.0.0")
        up.sync()
        _answers(recorder, "1.1.0", 30, 0.001, error=True)
        swapped: list[str] = []
        watcher = threading.Thread(target=lambda: swapped.extend(up.watch_gates()))
        watcher.start()
        watcher.join()
        assert swapped == ["mlp"]
        assert up.host.current("mlp").version == "1.0.0"  # serving the old one already
        assert rig.state().models["mlp"].serving.version == "1.1.0"  # not committed yet
        closed = up.check_gates()
        assert closed["mlp"].result == "rejected"
        model = rig.state().models["mlp"]
        assert (model.serving.version, model.gate) == ("1.0.0", None)
        assert [r.version for r in model.rejected] == ["1.1.0"]
