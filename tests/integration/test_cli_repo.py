"""The authoring commands on real git + DVC repositories."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import yaml

from modelreg.examples import run_onnxruntime
from tests.conftest import git, run_modelreg

pytestmark = pytest.mark.integration


def test_init_scaffolds_git_dvc_and_schemas(repo: Path, cli) -> None:
    assert (repo / ".git").is_dir()
    assert (repo / ".dvc" / "config").is_file()
    config = yaml.safe_load((repo / "modelreg.yaml").read_text())
    assert config["kind"] == "RegistryConfig"
    dvc_config = (repo / ".dvc" / "config").read_text()
    assert "remote = storage" in dvc_config
    url = re.search(r"url = (\S+)", dvc_config)
    assert url
    assert url.group(1) == "../.modelreg/remote"  # relative to .dvc/: moves with the repo
    assert (repo / ".modelreg" / "remote").is_dir()
    staged = git(repo, "diff", "--cached", "--name-only").split()
    assert "modelreg.yaml" in staged
    assert ".modelreg/schemas/model.schema.json" in staged
    # the local remote and other state stay out of git
    assert git(repo, "check-ignore", ".modelreg/remote").strip() == ".modelreg/remote"
    again = cli("init", str(repo), cwd=repo.parent)
    assert again.code == 1
    assert "already a modelreg repository" in again.err
    assert len(again.err.strip().splitlines()) == 1


def test_init_in_existing_git_repo_with_remote(tmp_path: Path, cli) -> None:
    root = tmp_path / "existing"
    root.mkdir()
    git(root, "init", "-q")
    (root / "README.md").write_text("hello\n")
    remote = tmp_path / "shared-remote"
    r = cli("init", str(root), "--remote", str(remote), "--json", cwd=tmp_path)
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert report["git_initialized"] is False
    assert str(remote) in (root / ".dvc" / "config").read_text()


def test_init_that_stopped_half_way_can_be_run_again(tmp_path: Path, cli) -> None:
    root = tmp_path / "fleet"
    (root / ".modelreg").mkdir(parents=True)
    (root / ".modelreg/keys").write_text("a file where the key folder goes\n")
    r = cli("init", str(root), cwd=tmp_path)
    assert r.code == 1
    assert r.err == f"modelreg: {root / '.modelreg/keys'}: File exists\n"
    assert not (root / "modelreg.yaml").exists()  # not a repository yet
    (root / ".modelreg/keys").unlink()
    r = cli("init", str(root), cwd=tmp_path)
    assert r.code == 0, r.err
    assert (root / ".modelreg/keys/root.key").is_file()
    staged = set(git(root, "diff", "--cached", "--name-only").split())
    assert {"modelreg.yaml", "trust/metadata/1.root.json", ".github/workflows/pr.yml"} <= staged
    assert git(root, "status", "--porcelain", "--untracked-files=all").count("??") == 0


def test_errors_map_to_exit_codes(mlp_repo: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    import registry.jsonschema
    from registry.errors import UsageError

    def usage(kind: str | None) -> str:
        raise UsageError("that cannot be")

    monkeypatch.setattr(registry.jsonschema, "schema_text", usage)
    r = cli("schema", cwd=mlp_repo)
    assert (r.code, r.err) == (2, "modelreg: error: that cannot be\n")

    def bug(kind: str | None) -> str:
        raise ValueError("a bug, not the user's doing")

    monkeypatch.setattr(registry.jsonschema, "schema_text", bug)
    r = cli("schema", cwd=mlp_repo)
    assert r.code == 1
    assert r.err == (
        "modelreg: internal error: ValueError: a bug, not the user's doing "
        "(rerun with --traceback)\n"
    )
    r = cli("--traceback", "schema", cwd=mlp_repo)
    assert "Traceback (most recent call last)" in r.err


def test_traceback_is_accepted_after_the_subcommand(
    mlp_repo: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    import registry.jsonschema

    def bug(kind: str | None) -> str:
        raise ValueError("a bug")

    monkeypatch.setattr(registry.jsonschema, "schema_text", bug)
    r = cli("schema", "--kind", "model", "--traceback", cwd=mlp_repo)
    assert r.code == 1
    assert "No such option" not in r.err
    assert "Traceback (most recent call last)" in r.err
    assert r.err.endswith("modelreg: internal error: ValueError: a bug (rerun with --traceback)\n")


def test_written_files_point_editors_at_existing_schemas(mlp_repo: Path) -> None:
    for path in [mlp_repo / "modelreg.yaml", *mlp_repo.glob("manifests/**/*.yaml")]:
        first = path.read_text().splitlines()[0]
        match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
        assert match, path
        schema = (path.parent / match.group(1)).resolve()
        assert schema.is_file(), schema
        assert json.loads(schema.read_text())["$schema"].startswith("https://json-schema.org/")


def test_model_add_writes_valid_manifest_and_refuses_duplicates(repo: Path, cli) -> None:
    r = cli("model", "add", "defect", "--owner", "vision@example.com", "--label", "team=vision",
            "--target", "cpu", cwd=repo)  # fmt: skip
    assert r.code == 0, r.err
    doc = yaml.safe_load((repo / "manifests/defect/model.yaml").read_text())
    assert doc["metadata"] == {"name": "defect", "labels": {"team": "vision"}}
    assert doc["spec"]["owner"] == "vision@example.com"
    assert doc["spec"]["targets"] == ["cpu"]
    dup = cli("model", "add", "defect", cwd=repo)
    assert dup.code == 1
    assert dup.err.strip() == "manifests/defect/model.yaml: model 'defect' is already declared"
    bad = cli("model", "add", "Defect_1", cwd=repo)
    assert bad.code == 1
    assert "not a valid model name" in bad.err
    assert not (repo / "manifests/Defect_1").exists()
    # a bad option value names the option, not a file that was never written
    r = cli("model", "add", "seg", "--channel-order", "canary,Prod", "--task", "t" * 300, cwd=repo)
    assert r.code == 2
    assert r.err == (
        "modelreg: error: --task: longer than 256 characters; --channel-order: 'Prod' is not "
        "valid here (lowercase letters, digits and '-', starting and ending with a letter or "
        "digit, at most 63 characters)\n"
    )
    assert not (repo / "manifests/seg").exists()


def test_version_add_tracks_artifact_with_dvc(mlp_repo: Path, example_models: Path) -> None:
    artifact = mlp_repo / "models/mlp/1.0.0.onnx"
    source = example_models / "mlp/1.0.0.onnx"
    assert artifact.read_bytes() == source.read_bytes()
    pointer = yaml.safe_load((mlp_repo / "models/mlp/1.0.0.onnx.dvc").read_text())
    out = pointer["outs"][0]
    assert out["md5"] == hashlib.md5(source.read_bytes()).hexdigest()  # noqa: S324 - DVC's digest
    assert out["path"] == "1.0.0.onnx"
    # the artifact itself is ignored by git, its pointer is committed
    assert git(mlp_repo, "check-ignore", "models/mlp/1.0.0.onnx").strip()
    tracked = git(mlp_repo, "ls-files").split()
    assert "models/mlp/1.0.0.onnx.dvc" in tracked
    assert "models/mlp/1.0.0.onnx" not in tracked
    # DVC's cache holds the bytes
    md5 = out["md5"]
    assert (mlp_repo / ".dvc/cache/files/md5" / md5[:2] / md5[2:]).is_file()


def test_version_add_reads_signature_parent_and_goldens(
    mlp_repo: Path, example_models: Path
) -> None:
    v1 = yaml.safe_load((mlp_repo / "manifests/mlp/versions/1.0.0.yaml").read_text())
    v11 = yaml.safe_load((mlp_repo / "manifests/mlp/versions/1.1.0.yaml").read_text())
    assert v1["spec"]["signature"]["inputs"] == [
        {"name": "input", "dtype": "float32", "shape": ["batch", 16]}
    ]
    assert v1["spec"]["metrics"] == {"accuracy": 0.91}
    assert "parent" not in v1["spec"]
    assert v11["spec"]["parent"] == "1.0.0"
    model = yaml.safe_load((mlp_repo / "manifests/mlp/model.yaml").read_text())
    assert model["spec"]["signature"] == v1["spec"]["signature"]
    case = v1["spec"]["goldens"]["cases"][0]
    with np.load(mlp_repo / case["inputs"]) as ins, np.load(mlp_repo / case["outputs"]) as outs:
        expected = run_onnxruntime(
            (example_models / "mlp/1.0.0.onnx").read_bytes(), {k: ins[k] for k in ins.files}
        )
        assert set(outs.files) == set(expected)
        for name, value in expected.items():
            np.testing.assert_allclose(outs[name], value, rtol=1e-6)


def test_version_add_refusals_leave_nothing_behind(
    mlp_repo: Path, cli, tmp_path: Path, example_models: Path
) -> None:
    before = sorted(p.relative_to(mlp_repo) for p in mlp_repo.rglob("*") if ".git" not in p.parts)
    not_onnx = tmp_path / "garbage.onnx"
    not_onnx.write_bytes(b"\x00\x01 definitely not protobuf \xff" * 10)
    r = cli("version", "add", "mlp", "1.2.0", "--artifact", str(not_onnx), cwd=mlp_repo)
    assert r.code == 1
    assert r.err.startswith(f"modelreg: {not_onnx}: not an ONNX model")
    dup = cli("version", "add", "mlp", "1.0.0", "--artifact", str(not_onnx), cwd=mlp_repo)
    assert dup.code == 1
    assert "already exists; versions are immutable" in dup.err
    unknown = cli("version", "add", "nope", "1.0.0", "--artifact", str(not_onnx), cwd=mlp_repo)
    assert unknown.code == 1
    assert "model 'nope' is not declared; run `modelreg model add nope` first" in unknown.err
    badver = cli("version", "add", "mlp", "1.2", "--artifact", str(not_onnx), cwd=mlp_repo)
    assert badver.code == 2
    assert "not a SemVer version" in badver.err
    parent = cli("version", "add", "mlp", "1.2.0", "--artifact",
                 str(example_models / "mlp/1.1.0.onnx"), "--parent", "0.9.0", cwd=mlp_repo)  # fmt: skip
    assert parent.code == 1
    assert "parent 0.9.0 is not declared for model 'mlp' (declared: 1.0.0, 1.1.0)" in parent.err
    wrong_io = cli("version", "add", "mlp", "1.2.0", "--artifact",
                   str(example_models / "cnn/1.0.0.onnx"), cwd=mlp_repo)  # fmt: skip
    assert wrong_io.code == 1
    assert "I/O signature does not match model 'mlp'" in wrong_io.err
    after = sorted(p.relative_to(mlp_repo) for p in mlp_repo.rglob("*") if ".git" not in p.parts)
    assert after == before
    for result in (r, dup, unknown, badver, parent, wrong_io):
        assert "Traceback" not in result.err
        assert len(result.err.strip().splitlines()) == 1


def test_a_signature_change_is_declared_by_the_version_and_the_repo_stays_valid(
    repo: Path, cli, example_models: Path
) -> None:
    assert cli("model", "add", "cnn", cwd=repo).code == 0
    assert cli("version", "add", "cnn", "1.0.0", "--artifact",
               str(example_models / "cnn/1.0.0.onnx"), cwd=repo).code == 0  # fmt: skip
    model_file = repo / "manifests/cnn/model.yaml"
    contract = model_file.read_text()
    add = ("version", "add", "cnn", "2.0.0", "--artifact", str(example_models / "cnn/2.0.0.onnx"))
    refused = cli(*add, cwd=repo)
    assert refused.code == 1
    assert "input 'image' is float32[" in refused.err
    # the error names the path that works, not the one that breaks older versions
    assert "--signature-change TEXT" in refused.err
    assert "declare a new model (modelreg model add cnn-v2)" in refused.err
    # giving the model the new signature would leave 1.0.0 invalid: refused, named
    update = cli(*add, "--update-model-signature", cwd=repo)
    assert update.code == 1
    assert "would leave versions of 'cnn' that no longer fit the model: 1.0.0 (" in update.err
    assert len(update.err.strip().splitlines()) == 1
    assert not (repo / "manifests/cnn/versions/2.0.0.yaml").exists()
    assert model_file.read_text() == contract
    accepted = cli(*add, "--signature-change", "takes 32x32 images", cwd=repo)
    assert accepted.code == 0, accepted.err
    assert "declared cnn 2.0.0" in accepted.out
    assert model_file.read_text() == contract  # the model's contract stays
    version = yaml.safe_load((repo / "manifests/cnn/versions/2.0.0.yaml").read_text())
    assert version["spec"]["signature_change"] == "takes 32x32 images"
    assert version["spec"]["signature"]["inputs"][0]["shape"] == ["batch", 1, 32, 32]
    valid = cli("validate", cwd=repo)
    assert valid.code == 0, valid.err
    shown = json.loads(cli("show", "cnn:2.0.0", "--json", cwd=repo).out)
    assert (shown["signature_change"], shown["signature_from"]) == ("takes 32x32 images", "version")
    # without the declaration, validate names the field to set
    path = repo / "manifests/cnn/versions/2.0.0.yaml"
    path.write_text(path.read_text().replace("  signature_change: takes 32x32 images\n", ""))
    broken = cli("validate", cwd=repo)
    assert broken.code == 1
    assert "manifests/cnn/versions/2.0.0.yaml:" in broken.err
    assert "say why in spec.signature_change" in broken.err
    # a declared change for a signature that does not differ is refused
    same = cli("version", "add", "cnn", "1.1.0", "--artifact", str(example_models / "cnn/1.1.0.onnx"),
               "--signature-change", "nothing changes", cwd=repo)  # fmt: skip
    assert same.code == 1
    assert "matches model 'cnn': --signature-change is for a version" in same.err


def test_update_model_signature_refuses_versions_that_take_the_models(
    repo: Path, cli, example_models: Path
) -> None:
    assert cli("model", "add", "cnn", cwd=repo).code == 0
    assert cli("version", "add", "cnn", "1.0.0", "--artifact",
               str(example_models / "cnn/1.0.0.onnx"), cwd=repo).code == 0  # fmt: skip
    path = repo / "manifests/cnn/versions/1.0.0.yaml"
    text = path.read_text()
    start = text.index("  signature:")
    end = text.index("\n  ", text.index("outputs:", start) + 1)
    while text[end + 3 : end + 4] in (" ", "-"):  # the rest of the signature block
        end = text.index("\n", end + 1)
    path.write_text(text[:start] + text[end + 1 :])
    assert cli("validate", cwd=repo).code == 0  # 1.0.0 takes the model's signature
    r = cli("version", "add", "cnn", "2.0.0", "--artifact", str(example_models / "cnn/2.0.0.onnx"),
            "--update-model-signature", cwd=repo)  # fmt: skip
    assert r.code == 1
    assert "1.0.0 (it declares no signature of its own)" in r.err


def test_update_model_signature_when_every_version_fits(
    repo: Path, cli, example_models: Path
) -> None:
    assert cli("model", "add", "cnn", cwd=repo).code == 0
    assert cli("version", "add", "cnn", "2.0.0", "--artifact",
               str(example_models / "cnn/2.0.0.onnx"), cwd=repo).code == 0  # fmt: skip
    path = repo / "manifests/cnn/versions/2.0.0.yaml"
    path.write_text(
        path.read_text().replace("  signature:", "  signature_change: bigger\n  signature:")
    )
    r = cli("version", "add", "cnn", "3.0.0", "--artifact", str(example_models / "cnn/1.0.0.onnx"),
            "--update-model-signature", cwd=repo)  # fmt: skip
    # 2.0.0 declares its own signature, so nothing breaks: the model takes 3.0.0's
    assert r.code == 0, r.err
    assert "signature set from this version" in r.out
    model = yaml.safe_load((repo / "manifests/cnn/model.yaml").read_text())
    assert model["spec"]["signature"]["inputs"][0]["shape"] == ["batch", 1, 28, 28]
    assert cli("validate", cwd=repo).code == 0


def test_promote_keeps_comments_and_enforces_order(mlp_repo: Path, cli) -> None:
    model = mlp_repo / "manifests/mlp/model.yaml"
    text = model.read_text().replace("spec:\n", "spec:  # reviewed by release owners\n", 1)
    text = text.replace("  task: classification\n", "  task: classification  # keep\n")
    model.write_text(text)
    refused = cli("promote", "mlp", "1.1.0", "--channel", "production", cwd=mlp_repo)
    assert refused.code == 1
    assert "must be promoted to 'canary' before 'production'" in refused.err
    assert model.read_text() == text
    r = cli("promote", "mlp", "1.1.0", "--channel", "canary", "--percent", "10", cwd=mlp_repo)
    assert r.code == 0, r.err
    r = cli("promote", "mlp", "1.1.0", "--channel", "production", cwd=mlp_repo)
    assert r.code == 0, r.err
    edited = model.read_text()
    assert "spec:  # reviewed by release owners\n" in edited
    assert "  task: classification  # keep\n" in edited
    channels = yaml.safe_load(edited)["spec"]["channels"]
    assert channels == {
        "canary": {"version": "1.1.0", "rollout": {"percent": 10}},
        "production": "1.1.0",
    }
    # only the channel lines changed
    old_lines, new_lines = text.splitlines(), edited.splitlines()
    assert [ln for ln in old_lines if ln not in new_lines] == ["  channels: {}"]
    back = cli("promote", "mlp", "1.0.0", "--channel", "production", cwd=mlp_repo)
    assert back.code == 1
    forced = cli(
        "promote", "mlp", "1.0.0", "--channel", "production", "--force", "--json", cwd=mlp_repo
    )
    assert forced.code == 0
    assert json.loads(forced.out)["previous"] == "1.1.0"
    undeclared = cli("promote", "mlp", "9.9.9", "--channel", "canary", "--force", cwd=mlp_repo)
    assert undeclared.code == 1
    assert (
        "version 9.9.9 is not declared for model 'mlp' (declared: 1.0.0, 1.1.0)" in undeclared.err
    )
    out_of_range = cli(
        "promote", "mlp", "1.0.0", "--channel", "canary", "--percent", "150", cwd=mlp_repo
    )
    assert out_of_range.code == 2
    assert cli("validate", cwd=mlp_repo).code == 0


def test_promote_stages_its_edit_like_model_and_version_add(mlp_repo: Path, cli) -> None:
    assert git(mlp_repo, "status", "--porcelain") == ""
    r = cli("promote", "mlp", "1.0.0", "--channel", "canary", cwd=mlp_repo)
    assert r.code == 0, r.err
    assert git(mlp_repo, "diff", "--name-only") == ""  # nothing left unstaged
    assert git(mlp_repo, "diff", "--cached", "--name-only") == "manifests/mlp/model.yaml\n"
    git(mlp_repo, "commit", "-qm", "mlp 1.0.0 to canary")
    assert git(mlp_repo, "status", "--porcelain") == ""
    assert "canary: 1.0.0" in git(mlp_repo, "show", "HEAD:manifests/mlp/model.yaml")


def test_build_metadata_does_not_make_a_second_version(
    mlp_repo: Path, cli, example_models: Path
) -> None:
    refusal = (
        "version 1.1.0+build.5 ranks equal to 1.1.0 (SemVer ignores build metadata after "
        "'+'); declare a distinct version instead, e.g. 1.1.0-rc.1 or the next patch"
    )
    r = cli("version", "add", "mlp", "1.1.0+build.5", "--artifact",
            str(example_models / "mlp/1.1.0.onnx"), cwd=mlp_repo)  # fmt: skip
    assert r.code == 1
    assert r.err == f"manifests/mlp/versions/1.1.0+build.5.yaml: {refusal}\n"
    assert not (mlp_repo / "manifests/mlp/versions/1.1.0+build.5.yaml").exists()
    # written by hand, validate refuses it where the version is declared
    text = (mlp_repo / "manifests/mlp/versions/1.1.0.yaml").read_text()
    (mlp_repo / "manifests/mlp/versions/1.1.0+build.5.yaml").write_text(
        text.replace("version: 1.1.0", "version: 1.1.0+build.5")
    )
    r = cli("validate", cwd=mlp_repo)
    assert r.code == 1
    assert f"manifests/mlp/versions/1.1.0+build.5.yaml:6:12: metadata.version: {refusal}" in (
        r.err.splitlines()
    )


def test_golden_inputs_that_do_not_fit_the_model_are_one_line(
    mlp_repo: Path, cli, tmp_path: Path, example_models: Path
) -> None:
    cases: dict[str, npt.NDArray[Any]] = {
        "shape.npz": np.zeros((2, 8), dtype=np.float32),
        "dtype.npz": np.zeros((2, 16), dtype=np.float64),
    }
    for name, array in cases.items():
        np.savez(tmp_path / name, input=array)
        r = cli("version", "add", "mlp", "1.2.0", "--artifact",
                str(example_models / "mlp/1.1.0.onnx"), "--golden-inputs",
                str(tmp_path / name), cwd=mlp_repo)  # fmt: skip
        assert r.code == 1
        assert r.err == (
            f"modelreg: {tmp_path / name}: input 'input' expects float32 [batch, 16], "
            f"given {array.dtype} [{', '.join(map(str, array.shape))}]\n"
        )
        assert not (mlp_repo / "manifests/mlp/versions/1.2.0.yaml").exists()


def test_promote_to_a_mistyped_channel_suggests_the_name_not_force(mlp_repo: Path, cli) -> None:
    model = mlp_repo / "manifests/mlp/model.yaml"
    before = model.read_text()
    for args in ((), ("--force",)):
        r = cli("promote", "mlp", "1.0.0", "--channel", "prodution", *args, cwd=mlp_repo)
        assert r.code == 1
        assert r.err == (
            "manifests/mlp/model.yaml: channel 'prodution' is not in the promotion order of "
            "'mlp' (canary, production); did you mean 'production'? To add a channel, list it "
            "in spec.promotion.order of the model\n"
        )
        assert model.read_text() == before  # --force creates no channel validate refuses


def test_promoting_a_name_that_is_not_a_version_is_one_line_not_a_crash(
    mlp_repo: Path, cli
) -> None:
    # production follows canary, which already serves something: the policy compares
    # versions, and a name that is none must be refused, not parsed.
    assert cli("promote", "mlp", "1.0.0", "--channel", "canary", cwd=mlp_repo).code == 0
    assert cli("promote", "mlp", "1.0.0", "--channel", "production", cwd=mlp_repo).code == 0
    model = mlp_repo / "manifests/mlp/model.yaml"
    before = model.read_text()
    r = cli("promote", "mlp", "latest", "--channel", "production", cwd=mlp_repo)
    assert r.code == 1
    assert "internal error" not in r.err
    assert "version latest is not declared for model 'mlp'" in r.err
    assert model.read_text() == before


def test_status_table_and_json(mlp_repo: Path, cli) -> None:
    head = git(mlp_repo, "rev-parse", "HEAD").strip()
    assert (
        cli("promote", "mlp", "1.0.0", "--channel", "canary", "--percent", "25", cwd=mlp_repo).code
        == 0
    )
    r = cli("status", cwd=mlp_repo)
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == ["model", "version", "commit", "mlflow", "ci", "run", "channels",
                                "signed", "published"]  # fmt: skip
    assert lines[1].split()[:3] == ["mlp", "1.0.0", head[:8]]
    assert "canary (25%)" in lines[1]
    # the mlflow column's "-" is explained (issue 27, point 15)
    assert r.err.strip() == "(mlflow: - without --mlflow: MLflow is not asked unless you say so)"
    (mlp_repo / "manifests/mlp/versions/1.1.0.yaml").write_text(
        (mlp_repo / "manifests/mlp/versions/1.1.0.yaml").read_text() + "# touched\n"
    )
    rows = json.loads(cli("status", "--json", cwd=mlp_repo).out)["versions"]
    assert [(row["version"], row["commit"], row["dirty"]) for row in rows] == [
        ("1.0.0", head, False),
        ("1.1.0", head, True),
    ]
    assert rows[0]["channels"] == ["canary (25%)"]


def test_validate_reports_all_problems_across_files(mlp_repo: Path, cli) -> None:
    model = mlp_repo / "manifests/mlp/model.yaml"
    model.write_text(
        model.read_text().replace("  channels: {}\n", "  channels:\n    production: 3.0.0\n")
    )
    v11 = mlp_repo / "manifests/mlp/versions/1.1.0.yaml"
    v11.write_text(v11.read_text().replace("parent: 1.0.0", "parent: 1.0.5"))
    r = cli("validate", cwd=mlp_repo)
    assert r.code == 1
    assert r.out == ""
    lines = r.err.strip().splitlines()
    assert len(lines) == 2
    assert re.match(
        r"manifests/mlp/model\.yaml:\d+:17: spec\.channels\.production: channel 'production' points "
        r"at version 3\.0\.0, which is not declared for model 'mlp' \(declared: 1\.0\.0, 1\.1\.0\)",
        lines[0],
    )
    assert re.match(
        r"manifests/mlp/versions/1\.1\.0\.yaml:\d+:\d+: spec\.parent: version 1\.0\.5 is not declared "
        r"for model 'mlp' \(declared: 1\.0\.0, 1\.1\.0\)",
        lines[1],
    )
    only = cli("validate", "manifests/mlp/versions", "--json", cwd=mlp_repo)
    report = json.loads(only.out)
    assert only.code == 1
    assert [p["field"] for p in report["problems"]] == ["spec.parent"]


def test_stray_version_file_is_a_problem_not_a_crash(mlp_repo: Path, cli) -> None:
    stray = mlp_repo / "manifests/mlp/versions/v1.2.yaml"
    stray.write_text("apiVersion: modelreg/v1\n")
    line = (
        "manifests/mlp/versions/v1.2.yaml:1:1: file name 'v1.2' is not a SemVer version; "
        "name it <MAJOR.MINOR.PATCH>.yaml"
    )
    for args in (("validate",), ("status",), ("status", "--json")):
        r = cli(*args, cwd=mlp_repo)
        assert r.code == 1, (args, r.err)
        assert line in r.err.splitlines() or args[-1] == "--json", (args, r.err)
        assert "internal error" not in r.err
    assert cli("status", cwd=mlp_repo).out.splitlines()[1].split()[:2] == ["mlp", "1.0.0"]
    base = git(mlp_repo, "rev-parse", "HEAD").strip()
    git(mlp_repo, "checkout", "-qb", "stray")
    git(mlp_repo, "add", str(stray))
    git(mlp_repo, "commit", "-qm", "a stray file")
    r = cli("ci", "pr", "--base", base, cwd=mlp_repo)
    assert r.code == 1
    assert line in r.err.splitlines()
    assert "internal error" not in r.err
    problems = json.loads(cli("status", "--json", cwd=mlp_repo).out)["problems"]
    assert {(p["file"], p["line"], p["col"]) for p in problems} >= {
        ("manifests/mlp/versions/v1.2.yaml", 1, 1)
    }


def test_real_entry_point_exit_codes(mlp_repo: Path) -> None:
    ok = run_modelreg("validate", cwd=mlp_repo)
    assert ok.code == 0
    assert ok.out.startswith("valid: 3 files (1 model, 2 versions)")
    usage = run_modelreg("validate", "--no-such-option", cwd=mlp_repo)
    assert usage.code == 2
    assert "No such option" in usage.err
    outside = run_modelreg("status", cwd=mlp_repo.parent)
    assert outside.code == 1
    assert "not inside a modelreg repository" in outside.err
    assert "Traceback" not in outside.err
    schema = run_modelreg("schema", cwd=mlp_repo)
    assert schema.code == 0
    kinds = {d["properties"]["kind"]["const"] for d in json.loads(schema.out)["$defs"].values()
             if "kind" in d.get("properties", {})}  # fmt: skip
    assert kinds == {"RegisteredModel", "ModelVersion"}


def test_init_inside_an_ignored_folder_gets_its_own_repository(tmp_path: Path, cli) -> None:
    outer = tmp_path / "outer"
    outer.mkdir()
    git(outer, "init", "-q")
    (outer / ".gitignore").write_text("/scratch/\n")
    r = cli("init", str(outer / "scratch" / "fleet"), "--json", cwd=outer)
    assert r.code == 0, r.err
    assert json.loads(r.out)["git_initialized"] is True
    assert (outer / "scratch/fleet/.git").is_dir()


def test_status_and_diff_refuse_bad_arguments_cleanly(mlp_repo: Path, cli) -> None:
    unknown = cli("status", "--model", "nosuch", cwd=mlp_repo)
    assert unknown.code == 1
    assert unknown.err.strip() == "nosuch: model 'nosuch' is not declared (declared: mlp)"
    missing_dir = cli("diff", "mlp", "1.0.0", "1.1.0", "-o", "/nonexistent/x.md", cwd=mlp_repo)
    assert missing_dir.code == 2
    assert "folder /nonexistent does not exist" in missing_dir.err
    assert "Traceback" not in missing_dir.err + unknown.err


def test_promote_says_when_a_rollout_becomes_full(mlp_repo: Path, cli) -> None:
    assert cli("promote", "mlp", "1.1.0", "-c", "canary", "--percent", "10", cwd=mlp_repo).code == 0
    full = cli("promote", "mlp", "1.1.0", "-c", "canary", cwd=mlp_repo)
    assert full.code == 0
    assert "(rollout 10% -> all devices)" in full.out
