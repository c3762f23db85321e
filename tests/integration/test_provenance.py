"""Provenance end to end (issue 28, points 1, 2 and 5): a release signs where each
version came from (its pull request, the approvals counted, the policy that judged it,
the CI run), in the device description and as SLSA provenance that a DSSE verifier
other than ours accepts; what a release cannot know is marked, never invented."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey

from signing.errors import DigestMismatchError
from signing.keys import load_private_key
from signing.provenance import LOCAL_BUILDER, SLSA_PREDICATE, review_of, verify_envelope
from signing.tuf_repo import TrustRepo
from signing.version_doc import VersionDoc
from tests.conftest import git
from tests.github_fake import TOKEN, fake_github

pytestmark = pytest.mark.integration

REMOTE = ".modelreg/remote/modelreg"
WORKFLOW = "acme/fleet/.github/workflows/release.yml@refs/heads/main"


@pytest.fixture
def merged(tmp_path: Path, cli, example_models: Path) -> dict[str, Any]:
    """mlp 1.0.0 declared on branch ``pr-7`` and merged into main by a merge commit."""
    root = tmp_path / "fleet"
    assert cli("init", str(root), cwd=tmp_path).code == 0
    assert cli("model", "add", "mlp", "--channel-order", "canary,production", cwd=root).code == 0
    git(root, "add", "-A")
    git(root, "commit", "-qm", "declare mlp")
    base = git(root, "rev-parse", "HEAD").strip()
    git(root, "checkout", "-qb", "pr-7")
    r = cli("version", "add", "mlp", "1.0.0", "--artifact", str(example_models / "mlp/1.0.0.onnx"),
            "--golden-inputs", str(example_models / "mlp/1.0.0.inputs.npz"), cwd=root)  # fmt: skip
    assert r.code == 0, r.err
    git(root, "commit", "-qm", "mlp 1.0.0")
    stale = git(root, "rev-parse", "HEAD").strip()
    assert cli("promote", "mlp", "1.0.0", "-c", "canary", cwd=root).code == 0
    git(root, "commit", "-qam", "1.0.0 to canary")
    head = git(root, "rev-parse", "HEAD").strip()
    git(root, "checkout", "-q", "main")
    git(root, "merge", "-q", "--no-ff", "-m", "Merge pull request #7", "pr-7")
    merge = git(root, "rev-parse", "HEAD").strip()
    return {"root": root, "base": base, "stale": stale, "head": head, "merge": merge}


def _release_env(monkeypatch: pytest.MonkeyPatch, api: str) -> None:
    for key, value in {
        "GITHUB_REF": "refs/heads/main", "GITHUB_REPOSITORY": "acme/fleet",
        "GITHUB_SERVER_URL": "https://github.example", "GITHUB_RUN_ID": "4242",
        "GITHUB_RUN_ATTEMPT": "2", "GITHUB_WORKFLOW_REF": WORKFLOW, "GITHUB_EVENT_NAME": "push",
        "RUNNER_ENVIRONMENT": "github-hosted", "RUNNER_OS": "Linux", "GITHUB_TOKEN": TOKEN,
        "GITHUB_API_URL": api,
    }.items():  # fmt: skip
        monkeypatch.setenv(key, value)


def _signed(root: Path, path: str) -> bytes:
    return TrustRepo.load(root / "trust/metadata").read_target(root / REMOTE, path)


def _targets_key(root: Path) -> Any:
    return load_private_key(root / ".modelreg/keys/targets.key").public_key()


def test_a_release_signs_who_approved_what_it_released(
    merged: dict[str, Any], cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, base, head, merge = merged["root"], merged["base"], merged["head"], merged["merge"]
    with fake_github() as gh:
        gh.merge("acme/fleet", 7, commits=[merged["stale"], head], head=head, base=base,
                 merge_commit=merge, author="dev")  # fmt: skip
        gh.review("acme/fleet", 7, "ann", "APPROVED", head)
        gh.review("acme/fleet", 7, "bob", "APPROVED", merged["stale"])  # an older commit
        gh.review("acme/fleet", 7, "carol", "APPROVED", head)
        gh.access("acme/fleet", "carol", "triage")  # no write access: does not count
        gh.review("acme/fleet", 7, "dev", "APPROVED", head)  # the author
        # what ci pr counted on the pull request's head, before the merge ...
        git(root, "checkout", "-q", "pr-7")
        event = tmp_path / "event.json"
        event.write_text(json.dumps({"pull_request": {
            "number": 7, "base": {"sha": base, "ref": "main"}, "head": {"sha": head},
            "user": {"login": "dev"}}}))  # fmt: skip
        monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
        monkeypatch.setenv("GITHUB_REPOSITORY", "acme/fleet")
        monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        monkeypatch.setenv("GITHUB_API_URL", gh.url)
        pr = cli("ci", "pr", "--json", cwd=root)
        assert pr.code == 0, pr.err
        assert json.loads(pr.out)["problems"] == []
        comment = (root / ".modelreg/ci/pr-comment.md").read_text()
        assert f"- approvals: 1 approval(s) of {head[:12]} (ann)" in comment
        monkeypatch.delenv("GITHUB_EVENT_PATH")
        git(root, "checkout", "-q", "main")
        # ... is what the release signs
        _release_env(monkeypatch, gh.url)
        r = cli("ci", "release", "--json", cwd=root)
    assert r.code == 0, r.err
    published = json.loads(r.out)["published"]
    assert "provenance/mlp/1.0.0.intoto.json" in published

    doc = VersionDoc.from_bytes(_signed(root, "versions/mlp/1.0.0.json"))
    provenance = doc.provenance
    assert provenance is not None
    assert provenance.commit == merge  # what the release built
    assert provenance.unknown == {}
    pull = provenance.pull_request
    assert pull is not None
    assert (pull.number, pull.head, pull.base, pull.merge_commit, pull.author) == (
        7, head, base, merge, "dev",
    )  # fmt: skip
    assert [(a.login, a.permission, a.commit) for a in provenance.approvals or []] == [
        ("ann", "write", head)
    ]
    assert provenance.approvals is not None
    assert provenance.approvals[0].review_id is not None
    policy = provenance.policy
    assert policy is not None
    committed = subprocess.run(["git", "-C", str(root), "cat-file", "blob",
                                f"{base}:manifests/mlp/model.yaml"],
                               capture_output=True, check=True).stdout  # fmt: skip
    assert (policy.file, policy.commit) == ("manifests/mlp/model.yaml", base)
    assert policy.sha256 == hashlib.sha256(committed).hexdigest()
    ci = provenance.ci
    assert ci is not None
    assert (ci.run_id, ci.run_attempt, ci.workflow_ref, ci.runner_environment) == (
        "4242", "2", WORKFLOW, "github-hosted",
    )  # fmt: skip
    assert provenance.summary() == "PR #7 approved by ann; CI run 4242 attempt 2"
    # anyone with the repository reads it back, checked against the signed metadata
    shown = cli("show", "mlp:1.0.0", "--provenance", cwd=root)
    assert shown.code == 0, shown.err
    assert "  provenance:     PR #7 approved by ann; CI run 4242 attempt 2\n" in shown.out
    facts = json.loads(cli("show", "mlp:1.0.0", "--provenance", "--json", cwd=root).out)
    assert facts["provenance"]["pull_request"]["number"] == 7
    assert facts["provenance"]["approvals"][0]["login"] == "ann"

    # The SLSA provenance verifies with securesystemslib's DSSE, not only our code.
    envelope = _signed(root, "provenance/mlp/1.0.0.intoto.json")
    key = SSlibKey.from_crypto(_targets_key(root))
    Envelope.from_dict(json.loads(envelope)).verify([key], 1)
    statement = verify_envelope(envelope, [_targets_key(root)], "provenance")
    artifact = (root / "models/mlp/1.0.0.onnx").read_bytes()
    assert statement["subject"] == [
        {
            "name": "models/mlp/1.0.0.onnx",
            "digest": {"sha256": hashlib.sha256(artifact).hexdigest()},
        }
    ]
    assert statement["predicateType"] == SLSA_PREDICATE
    predicate = statement["predicate"]
    assert predicate["runDetails"]["builder"]["id"] == f"https://github.com/{WORKFLOW}"
    source = predicate["buildDefinition"]["resolvedDependencies"][0]
    assert source == {"uri": f"git+https://github.example/acme/fleet@{merge}",
                      "digest": {"gitCommit": merge}}  # fmt: skip
    assert review_of(statement, "provenance") == provenance


def test_a_release_by_hand_marks_what_it_cannot_know(merged: dict[str, Any], cli) -> None:
    root = merged["root"]
    r = cli("ci", "release", "--json", cwd=root)
    assert r.code == 0, r.err
    provenance = VersionDoc.from_bytes(_signed(root, "versions/mlp/1.0.0.json")).provenance
    assert provenance is not None
    assert (provenance.pull_request, provenance.approvals, provenance.policy, provenance.ci) == (
        None, None, None, None,
    )  # fmt: skip
    assert provenance.unknown["ci"] == "released outside GitHub Actions (GITHUB_RUN_ID is not set)"
    assert provenance.unknown["pull_request"].startswith("GITHUB_REPOSITORY is not set")
    assert set(provenance.unknown) == {"ci", "pull_request", "approvals", "policy"}
    statement = verify_envelope(
        _signed(root, "provenance/mlp/1.0.0.intoto.json"), [_targets_key(root)], "provenance"
    )
    assert statement["predicate"]["runDetails"]["builder"]["id"] == LOCAL_BUILDER
    shown = cli("show", "mlp:1.0.0", "--provenance", cwd=root).out
    assert "no pull request (GITHUB_REPOSITORY is not set: no pull request to look up)" in shown
    assert "not released by CI (released outside GitHub Actions" in shown


def test_a_tampered_provenance_is_refused_before_anything_reads_it(
    merged: dict[str, Any], cli, tmp_path: Path
) -> None:
    """The description on the remote edited (the commit it names swapped for another,
    same length): the device's TUF client refuses the bytes; the SLSA envelope does not
    verify under another key."""
    from edge_sync.sync.trust import DeviceTrust

    root = merged["root"]
    assert cli("ci", "release", cwd=root).code == 0
    trust = TrustRepo.load(root / "trust/metadata")
    info = trust.published("versions/mlp/1.0.0.json")
    assert info is not None
    stored = next((root / REMOTE / "targets/versions/mlp").glob(f"*.{'1.0.0.json'}"))
    data = stored.read_bytes()
    assert json.loads(data)["provenance"]["commit"] == merged["merge"]
    stored.write_bytes(data.replace(merged["merge"].encode(), merged["base"].encode()))
    assert len(stored.read_bytes()) == info.length
    DeviceTrust.provision(tmp_path / "dev", (root / "trust/metadata/1.root.json").read_bytes())
    device = DeviceTrust(tmp_path / "dev", root, root / REMOTE)
    with pytest.raises(DigestMismatchError):
        device.fetch("versions/mlp/1.0.0.json", tmp_path / "got", kind="version")
    from cryptography.hazmat.primitives.asymmetric import ec

    from signing.errors import SignatureError

    stranger = ec.generate_private_key(ec.SECP256R1()).public_key()
    with pytest.raises(SignatureError, match="does not verify"):
        verify_envelope(_signed(root, "provenance/mlp/1.0.0.intoto.json"), [stranger], "p")


def test_what_github_answers_is_kept_as_one_bounded_line(
    merged: dict[str, Any], cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An API error quoting a long URL (or whatever a hostile proxy answered) is a
    reason of at most 500 printable characters: the release goes on, nothing invented."""
    root = merged["root"]
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/fleet")
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_API_URL", "http://127.0.0.1:9/" + "x" * 700 + "\x1b[31m")
    r = cli("ci", "release", "--json", cwd=root)
    assert r.code == 0, r.err
    assert TOKEN not in r.out + r.err
    provenance = VersionDoc.from_bytes(_signed(root, "versions/mlp/1.0.0.json")).provenance
    assert provenance is not None
    assert provenance.pull_request is None
    why = provenance.unknown["pull_request"]
    assert why.startswith("GitHub API")
    assert len(why) <= 500
    assert why.isprintable()
