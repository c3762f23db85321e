"""``modelreg diff`` on real git + DVC repositories."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelreg.cli.diff_cmd import diff
from tests.conftest import git

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def diff_registered() -> Iterator[None]:
    """Register ``diff`` on the CLI group for these tests unless main.py already does."""
    from modelreg.cli.main import cli as group

    added = "diff" not in group.commands
    if added:
        group.add_command(diff)
    yield
    if added:
        group.commands.pop("diff")


@pytest.fixture
def repo(tmp_path: Path, cli, example_models: Path) -> Path:
    """mlp 1.0.0 on main; a feature branch adding mlp 1.1.0, 2.0.0 and a new cnn model."""
    root = tmp_path / "models-repo"
    assert cli("init", str(root), cwd=tmp_path).code == 0
    assert cli("model", "add", "mlp", cwd=root).code == 0

    def add(model: str, version: str, *extra: str) -> None:
        files = example_models / model
        r = cli("version", "add", model, version, "--artifact", str(files / f"{version}.onnx"),
                "--golden-inputs", str(files / f"{version}.inputs.npz"), *extra,
                cwd=root)  # fmt: skip
        assert r.code == 0, r.err

    add("mlp", "1.0.0", "--metric", "accuracy=0.912")
    git(root, "commit", "-qm", "mlp 1.0.0")
    git(root, "checkout", "-qb", "feature")
    add("mlp", "1.1.0", "--metric", "accuracy=0.924")
    add("mlp", "2.0.0", "--metric", "accuracy=0.931")
    assert cli("model", "add", "cnn", cwd=root).code == 0
    add("cnn", "1.0.0")
    git(root, "commit", "-qm", "mlp 1.1.0, 2.0.0; cnn 1.0.0")
    return root


def test_diff_two_versions_prints_markdown(repo: Path, cli) -> None:
    r = cli("diff", "mlp", "1.0.0", "1.1.0", cwd=repo)
    assert r.code == 0, r.err
    assert r.out.startswith("### Model diff: mlp 1.0.0 → 1.1.0\n\n**Weights only**: 4 of 16")
    assert "| `accuracy` | 0.912 | 0.924 | +0.012 | +1.32 % |" in r.out
    assert "| `default` | `probs` |" in r.out  # drift on the 1.1.0 goldens


def test_diff_json_output_file_and_step_summary(
    repo: Path, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    comment = tmp_path / "comment.md"
    r = cli("diff", "mlp", "1.1.0", "2.0.0", "--json", "--output", str(comment), cwd=repo)
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["verdict"] == "graph change"
    assert [o["op_type"] for o in data["graph"]["ops"] if o["added"]] == ["Add", "MatMul", "Relu"]
    markdown = comment.read_text()
    assert markdown.startswith("### Model diff: mlp 1.1.0 → 2.0.0\n")
    assert summary.read_text() == markdown + "\n"


def test_diff_against_base_ref(repo: Path, cli) -> None:
    r = cli("diff", "--base", "main", "--json", cwd=repo)
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["base"] == "main"
    pairs = [
        (d["model"], d["old"]["label"], d["new"]["label"], d["verdict"]) for d in data["diffs"]
    ]
    assert pairs == [
        ("mlp", "1.0.0", "1.1.0", "weights only"),
        ("mlp", "1.1.0", "2.0.0", "graph change"),
    ]
    assert data["without_parent"] == [{"model": "cnn", "version": "1.0.0"}]
    md = cli("diff", "--base", "main", cwd=repo)
    assert md.code == 0, md.err
    assert md.out.startswith("## Model diffs against `main`\n")
    assert "- `cnn` 1.0.0: new model version without a parent; nothing to diff." in md.out
    assert md.out.count("### Model diff: mlp") == 2
    # nothing changed against the branch itself
    same = cli("diff", "--base", "HEAD", cwd=repo)
    assert same.code == 0, same.err
    assert "No model version changed." in same.out


def test_a_changed_dvc_pointer_alone_is_built_and_diffed(
    repo: Path, cli, example_models: Path
) -> None:
    """What a pull request builds is what its comment diffs: one rule for both
    (before, a pull request that swapped only an artifact was built but not diffed)."""
    from pipelines import dvc
    from pipelines.build import changed_versions as built
    from pipelines.diff import changed_versions as diffed
    from registry.repository import load_repository

    base = git(repo, "rev-parse", "HEAD").strip()
    artifact = repo / "models/mlp/1.1.0.onnx"
    artifact.chmod(0o644)
    shutil.copyfile(example_models / "mlp/1.0.0.onnx", artifact)  # same graph, other weights
    dvc.add(repo, artifact)
    git(repo, "commit", "-qam", "retrain 1.1.0 in place")
    changed = git(repo, "diff", "--name-only", base).split()
    assert changed == ["models/mlp/1.1.0.onnx.dvc"]
    loaded = load_repository(repo, jobs=1)
    assert built(loaded, base) == {("mlp", "1.1.0")}
    assert diffed(loaded, base) == [("mlp", "1.1.0")]
    r = cli("diff", "--base", base, "--json", cwd=repo)
    assert r.code == 0, r.err
    (one,) = json.loads(r.out)["diffs"]
    assert (one["old"]["label"], one["new"]["label"]) == ("1.0.0", "1.1.0")


def test_diff_domain_errors_exit_1_with_one_line(repo: Path, cli) -> None:
    unknown = cli("diff", "mlp", "1.0.0", "9.9.9", cwd=repo)
    assert unknown.code == 1
    assert unknown.err.strip() == (
        "manifests/mlp/versions/9.9.9.yaml: version 9.9.9 is not declared for model 'mlp' "
        "(declared: 1.0.0, 1.1.0, 2.0.0)"
    )
    artifact = repo / "models/mlp/1.1.0.onnx"
    data = artifact.read_bytes()
    artifact.unlink()  # as in a fresh clone: diff pulls it through DVC
    assert cli("diff", "mlp", "1.0.0", "1.1.0", cwd=repo).code == 0
    assert artifact.read_bytes() == data
    artifact.unlink()
    shutil.rmtree(repo / ".dvc/cache")  # and nowhere to pull it from
    missing = cli("diff", "mlp", "1.0.0", "1.1.0", cwd=repo)
    assert missing.code == 1
    assert missing.err.strip() == (
        "modelreg: models/mlp/1.1.0.onnx: missing from the workspace, the DVC cache and the "
        f"DVC remote (md5 {hashlib.md5(data, usedforsecurity=False).hexdigest()}); upload it with "
        "`dvc push models/mlp/1.1.0.onnx` from the clone that added it; the DVC remote is "
        ".modelreg/remote, a folder inside each clone (the default of `modelreg init`) that no "
        "teammate or CI job reaches: point DVC at a shared remote first (`dvc remote modify "
        "storage url s3://bucket/path`, commit .dvc/config)"
    )
    # a ref that names no commit is a usage error, as for build --base (one rule)
    bad_ref = cli("diff", "--base", "no-such-ref", cwd=repo)
    assert bad_ref.code == 2
    assert bad_ref.err == "modelreg: error: git ref 'no-such-ref' does not name a commit\n"


def test_diff_usage_errors_exit_2(repo: Path, cli) -> None:
    assert cli("diff", "mlp", "1.0.0", cwd=repo).code == 2
    both = cli("diff", "mlp", "1.0.0", "1.1.0", "--base", "main", cwd=repo)
    assert both.code == 2
    assert "not both" in both.err
