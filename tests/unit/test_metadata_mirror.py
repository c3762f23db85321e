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

from edge_sync.trust import DeviceTrust
from pipelines.publish._mirror import TIMESTAMP, LocalMirror, mirror, plan_mirror
from signing.errors import RollbackError
from signing.tuf_repo import TrustRepo
from signing.tuf_roles import MIRROR_DIR
from tests.trust_sim import RepoSim


def _timestamp(version: int, pad: str = "") -> bytes:
    return json.dumps({"signed": {"_type": "timestamp", "version": version}, "pad": pad}).encode()


FILES = (("1.root.json", b"root-1"), ("2.root.json", b"root-22"), ("3.targets.json", b"t" * 30),
         ("3.snapshot.json", b"s" * 20), (TIMESTAMP, _timestamp(3)))  # fmt: skip
ALL = [name for name, _ in FILES]


@pytest.mark.parametrize(
    ("present", "remote_timestamp", "expected"),
    [
        pytest.param({}, None, ALL, id="empty-remote-everything-in-order"),
        pytest.param({n: len(d) for n, d in FILES}, _timestamp(3), [], id="up-to-date-nothing"),
        pytest.param(
            {n: len(d) for n, d in FILES if n != "2.root.json"},
            _timestamp(3),
            ["2.root.json"],
            id="a-missing-root",
        ),
        pytest.param(
            {**{n: len(d) for n, d in FILES}, "3.targets.json": 7},
            _timestamp(3),
            ["3.targets.json"],
            id="a-versioned-file-cut-short",
        ),
        pytest.param(
            {n: len(d) for n, d in FILES}, _timestamp(2), [TIMESTAMP], id="an-older-timestamp"
        ),
        pytest.param(
            {n: len(d) for n, d in FILES},
            _timestamp(3, pad=" "),
            [TIMESTAMP],
            id="same-version-other-bytes",
        ),
        pytest.param({n: len(d) for n, d in FILES}, b"\x00garbage", [TIMESTAMP], id="garbage"),
    ],
)
def test_what_the_mirror_uploads(
    present: dict[str, int], remote_timestamp: bytes | None, expected: list[str]
) -> None:
    assert plan_mirror(FILES, present, remote_timestamp) == expected


def test_a_mirror_ahead_of_the_repository_is_never_rolled_back() -> None:
    """The remote holds a newer timestamp than the metadata being mirrored (a release
    whose metadata commit never reached git): uploading would roll devices back."""
    present = {n: len(d) for n, d in FILES}
    with pytest.raises(RollbackError, match="holds timestamp version 9, above the 3"):
        plan_mirror(FILES, present, _timestamp(9))


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
    assert mirror(folder, sim.repo.mirror_files()) == folder.writes == [
        "1.root.json", "1.targets.json", "1.snapshot.json", TIMESTAMP,
    ]  # fmt: skip
    # the exact bytes of the repository's files
    for name in folder.writes:
        assert (folder.folder / name).read_bytes() == (sim.metadata_dir / name).read_bytes()
        assert stat.S_IMODE((folder.folder / name).stat().st_mode) == 0o644
    # nothing new: nothing written (an idle device's conditional request stays "304")
    before = (folder.folder / TIMESTAMP).stat()
    assert mirror(folder, sim.repo.mirror_files()) == []
    assert (folder.folder / TIMESTAMP).stat().st_ino == before.st_ino
    # a key rotation and a release: the new root before anything signed under it
    new_root = sim.repo.rotate_root(sim.root_signers, [s.public_key for s in sim.root_signers],
                                    sim.root_signers, 1)  # fmt: skip
    sim.release("mlp", "1.1.0")
    folder.writes.clear()
    mirror(folder, sim.repo.mirror_files())
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
    mirror(LocalMirror(sim.remote / MIRROR_DIR), sim.repo.mirror_files())
    DeviceTrust.provision(sim.state, (sim.metadata_dir / "1.root.json").read_bytes())
    device = DeviceTrust(sim.state, None, sim.remote, metadata=sim.remote / MIRROR_DIR)
    device.refresh()
    assert device.trusted()["timestamp"].version == 1
    fetched = device.fetch(path, tmp_path / "out", model="mlp", version="1.0.0", kind="artifact")
    assert fetched.read_bytes() == sim.released[path]
    # the timestamp handed over by the watcher is not downloaded again
    sim.release("mlp", "1.1.0")
    mirror(LocalMirror(sim.remote / MIRROR_DIR), sim.repo.mirror_files())
    given = (sim.remote / MIRROR_DIR / TIMESTAMP).read_bytes()
    device = DeviceTrust(sim.state, None, sim.remote, metadata=sim.remote / MIRROR_DIR,
                         prefetched={TIMESTAMP: given})  # fmt: skip
    device.refresh()
    assert device.trusted()["timestamp"].version == 2
    # root 2 (absent: 404), snapshot 2, targets 2; not the timestamp
    assert device.requests == 3
