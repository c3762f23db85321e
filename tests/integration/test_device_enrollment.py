"""Devices sign their reports (issue 28, points 3 and 5): enrolled by pull request, one
key file each; the fleet counts only reports signed by an enrolled device and newer
than the last one seen from it. Every attack here is listed apart and moves no wave."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from signing.device_reports import seal_report
from tests.conftest import git
from tests.fleet_reports import model, report
from tests.github_fake import TOKEN, fake_github
from tests.integration.test_fleet_advance import NOW, H, cohort, percent_of, release, repo

pytestmark = pytest.mark.integration
__all__ = ["repo"]  # the fixture, from the fleet advance tests


def _pem(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _on(device: str, sequence: int, version: str = "1.1.0") -> bytes:
    doc = report(device, {"mlp": model(version, "canary")}, format=3, sequence=sequence)
    return json.dumps(doc).encode()


def _write(folder: Path, stored: dict[str, bytes]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        old.unlink()
    for device, data in stored.items():
        (folder / f"{device}.json").write_bytes(data)
    return str(folder)


def test_only_reports_signed_by_enrolled_devices_move_a_wave(
    repo: Path, tmp_path: Path, cli: Any
) -> None:
    a, b, c = cohort(10, 3)
    keys = {d: ed25519.Ed25519PrivateKey.generate() for d in (a, b, c)}
    factory = tmp_path / "factory"  # what a factory line collects: <device-id>.pub
    factory.mkdir()
    for device, key in keys.items():
        (factory / f"{device}.pub").write_bytes(_pem(key))
    r = cli("fleet", "enroll", "--from", str(factory), cwd=repo)
    assert r.code == 0, r.err
    assert r.out.startswith("enrolled 3 device(s); commit the key files")
    assert sorted(git(repo, "diff", "--cached", "--name-only").split()) == [
        f"devices/{d}.pub" for d in sorted((a, b, c))
    ]
    git(repo, "commit", "-qm", "enroll the canary devices")
    release(repo, NOW - 2 * H)
    folder = tmp_path / "reports"

    # one honest report; one unsigned; one claiming c, signed by a's key
    url = _write(folder, {
        a: seal_report(_on(a, 1), keys[a]),
        b: _on(b, 1),
        c: seal_report(_on(c, 1), keys[a]),
    })  # fmt: skip
    r = cli("fleet", "advance", "--reports", url, "--dry-run", cwd=repo)
    assert r.code == 0, r.err
    assert "wait: 1 of 1 devices of the 10% wave report running 1.1.0; 2 needed" in r.out
    assert f"not counted: {b}.json: not signed" in r.out
    assert (
        f"not counted: {c}.json: the signature does not verify with the key enrolled for {c!r}"
        in (r.out)
    )
    assert percent_of(repo)["percent"] == 10

    # a device nobody enrolled reports too: listed apart in fleet status
    stranger = ed25519.Ed25519PrivateKey.generate()
    url = _write(folder, {
        a: seal_report(_on(a, 2), keys[a]),
        b: seal_report(_on(b, 1), keys[b]),
        c: seal_report(_on(c, 1), keys[c]),
        "cam-stranger": seal_report(_on("cam-stranger", 1), stranger),
    })  # fmt: skip
    status = json.loads(cli("fleet", "status", "--reports", url, "--json", cwd=repo).out)
    assert status["authenticated"] is True
    assert status["devices"] == 3
    assert status["untrusted"] == [{
        "source": "cam-stranger.json",
        "reason": "device 'cam-stranger' is not enrolled (modelreg fleet enroll cam-stranger "
                  "--public-key FILE)",
    }]  # fmt: skip
    # three signed reports: the next wave
    r = cli("fleet", "advance", "--reports", url, cwd=repo)
    assert r.code == 0, r.err
    assert percent_of(repo)["percent"] == 50

    # a's report of sequence 1, stored again (replayed): older than the 2 already seen
    url = _write(folder, {a: seal_report(_on(a, 1), keys[a])})
    status = json.loads(cli("fleet", "status", "--reports", url, "--json", cwd=repo).out)
    assert status["untrusted"] == [{
        "source": f"{a}.json",
        "reason": f"replayed: sequence 1, older than 2 already seen from {a!r}",
    }]  # fmt: skip
    # ... or another report under a number already seen
    url = _write(folder, {a: seal_report(_on(a, 2, "1.0.0"), keys[a])})
    status = json.loads(cli("fleet", "status", "--reports", url, "--json", cwd=repo).out)
    assert status["untrusted"][0]["reason"] == (
        f"replayed: sequence 2 was seen from {a!r} with other content"
    )

    # b revoked mid-wave: its reports stop counting once the removal is merged
    r = cli("fleet", "revoke", b, cwd=repo)
    assert r.code == 0, r.err
    git(repo, "commit", "-qm", f"revoke {b}")
    url = _write(folder, {a: seal_report(_on(a, 3), keys[a]), b: seal_report(_on(b, 2), keys[b])})
    r = cli("fleet", "devices", "--reports", url, "--json", cwd=repo)
    devices = json.loads(r.out)
    assert [row["device"] for row in devices["devices"]] == [a]
    assert devices["untrusted"] == [{"report": f"{b}.json", "reason": (
        f"device {b!r} is not enrolled (modelreg fleet enroll {b} --public-key FILE)"
    )}]  # fmt: skip


def test_enrollment_refuses_what_is_not_a_device_key(repo: Path, tmp_path: Path, cli: Any) -> None:
    bad = tmp_path / "bad.pub"
    bad.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    r = cli("fleet", "enroll", "cam-1", "--public-key", str(bad), cwd=repo)
    assert (r.code, r.err.strip()) == (1, "modelreg: the key of cam-1: not a PEM public key")
    good = tmp_path / "good.pub"
    good.write_bytes(_pem(ed25519.Ed25519PrivateKey.generate()))
    r = cli("fleet", "enroll", "../cam", "--public-key", str(good), cwd=repo)
    assert r.code == 2
    assert "is not a device id" in r.err
    assert not (repo / "devices").exists()  # nothing written
    assert cli("fleet", "enroll", "cam-1", "--public-key", str(good), cwd=repo).code == 0
    other = tmp_path / "other.pub"
    other.write_bytes(_pem(ed25519.Ed25519PrivateKey.generate()))
    r = cli("fleet", "enroll", "cam-1", "--public-key", str(other), cwd=repo)
    assert r.code == 2
    assert "cam-1 is enrolled with another key" in r.err
    assert cli("fleet", "enroll", "cam-1", "--public-key", str(other), "--replace",
               cwd=repo).code == 0  # fmt: skip
    assert (repo / "devices/cam-1.pub").read_bytes() == other.read_bytes()
    r = cli("fleet", "revoke", "cam-9", cwd=repo)
    assert r.code == 2
    assert "cam-9 is not enrolled" in r.err


def test_a_pull_request_that_enrolls_a_device_needs_approval(
    repo: Path, tmp_path: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (repo / ".gitignore").write_text("/.modelreg/\n")  # as `modelreg init` writes it
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-qm", "ignore local state")
    base = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-qb", "enroll")
    key = tmp_path / "cam-1.pub"
    key.write_bytes(_pem(ed25519.Ed25519PrivateKey.generate()))
    assert cli("fleet", "enroll", "cam-1", "--public-key", str(key), cwd=repo).code == 0
    git(repo, "commit", "-qm", "enroll cam-1")
    head = git(repo, "rev-parse", "HEAD").strip()
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": 4, "base": {"sha": base, "ref": "main"},
                                                  "head": {"sha": head}, "user": {"login": "dev"}}}))  # fmt: skip
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/fleet")
    with fake_github() as gh:
        monkeypatch.setenv("GITHUB_API_URL", gh.url)
        monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        gh.reviews[("acme/fleet", 4)] = []
        r = cli("ci", "pr", cwd=repo)
        assert r.code == 1
        assert f"enrolling or revoking devices needs 1 approval(s) of commit {head[:12]}" in r.err
        comment = (repo / ".modelreg/ci/pr-comment.md").read_text()
        assert "- devices enrolled: `cam-1`" in comment
        gh.review("acme/fleet", 4, "ann", "APPROVED", head)
        r = cli("ci", "pr", cwd=repo)
        assert r.code == 0, r.err
