"""The health gate: the pure decision (``edge_sync.decide.health.judge``), the recorder, and
the updater's gate after a real install (the previous engine kept loaded, swapped back
and the version rejected on failure; made last known good on success)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from edge_sync.decide.health import GatePolicy, Window, compare_latency, judge
from edge_sync.decide.restarts import after_stop, rejection_reason
from edge_sync.errors import StoppedError
from edge_sync.serve.recorder import Recorder

POLICY = GatePolicy(window_s=10, min_requests=20, max_error_rate=0.05, max_latency_ratio=2.0)


def win(requests: int, errors: int = 0, seconds: float = 0.010, units: int = 32) -> Window:
    """A window of ``requests`` answers of ``units`` input elements, each ``seconds``."""
    return Window(requests, errors, ((units, seconds),) * (requests - errors))


def mixed(*parts: Window) -> Window:
    return Window(sum(p.requests for p in parts), sum(p.errors for p in parts),
                  tuple(x for p in parts for x in p.latencies))  # fmt: skip


STEADY = win(500)
"""The previous version: 500 answers of 32 elements, 10 ms each."""
TWO_SIZES = mixed(win(200), win(200, seconds=1.0, units=32_000))


F, R = False, True  # a first window, a second one (after a latency failure)


@pytest.mark.parametrize(
    ("new", "before", "when", "verdict"),
    [
        (win(40, 0, 0.011), STEADY, (3, F), ("wait", "")),
        (win(40, 0, 0.011), STEADY, (10, F), ("pass", "40 requests, 0 failed, median latency 1.10x")),
        (win(40, 3, 0.011), STEADY, (3, F), ("fail", "3 of 40 requests failed")),  # at once
        (win(40, 10, 0.011), STEADY, (3, F), ("fail", "10 of 40")),  # errors: never retried
        (win(10, 3, 0.011), STEADY, (3, F), ("wait", "")),  # too few to judge errors yet
        (win(40, 2, 0.011), STEADY, (10, F), ("pass", "")),  # 5 %: within
        (win(40, 0, 0.025), STEADY, (3, F), ("wait", "")),  # latency waits for the window
        # a latency-only failure: one more window, then the verdict
        (win(40, 0, 0.025), STEADY, (10, F), ("retry", "median latency 2.50x the previous")),
        (win(40, 0, 0.025), STEADY, (10, R), ("fail", "2.50x the previous version's, size for")),
        (win(40, 0, 0.050), STEADY, (10, R), ("fail", "40 answers, median 50.00 ms, against 500")),
        (win(5, 0, 0.900), STEADY, (10, F), ("wait", "")),  # too few: the window is extended
        (win(5, 0, 0.900), STEADY, (40, F), ("pass", "not judged: 5 requests in 40 s")),
        (win(0), STEADY, (40, F), ("pass", "not judged: 0 requests")),  # no traffic: no blame
        (win(19, 19), STEADY, (10, F), ("fail", "19 of 19 requests failed")),  # few, all failed
        (win(2, 2), STEADY, (10, F), ("wait", "")),  # two errors: not yet evidence
        # the attack: large requests right after the swap, none of that size before
        (win(40, 0, 0.5, units=32_000), STEADY, (10, F), ("wait", "")),
        (win(40, 0, 0.5, units=32_000), STEADY, (40, F),
         ("pass", "latency not compared: 0 of 40 answers in a size class")),
        (mixed(win(25, 0, 0.5, units=32_000), win(30, 0, 0.011)), STEADY, (10, F),
         ("pass", "median latency 1.10x")),  # the large ones are left out
        # sizes seen before are compared with their own kind
        (win(40, 0, 1.1, units=32_000), TWO_SIZES, (10, F), ("pass", "1.10x")),
        (win(40, 0, 5.0, units=30_000), TWO_SIZES, (10, F), ("retry", "5.00x")),
        (mixed(win(20, 0, 0.05), win(20, 0, 5.0, units=32_000)), TWO_SIZES, (10, R),
         ("fail", "5.00x the previous version's, size for size (40 answers")),
    ],
)  # fmt: skip
def test_judge(
    new: Window, before: Window, when: tuple[float, bool], verdict: tuple[str, str]
) -> None:
    elapsed, retried = when
    decided = judge(POLICY, new, before, elapsed, retried=retried)
    assert decided.decision == verdict[0]
    assert verdict[1] in decided.reason


def test_latency_is_not_judged_without_a_baseline() -> None:
    verdict = judge(POLICY, win(100, 0, 1.0), win(3, 0, 0.001), 11)
    assert verdict.decision == "pass"
    assert "latency not compared: 0 of 100 answers" in verdict.reason


def test_latency_evidence_names_samples_statistics_and_sizes() -> None:
    new = mixed(win(30, 0, 0.030, units=40), win(5, 0, 0.030, units=64))  # 64: no baseline
    before = mixed(win(40, 0, 0.010, units=32), win(3, 0, 0.010, units=64))  # 3 < 5 per class
    latency = compare_latency(new, before, 20)
    assert (latency.new, latency.before, latency.seen) == (30, 40, 35)
    assert latency.ratio == pytest.approx(3.0)
    assert latency.sizes == (40, 40)  # 32 and 40 are one size class (within sqrt 2)
    assert "3.00x" in latency.text()
    assert "40 to 40 input elements" in latency.text()
    few = compare_latency(win(19, 0, 0.030), before, 20)
    assert few.ratio is None  # fewer than the minimum compared on the new side
    thin = compare_latency(win(30), win(19), 20)
    assert thin.ratio is None  # nor on the baseline's


@pytest.mark.parametrize(
    ("given", "decided"),
    [  # (record, unclean stops before, this stop unclean, gate configured)
        (("gate", 0, False, True), ("reopen", 0)),  # a clean stop: watch it again
        (("gate", 0, True, True), ("reopen", 1)),  # one power cut is no verdict
        (("gate", 1, False, True), ("reopen", 1)),
        (("gate", 1, True, True), ("reject", 2)),  # the second: it is the cause
        (("gate", 0, False, False), ("stand", 0)),  # gates turned off: the version stands
        (("gate", 0, True, False), ("stand", 1)),
        (("gate", 1, True, False), ("reject", 2)),
        (("attempt", 0, False, True), ("keep", 0)),
        (("attempt", 0, True, True), ("keep", 1)),
        (("attempt", 1, True, True), ("reject", 2)),
    ],
)
def test_after_stop(given: tuple[Any, int, bool, bool], decided: tuple[str, int]) -> None:
    record, before, unclean, gated = given
    assert after_stop(record, before, unclean=unclean, gated=gated) == decided


def test_rejection_reasons() -> None:
    assert "stopped unexpectedly twice during its health gate" in rejection_reason("gate", 2)
    assert "twice while it was being loaded" in rejection_reason("attempt", 2)


def test_the_recorder_windows_by_time_and_version() -> None:
    recorder = Recorder(keep=101)
    t0 = time.monotonic()
    recorder.record("m", "1", error=True, seconds=9.0, units=1)  # dropped: 101 kept
    for i in range(100):
        recorder.record("m", "1", error=i % 10 == 0, seconds=i / 1000, units=i)
    recorder.record("m", "1", error=False, seconds=9.0, units=None)
    recorder.record("m", "2", error=False, seconds=5.0, units=8)
    recorder.record("m", "2", error=False, seconds=5.0)  # no size: errors only
    window = recorder.window("m", "1", t0, time.monotonic() + 1)
    assert (window.requests, window.errors) == (101, 10)
    assert len(window.latencies) == 90  # errors carry no latency, nor an unknown size
    assert (50, 0.05) not in window.latencies  # an error
    assert (51, 0.051) in window.latencies
    assert recorder.window("m", "1", time.monotonic() + 1, time.monotonic() + 2).requests == 0
    two = recorder.window("m", "2", t0, time.monotonic() + 1)
    assert (two.requests, two.latencies) == (2, ((8, 5.0),))
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
        recorder.record("mlp", version, error=error, seconds=seconds, units=32)


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
        # the text view shows the open gate, the previous and last known good versions
        # (issue 27, bug 7: only --json did)
        shown = _status_text(rig)
        assert "  health gate: open on 1.1.0 since " in shown
        assert "  previous: 1.0.0 (" in shown
        assert "  last known good: 1.0.0 (" in shown
        _answers(recorder, "1.1.0", 50, 0.020)
        assert up.check_gates() == {}  # the window has not passed
        time.sleep(0.35)
        assert up.check_gates() == {}  # latency alone: a second window first
        ((model_name, said),) = up.take_retries()
        assert model_name == "mlp"
        assert "median latency 10.00x" in said
        assert up.gates["mlp"].retried
        assert host.current("mlp").version == "1.1.0"
        _answers(recorder, "1.1.0", 50, 0.020)
        time.sleep(0.35)
        rolled = up.check_gates()
        assert rolled["mlp"].result == "rejected"
        assert "median latency 10.00x the previous version's, size for size (50 answers" in (
            rolled["mlp"].reason or "")  # fmt: skip
        assert "in two windows in a row" in (rolled["mlp"].reason or "")
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
        shown = _status_text(rig)
        assert "health gate: open" not in shown
        # where the version served came from (a release by hand: no PR, no CI run)
        assert "\n  provenance: no pull request known; not released by CI (commit " in shown
        assert "  last update: rejected 1.1.0 at " in shown  # no "via -, 0 bytes"
        assert "via -" not in shown
        assert "  rejected 1.1.0: health gate" in shown


def _status_text(rig: Any) -> str:
    r = rig.cli("edge", "status", "--config", str(rig.config()), cwd=rig.tmp)
    assert r.code == 0, r.err
    return str(r.out) + str(r.err)


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


def test_a_gate_with_no_traffic_ends_unjudged_and_blames_nothing(rig: Any) -> None:
    """No request in four windows (the window, extended three times): the version
    stands, known good, with "not judged" as the reason (docs/reference/daemon.md)."""
    recorder = _gated(rig, window_s=0.1)
    with rig.updater() as up:
        up.sync()
        _answers(recorder, "1.0.0", 50, 0.002)
        rig.release_version("1.1.0", "1.0.0")
        up.sync()
        time.sleep(0.25)
        assert up.check_gates() == {}  # extended: no traffic yet
        time.sleep(0.2)
        closed = up.check_gates()["mlp"]
        assert (closed.result, closed.version) == ("installed", "1.1.0")
        assert "health gate not judged: 0 requests" in (closed.reason or "")
        model = rig.state().models["mlp"]
        assert (model.serving.version, model.last_known_good.version) == ("1.1.0", "1.1.0")
        assert (model.gate, model.rejected) == (None, [])


def test_a_newer_version_during_a_gate_replaces_it_unjudged_keeping_the_fallback(
    rig: Any,
) -> None:
    """1.1.0 is swapped in and watched; 2.0.0 arrives before the gate decided: 1.1.0 is
    neither kept as known good nor rejected, and if 2.0.0 fails its gate the device goes
    back to 1.0.0, the last version known good."""
    # 1 s windows: 1.1.0's gate, with no answers, would end unjudged after four, and
    # releasing 2.0.0 takes a second or two on a loaded machine
    recorder = _gated(rig, window_s=1.0)
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
        time.sleep(1.05)
        assert up.check_gates() == {}  # a second window
        _answers(recorder, "2.0.0", 50, 0.050)
        time.sleep(1.05)
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

        real_commit = up.state.commit

        def full_disk(state: Any) -> None:
            if state.models["mlp"].serving.version != "1.1.0":  # the attempt before it
                real_commit(state)
                return
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


def test_one_unclean_stop_reopens_the_gate_and_a_second_rejects_the_version(rig: Any) -> None:
    """A power cut while a gate watches is no verdict: the gate opens again on the same
    version, counted in the state; a second unclean stop during that version's gate
    takes it for the cause (a version that crashes the daemon must not hold it in a
    restart loop)."""
    from edge_sync.engine.host import InProcessHost

    _gated(rig, window_s=60)
    _gate_open_on_1_1_0(rig)
    rig.hosts["device"] = InProcessHost()  # a new process
    with rig.updater() as up:
        assert up.resume(unclean=True) == {}
        assert up.host.current("mlp").version == "1.1.0"
        assert up.gates["mlp"].old.version == "1.0.0"  # watched again, with its fallback
        model = rig.state().models["mlp"]
        assert (model.serving.version, model.gate.version) == ("1.1.0", "1.1.0")
        assert model.gate.unclean_stops == 1
        assert model.rejected == []
    rig.hosts["device"] = InProcessHost()  # killed again, before its gate closed
    with rig.updater() as up:
        assert up.resume(unclean=True) == {}
        assert up.host.current("mlp").version == "1.0.0"
        model = rig.state().models["mlp"]
        assert (model.serving.version, model.gate) == ("1.0.0", None)
        assert model.last_update.result == "rejected"
        assert "stopped unexpectedly twice during its health gate" in model.rejected[0].reason
        assert "mlp" not in up.sync().updates  # not tried again
        assert up.host.current("mlp").version == "1.0.0"


class _Died(BaseException):
    """The process died here (nothing catches it: the state stays as it was)."""


def test_a_version_that_kills_the_daemon_while_it_loads_is_rejected_after_two_restarts(
    rig: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge_sync.engine.host import InProcessHost

    _gated(rig, window_s=60)
    with rig.updater() as up:
        up.sync()
    rig.release_version("1.1.0", "1.0.0")
    for restart in (1, 2):
        host = rig.hosts["device"] = InProcessHost()
        real_build = host.build

        def build(request: Any, real_build: Any = real_build) -> Any:
            if request.version == "1.1.0":
                raise _Died
            return real_build(request)

        monkeypatch.setattr(host, "build", build)
        with rig.updater() as up:
            assert up.resume(unclean=restart > 1) == {}
            assert up.host.current("mlp").version == "1.0.0"
            with pytest.raises(_Died):
                up.sync()
        attempt = rig.state().models["mlp"].attempt  # written before the load
        assert (attempt.version, attempt.unclean_stops) == ("1.1.0", restart - 1)
    rig.hosts["device"] = InProcessHost()
    with rig.updater() as up:
        assert up.resume(unclean=True) == {}
        model = rig.state().models["mlp"]
        assert model.attempt is None
        assert "twice while it was being loaded" in model.rejected[0].reason
        assert (model.serving.version, model.last_known_good.version) == ("1.0.0", "1.0.0")
        assert "mlp" not in up.sync().updates  # not tried again
        assert up.host.current("mlp").version == "1.0.0"


def test_a_clean_stop_while_a_version_loads_counts_nothing(rig: Any) -> None:
    """A stopping daemon ends its sync at a stage boundary: the attempt it recorded is
    taken back (a later power cut, while idle, blames no version), and the version is
    tried again at the next start."""
    from edge_sync.engine.host import InProcessHost

    _gated(rig, window_s=60)
    with rig.updater() as up:
        up.sync()
    rig.release_version("1.1.0", "1.0.0")
    seen: list[Any] = []

    def observer(stage: str, phase: str) -> None:
        if (stage, phase) == ("build", "start"):
            seen.append(rig.state().models["mlp"].attempt)

    rig.updater_options |= {"observer": observer, "should_stop": lambda: bool(seen)}
    with rig.updater() as up, pytest.raises(StoppedError, match="stopped before self_test"):
        up.sync()  # ended as stopped, not as a failure of the version
    assert seen[0].version == "1.1.0"  # recorded before the load
    assert rig.state().models["mlp"].attempt is None
    rig.updater_options = {k: v for k, v in rig.updater_options.items()
                           if k not in {"observer", "should_stop"}}  # fmt: skip
    rig.hosts["device"] = InProcessHost()
    with rig.updater() as up:
        up.resume(unclean=True)  # a power cut later, while idle
        assert rig.state().models["mlp"].rejected == []
        assert up.sync().updates["mlp"].result == "installed"
    model = rig.state().models["mlp"]
    assert (model.serving.version, model.attempt, model.gate.unclean_stops) == ("1.1.0", None, 0)


def test_a_clean_restart_watches_the_version_again(rig: Any) -> None:
    from edge_sync.engine.host import InProcessHost

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


def test_the_server_records_decoded_elements_and_the_engine_run_whatever_the_encoding(
    tmp_path: Path,
) -> None:
    """The same tensor as JSON, as JSON with spaces, gzip'd, as binary data and
    trickled over a second: one size (its decoded elements) and the engine's run, never
    the upload (a client cannot make a version look slow by sending slowly, nor big by
    the way it encodes a request)."""
    import gzip
    import hashlib
    import http.client
    import json
    import threading

    import uvicorn

    from edge_sync.engine.base import LoadRequest
    from edge_sync.engine.host import InProcessHost
    from edge_sync.serve.app import create_app
    from tests.edge import models

    host, recorder = InProcessHost(prepack="off"), Recorder()
    path = models.save(models.mlp(), tmp_path / "m.onnx")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    host.swap("mlp", host.build(LoadRequest("mlp", "1.0.0", path, digest)))
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
    x = models.sample(batch=8)
    tensor = {"name": "x", "shape": list(x.shape), "datatype": "FP32"}
    plain = json.dumps({"inputs": [{**tensor, "data": x.reshape(-1).tolist()}]}).encode()
    header = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": x.nbytes}}]})
    bodies = [
        (plain, {}),
        (json.dumps(json.loads(plain), indent=8).encode(), {}),  # padded with spaces
        (gzip.compress(plain), {"Content-Encoding": "gzip"}),
        (header.encode() + x.tobytes(),
         {"Inference-Header-Content-Length": str(len(header.encode()))}),
    ]  # fmt: skip
    try:
        for body, headers in bodies:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/v2/models/mlp/infer", body, headers)
            assert conn.getresponse().status == 200
            conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.putrequest("POST", "/v2/models/mlp/infer")
        conn.putheader("Content-Length", str(len(plain)))
        conn.endheaders()
        started = time.monotonic()
        for i in range(0, len(plain), len(plain) // 4 + 1):  # trickled
            conn.send(plain[i : i + len(plain) // 4 + 1])
            time.sleep(0.3)
        assert conn.getresponse().status == 200
        trickled = time.monotonic() - started
        conn.close()
    finally:
        uv.should_exit = True
        thread.join(timeout=30)
    window = recorder.window("mlp", "1.0.0", 0, time.monotonic() + 1)
    assert window.requests == 5
    assert {units for units, _ in window.latencies} == {x.size}
    assert trickled > 0.9
    assert max(seconds for _, seconds in window.latencies) < trickled / 3


def test_a_daemon_that_dies_of_an_error_leaves_its_unclean_mark(
    rig: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception out of the daemon is an unclean stop too (its announcement stays:
    the next start counts it against a version on trial); a clean stop removes it."""
    from edge_sync.config import load_edge_config
    from edge_sync.daemon import Daemon
    from edge_sync.state.store import StateDir
    from edge_sync.sync.updater import Updater

    config = load_edge_config(rig.config())

    def boom(self: Any, *, unclean: bool = False) -> dict[str, str]:
        raise RuntimeError("a bug, or memory")

    clean = Daemon(config, serving=False)
    clean.stop()  # stopped before it ran: one clean pass
    assert clean.run(install_signals=False) == 0
    assert StateDir(config.state_path).daemon_info() is None
    monkeypatch.setattr(Updater, "resume", boom)
    with pytest.raises(RuntimeError, match="a bug"):
        Daemon(config, serving=False).run(install_signals=False)
    assert StateDir(config.state_path).daemon_info() is not None


def test_a_cpu_run_on_one_thread_is_timed_by_its_cpu_time(tmp_path: Path) -> None:
    """ONNX Runtime on the CPU with one intra-op thread (the default) computes on the
    request's thread: its CPU time is what the gate compares, which other requests
    competing for the CPU cannot stretch; a pool of threads is timed by the wall clock."""
    import hashlib

    from edge_sync.engine.base import LoadRequest
    from edge_sync.engine.host import InProcessHost
    from edge_sync.serve.core import run_clock as _run_clock
    from tests.edge import models

    path = models.save(models.mlp(), tmp_path / "m.onnx")
    request = LoadRequest("mlp", "1", path, hashlib.sha256(path.read_bytes()).hexdigest())
    assert _run_clock(InProcessHost(prepack="off").build(request)) is time.thread_time
    pooled = InProcessHost(prepack="off", intra_op_threads=2).build(request)
    assert _run_clock(pooled) is time.perf_counter
