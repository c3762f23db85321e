"""A pull request gets nothing signed that the pipeline did not build and the base
branch's policy did not approve (issue 8, points 1, 3, 4 and DVC's configuration).

Each test replays an attack found in review on a released fleet repository: the
attacker's branch, ``ci pr`` on it, the merge (the check was not required, or was
fooled), ``ci release`` with the online keys, and a device that trusts only root v1.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.conftest import ARTIFACT, Fleet
from tests.conftest import Result, git

pytestmark = pytest.mark.integration


def _planted_record(fleet: Fleet, version: str) -> Path:
    """A build record that names files of the runner as engines of ``version``."""
    folder = fleet.root / ".modelreg/build/mlp" / version
    folder.mkdir(parents=True, exist_ok=True)
    key = fleet.root / ".modelreg/keys/targets.key"
    engines = [
        {"target": "cpu", "engine": "onnxruntime", "status": "built", "path": ".git/config"},
        {"target": "passwd", "engine": "onnxruntime", "status": "built", "path": "/etc/passwd"},
        {"target": "key", "engine": "onnxruntime", "status": "built", "path": str(key)},
    ]
    record = {"ok": True, "model": "mlp", "version": version, "engines": engines}
    (folder / "build.json").write_text(json.dumps(record))
    (folder / "cpu.ort.onnx").symlink_to(fleet.root / ".git/config")
    return folder


def _problems(result: Result) -> str:
    """The problems of a ``--json`` run, one per line."""
    return "\n".join(json.loads(result.out)["problems"])


def _published(fleet: Fleet) -> set[str]:
    metadata = fleet.root / "trust/metadata"
    ts = json.loads((metadata / "timestamp.json").read_text())["signed"]
    snap = json.loads(
        (metadata / f"{ts['meta']['snapshot.json']['version']}.snapshot.json").read_text()
    )
    version = snap["signed"]["meta"]["targets.json"]["version"]
    targets = json.loads((metadata / f"{version}.targets.json").read_text())
    return set(targets["signed"]["targets"])


def test_a_committed_build_record_is_refused_and_never_signed(fleet: Fleet) -> None:
    before = _published(fleet)
    base = fleet.branch("engines")
    _planted_record(fleet, "1.0.0")
    fleet.commit("faster engines", ".modelreg/build", force=True)
    pr = fleet.ci_pr(base)
    assert pr.code == 1
    assert ".modelreg/build/mlp/1.0.0/build.json: is modelreg's local state" in pr.err
    assert ".modelreg/build/mlp/1.0.0/cpu.ort.onnx: is a symbolic link" in pr.err
    assert "local state" in fleet.comment()
    fleet.merge("engines")
    release = fleet.release()
    assert release.code == 1
    assert ".modelreg/build/mlp/1.0.0/build.json: is modelreg's local state" in _problems(release)
    assert _published(fleet) == before
    assert not any(t.startswith("engines/mlp/1.0.0/") and t != "engines/mlp/1.0.0/cpu.ort.onnx"
                   for t in _published(fleet))  # fmt: skip


def test_release_publishes_engines_from_its_own_build_only(fleet: Fleet) -> None:
    """A record left in the work tree (untracked, as on a reused runner) is never read:
    the engine of a new version comes from this run's build, byte for byte."""
    _planted_record(fleet, "1.0.0")
    _planted_record(fleet, "1.1.0")
    r = fleet.cli("version", "add", "mlp", "1.1.0", "--artifact",
                  str(fleet.models / "mlp/1.1.0.onnx"), "--target", "cpu=onnxruntime",
                  cwd=fleet.root)  # fmt: skip
    assert r.code == 0, r.err
    fleet.commit("mlp 1.1.0")
    release = fleet.release()
    assert release.code == 0, release.err
    report = json.loads(release.out)
    engines = sorted(t for t in report["published"] if t.startswith("engines/"))
    assert engines == ["engines/mlp/1.1.0/cpu.ort.onnx"]
    built = next(v for v in report["build"]["versions"] if v["version"] == "1.1.0")
    engine = next(e for e in built["engines"] if e["target"] == "cpu")
    assert not engine["path"].startswith(".modelreg/")  # a private folder of the run
    device = fleet.device()
    got = device.fetch("engines/mlp/1.1.0/cpu.ort.onnx", fleet.tmp / "engine", kind="engine")
    assert got.read_bytes() != (fleet.root / ".git/config").read_bytes()
    import hashlib

    assert hashlib.sha256(got.read_bytes()).hexdigest() == engine["sha256"]
    # The version's signed description names the engine released with it.
    from signing.version_doc import VersionDoc

    doc = device.fetch("versions/mlp/1.1.0.json", fleet.tmp / "doc", kind="version")
    assert VersionDoc.from_bytes(doc.read_bytes()).engines == {
        "cpu": "engines/mlp/1.1.0/cpu.ort.onnx"
    }


def test_engine_checks_refuse_links_changes_and_undeclared_targets(tmp_path: Path) -> None:
    import hashlib

    from pipelines.build import BUILT, EngineResult
    from pipelines.errors import ArtifactError
    from pipelines.publish._stage import _built_engine, engine_file_name

    data = b"engine bytes"
    (tmp_path / "cpu.ort.onnx").write_bytes(data)
    engine = EngineResult("cpu", "onnxruntime", BUILT, "x", hashlib.sha256(data).hexdigest(),
                          len(data))  # fmt: skip
    assert _built_engine(tmp_path, "cpu.ort.onnx", engine) == data
    (tmp_path / "cpu.ort.onnx").write_bytes(b"engine bytez")  # same size, other bytes
    with pytest.raises(ArtifactError, match="changed since it was built"):
        _built_engine(tmp_path, "cpu.ort.onnx", engine)
    (tmp_path / "cpu.ort.onnx").unlink()
    (tmp_path / "secret").write_bytes(data)
    (tmp_path / "cpu.ort.onnx").symlink_to(tmp_path / "secret")
    with pytest.raises(ArtifactError, match="not readable as a regular file"):
        _built_engine(tmp_path, "cpu.ort.onnx", engine)
    assert engine_file_name("cpu", "onnxruntime") == "cpu.ort.onnx"
    assert engine_file_name("gpu", "tensorrt") == "gpu.plan"
    for target, kind in (("passwd", None), ("../x", "onnxruntime"), ("..", "tensorrt")):
        with pytest.raises(ArtifactError):
            engine_file_name(target, kind)


def test_deleting_the_timestamp_cannot_reset_release_history(fleet: Fleet) -> None:
    metadata = fleet.root / "trust/metadata"
    first_targets = (metadata / "1.targets.json").read_bytes()
    device = fleet.device()  # a device that already trusts the release
    base = fleet.branch("reset")
    (metadata / "timestamp.json").unlink()
    fleet.commit("tidy up")
    pr = fleet.ci_pr(base)
    assert pr.code == 1
    assert "trust/metadata" in pr.err
    fleet.merge("reset")
    release = fleet.release()
    assert release.code == 1
    assert "timestamp" in _problems(release)
    assert (metadata / "1.targets.json").read_bytes() == first_targets
    assert git(fleet.root, "status", "--porcelain", "--", "trust").strip() == ""
    from signing.errors import RollbackError, TrustFetchError

    with pytest.raises(TrustFetchError):  # the file is missing: a transport failure,
        device.refresh()  # and the device keeps what it trusts
    git(fleet.root, "revert", "-m", "1", "--no-edit", "HEAD")
    assert fleet.release().code == 0
    try:
        device.refresh()  # nothing was re-signed over what the device holds
    except RollbackError as e:  # pragma: no cover - the failure this test exists for
        pytest.fail(f"the device was stopped: {e}")
    assert device.target_info(ARTIFACT).facts.version == "1.0.0"


def test_deleting_all_online_metadata_is_caught_by_history(fleet: Fleet) -> None:
    metadata = fleet.root / "trust/metadata"
    fleet.branch("wipe")
    for path in metadata.iterdir():
        if not path.name.endswith(".root.json"):
            path.unlink()
    fleet.commit("start over")
    fleet.merge("wipe")
    release = fleet.release()
    assert release.code == 1
    assert "version 0 is below 1, a version that was released before" in _problems(release)
    assert sorted(p.name for p in metadata.iterdir()) == ["1.root.json"]


def test_rewinding_the_timestamp_to_an_older_signed_copy_is_refused(fleet: Fleet) -> None:
    metadata = fleet.root / "trust/metadata"
    old = (metadata / "timestamp.json").read_bytes()
    r = fleet.cli("freshness", "refresh", cwd=fleet.root)
    assert r.code == 0, r.err
    fleet.commit("freshness [skip ci]")
    fleet.branch("rewind")
    (metadata / "timestamp.json").write_bytes(old)  # genuinely signed, one version back
    fleet.commit("rewind")
    fleet.merge("rewind")
    release = fleet.release()
    assert release.code == 1
    assert "timestamp: version 1 is below 2, a version that was released before" in _problems(
        release
    )


def test_moving_the_manifests_does_not_escape_the_base_policy(fleet: Fleet) -> None:
    base = fleet.branch("move")
    shutil.move(fleet.root / "manifests", fleet.root / "m2")
    config = fleet.root / "modelreg.yaml"
    config.write_text(config.read_text().replace("manifests: manifests", "manifests: m2"))
    model = fleet.root / "m2/mlp/model.yaml"
    text = model.read_text().replace("promotion:\n", "promotion:\n    approvals: 0\n")
    model.write_text(text.replace("canary: 1.0.0", "canary: 1.0.0\n    production: 1.0.0"))
    version = fleet.root / "m2/mlp/versions/1.0.0.yaml"
    version.write_text(version.read_text().replace("manifests/mlp/", "m2/mlp/"))
    fleet.commit("reorganize")
    pr = fleet.ci_pr(base)
    assert pr.code == 1
    lines = pr.err.strip().splitlines()
    assert any(line.startswith("modelreg.yaml: cannot count the approvals changing the "
                               "repository configuration needs") for line in lines), lines  # fmt: skip
    assert any("spec.channels.production" in line and "cannot count the approvals" in line
               for line in lines), lines  # fmt: skip


def test_a_swapped_release_cannot_hide_behind_another_trust_folder(fleet: Fleet) -> None:
    base = fleet.branch("hide")
    shutil.copytree(fleet.root / "trust/metadata", fleet.root / "elsewhere")
    shutil.rmtree(fleet.root / "trust")
    config = fleet.root / "modelreg.yaml"
    config.write_text(config.read_text().replace("metadata: trust/metadata", "metadata: elsewhere"))
    # swap the released artifact for other bytes under the same version
    r = fleet.cli("version", "add", "mlp", "1.1.0", "--artifact",
                  str(fleet.models / "mlp/1.1.0.onnx"), cwd=fleet.root)  # fmt: skip
    assert r.code == 0, r.err
    shutil.copy(fleet.root / "models/mlp/1.1.0.onnx.dvc", fleet.root / "models/mlp/1.0.0.onnx.dvc")
    pointer = fleet.root / "models/mlp/1.0.0.onnx.dvc"
    pointer.write_text(pointer.read_text().replace("path: 1.1.0.onnx", "path: 1.0.0.onnx"))
    fleet.commit("swap")
    pr = fleet.ci_pr(base)
    assert pr.code == 1
    assert "version 1.0.0 is released and its artifact models/mlp/1.0.0.onnx has changed" in pr.err


def test_dvc_configuration_from_a_pull_request_is_never_used(fleet: Fleet) -> None:
    base = fleet.branch("cache")
    outside = fleet.tmp / "outside-cache"
    dvc_config = fleet.root / ".dvc/config"
    dvc_config.write_text(dvc_config.read_text() + f"[cache]\n    dir = {outside}\n")
    fleet.commit("shared cache")
    pr = fleet.ci_pr(base)
    assert pr.code == 1  # approvals are needed (and cannot be counted without a token)
    assert ".dvc/config: cannot count the approvals changing the DVC configuration" in pr.err
    assert "- build: skipped (DVC's configuration changes" in fleet.comment()
    assert not outside.exists()
    r = fleet.cli("version", "add", "mlp", "1.1.0", "--artifact",
                  str(fleet.models / "mlp/1.1.0.onnx"), cwd=fleet.root)  # fmt: skip
    assert r.code == 0, r.err
    fleet.commit("and a version")
    shutil.rmtree(outside)  # `version add` (authoring, on the attacker's machine) used it
    pr = fleet.ci_pr(base)
    assert pr.code == 1
    assert "cannot also change model versions" in pr.err
    assert not outside.exists()


def test_the_commit_judged_is_the_head_the_approvals_count_for(fleet: Fleet) -> None:
    """Approvals are counted on the event's head: a checkout of another commit (a later
    push, the merge ref) would have them vouch for code they never saw."""
    base = fleet.branch("later")
    reviewed = fleet.commit("reviewed")
    (fleet.root / "README.extra").write_text("pushed after the review\n")
    head = fleet.commit("unreviewed")
    fleet.github_env(base=base, head=reviewed)
    r = fleet.cli("ci", "pr", cwd=fleet.root)
    assert r.code == 1
    assert r.err.strip() == (
        f"HEAD: the checkout is at {head[:12]}, not the pull request's head {reviewed[:12]}; "
        "check out the head commit (approvals count for it)"
    )
    fleet.github_env(base=base, head=head)
    assert fleet.cli("ci", "pr", cwd=fleet.root).code == 0


def test_a_merge_that_keeps_an_old_tree_cannot_hide_releases(fleet: Fleet) -> None:
    """``git merge -s ours`` of main into an old branch keeps the old metadata and makes
    every later release invisible to a simplified ``git log``: the release sees them."""
    metadata = fleet.root / "trust/metadata"
    fleet.branch("stale")  # forked while timestamp version 1 was current
    git(fleet.root, "checkout", "-q", "main")
    r = fleet.cli("freshness", "refresh", cwd=fleet.root)
    assert r.code == 0, r.err
    fleet.commit("freshness [skip ci]")
    released = (metadata / "timestamp.json").read_bytes()
    git(fleet.root, "checkout", "-q", "stale")
    git(fleet.root, "merge", "-q", "-s", "ours", "-m", "sync with main", "main")
    assert json.loads((metadata / "timestamp.json").read_text())["signed"]["version"] == 1
    fleet.merge("stale")
    release = fleet.release()
    assert release.code == 1
    assert "timestamp: version 1 is below 2" in _problems(release)
    assert git(fleet.root, "status", "--porcelain", "--", "trust").strip() == ""
    git(fleet.root, "checkout", "-q", "HEAD^1", "--", "trust")
    assert (metadata / "timestamp.json").read_bytes() == released


def test_the_release_continues_the_branch_it_was_merged_into(fleet: Fleet) -> None:
    """The second line of defence, on its own: whatever git history shows, the metadata
    must follow the first parent's (the branch before the merge)."""
    from pipelines.ci._release import _check_follows_parent
    from registry.repository import load_repository
    from signing.errors import RollbackError
    from signing.tuf_repo import TrustRepo

    fleet.branch("old")
    git(fleet.root, "checkout", "-q", "main")
    r = fleet.cli("freshness", "refresh", cwd=fleet.root)
    assert r.code == 0, r.err
    fleet.commit("freshness [skip ci]")
    repo = load_repository(fleet.root, cache=False)
    _check_follows_parent(repo, TrustRepo.load(fleet.root / "trust/metadata"))  # it follows
    git(fleet.root, "checkout", "-q", "old")
    git(fleet.root, "merge", "-q", "-s", "ours", "-m", "sync", "main")
    fleet.merge("old")
    with pytest.raises(RollbackError, match="below the base's 2"):
        _check_follows_parent(repo, TrustRepo.load(fleet.root / "trust/metadata"))


def test_a_policy_broken_on_the_base_is_not_replaced_by_the_pull_requests(fleet: Fleet) -> None:
    """A model.yaml that does not load on the base has no policy to read; the pull
    request that repairs it must not bring its own (``approvals: 0``) and promote."""
    model = fleet.root / "manifests/mlp/model.yaml"
    git(fleet.root, "checkout", "-q", "main")
    good = model.read_text()
    model.write_text(good.replace("promotion:\n", "promotion:\n    approvals: two\n"))
    fleet.commit("typo on main")  # a careless operator, straight to main
    base = fleet.branch("repair")
    text = good.replace("promotion:\n", "promotion:\n    approvals: 0\n")
    model.write_text(text.replace("canary: 1.0.0", "canary: 1.0.0\n    production: 1.0.0"))
    fleet.commit("repair, and promote")
    pr = fleet.ci_pr(base)
    assert pr.code == 1
    (line,) = [line for line in pr.err.splitlines() if "cannot count the approvals" in line]
    assert line.startswith("manifests/mlp/model.yaml:")
    assert "spec.channels: cannot count the approvals this promotion needs" in line


def test_the_released_metadata_cannot_move_to_another_folder(fleet: Fleet) -> None:
    """Devices read the metadata where it was released; a release written elsewhere
    would leave them on the old one until it expires (a freeze)."""
    base = fleet.branch("move-trust")
    shutil.copytree(fleet.root / "trust/metadata", fleet.root / "signed")
    config = fleet.root / "modelreg.yaml"
    config.write_text(config.read_text().replace("metadata: trust/metadata", "metadata: signed"))
    fleet.commit("tidy")
    pr = fleet.ci_pr(base)
    assert pr.code == 1
    moved = ("modelreg.yaml: trust.metadata: the released metadata is in trust/metadata, "
             "where devices read it; it cannot move to signed")  # fmt: skip
    assert moved in pr.err.splitlines()
    fleet.merge("move-trust")
    release = fleet.release()
    assert release.code == 1
    assert _problems(release) == moved
    assert not list((fleet.root / "signed").glob("2.*"))


def test_the_release_never_reads_the_checkouts_parse_cache(fleet: Fleet) -> None:
    """The parse cache is the checkout's local state: what is built and signed is parsed
    from the manifests themselves."""
    import registry.repository
    from registry.cache import ParseCache

    r = fleet.cli("version", "add", "mlp", "1.1.0", "--artifact",
                  str(fleet.models / "mlp/1.1.0.onnx"), cwd=fleet.root)  # fmt: skip
    assert r.code == 0, r.err
    fleet.commit("mlp 1.1.0")
    opened: list[Path] = []
    real = ParseCache

    def spy(root: Path, key: str) -> object:
        opened.append(root)
        return real(root, key)

    fleet.monkeypatch.setattr(registry.repository, "ParseCache", spy)
    release = fleet.release()
    assert release.code == 0, release.err
    assert "models/mlp/1.1.0.onnx" in _published(fleet)
    assert opened == []


def test_a_release_loads_validates_and_verifies_the_checkout_once(fleet: Fleet) -> None:
    """One context for every stage: the manifests are parsed and cross-checked once and
    the checkout's trust metadata verified once for validate, build, publish, diff and
    register (metadata of earlier commits, read to check history, is other metadata)."""
    import registry.checks
    import registry.repository
    from signing.tuf_repo import TrustRepo

    for version in ("1.1.0", "2.0.0"):
        r = fleet.cli("version", "add", "mlp", version, "--artifact",
                      str(fleet.models / f"mlp/{version}.onnx"), cwd=fleet.root)  # fmt: skip
        assert r.code == 0, r.err
    fleet.commit("mlp 1.1.0 and 2.0.0")
    loads: list[Path] = []
    checks: list[object] = []
    verified: list[Path] = []
    real_init, real_check = (
        registry.repository.Repository.__init__,
        registry.checks.check_repository,
    )
    real_load = TrustRepo.load.__func__  # type: ignore[attr-defined]

    def init(self: object, *args: Any, **kwargs: Any) -> None:
        loads.append(kwargs.get("root") or args[0])
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]

    def check(repo: object) -> object:
        checks.append(repo)
        return real_check(repo)  # type: ignore[arg-type]

    def load(cls: type[TrustRepo], /, metadata_dir: Path, **kwargs: Any) -> TrustRepo:
        verified.append(metadata_dir)
        return real_load(cls, metadata_dir, **kwargs)  # type: ignore[no-any-return]

    fleet.monkeypatch.setattr(registry.repository.Repository, "__init__", init)
    fleet.monkeypatch.setattr(registry.checks, "check_repository", check)
    fleet.monkeypatch.setattr(TrustRepo, "load", classmethod(load))
    release = fleet.release()
    assert release.code == 0, release.err
    assert {"models/mlp/1.1.0.onnx", "models/mlp/2.0.0.onnx"} <= _published(fleet)
    assert loads == [fleet.root]
    assert len(checks) == 1
    checkout = (fleet.root / "trust/metadata").resolve()
    assert [p for p in verified if Path(p).resolve() == checkout] == [Path(verified[0])]


def test_a_released_versions_signed_fields_and_goldens_cannot_change(fleet: Fleet) -> None:
    """A version's description (targets, engine settings, golden cases) is signed with
    it: a pull request editing them for a released version would get them signed for
    devices that have not installed it yet (a selector that matches no device, goldens
    that fail everywhere)."""
    base = fleet.branch("retarget")
    version = fleet.root / "manifests/mlp/versions/1.0.0.yaml"
    version.write_text(
        version.read_text().replace("name: cpu", "name: cpu\n      selector: {arch: none}")
    )
    outputs = fleet.root / "manifests/mlp/goldens/1.0.0/outputs.npz"
    import numpy as np

    with np.load(outputs) as held:
        arrays = {k: held[k] + 1.0 for k in held.files}
    np.savez(outputs, **arrays)
    fleet.commit("retarget 1.0.0")
    pr = fleet.ci_pr(base)
    assert pr.code == 1
    lines = pr.err.splitlines()
    assert any("spec.targets: version 1.0.0 is released and its targets are signed" in line
               for line in lines), lines  # fmt: skip
    assert any("its golden file manifests/mlp/goldens/1.0.0/outputs.npz is signed" in line
               for line in lines), lines  # fmt: skip
