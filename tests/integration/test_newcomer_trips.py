"""What a new user tripped on (issue 11, point 7), each on a real repository: the
error names the file and the way out, and nothing half-written is left behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import git

pytestmark = pytest.mark.integration


def _tree(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if ".git" not in p.parts)


def test_a_broken_version_file_is_named_by_promote_not_called_undeclared(
    mlp_repo: Path,
    cli: Any,
) -> None:
    path = mlp_repo / "manifests/mlp/versions/1.1.0.yaml"
    path.write_text(path.read_text().replace("metadata:", "metadata:\n  colour: red", 1))
    r = cli("promote", "mlp", "1.1.0", "-c", "canary", cwd=mlp_repo)
    assert r.code == 1
    assert r.err.startswith("manifests/mlp/versions/1.1.0.yaml:")
    assert "unknown key 'colour'" in r.err
    assert "not declared" not in r.err


def test_validate_path_reports_the_broken_manifests_it_depends_on(
    mlp_repo: Path,
    cli: Any,
) -> None:
    model = mlp_repo / "manifests/mlp/model.yaml"
    model.write_text(model.read_text().replace("  task: classification", "  task: [oops]"))
    r = cli("validate", "manifests/mlp/versions/1.1.0.yaml", cwd=mlp_repo)
    assert r.code == 1
    assert "manifests/mlp/model.yaml:" in r.err
    git(mlp_repo, "checkout", "--", "manifests/mlp/model.yaml")
    # its parent (1.0.0) broken: the version cannot be judged valid either
    parent = mlp_repo / "manifests/mlp/versions/1.0.0.yaml"
    parent.write_text(parent.read_text().replace("apiVersion: modelreg/v1", "apiVersion: v2"))
    r = cli("validate", "manifests/mlp/versions/1.1.0.yaml", cwd=mlp_repo)
    assert r.code == 1
    assert r.err.startswith("manifests/mlp/versions/1.0.0.yaml:")
    # 1.0.0 does not depend on its child 1.1.0: a broken child stays out of its report
    git(mlp_repo, "checkout", "--", "manifests/mlp/versions/1.0.0.yaml")
    child = mlp_repo / "manifests/mlp/versions/1.1.0.yaml"
    child.write_text(child.read_text() + "bogus: 1\n")
    assert cli("validate", "manifests/mlp/versions/1.0.0.yaml", cwd=mlp_repo).code == 0
    # the model depends on the versions its channels serve
    git(mlp_repo, "checkout", "--", "manifests/mlp/versions/1.1.0.yaml")
    assert cli("promote", "mlp", "1.0.0", "-c", "canary", cwd=mlp_repo).code == 0
    served = mlp_repo / "manifests/mlp/versions/1.0.0.yaml"
    served.write_text(served.read_text() + "bogus: 1\n")
    child.write_text(child.read_text() + "bogus: 1\n")
    r = cli("validate", "manifests/mlp/model.yaml", cwd=mlp_repo)
    assert r.code == 1
    assert r.err.startswith("manifests/mlp/versions/1.0.0.yaml:")
    assert "1.1.0.yaml" not in r.err
    git(mlp_repo, "checkout", "--", "manifests/mlp")
    # another model's problems stay out of it
    assert cli("model", "add", "other", cwd=mlp_repo).code == 0
    other = mlp_repo / "manifests/other/model.yaml"
    other.write_text(other.read_text() + "bogus: 1\n")
    assert cli("validate", "manifests/mlp/versions/1.1.0.yaml", cwd=mlp_repo).code == 0


def test_json_errors_have_one_shape_for_every_command(
    mlp_repo: Path,
    cli: Any,
) -> None:
    keys = {"file", "line", "col", "field", "message"}
    path = mlp_repo / "manifests/mlp/versions/1.1.0.yaml"
    path.write_text(path.read_text().replace("metadata:", "metadata:\n  colour: red", 1))
    for args, code in (
        (("promote", "mlp", "1.1.0", "-c", "canary", "--json"), 1),  # a manifest problem
        (("show", "nope", "--json"), 1),  # a registry error
        (("promote", "mlp", "--json"), 2),  # a usage error
        (("keys", "generate", "--json"), 2),  # click's multi-line text: one line here
        (("validate", "--json"), 1),
    ):
        r = cli(*args, cwd=mlp_repo)
        assert r.code == code, args
        out = json.loads(r.out)
        assert out["ok"] is False
        assert out["exit_code"] == code
        assert out["errors"], args
        for error in out["errors"]:
            assert set(error) == keys, args
            assert error["message"]
            assert "\n" not in error["message"]
            assert "\t" not in error["message"]
    promote = json.loads(cli("promote", "mlp", "1.1.0", "-c", "canary", "--json", cwd=mlp_repo).out)
    (error,) = promote["errors"]
    assert error["file"] == "manifests/mlp/versions/1.1.0.yaml"
    assert isinstance(error["line"], int)
    assert error["field"] == "metadata.colour"
    assert "unknown key 'colour'" in error["message"]


def test_a_target_the_model_does_not_allow_fails_version_add_and_build(
    repo: Path,
    cli: Any,
    example_models: Path,
) -> None:
    assert cli("model", "add", "mlp", "--target", "cpu", cwd=repo).code == 0
    git(repo, "commit", "-qm", "mlp")
    before = _tree(repo)
    r = cli("version", "add", "mlp", "1.0.0", "--artifact", str(example_models / "mlp/1.0.0.onnx"),
            "--target", "gpu=onnxruntime", cwd=repo)  # fmt: skip
    assert r.code == 1
    assert r.err.strip() == (
        "manifests/mlp/versions/1.0.0.yaml: target 'gpu' is not allowed for model 'mlp' "
        "(allowed: cpu); use one of those, or add it to spec.targets in manifests/mlp/model.yaml"
    )
    assert _tree(repo) == before
    # written by hand anyway: build refuses to build the engine, with the same line
    r = cli("version", "add", "mlp", "1.0.0", "--artifact", str(example_models / "mlp/1.0.0.onnx"),
            "--target", "cpu=onnxruntime", cwd=repo)  # fmt: skip
    assert r.code == 0, r.err
    path = repo / "manifests/mlp/versions/1.0.0.yaml"
    path.write_text(path.read_text().replace("name: cpu", "name: gpu"))
    built = cli("build", "mlp", "1.0.0", cwd=repo)
    assert built.code == 1
    assert "target 'gpu' is not allowed for model 'mlp'" in built.err
    assert not list((repo / ".modelreg/build/mlp/1.0.0").glob("*gpu*"))


def test_init_says_the_default_remote_is_local_and_a_teammate_learns_why(
    tmp_path: Path, cli: Any, example_models: Path
) -> None:
    r = cli("init", str(tmp_path / "mine"), cwd=tmp_path)
    assert r.code == 0
    assert "teammates' clones and CI cannot reach it" in r.err
    assert "modelreg init --remote s3://bucket/path" in r.err
    shared = cli(
        "init", str(tmp_path / "shared"), "--remote", str(tmp_path / "store"), cwd=tmp_path
    )
    assert "cannot reach it" not in shared.err
    mine = tmp_path / "mine"
    assert cli("model", "add", "mlp", cwd=mine).code == 0
    assert cli("version", "add", "mlp", "1.0.0", "--artifact",
               str(example_models / "mlp/1.0.0.onnx"), cwd=mine).code == 0  # fmt: skip
    git(mine, "commit", "-qm", "mlp 1.0.0")
    teammate = tmp_path / "teammate"
    git(tmp_path, "clone", "-q", str(mine), str(teammate))
    shutil.rmtree(teammate / ".modelreg", ignore_errors=True)
    r = cli("build", "mlp", "1.0.0", cwd=teammate)
    assert r.code == 1
    assert "from the clone that added it" in r.err
    assert "a folder inside each clone" in r.err
    assert "dvc remote modify storage url" in r.err
