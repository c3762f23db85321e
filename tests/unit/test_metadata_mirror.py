"""The signed metadata mirrored to the artifact remote (issue 14, point 1): what is
uploaded, in which order, and that a device reads the mirror as it reads git.

``plan_mirror`` is a decision without I/O, tested by table; ``mirror`` runs it against
a folder that records every write; the repository side is the production ``TrustRepo``
(``tests/trust_sim.py``)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from edge_sync.sync.trust import DeviceTrust
from pipelines.publish._mirror import (
    TIMESTAMP,
    LocalMirror,
    MirrorState,
    mirror,
    plan_mirror,
    read_state,
    timestamp_floor,
)
from signing.errors import RollbackError
from signing.tuf_repo import TrustRepo
from signing.tuf_roles import MIRROR_DIR
from tests.trust_sim import RepoSim


def _timestamp(version: int, pad: str = "", *, ours: bool = True) -> bytes:
    doc = {"signed": {"_type": "timestamp", "version": version}, "pad": pad, "ours": ours}
    return json.dumps(doc).encode()


def _verified(data: bytes) -> int | None:
    """Stands for ``TrustRepo.mirrored_timestamp``: a version for our signed bytes only."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return int(doc["signed"]["version"]) if doc.get("ours") else None


FILES = (("1.root.json", b"root-1"), ("2.root.json", b"root-22"), ("3.targets.json", b"t" * 30),
         ("3.snapshot.json", b"s" * 20), (TIMESTAMP, _timestamp(3)))  # fmt: skip
ALL = [name for name, _ in FILES]
SIZES = {n: len(d) for n, d in FILES}
HELD = {n: d for n, d in FILES if not n.endswith(".root.json")}


def _state(
    sizes: dict[str, int] | None = None, held: dict[str, bytes] | None = None
) -> MirrorState:
    return MirrorState(SIZES if sizes is None else sizes, {**HELD, **(held or {})})


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        pytest.param(MirrorState({}, {}), ALL, id="empty-remote-everything-in-order"),
        pytest.param(_state(), [], id="up-to-date-nothing"),
        pytest.param(
            _state({n: v for n, v in SIZES.items() if n != "2.root.json"}),
            ["2.root.json"],
            id="a-missing-root",
        ),
        pytest.param(_state({**SIZES, "1.root.json": 2}), ["1.root.json"], id="a-root-cut-short"),
        pytest.param(
            _state(held={"3.targets.json": b"T" * 30}), ["3.targets.json"], id="a-lost-runs-targets"
        ),
        pytest.param(_state(held={TIMESTAMP: _timestamp(2)}), [TIMESTAMP], id="an-older-timestamp"),
        pytest.param(
            _state(held={TIMESTAMP: _timestamp(3, " ")}), [TIMESTAMP], id="same-version-other-bytes"
        ),
        pytest.param(_state(held={TIMESTAMP: b"\x00garbage"}), [TIMESTAMP], id="garbage"),
        pytest.param(
            _state(held={TIMESTAMP: _timestamp(9, ours=False)}),
            [TIMESTAMP],
            id="a-forged-newer-one",
        ),
    ],
)
def test_what_the_mirror_uploads(state: MirrorState, expected: list[str]) -> None:
    assert plan_mirror(FILES, state, _verified) == expected


def test_a_mirror_ahead_of_the_repository_is_never_rolled_back() -> None:
    """The mirror holds a newer timestamp this repository signed (a run whose metadata
    commit never reached git): uploading ours would roll devices back."""
    with pytest.raises(RollbackError, match="holds timestamp version 9, above the 3"):
        plan_mirror(FILES, _state(held={TIMESTAMP: _timestamp(9)}), _verified)


@pytest.mark.parametrize(
    ("theirs", "floor"),
    [
        pytest.param(None, {}, id="nothing-mirrored"),
        pytest.param(_timestamp(3), {}, id="ours"),
        pytest.param(_timestamp(2), {}, id="older"),
        pytest.param(_timestamp(3, " "), {"timestamp": 3}, id="same-version-a-fork"),
        pytest.param(_timestamp(5), {"timestamp": 5}, id="a-lost-push"),
        pytest.param(_timestamp(5, ours=False), {}, id="forged"),
    ],
)
def test_what_a_release_signs_above(theirs: bytes | None, floor: dict[str, int]) -> None:
    held = {TIMESTAMP: theirs} if theirs is not None else {}
    assert timestamp_floor(_timestamp(3), MirrorState(SIZES, held), _verified) == floor


class _Recording(LocalMirror):
    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.writes: list[str] = []

    def write(self, name: str, data: bytes) -> None:
        self.writes.append(name)
        super().write(name, data)


def test_roots_first_then_targets_and_snapshot_and_the_timestamp_last(tmp_path: Path) -> None:
    sim = RepoSim.create(tmp_path, seed="mirror")
    sim.release("mlp", "1.0.0", channels={"canary": ("1.0.0", None)})
    folder = _Recording(sim.remote / MIRROR_DIR)
    assert mirror(folder, sim.repo.mirror_files(), sim.repo.mirrored_timestamp) == folder.writes == [
        "1.root.json", "1.targets.json", "1.snapshot.json", TIMESTAMP,
    ]  # fmt: skip
    # the exact bytes of the repository's files
    for name in folder.writes:
        assert (folder.folder / name).read_bytes() == (sim.metadata_dir / name).read_bytes()
        assert stat.S_IMODE((folder.folder / name).stat().st_mode) == 0o644
    # nothing new: nothing written (an idle device's conditional request stays "304")
    before = (folder.folder / TIMESTAMP).stat()
    assert mirror(folder, sim.repo.mirror_files(), sim.repo.mirrored_timestamp) == []
    assert (folder.folder / TIMESTAMP).stat().st_ino == before.st_ino
    # a key rotation and a release: the new root before anything signed under it
    new_root = sim.repo.rotate_root(sim.root_signers, [s.public_key for s in sim.root_signers],
                                    sim.root_signers, 1)  # fmt: skip
    sim.release("mlp", "1.1.0")
    folder.writes.clear()
    mirror(folder, sim.repo.mirror_files(), sim.repo.mirrored_timestamp)
    assert folder.writes == [f"{new_root}.root.json", "2.targets.json", "2.snapshot.json",
                             TIMESTAMP]  # fmt: skip


def test_the_bytes_mirrored_are_those_loaded_and_verified(tmp_path: Path) -> None:
    """A loaded repository mirrors the files it verified, byte for byte (the mirror is
    a transport: the same signatures, the same hashes that snapshot and timestamp list)."""
    sim = RepoSim.create(tmp_path, seed="mirror")
    sim.release("mlp", "1.0.0", channels={"canary": ("1.0.0", None)})
    sim.release("mlp", "1.1.0")
    loaded = TrustRepo.load(sim.metadata_dir)
    assert loaded.mirror_files() == sim.repo.mirror_files()
    names = [name for name, _ in loaded.mirror_files()]
    assert names == ["1.root.json", "2.targets.json", "2.snapshot.json", TIMESTAMP]
    assert all(data == (sim.metadata_dir / name).read_bytes() for name, data in
               loaded.mirror_files())  # fmt: skip


def test_a_device_reads_the_mirror_as_it_reads_the_checkout(tmp_path: Path) -> None:
    sim = RepoSim.create(tmp_path, seed="mirror")
    path = sim.release("mlp", "1.0.0", channels={"canary": ("1.0.0", None)})
    mirror(
        LocalMirror(sim.remote / MIRROR_DIR), sim.repo.mirror_files(), sim.repo.mirrored_timestamp
    )
    DeviceTrust.provision(sim.state, (sim.metadata_dir / "1.root.json").read_bytes())
    device = DeviceTrust(sim.state, None, sim.remote, metadata=sim.remote / MIRROR_DIR)
    device.refresh()
    assert device.trusted()["timestamp"].version == 1
    fetched = device.fetch(path, tmp_path / "out", model="mlp", version="1.0.0", kind="artifact")
    assert fetched.read_bytes() == sim.released[path]
    # the timestamp handed over by the watcher is not downloaded again
    sim.release("mlp", "1.1.0")
    mirror(
        LocalMirror(sim.remote / MIRROR_DIR), sim.repo.mirror_files(), sim.repo.mirrored_timestamp
    )
    given = (sim.remote / MIRROR_DIR / TIMESTAMP).read_bytes()
    device = DeviceTrust(sim.state, None, sim.remote, metadata=sim.remote / MIRROR_DIR,
                         prefetched={TIMESTAMP: given})  # fmt: skip
    device.refresh()
    assert device.trusted()["timestamp"].version == 2
    # root 2 (absent: 404), snapshot 2, targets 2; not the timestamp
    assert device.requests == 3


def test_a_lost_push_is_signed_above_and_devices_move_on(tmp_path: Path) -> None:
    """A refresh mirrored timestamp 2 and its commit never reached git; the next run,
    from git's timestamp 1, signs 3 (a timestamp 2 again would be one devices already
    hold another of, and keep)."""
    sim = RepoSim.create(tmp_path, seed="mirror")
    sim.release("mlp", "1.0.0", channels={"canary": ("1.0.0", None)})
    folder = LocalMirror(sim.remote / MIRROR_DIR)
    mirror(folder, sim.repo.mirror_files(), sim.repo.mirrored_timestamp)
    git_copy = (sim.metadata_dir / TIMESTAMP).read_bytes()
    sim.repo.refresh_timestamp(sim.signers["timestamp"])
    mirror(folder, sim.repo.mirror_files(), sim.repo.mirrored_timestamp)
    DeviceTrust.provision(sim.state, (sim.metadata_dir / "1.root.json").read_bytes())
    device = DeviceTrust(sim.state, None, sim.remote, metadata=sim.remote / MIRROR_DIR)
    device.refresh()
    assert device.trusted()["timestamp"].version == 2
    (sim.metadata_dir / TIMESTAMP).write_bytes(git_copy)  # the push was lost
    repo = TrustRepo.load(sim.metadata_dir)
    ours = dict(repo.mirror_files())[TIMESTAMP]
    state = read_state(folder, repo.mirror_files())
    floor = timestamp_floor(ours, state, repo.mirrored_timestamp)
    assert floor == {"timestamp": 2}
    with pytest.raises(RollbackError):  # mirroring git's timestamp 1 as it is: refused
        mirror(folder, repo.mirror_files(), repo.mirrored_timestamp)
    assert repo.refresh_timestamp(sim.signers["timestamp"], floor=floor).versions == {
        "timestamp": 3
    }
    assert mirror(folder, repo.mirror_files(), repo.mirrored_timestamp) == [TIMESTAMP]
    device.refresh()
    assert device.trusted()["timestamp"].version == 3
    # nothing mirrored ahead any more: no floor, and a publish signs nothing new
    state = read_state(folder, repo.mirror_files())
    assert timestamp_floor(dict(repo.mirror_files())[TIMESTAMP], state,
                           repo.mirrored_timestamp) == {}  # fmt: skip
    assert not repo.publish(sim.signers, floor={}).changed
