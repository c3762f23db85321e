"""The daemon's timing rules (docs/reference/daemon.md): poll with jitter, back off on failure;
and the channels document's sequences as high-water marks across syncs."""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from edge_sync.decide.schedule import backoff_delay, next_delay
from tests.edge.conftest import SOURCES, EdgeRig

if TYPE_CHECKING:
    from edge_sync.config import EdgeConfig


def test_polls_spread_within_the_jitter() -> None:
    rng = random.Random(7)
    waits = [next_delay(60.0, 0.2, rng) for _ in range(2000)]
    assert min(waits) >= 48.0
    assert max(waits) <= 72.0
    assert max(waits) - min(waits) > 20.0  # spread, not a constant
    assert next_delay(60.0, 0.0, rng) == 60.0


def test_backoff_starts_small_doubles_and_is_capped() -> None:
    assert [backoff_delay(n, 60.0, 900.0) for n in range(1, 9)] == [
        5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0,
    ]  # fmt: skip
    assert backoff_delay(9, 60.0, 900.0) == 900.0
    assert backoff_delay(50, 60.0, 900.0) == 900.0
    assert backoff_delay(1, 1.0, 900.0) == 1.0  # never slower than the poll itself
    assert backoff_delay(3, 1.0, 2.5) == 2.5


@pytest.mark.integration
@pytest.mark.parametrize("rig", SOURCES, indirect=True)
def test_a_channels_document_that_goes_back_is_refused(rig: EdgeRig) -> None:
    """The device keeps the last accepted channels document: a validly signed one whose
    sequence is lower (replayed, or signed by a stolen key) is a rollback."""
    assert rig.sync().updates["mlp"].version == "1.0.0"
    from edge_sync.state.store import StateDir

    state_dir = StateDir(rig.tmp / "device/state")
    state = state_dir.load()
    assert state.channels is not None
    ahead = dict(state.channels, sequence=state.channels["sequence"] + 5)
    state_dir.commit(state.model_copy(update={"channels": ahead}))
    rig.release_version("1.1.0", "1.0.0")
    report = rig.sync()
    assert report.result == "failed"
    assert "does not follow" in (report.reason or ""), report.reason
    assert rig.state().models["mlp"].serving.version == "1.0.0"


@pytest.mark.integration
def test_a_file_url_repository_and_remote(rig: EdgeRig) -> None:
    report = rig.sync(
        repository={"url": rig.root.as_uri(), "branch": "main"},
        artifacts={"url": rig.remote.as_uri()},
    )
    assert report.updates["mlp"].version == "1.0.0"
    kept = rig.tmp / "device/state/descriptions"
    assert [p.name for p in kept.iterdir()] == ["mlp-1.0.0.json"]


def test_an_unexpected_error_in_a_sync_is_a_failed_sync(capsys: pytest.CaptureFixture[str]) -> None:
    from edge_sync.daemon import _guarded

    class Broken:
        def sync(self) -> None:
            raise KeyError("models")

    report = _guarded(Broken())  # type: ignore[arg-type]
    assert report is not None
    assert (report.result, report.reason) == ("failed", "internal error: KeyError: 'models'")
    assert "modelreg edge: internal error: KeyError" in capsys.readouterr().err


def test_a_sync_cut_by_the_stop_is_no_failed_sync(tmp_path: Path) -> None:
    """A poll or download a stopping daemon cuts ends the loop: it is neither counted
    nor reported as a failed sync (a fleet that restarts must not look like it failed)."""
    from edge_sync.daemon import Daemon, _guarded
    from edge_sync.errors import StoppedError
    from edge_sync.sync.updater import SyncOutcome

    seen: list[SyncOutcome] = []
    daemon = Daemon(_config(tmp_path, 0.0, "mlp"), serving=False, on_sync=seen.append)

    class Cut:
        def __init__(self) -> None:
            self.gates: dict[str, object] = {}
            self.settled: dict[str, object] = {}
            self.syncs = 0

        def sync(self) -> SyncOutcome:
            self.syncs += 1
            daemon._stopping = True  # the stop arrives during the download
            raise StoppedError("stopped during the sync (timestamp.json: stopped after 0 bytes)")

        def next_gate_s(self) -> None:
            return None

        def check_gates(self) -> list[object]:
            return []

    cut = Cut()
    assert _guarded(cut) is None  # type: ignore[arg-type]
    daemon._stopping = False
    daemon._loop(cut, None, None)  # type: ignore[arg-type]
    assert cut.syncs == 2
    assert seen == []  # the cut sync was not reported as a result


def test_the_first_poll_waits_only_when_every_model_is_served(tmp_path: Path) -> None:
    """After a restart that serves every subscribed model, the first poll comes at a
    random point of one poll interval; a model with nothing to serve (a new device, a
    new subscription) or ``jitter: 0`` polls at once."""
    from edge_sync.daemon import Daemon

    def config(jitter: float) -> EdgeConfig:
        return _config(tmp_path, jitter, "mlp", "det")

    class Served:
        def __init__(self, *models: str) -> None:
            self.models = models

        def current(self, model: str) -> object | None:
            return object() if model in self.models else None

    rng = random.Random(3)
    both = Daemon(config(0.2), host=Served("mlp", "det"), serving=False)  # type: ignore[arg-type]
    waits = [both._first_delay(rng) for _ in range(2000)]
    assert 0 <= min(waits) < 1.0
    assert 59.0 < max(waits) <= 60.0  # spread over the whole interval
    one = Daemon(config(0.2), host=Served("mlp"), serving=False)  # type: ignore[arg-type]
    assert one._first_delay(rng) == 0.0
    fixed = Daemon(config(0.0), host=Served("mlp", "det"), serving=False)  # type: ignore[arg-type]
    assert fixed._first_delay(rng) == 0.0


def _config(tmp_path: Path, jitter: float, *models: str) -> EdgeConfig:
    """A device following ``models`` on channel ``c`` every 60 s (nothing behind it)."""
    from edge_sync.config import EdgeConfig

    return EdgeConfig.model_validate({
        "apiVersion": "modelreg/v1", "kind": "EdgeConfig", "device": {"id": "d-1"},
        "repository": {"url": str(tmp_path), "poll_interval": 60, "jitter": jitter},
        "trust": {"root": "1.root.json"}, "artifacts": {"url": str(tmp_path)},
        "models": [{"name": m, "channel": "c"} for m in models],
        "state_dir": str(tmp_path / "state"),
    })  # fmt: skip
