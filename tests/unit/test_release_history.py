"""``released_floor``: what a branch's history released, counting only signed history."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from tuf.api.metadata import Metadata, Root

from pipelines.ci._base import Committed, released_floor
from tests.trust_sim import RepoSim, new_signer


def _roots(sim: RepoSim) -> list[Metadata[Root]]:
    folder = sim.metadata_dir
    return [Metadata[Root].from_bytes((folder / f"{n}.root.json").read_bytes())
            for n in range(1, sim.repo.version("root") + 1)]  # fmt: skip


def _history(sim: RepoSim) -> list[Committed]:
    return [Committed(p.name, p.read_bytes()) for p in sorted(sim.metadata_dir.iterdir())]


def test_the_floor_is_the_highest_signed_version_of_each_role(tmp_path: Path) -> None:
    sim = RepoSim.create(tmp_path, seed="floor")
    sim.release("mlp", "1.0.0")
    first = _history(sim)
    sim.release("mlp", "1.1.0")
    floor, problems = released_floor(_roots(sim), first + _history(sim))
    assert problems == []
    assert floor == {"targets": 2, "snapshot": 2, "timestamp": 2}


def test_unsigned_or_foreign_history_does_not_raise_the_bar(tmp_path: Path) -> None:
    """A file once committed by a pull request and removed later never counts: it would
    stop every release for ever."""
    sim = RepoSim.create(tmp_path / "a", seed="floor")
    sim.release("mlp", "1.0.0")
    stranger = RepoSim.create(tmp_path / "b", seed="stranger")
    for _ in range(3):
        stranger.release("mlp", "1.0.0" if _ == 0 else f"1.{_}.0")
    junk = [Committed("9.snapshot.json", b"{not json"), Committed("x.json", b"[1]")]
    history = _history(sim) + _history(stranger) + junk
    forged = sim.forge("timestamp", 99, [new_signer()])  # keys no root trusts
    history.append(Committed("timestamp.json", forged))
    floor, problems = released_floor(_roots(sim), history)
    assert floor == {"targets": 1, "snapshot": 1, "timestamp": 1}
    assert problems == []


def test_a_rewritten_or_lost_root_is_a_problem(tmp_path: Path) -> None:
    sim = RepoSim.create(tmp_path, seed="roots")
    sim.release("mlp", "1.0.0")
    current = _roots(sim)
    successor = copy.deepcopy(current[0].signed)
    successor.version = 2
    genuine_v2 = sim.forge_root(successor, sim.root_signers)  # signed by root v1's keys
    _, problems = released_floor(current, [Committed("2.root.json", genuine_v2)])
    assert [p.file for p in problems] == ["2.root.json"]
    assert "root version 2 was released and is rewritten or missing" in problems[0].message
    # a root nobody with the root keys signed was never released: no problem
    forged = copy.deepcopy(successor)
    forged.version = 2
    fake = sim.forge_root(forged, [new_signer()])
    assert released_floor(current, [Committed("2.root.json", fake)])[1] == []
    # the current chain holding that very root is fine
    (sim.metadata_dir / "2.root.json").write_bytes(genuine_v2)
    chain = [*current, Metadata[Root].from_bytes(genuine_v2)]
    assert released_floor(chain, [Committed("2.root.json", genuine_v2)])[1] == []


def test_blobs_over_the_cap_are_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """History is read in batches; an object over the cap is sized, not read."""
    from pipelines.ci import _base as ci_base
    from tests.conftest import git

    git(tmp_path, "init", "-q")
    (tmp_path / "small.json").write_bytes(b"{}")
    (tmp_path / "big.json").write_bytes(b"x" * 4096)
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "-qm", "c")
    head = git(tmp_path, "rev-parse", "HEAD").strip()
    big_sha = git(tmp_path, "rev-parse", f"{head}:big.json").strip()
    monkeypatch.setattr(ci_base, "_MAX_BLOB", 1024)
    asked: list[tuple[str, list[str]]] = []
    real = ci_base._cat_file

    def spy(root: Path, mode: str, names: list[str]) -> bytes:
        asked.append((mode, list(names)))
        return real(root, mode, names)

    monkeypatch.setattr(ci_base, "_cat_file", spy)
    names = [f"{head}:./small.json", f"{head}:./big.json", f"{head}:./gone.json", head,
             f"{head}:./small.json"]  # fmt: skip
    assert ci_base._blobs_at(tmp_path, names) == [b"{}", b"", b"", b"", b"{}"]
    (batch,) = [shas for mode, shas in asked if mode == "--batch"]
    assert big_sha not in batch
    assert len(batch) == 1  # the small file once; a commit is not a file
