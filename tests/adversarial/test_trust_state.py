"""CI never re-signs what the current keys did not sign, and release history cannot be
reset (issue 8, points 2 and 3: what ``TrustRepo.load`` guarantees on its own).

Each test replays the attack on a released fleet repository through the real commands
(``keys rotate``, a merged branch, ``freshness refresh``, ``ci release``) and checks
that nothing is signed and that a device never receives what the attacker wanted.
The comparison with the base branch and git history is ``ci release``'s own, tested
with it; here the merged state alone must be refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest
from securesystemslib.signer import CryptoSigner

from signing.errors import SignatureError, TrustFetchError
from signing.tuf_facts import TargetFacts
from signing.tuf_repo import TrustRepo
from signing.tuf_roles import (
    ONLINE_ROLES,
    TARGETS_DIR,
    stored_name,
    target_file,
)
from tests.adversarial.conftest import ARTIFACT, Fleet
from tests.conftest import Result, git
from tests.trust_sim import online_signers, sign_online

pytestmark = pytest.mark.integration

FORGED = b"weights that were never reviewed"


def _metadata(fleet: Fleet) -> dict[str, bytes]:
    folder = fleet.root / "trust/metadata"
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _problems(result: Result) -> list[str]:
    """The problems ``ci release --json`` reported."""
    report = json.loads(result.out)
    assert report["ok"] is False
    problems: list[str] = report["problems"]
    return problems


def _old_signers(fleet: Fleet) -> dict[str, CryptoSigner]:
    """The replaced online keys that ``keys rotate`` kept beside the new ones."""
    return online_signers(fleet.root / ".modelreg/keys", "{role}.*.key.old")


def _forge_release(fleet: Fleet, signers: Mapping[str, CryptoSigner]) -> None:
    """Whoever kept the replaced keys: a release that swaps the released artifact.

    The forged bytes are put on the artifact remote too (an untrusted transport), so
    only the signatures stand between them and a device.
    """
    trust = TrustRepo.load(fleet.root / "trust/metadata")
    files = dict(trust.targets)
    facts = TargetFacts.from_custom(files[ARTIFACT].custom)
    files[ARTIFACT] = target_file(ARTIFACT, FORGED, facts)
    stored = fleet.remote / TARGETS_DIR / stored_name(files[ARTIFACT])
    stored.write_bytes(FORGED)
    sign_online(fleet.root / "trust/metadata", signers, files)


def _device_artifact(fleet: Fleet, name: str) -> bytes:
    device = fleet.device(name)
    fetched: bytes = device.fetch(ARTIFACT, fleet.tmp / f"{name}-art", kind="artifact").read_bytes()
    return fetched


def test_metadata_signed_with_rotated_keys_is_never_resigned(fleet: Fleet) -> None:
    for role in ONLINE_ROLES:
        rotated = fleet.cli("keys", "rotate", "--role", role, cwd=fleet.root)
        assert rotated.code == 0, rotated.err
        # what gitless devices need is said (issue 27, point 15)
        assert "gitless devices (repository.source: artifacts) see the new root once" in (
            rotated.out
        )
    fleet.commit("rotate the online keys")
    released = _device_artifact(fleet, "device")
    assert released != FORGED
    signed = TrustRepo.load(fleet.root / "trust/metadata").published(ARTIFACT)

    fleet.branch("metadata")
    _forge_release(fleet, _old_signers(fleet))
    fleet.commit("refresh trust metadata")
    fleet.merge("metadata")
    merged = _metadata(fleet)
    head = fleet.sha()

    refresh = fleet.cli("freshness", "refresh", cwd=fleet.root)
    assert refresh.code == 1
    assert len(refresh.err.strip().splitlines()) == 1, refresh.err
    assert "trust/metadata/timestamp.json: signed by timestamp keys of root v3" in refresh.err
    assert "that root v4 no longer trusts" in refresh.err
    assert "restore the metadata folder from the last good commit" in refresh.err
    assert "Traceback" not in refresh.err
    release = fleet.release()
    assert release.code == 1
    (problem,) = _problems(release)
    assert "timestamp.json: signed by timestamp keys of root v3" in problem
    # nothing was signed: the merged files are as the attacker left them, no commit
    assert _metadata(fleet) == merged
    assert fleet.sha() == head
    # the device refuses the forged metadata and keeps what was released
    with pytest.raises(SignatureError, match="timestamp was signed by 0/1 keys"):
        fleet.device("device")
    with pytest.raises(SignatureError):
        fleet.device("new-device")
    # the recovery the message names: back to the last good commit
    git(fleet.root, "revert", "--no-edit", "-m", "1", head)
    assert signed is not None
    assert TrustRepo.load(fleet.root / "trust/metadata").published(ARTIFACT) == signed
    assert fleet.device("device").target_info(ARTIFACT).sha256 == signed.hashes["sha256"]
    assert _device_artifact(fleet, "new-device") == released


def test_a_deleted_timestamp_does_not_restart_the_release_history(fleet: Fleet) -> None:
    device = fleet.device("device")
    versions = {role: s.version for role, s in device.trusted().items()}
    before = _metadata(fleet)
    fleet.branch("cleanup")
    (fleet.root / "trust/metadata/timestamp.json").unlink()
    fleet.commit("drop the stale timestamp")
    fleet.merge("cleanup")
    head = fleet.sha()

    release = fleet.release()
    assert release.code == 1
    (problem,) = _problems(release)
    assert "timestamp.json is missing but released metadata exists" in problem
    assert "1.snapshot.json" in problem
    refresh = fleet.cli("freshness", "refresh", cwd=fleet.root)
    assert refresh.code == 1
    assert len(refresh.err.strip().splitlines()) == 1, refresh.err
    assert "release history would start again at version 1" in refresh.err
    # version 1 was not signed again: its files are untouched, nothing was committed
    after = _metadata(fleet)
    assert after == {name: data for name, data in before.items() if name != "timestamp.json"}
    assert fleet.sha() == head
    # the device cannot refresh from this checkout, but is not rolled back either
    with pytest.raises(TrustFetchError, match="timestamp"):
        fleet.device("device")
    git(fleet.root, "revert", "--no-edit", "-m", "1", head)
    assert fleet.release().code == 0
    device = fleet.device("device")
    assert {role: s.version for role, s in device.trusted().items()} == versions
    assert _metadata(fleet) == before


def test_metadata_reached_through_a_link_is_never_loaded(fleet: Fleet) -> None:
    """A merged pull request replaced ``timestamp.json`` with a link (to a copy it
    controls, or a file on the runner): CI reads no metadata through a link."""
    from signing.errors import FileSetError

    folder = fleet.root / "trust/metadata"
    elsewhere = fleet.tmp / "timestamp.json"
    elsewhere.write_bytes((folder / "timestamp.json").read_bytes())
    (folder / "timestamp.json").unlink()
    (folder / "timestamp.json").symlink_to(elsewhere)
    with pytest.raises(FileSetError, match="is a symbolic link"):
        TrustRepo.load(folder)
    (folder / "timestamp.json").unlink()
    (folder / "timestamp.json").symlink_to(fleet.tmp / "absent.json")  # dangling
    with pytest.raises(FileSetError, match="is a symbolic link"):
        TrustRepo.load(folder)


def test_an_oversized_metadata_file_is_refused_before_it_is_read(fleet: Fleet) -> None:
    from signing.errors import DigestMismatchError
    from signing.tuf_repo import MAX_METADATA_BYTES

    timestamp = fleet.root / "trust/metadata/timestamp.json"
    with timestamp.open("r+b") as fh:  # sparse: refused by its size, never read
        fh.truncate(MAX_METADATA_BYTES + 1)
    with pytest.raises(DigestMismatchError, match=r"more than the 67108864 allowed"):
        TrustRepo.load(timestamp.parent)


def test_release_refuses_a_tracked_link_in_local_state(fleet: Fleet) -> None:
    schemas = fleet.root / ".modelreg/schemas"
    (schemas / "extra.json").symlink_to(fleet.root / ".git/config")
    fleet.commit("editor support", ".modelreg/schemas/extra.json", force=True)
    release = fleet.release()
    assert release.code == 1
    assert (
        ".modelreg/schemas/extra.json: is a symbolic link; modelreg reads no file through a "
        "link: commit the file itself" in release.err + release.out
    )
