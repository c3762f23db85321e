"""`modelreg ci pr` and `ci release` on real repositories, with the GitHub environment set."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import git, quiet_mlflow
from tests.github_fake import TOKEN, fake_github

pytestmark = pytest.mark.integration


@pytest.fixture
def repo(tmp_path: Path, cli, example_models: Path) -> Path:
    root = tmp_path / "fleet"
    assert cli("init", str(root), cwd=tmp_path).code == 0
    assert cli("model", "add", "mlp", "--channel-order", "canary,production", cwd=root).code == 0
    r = cli("version", "add", "mlp", "1.0.0", "--artifact", str(example_models / "mlp/1.0.0.onnx"),
            "--golden-inputs", str(example_models / "mlp/1.0.0.inputs.npz"),
            "--target", "cpu=onnxruntime", cwd=root)  # fmt: skip
    assert r.code == 0, r.err
    assert cli("promote", "mlp", "1.0.0", "-c", "canary", cwd=root).code == 0
    git(root, "add", "-A")
    git(root, "commit", "-qm", "mlp 1.0.0")
    return root


def add_version(cli, repo: Path, example_models: Path, version: str) -> None:
    """Declare example mlp ``version`` (its artifact DVC-tracked, nothing committed)."""
    r = cli("version", "add", "mlp", version, "--artifact",
            str(example_models / f"mlp/{version}.onnx"), cwd=repo)  # fmt: skip
    assert r.code == 0, r.err


def github_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, base: str, branch: str) -> Path:
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"base": {"sha": base, "ref": branch}}}))
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "output.txt"))
    monkeypatch.setenv("GITHUB_RUN_ID", "4242")
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.example")
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/fleet")
    return summary


def test_pr_with_a_new_version_passes_and_comments(
    repo: Path, cli, tmp_path: Path, example_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-qb", "new-version")
    r = cli("version", "add", "mlp", "1.1.0", "--artifact", str(example_models / "mlp/1.1.0.onnx"),
            "--golden-inputs", str(example_models / "mlp/1.1.0.inputs.npz"), cwd=repo)  # fmt: skip
    assert r.code == 0, r.err
    git(repo, "commit", "-qam", "mlp 1.1.0")
    summary = github_env(tmp_path, monkeypatch, base, "main")
    r = cli("ci", "pr", cwd=repo)
    assert r.code == 0, r.err
    comment = (repo / ".modelreg/ci/pr-comment.md").read_text()
    assert "ready for review" in comment
    assert "Model diff: mlp 1.0.0 → 1.1.0" in comment
    assert "Weights only" in comment
    assert comment.strip() in summary.read_text()
    assert "- note:" not in comment  # a clean work tree: what was judged is HEAD
    assert "warning:" not in r.err
    outputs = (tmp_path / "output.txt").read_text()
    assert "ok=true" in outputs
    report = json.loads((repo / ".modelreg/ci/pr-report.json").read_text())
    assert [(v["model"], v["version"]) for v in report["build"]["versions"]] == [("mlp", "1.1.0")]


def test_a_pull_request_is_loaded_and_diffed_against_its_base_once(
    repo: Path, cli, tmp_path: Path, example_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One context for the checks, the build and the diff: the repository is loaded
    once, and git is asked once which versions changed (a full pass over every version,
    seconds at 10,000 versions)."""
    import pipelines.changes
    import registry.repository

    base = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-qb", "new-version")
    add_version(cli, repo, example_models, "1.1.0")
    git(repo, "commit", "-qam", "mlp 1.1.0")
    github_env(tmp_path, monkeypatch, base, "main")
    asked: list[str] = []
    loads: list[object] = []
    real_git, real_init = pipelines.changes.git, registry.repository.Repository.__init__  # type: ignore[attr-defined]

    def spy_git(root: Path, *args: str, **kwargs: Any) -> Any:
        if "--name-only" in args:
            asked.append(args[-2])
        return real_git(root, *args, **kwargs)

    def spy_init(self: object, *args: Any, **kwargs: Any) -> None:
        loads.append(self)
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pipelines.changes, "git", spy_git)
    monkeypatch.setattr(registry.repository.Repository, "__init__", spy_init)
    r = cli("ci", "pr", cwd=repo)
    assert r.code == 0, r.err
    report = json.loads((repo / ".modelreg/ci/pr-report.json").read_text())
    assert [(v["model"], v["version"]) for v in report["build"]["versions"]] == [("mlp", "1.1.0")]
    assert [(d["model"], d["new"]["label"]) for d in report["diff"]["diffs"]] == [("mlp", "1.1.0")]
    assert asked == [base]
    assert len(loads) == 1


def test_pr_that_skips_canary_fails_with_one_line(
    repo: Path, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example_models: Path
) -> None:
    base = git(repo, "rev-parse", "HEAD").strip()
    add_version(cli, repo, example_models, "1.1.0")
    assert cli("promote", "mlp", "1.1.0", "-c", "production", "--force", cwd=repo).code == 0
    git(repo, "commit", "-qam", "straight to production")
    github_env(tmp_path, monkeypatch, base, "main")
    r = cli("ci", "pr", cwd=repo)
    assert r.code == 1
    lines = r.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("manifests/mlp/model.yaml:")
    assert (
        "spec.channels.production: version 1.1.0 must be promoted to 'canary' before 'production'"
        in lines[0]
    )
    assert "ok=false" in (tmp_path / "output.txt").read_text()
    # the same change aimed at another branch also breaks the branch policy
    github_env(tmp_path, monkeypatch, base, "develop")
    r = cli("ci", "pr", cwd=repo)
    assert "promotions of 'mlp' must target branch 'main', not 'develop'" in r.err


def test_release_publishes_commits_and_is_idempotent(
    repo: Path, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    github_env(tmp_path, monkeypatch, "HEAD", "main")
    r = cli("ci", "release", "--json", cwd=repo)
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert "models/mlp/1.0.0.onnx" in report["published"]
    # the engine the runner built (and checked) is released too, signed for its target
    assert "engines/mlp/1.0.0/cpu.ort.onnx" in report["published"]
    from edge_sync.sync.trust import DeviceTrust

    DeviceTrust.provision(tmp_path / "dev", (repo / "trust/metadata/1.root.json").read_bytes())
    device = DeviceTrust(tmp_path / "dev", repo, repo / ".modelreg/remote/modelreg")
    device.refresh()
    engine = device.target_info("engines/mlp/1.0.0/cpu.ort.onnx")
    assert (engine.facts.kind, engine.facts.target) == ("engine", "cpu")
    # MLflow holds the release's OMS bundle digest, the same bytes the device can fetch
    import mlflow

    bundle = device.fetch("bundles/mlp/1.0.0.sigstore.json", tmp_path / "b", kind="bundle")
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{repo / '.modelreg/mlflow.db'}")
    tags = client.get_model_version("mlp", "1").tags
    assert tags["modelreg.bundle_digest"] == hashlib.sha256(bundle.read_bytes()).hexdigest()
    assert report["commit"] == git(repo, "rev-parse", "HEAD").strip()
    message = git(repo, "log", "-1", "--format=%s")
    assert "[skip ci]" in message
    assert git(repo, "status", "--porcelain", "--", "trust").strip() == ""
    assert report["mlflow"]["changes"] > 0
    assert list(report["timings_ms"]) == [
        "validate",
        "build",
        "publish",
        "commit",
        "diff",
        "register",
    ]
    row = json.loads(cli("status", "--json", cwd=repo).out)["versions"][0]
    assert row["ci_run"] == "https://github.example/acme/fleet/actions/runs/4242"
    assert cli("status", cwd=repo).out.splitlines()[1].split()[4] == "4242"
    with_mlflow = cli("status", "--mlflow", cwd=repo).out.splitlines()[1].split()
    assert with_mlflow[3] == "1"  # the MLflow version number of mlp 1.0.0
    again = cli("ci", "release", "--json", cwd=repo)
    assert again.code == 0, again.err
    assert json.loads(again.out)["published"] == []
    assert json.loads(again.out)["commit"] is None
    assert json.loads(again.out)["mlflow"]["changes"] == 0
    assert git(repo, "log", "-1", "--format=%s") == message


def test_release_failure_still_reports(
    repo: Path, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    github_env(tmp_path, monkeypatch, "HEAD", "main")
    model = repo / "manifests/mlp/model.yaml"
    model.write_text(model.read_text().replace("canary: 1.0.0", "canary: 7.0.0"))
    git(repo, "commit", "-qam", "a channel at an undeclared version")
    r = cli("ci", "release", "--json", cwd=repo)
    assert r.code == 1
    report = json.loads(r.out)
    assert report["ok"] is False
    assert "points at version 7.0.0, which is not declared" in report["problems"][0]
    assert "ok=false" in (tmp_path / "output.txt").read_text()
    assert (repo / ".modelreg/ci/release-report.json").is_file()


def test_release_refuses_uncommitted_content(
    repo: Path, cli, tmp_path: Path, example_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    github_env(tmp_path, monkeypatch, "HEAD", "main")
    add_version(cli, repo, example_models, "1.1.0")  # untracked manifest, staged pointer
    model = repo / "manifests/mlp/model.yaml"  # tracked and modified
    model.write_text(model.read_text().replace("canary: 1.0.0", "canary: 1.1.0"))
    head = git(repo, "rev-parse", "HEAD")
    r = cli("ci", "release", cwd=repo)
    assert r.code == 1
    assert r.err == (
        "uncommitted changes would be released: 'manifests/mlp/model.yaml', "
        "'manifests/mlp/versions/1.1.0.yaml', 'models/mlp/1.1.0.onnx.dvc'; commit them "
        "(or remove them) first: ci release signs only committed content\n"
    )
    assert not (repo / "trust/metadata/targets.json").exists()  # nothing signed
    assert git(repo, "rev-parse", "HEAD") == head
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "mlp 1.1.0 to canary")
    r = cli("ci", "release", "--json", cwd=repo)
    assert r.code == 0, r.err
    assert "models/mlp/1.1.0.onnx" in json.loads(r.out)["published"]


def test_pr_with_an_unreadable_event_file(
    repo: Path, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    event = tmp_path / "event.json"
    event.write_text("{bad")
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    r = cli("ci", "pr", cwd=repo)
    assert r.code == 1
    assert r.err.strip().startswith(f"{event}: not a readable GitHub event")


def test_promotion_needs_the_approvals_its_policy_asks_for(
    repo: Path, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-qb", "to-production")
    assert cli("promote", "mlp", "1.0.0", "-c", "production", cwd=repo).code == 0
    git(repo, "commit", "-qam", "mlp 1.0.0 to production")
    head = git(repo, "rev-parse", "HEAD").strip()
    github_env(tmp_path, monkeypatch, base, "main")
    event = {"pull_request": {"number": 5, "base": {"sha": base, "ref": "main"},
                              "head": {"sha": head}, "user": {"login": "dev"}}}  # fmt: skip
    (tmp_path / "event.json").write_text(json.dumps(event))
    where = f"manifests/mlp/model.yaml:{_value_at(repo, 'production: ')}: spec.channels.production"
    # no token: fail closed, saying how to fix the workflow
    r = cli("ci", "pr", cwd=repo)
    assert r.code == 1
    assert r.err.strip() == (
        f"{where}: cannot count the approvals this promotion needs: GITHUB_TOKEN is not set; "
        "give the step `GITHUB_TOKEN: ${{ github.token }}`"
    )
    with fake_github() as gh:
        monkeypatch.setenv("GITHUB_API_URL", gh.url)
        monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        gh.review("acme/fleet", 5, "dev", "APPROVED", head)  # the author's own
        gh.review("acme/fleet", 5, "ann", "APPROVED", base)  # before the last push
        gh.review("acme/fleet", 5, "bob", "COMMENTED", head)
        r = cli("ci", "pr", cwd=repo)
        assert r.code == 1
        assert r.err.strip() == (
            f"{where}: promoting 'mlp' needs 1 approval(s) of commit {head[:12]}; it has 0"
        )
        gh.review("acme/fleet", 5, "ann", "APPROVED", head)
        r = cli("ci", "pr", cwd=repo)
        assert r.code == 0, r.err
        comment = (repo / ".modelreg/ci/pr-comment.md").read_text()
        assert f"- approvals: 1 approval(s) of {head[:12]} (ann)" in comment
        # a change request revokes it; a broken API fails closed
        gh.review("acme/fleet", 5, "ann", "CHANGES_REQUESTED", head)
        assert cli("ci", "pr", cwd=repo).code == 1
        gh.broken = 503
        r = cli("ci", "pr", cwd=repo)
        assert r.err.strip() == (
            f"{where}: cannot count the approvals this promotion needs: GitHub API: reviews "
            "of pull request #5: HTTP 503 Service Unavailable"
        )
    # a local run (no pull-request event, so no reviews to count) says it did not count
    monkeypatch.delenv("GITHUB_EVENT_PATH")
    r = cli("ci", "pr", "--base", base, cwd=repo)
    assert r.code == 0, r.err
    assert (
        "- approvals: not checked (no pull request event"
        in (repo / ".modelreg/ci/pr-comment.md").read_text()
    )


def _value_at(repo: Path, key: str) -> str:
    """``line:col`` of the value after ``key`` in the model manifest."""
    lines = (repo / "manifests/mlp/model.yaml").read_text().splitlines()
    line, text = next((i, t) for i, t in enumerate(lines, 1) if t.strip().startswith(key))
    return f"{line}:{text.index(key) + len(key) + 1}"


def test_a_pull_request_is_judged_by_the_policy_of_its_base(
    repo: Path, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example_models: Path
) -> None:
    model = repo / "manifests/mlp/model.yaml"
    text = model.read_text()
    assert "approvals:" not in text  # the default, 1
    model.write_text(text.replace("promotion:\n", "promotion:\n    approvals: 2\n"))
    git(repo, "commit", "-qam", "promotions of mlp need two approvals")
    base = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-qb", "sneaky")
    # lower the bar and promote in the same pull request, with a new version beside
    add_version(cli, repo, example_models, "1.1.0")
    model.write_text(model.read_text().replace("    approvals: 2\n", "    approvals: 0\n"))
    assert cli("promote", "mlp", "1.0.0", "-c", "production", cwd=repo).code == 0
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "1.1.0, and 1.0.0 to production with no approvals needed")
    head = git(repo, "rev-parse", "HEAD").strip()
    github_env(tmp_path, monkeypatch, base, "main")
    event = {"pull_request": {"number": 9, "base": {"sha": base, "ref": "main"},
                              "head": {"sha": head}, "user": {"login": "dev"}},
             "review": {"state": "approved"}}  # a pull_request_review event  # fmt: skip
    (tmp_path / "event.json").write_text(json.dumps(event))
    with fake_github() as gh:
        monkeypatch.setenv("GITHUB_API_URL", gh.url)
        monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        gh.review("acme/fleet", 9, "ann", "APPROVED", head)
        gh.review("acme/fleet", 9, "passer-by", "APPROVED", head, association="NONE")
        r = cli("ci", "pr", cwd=repo)
    assert r.code == 1
    assert r.err.strip().endswith(
        f"spec.channels.production: promoting 'mlp' needs 2 approval(s) of commit "
        f"{head[:12]}; it has 1 (ann)"
    )
    assert len(r.err.strip().splitlines()) == 1
    comment = (repo / ".modelreg/ci/pr-comment.md").read_text()
    assert f"- approvals: awaiting 1 more; 1 approval(s) of {head[:12]} (ann)" in comment
    # waiting for approvals, the reviewers still get the build and the diff
    assert "- build: 1 changed version(s), all passed" in comment
    assert "Model diff: mlp 1.0.0 → 1.1.0" in comment


def test_a_pull_request_without_promotions_needs_no_approval(
    repo: Path, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example_models: Path
) -> None:
    base = git(repo, "rev-parse", "HEAD").strip()
    add_version(cli, repo, example_models, "1.1.0")
    git(repo, "commit", "-qam", "mlp 1.1.0")
    github_env(tmp_path, monkeypatch, base, "main")
    event = {"pull_request": {"number": 4, "base": {"sha": base, "ref": "main"},
                              "head": {"sha": git(repo, "rev-parse", "HEAD").strip()}}}  # fmt: skip
    (tmp_path / "event.json").write_text(json.dumps(event))
    r = cli("ci", "pr", cwd=repo)  # no token needed: there is nothing to count
    assert r.code == 0, r.err
    assert (
        "- approvals: no promotion needs an approval"
        in (repo / ".modelreg/ci/pr-comment.md").read_text()
    )


def test_release_mirrors_what_it_can_when_a_bundle_is_unreadable(
    repo: Path, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    github_env(tmp_path, monkeypatch, "HEAD", "main")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////proc/no/such/mlflow.db")
    down = cli("ci", "release", cwd=repo)  # published and committed; MLflow unreachable
    assert down.code == 1
    for stored in (repo / ".modelreg/remote/modelreg/targets/bundles/mlp").iterdir():
        stored.unlink()  # the remote lost the bundle
    db = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    r = cli("ci", "release", "--json", cwd=repo)
    assert r.code == 1
    report = json.loads(r.out)
    assert len(report["problems"]) == 1
    assert report["problems"][0].startswith("mlp 1.0.0: OMS bundle not attached: ")
    assert report["mlflow"]["changes"] > 0  # the version is mirrored all the same
    with quiet_mlflow() as mlflow:
        version = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}").get_model_version("mlp", "1")
    assert version.tags["modelreg.semver"] == "1.0.0"
    assert "modelreg.bundle_digest" not in version.tags


def test_release_logs_one_line_per_stage_in_ci_and_keeps_stdout_json(
    repo: Path, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    github_env(tmp_path, monkeypatch, "HEAD", "main")
    monkeypatch.setenv("CI", "true")
    r = cli("ci", "release", "--json", cwd=repo)
    assert r.code == 0, r.err
    report = json.loads(r.out)  # stdout is the report alone
    lines = r.err.splitlines()
    timed = [re.fullmatch(r"(.+?) \((\d+\.\d\d) s\)", line) for line in lines]
    assert all(timed), lines
    labels = [m[1] for m in timed if m]
    # each stage of the release, in order, with its time (the same as the report's)
    assert [x for x in labels if x.startswith("release: ")] == [
        f"release: {stage}" for stage in report["timings_ms"]
    ]
    for step in ("fetch", "check", "load", "goldens", "engines"):
        assert f"build mlp 1.0.0: {step}" in labels
    assert "publish mlp 1.0.0: sign" in labels
    assert "dvc push: storage" in labels
    assert "register mlp 1.0.0: upload to MLflow" in labels
    seconds = {m[1]: float(m[2]) for m in timed if m}
    assert seconds["release: register"] == pytest.approx(
        report["timings_ms"]["register"] / 1000, abs=0.01
    )
    # the same command outside CI and off a terminal says nothing on stderr
    monkeypatch.delenv("CI")
    quiet = cli("ci", "release", "--json", cwd=repo)
    assert quiet.code == 0, quiet.err
    assert quiet.err == ""


def _heavy_mlp(path: Path, width: int = 512, depth: int = 8) -> Path:
    """An mlp with the example's signature (input [batch, 16] -> probs [batch, 4]) that
    does a hundred times the example's work per row."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    dims = [16, *[width] * depth, 4]
    nodes, inits, x = [], [], "input"
    for i in range(len(dims) - 1):
        w = (rng.standard_normal((dims[i], dims[i + 1])) / np.sqrt(dims[i])).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        out = "logits" if i == len(dims) - 2 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Relu" if out != "logits" else "Identity", [f"m{i}"], [out]))
        x = out
    nodes.append(helper.make_node("Softmax", ["logits"], ["probs"], axis=1))
    graph = helper.make_graph(
        nodes, "heavy", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 4])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_a_version_slower_than_its_base_policy_allows_is_refused(
    repo: Path, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Point 14: build times a new version against its parent on the runner, the
    comment shows the ratio, and ``max_latency_ratio`` (the base's) refuses one that
    got slower than it allows, even when the pull request raises the limit."""
    model = repo / "manifests/mlp/model.yaml"
    model.write_text(
        model.read_text().replace("promotion:\n", "promotion:\n    max_latency_ratio: 3\n")
    )
    git(repo, "commit", "-qam", "mlp may not get three times slower")
    base = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-qb", "heavy")
    heavy = _heavy_mlp(tmp_path / "heavy.onnx")
    r = cli("version", "add", "mlp", "1.1.0", "--artifact", str(heavy), cwd=repo)
    assert r.code == 0, r.err
    model.write_text(
        model.read_text().replace("max_latency_ratio: 3\n", "max_latency_ratio: 1000\n")
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "mlp 1.1.0, and a limit that lets it through")
    github_env(tmp_path, monkeypatch, base, "main")
    r = cli("ci", "pr", cwd=repo)
    assert r.code == 1
    report = json.loads((repo / ".modelreg/ci/pr-report.json").read_text())
    (record,) = report["build"]["versions"]
    latency = record["latency"]
    assert (latency["parent"], latency["inputs"], latency["setup"]) == (
        "1.0.0",
        "sample",
        "prepacked",
    )
    assert latency["reason"] is None
    assert latency["runs"] >= 10
    assert latency["ratio_p50"] > 3
    assert latency["ratio_p50"] == round(latency["p50_ms"] / latency["parent_p50_ms"], 3)
    refusal = next(line for line in r.err.splitlines() if "as long as its parent" in line)
    assert refusal.startswith(
        f"manifests/mlp/versions/1.1.0.yaml: mlp 1.1.0 runs {latency['ratio_p50']:.2f}x as long "
        "as its parent 1.0.0 at p50 on this runner ("
    )
    assert refusal.endswith("the base's spec.promotion.max_latency_ratio of mlp allows 3x")
    comment = (repo / ".modelreg/ci/pr-comment.md").read_text()
    shown = next(line for line in comment.splitlines() if line.startswith("- latency"))
    assert shown.startswith("- latency `mlp 1.1.0`: p50 ")
    assert f"; {latency['ratio_p50']:.2f}x at p50, " in shown
    assert shown.endswith("of 1.0.0's (sample, prepacked, " + f"{latency['runs']} runs each)")
    assert "changes needed" in comment


def test_a_version_as_fast_as_its_parent_passes_with_the_ratio_shown(
    repo: Path, cli, tmp_path: Path, example_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = repo / "manifests/mlp/model.yaml"
    model.write_text(
        model.read_text().replace("promotion:\n", "promotion:\n    max_latency_ratio: 3\n")
    )
    git(repo, "commit", "-qam", "mlp may not get three times slower")
    base = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-qb", "fine-tune")
    r = cli("version", "add", "mlp", "1.1.0", "--artifact", str(example_models / "mlp/1.1.0.onnx"),
            "--golden-inputs", str(example_models / "mlp/1.1.0.inputs.npz"), cwd=repo)  # fmt: skip
    assert r.code == 0, r.err
    git(repo, "commit", "-qam", "mlp 1.1.0")
    github_env(tmp_path, monkeypatch, base, "main")
    r = cli("ci", "pr", cwd=repo)
    assert r.code == 0, r.err
    report = json.loads((repo / ".modelreg/ci/pr-report.json").read_text())
    latency = report["build"]["versions"][0]["latency"]
    assert (latency["parent"], latency["inputs"]) == ("1.0.0", "goldens")
    assert latency["ratio_p50"] is not None
    comment = (repo / ".modelreg/ci/pr-comment.md").read_text()
    assert "- latency `mlp 1.1.0`: p50 " in comment


def test_pr_says_that_uncommitted_edits_were_judged_but_are_not_in_the_commit(
    repo: Path, cli, tmp_path: Path, example_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27 point 15: a pull request holds commits; edits left in the work tree are
    judged by a local run, and the run says so (a warning, not a failure)."""
    base = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-qb", "wip")
    add_version(cli, repo, example_models, "1.1.0")
    git(repo, "commit", "-qm", "mlp 1.1.0")
    version = repo / "manifests/mlp/versions/1.1.0.yaml"
    version.write_text(version.read_text().replace("spec:\n", "spec:\n  description: WIP\n", 1))
    (repo / "notes.txt").write_text("todo\n")
    github_env(tmp_path, monkeypatch, base, "main")
    r = cli("ci", "pr", cwd=repo)
    assert r.code == 0, r.err
    note = (
        "the work tree differs from HEAD in 2 path(s) (manifests/mlp/versions/1.1.0.yaml, "
        "notes.txt): they were judged here, but a pull request holds only commits, and its "
        "approvals count for the head commit: commit them, or stash them to judge HEAD alone"
    )
    assert r.err.splitlines() == [f"warning: {note}"]
    assert f"- note: {note}" in (repo / ".modelreg/ci/pr-comment.md").read_text()
    report = json.loads((repo / ".modelreg/ci/pr-report.json").read_text())
    assert report["uncommitted"] == ["manifests/mlp/versions/1.1.0.yaml", "notes.txt"]
