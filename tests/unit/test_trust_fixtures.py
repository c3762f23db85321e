"""Signed releases of every metadata format keep verifying, forever.

``tests/data/trust_fixtures/<format>/`` holds a tiny signed repository (metadata,
remote, the root a device is provisioned with) and ``expected.json``, what a device
must read from it.  Devices in the field hold such metadata: every future version of
``DeviceTrust`` must verify every stored format.  A new format gets a new folder; the
newest one is regenerated with ``MODELREG_REGEN_GOLDEN=1`` (keys and clock are
deterministic, so only signatures change) and the diff is reviewed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from tuf.api.metadata import Metadata

from edge_sync.sync.trust import DeviceTrust
from signing.tuf_repo import TrustRepo
from signing.tuf_roles import METADATA_DIR
from tests.conftest import REGEN_ENV
from tests.trust_sim import write_fixtures

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "trust_fixtures"
CURRENT = "v1"


def _regenerate_current() -> None:
    out = FIXTURES / CURRENT
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    expected = write_fixtures(out)
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


def _formats() -> list[str]:
    return sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) if FIXTURES.is_dir() else []


def test_current_format_has_fixtures() -> None:
    # Regenerate here, not at import: run it alone (no -n) and review the diff.
    if os.environ.get(REGEN_ENV) == "1":
        _regenerate_current()
    assert (FIXTURES / CURRENT / "expected.json").is_file(), (
        f"run with {REGEN_ENV}=1 to create {FIXTURES / CURRENT}"
    )


@pytest.mark.parametrize("fmt", _formats())
def test_stored_release_still_verifies(fmt: str, tmp_path: Path) -> None:
    folder = FIXTURES / fmt
    expected = json.loads((folder / "expected.json").read_text())
    DeviceTrust.provision(tmp_path, (folder / "root.json").read_bytes())
    device = DeviceTrust(tmp_path, folder / "repo", folder / "remote")
    device.refresh()

    assert {role: s.version for role, s in device.trusted().items()} == expected["versions"]
    assert device.channels().model_dump(mode="json") == expected["channels"]
    for path, want in expected["targets"].items():
        info = device.target_info(path)
        assert info.facts.model_dump(mode="json", exclude_defaults=True) == want["facts"]
        fetched = device.fetch(path, tmp_path / "out", kind=want["facts"]["kind"])
        assert hashlib.sha256(fetched.read_bytes()).hexdigest() == want["sha256"]


@pytest.mark.parametrize("fmt", _formats())
def test_stored_release_still_loads_for_ci(fmt: str, tmp_path: Path) -> None:
    """CI loads every stored format under the newest root only, with its history intact.

    The fixtures rotate the root key between releases: online roles signed after
    the rotation verify under the newest root, and the stored state follows itself.
    """
    expected = json.loads((FIXTURES / fmt / "expected.json").read_text())
    shutil.copytree(FIXTURES / fmt / "repo", tmp_path / "repo")
    trust = TrustRepo.load(tmp_path / "repo" / METADATA_DIR)
    assert {role: trust.version(role) for role in expected["versions"]} == expected["versions"]
    assert sorted(trust.targets) == sorted(expected["targets"])
    trust.check_follows(trust)
    trust.check_floor(expected["versions"])


def _payload(path: Path) -> Any:
    """The signed part, without what depends on signatures (hashes of signed files)."""
    signed = Metadata.from_bytes(path.read_bytes()).signed.to_dict()
    for meta in [*signed.get("meta", {}).values()]:
        meta.pop("hashes", None)
        meta.pop("length", None)
    return signed


def test_current_code_writes_the_current_format(tmp_path: Path) -> None:
    """The repository side still writes what the stored current fixtures hold."""
    expected = write_fixtures(tmp_path)
    stored = FIXTURES / CURRENT
    assert expected == json.loads((stored / "expected.json").read_text())
    metadata = sorted(p.relative_to(stored) for p in (stored / "repo").rglob("*.json"))
    assert metadata == sorted(p.relative_to(tmp_path) for p in (tmp_path / "repo").rglob("*.json"))
    for rel in metadata:
        assert _payload(tmp_path / rel) == _payload(stored / rel), rel
    remote = sorted(p.relative_to(stored) for p in (stored / "remote").rglob("*") if p.is_file())
    assert remote == sorted(
        p.relative_to(tmp_path) for p in (tmp_path / "remote").rglob("*") if p.is_file()
    )
    for rel in remote:
        assert (tmp_path / rel).read_bytes() == (stored / rel).read_bytes(), rel
