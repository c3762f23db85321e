"""``modelreg build`` on real git + DVC repositories, with real ONNX Runtime sessions."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml

from modelreg.cli.build_cmd import build as build_command
from pipelines.build import STAGES, BuildRecord, build, build_version
from pipelines.build._checks import compare_signatures
from pipelines.build._goldens import compare_output
from pipelines.errors import BuildError, PipelineError
from registry.repository import load_repository
from registry.schema import Signature
from tests.conftest import git

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _build_registered() -> None:
    # main.py is not ours to edit; register the command the way main's _register would.
    from modelreg.cli.main import cli as group

    if "build" not in group.commands:
        group.add_command(build_command)


def _add_mlp(repo: Path, cli, example_models: Path) -> None:
    assert cli("model", "add", "mlp", cwd=repo).code == 0
    r = cli("version", "add", "mlp", "1.0.0", "--artifact", str(example_models / "mlp/1.0.0.onnx"),
            "--golden-inputs", str(example_models / "mlp/1.0.0.inputs.npz"),
            "--target", "cpu=onnxruntime", "--target", "jetson=tensorrt:fp16", cwd=repo)  # fmt: skip
    assert r.code == 0, r.err
    r = cli("version", "add", "mlp", "1.1.0", "--artifact", str(example_models / "mlp/1.1.0.onnx"),
            cwd=repo)  # fmt: skip
    assert r.code == 0, r.err


@pytest.fixture
def repo(tmp_path: Path, cli, example_models: Path) -> Path:
    root = tmp_path / "models-repo"
    assert cli("init", str(root), cwd=tmp_path).code == 0
    _add_mlp(root, cli, example_models)
    git(root, "commit", "-qm", "mlp 1.0.0 and 1.1.0")
    return root


def _record(repo: Path, version: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (repo / ".modelreg/build/mlp" / version / "build.json").read_text()
    )
    return data


def _error_lines(err: str) -> list[str]:
    return err.strip().splitlines()


def _dvc_push(root: Path) -> None:
    from dvc.repo import Repo

    with warnings.catch_warnings():  # DVC's own deprecation noise, as in pipelines.dvc
        warnings.simplefilter("ignore", DeprecationWarning)
        with Repo(str(root)) as dvc_repo:
            assert dvc_repo.push() >= 1


def _drop_artifact(repo: Path, version: str) -> None:
    (repo / f"models/mlp/{version}.onnx").unlink()
    shutil.rmtree(repo / ".dvc/cache")  # so the bytes can only come from the remote


def test_build_passes_and_writes_record(repo: Path, cli, example_models: Path) -> None:
    r = cli("build", "--json", cwd=repo)
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert report["ok"] is True
    assert [(v["model"], v["version"]) for v in report["versions"]] == [
        ("mlp", "1.0.0"),
        ("mlp", "1.1.0"),
    ]
    record = _record(repo, "1.0.0")
    assert record == report["versions"][0]
    artifact = (repo / "models/mlp/1.0.0.onnx").read_bytes()
    pointer = yaml.safe_load((repo / "models/mlp/1.0.0.onnx.dvc").read_text())["outs"][0]
    assert record["artifact"] == "models/mlp/1.0.0.onnx"
    assert record["sha256"] == hashlib.sha256(artifact).hexdigest()
    assert record["size"] == len(artifact)
    assert record["md5"] == pointer["md5"]
    assert record["fetched"] is False
    assert record["checks_passed"] == list(STAGES)
    assert record["skipped"] == []
    assert list(record["timings_ms"]) == list(STAGES)
    assert all(isinstance(ms, float) and ms >= 0 for ms in record["timings_ms"].values())
    assert record["goldens"] == [
        {"case": "default", "passed": True, "rtol": 1e-4, "atol": 1e-5,
         "max_abs_error": {"probs": 0.0},
         "setups": {"shared": {"probs": 0.0}, "prepacked": {"probs": 0.0}}},
    ]  # fmt: skip

    cpu, jetson = record["engines"]
    assert (cpu["target"], cpu["engine"], cpu["status"]) == ("cpu", "onnxruntime", "built")
    assert cpu["path"] == ".modelreg/build/mlp/1.0.0/cpu.ort.onnx"
    engine = (repo / cpu["path"]).read_bytes()
    assert cpu["sha256"] == hashlib.sha256(engine).hexdigest()
    assert cpu["size"] == len(engine)
    assert (jetson["target"], jetson["engine"]) == ("jetson", "tensorrt")
    # the optimized model loads in ONNX Runtime and reproduces the goldens
    session = ort.InferenceSession(str(repo / cpu["path"]), providers=["CPUExecutionProvider"])
    with np.load(example_models / "mlp/1.0.0.inputs.npz") as ins:
        (probs,) = session.run(["probs"], {k: ins[k] for k in ins.files})
    with np.load(repo / "manifests/mlp/goldens/1.0.0/outputs.npz") as outs:
        np.testing.assert_allclose(probs, outs["probs"], rtol=1e-4, atol=1e-5)

    plain = _record(repo, "1.1.0")
    assert plain["ok"] is True
    assert plain["checks_passed"] == ["fetch", "check", "signature", "load"]
    assert plain["skipped"] == ["goldens", "engines"]
    assert plain["goldens"] == []
    assert plain["engines"] == []


def test_build_table_lists_versions_and_stage_timings(repo: Path, cli) -> None:
    r = cli("build", cwd=repo)
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == [
        "model", "version", "result", "fetch", "ms", "check", "ms", "signature", "ms",
        "load", "ms", "goldens", "ms", "engines", "ms", "p50", "vs", "parent", "targets",
    ]  # fmt: skip
    assert re.fullmatch(
        r"mlp +1\.0\.0 +ok( +\d+\.\d){6} +- +cpu: built, jetson: built on device", lines[1]
    )
    assert re.fullmatch(r"mlp +1\.1\.0 +ok( +\d+\.\d){6} +\d+\.\d\dx +-", lines[2])
    assert lines[3] == "built 2 versions; records in .modelreg/build/"
    assert r.err == ""


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is not None,
    reason="tensorrt is installed (a GPU runner): the engine may really be built there",
)
def test_tensorrt_target_is_recorded_as_built_on_device(repo: Path) -> None:
    record = build_version(load_repository(repo), "mlp", "1.0.0")
    jetson = next(e for e in record.engines if e.target == "jetson")
    assert jetson.status == "built on device"
    assert jetson.reason == "tensorrt is not installed on this runner"
    assert jetson.path is None
    assert jetson.detail == {"precision": "fp16", "workspace_mib": 1024}
    assert record.ok
    assert not list((repo / ".modelreg/build/mlp/1.0.0").glob("*.plan"))


def test_build_pulls_a_missing_artifact_from_the_dvc_remote(
    repo: Path, cli, example_models: Path
) -> None:
    _dvc_push(repo)
    _drop_artifact(repo, "1.0.0")
    r = cli("build", "mlp", "1.0.0", "--json", cwd=repo)
    assert r.code == 0, r.err
    record = json.loads(r.out)["versions"][0]
    assert record["fetched"] is True
    assert record["checks_passed"] == list(STAGES)
    restored = (repo / "models/mlp/1.0.0.onnx").read_bytes()
    assert restored == (example_models / "mlp/1.0.0.onnx").read_bytes()
    assert record["sha256"] == hashlib.sha256(restored).hexdigest()
    assert git(repo, "status", "--porcelain") == ""


def test_artifact_missing_everywhere_is_one_fetch_line(repo: Path, cli) -> None:
    _drop_artifact(repo, "1.1.0")  # never pushed: the remote is empty
    r = cli("build", "mlp", "1.1.0", cwd=repo)
    assert r.code == 1
    md5 = yaml.safe_load((repo / "models/mlp/1.1.0.onnx.dvc").read_text())["outs"][0]["md5"]
    expected = (
        f"models/mlp/1.1.0.onnx: missing from the workspace, the DVC cache and the DVC remote "
        f"(md5 {md5}); upload it with `dvc push models/mlp/1.1.0.onnx` from the clone that added it; "
        f"the DVC remote is .modelreg/remote, a folder inside each clone (the default of "
        f"`modelreg init`) that no teammate or CI job reaches: point DVC at a shared remote "
        f"first (`dvc remote modify storage url s3://bucket/path`, commit .dvc/config)"
    )
    assert _error_lines(r.err) == [expected]
    record = _record(repo, "1.1.0")
    assert record["ok"] is False
    assert record["checks_passed"] == []
    assert list(record["timings_ms"]) == ["fetch"]


def test_altered_golden_output_fails_naming_case_output_error_and_tolerances(
    repo: Path, cli
) -> None:
    outputs = repo / "manifests/mlp/goldens/1.0.0/outputs.npz"
    with np.load(outputs) as data:
        expected = {k: data[k] for k in data.files}
    expected["probs"] = expected["probs"].copy()
    expected["probs"][0, 1] += 0.25
    np.savez(outputs, **expected)
    r = cli("build", "mlp", "1.0.0", cwd=repo)
    assert r.code == 1
    (line,) = _error_lines(r.err)
    assert re.fullmatch(
        r"manifests/mlp/versions/1\.0\.0\.yaml:\d+:\d+: spec\.goldens\.cases\[0\]\.outputs: "
        r"case 'default' output 'probs' in session setups shared, prepacked: "
        r"max abs error 0\.25 exceeds tolerance "
        r"\(rtol=0\.0001, atol=1e-05\); 1 of \d+ values out of tolerance",
        line,
    ), line
    record = _record(repo, "1.0.0")
    assert "goldens" not in record["checks_passed"]
    assert record["goldens"][0]["passed"] is False
    assert record["goldens"][0]["max_abs_error"]["probs"] == pytest.approx(0.25)
    assert record["problems"][0]["stage"] == "goldens"


def test_golden_input_of_the_wrong_shape_or_dtype_is_one_line(repo: Path, cli) -> None:
    inputs = repo / "manifests/mlp/goldens/1.0.0/inputs.npz"
    with np.load(inputs) as data:
        given = data["input"]
    np.savez(inputs, input=given[:, :8].astype(np.float64))
    r = cli("build", "mlp", "1.0.0", cwd=repo)
    assert r.code == 1
    (line,) = _error_lines(r.err)
    assert re.fullmatch(
        r"manifests/mlp/versions/1\.0\.0\.yaml:\d+:\d+: spec\.goldens\.cases\[0\]\.inputs: "
        r"case 'default': manifests/mlp/goldens/1\.0\.0/inputs\.npz: input 'input' expects "
        rf"float32 \[batch, 16\], given float64 \[{given.shape[0]}, 8\]",
        line,
    ), line


def test_per_case_tolerance_overrides_the_default(repo: Path, cli) -> None:
    outputs = repo / "manifests/mlp/goldens/1.0.0/outputs.npz"
    with np.load(outputs) as data:
        np.savez(outputs, probs=data["probs"] + 0.001)
    manifest = repo / "manifests/mlp/versions/1.0.0.yaml"
    text = manifest.read_text()
    manifest.write_text(
        text.replace(
            "        outputs: manifests/mlp/goldens/1.0.0/outputs.npz\n",
            "        outputs: manifests/mlp/goldens/1.0.0/outputs.npz\n        atol: 0.002\n",
        )
    )
    r = cli("build", "mlp", "1.0.0", cwd=repo)
    assert r.code == 0, r.err
    assert _record(repo, "1.0.0")["goldens"][0]["atol"] == 0.002


def test_signature_mismatch_is_one_precise_line_per_problem(repo: Path, cli) -> None:
    manifest = repo / "manifests/mlp/versions/1.0.0.yaml"
    text = manifest.read_text()
    assert text.count("shape: [batch, 16]") == 1
    # a different symbol for the batch dimension is no mismatch: symbols are wildcards
    text = text.replace("shape: [batch, 16]", "shape: [batch, 8]").replace(
        "shape: [batch, 4]", "shape: [n, 4]"
    )
    manifest.write_text(text)
    r = cli("build", "mlp", "1.0.0", cwd=repo)
    assert r.code == 1
    (line,) = _error_lines(r.err)
    match = re.fullmatch(
        r"manifests/mlp/versions/1\.0\.0\.yaml:(\d+):\d+: spec\.signature\.inputs\[0\]\.shape\[1\]: "
        r"input 'input' dimension 1 is 16 in the graph but declared 8 \(graph shape \[batch, 16\]\)",
        line,
    )
    assert match, line
    assert "shape: [batch, 8]" in text.splitlines()[int(match.group(1)) - 1]
    record = _record(repo, "1.0.0")
    # the other stages still ran and passed
    assert record["checks_passed"] == ["fetch", "check", "load", "goldens", "engines"]


def test_corrupt_artifact_is_an_md5_mismatch(repo: Path, cli) -> None:
    artifact = repo / "models/mlp/1.1.0.onnx"
    data = bytearray(artifact.read_bytes())
    data[len(data) // 2] ^= 0xFF
    artifact.unlink()  # never write through a link into DVC's cache
    artifact.write_bytes(bytes(data))
    r = cli("build", "mlp", "1.1.0", cwd=repo)
    assert r.code == 1
    recorded = yaml.safe_load((repo / "models/mlp/1.1.0.onnx.dvc").read_text())["outs"][0]["md5"]
    actual = hashlib.md5(bytes(data)).hexdigest()  # noqa: S324 - DVC's digest
    expected = (
        f"models/mlp/1.1.0.onnx: md5 {actual} does not match models/mlp/1.1.0.onnx.dvc "
        f"({recorded}): the workspace copy is not the committed artifact; restore it with "
        "`dvc checkout models/mlp/1.1.0.onnx` or record the change with "
        "`dvc add models/mlp/1.1.0.onnx`"
    )
    assert _error_lines(r.err) == [expected]
    assert artifact.read_bytes() == bytes(data)  # reported, never silently replaced


def test_invalid_graph_is_one_checker_line(repo: Path, cli, tmp_path: Path) -> None:
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("NoSuchOp", ["input"], ["probs"])],
        "broken",
        [onnx.helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["batch", 16])],
        [onnx.helper.make_tensor_value_info("probs", onnx.TensorProto.FLOAT, ["batch", 4])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(model.SerializeToString())
    assert cli("version", "add", "mlp", "1.2.0", "--artifact", str(bad), cwd=repo).code == 0
    r = cli("build", "mlp", "1.2.0", cwd=repo)
    assert r.code == 1
    (line,) = _error_lines(r.err)
    assert line.startswith("models/mlp/1.2.0.onnx: ONNX checker: ")
    assert "NoSuchOp" in line
    assert _record(repo, "1.2.0")["checks_passed"] == ["fetch"]


def test_every_failure_of_every_version_is_reported(repo: Path) -> None:
    outputs = repo / "manifests/mlp/goldens/1.0.0/outputs.npz"
    with np.load(outputs) as data:
        np.savez(outputs, probs=data["probs"] * 2)
    artifact = repo / "models/mlp/1.1.0.onnx"
    artifact.unlink()
    artifact.write_bytes(b"not onnx")
    with pytest.raises(BuildError) as caught:
        build(repo)
    error = caught.value
    assert [(p.version, p.stage) for p in error.problems] == [
        ("1.0.0", "goldens"),
        ("1.1.0", "fetch"),
    ]
    assert str(error).splitlines() == [str(p) for p in error.problems]
    assert [r.ok for r in error.report.records] == [False, False]
    assert _record(repo, "1.0.0")["ok"] is False
    assert _record(repo, "1.1.0")["ok"] is False


def test_a_build_record_reads_back_as_the_record_written(repo: Path) -> None:
    """``BuildRecord.load`` gives back what the build wrote: passing and failing stages,
    goldens, engines with their settings, problems with their positions."""
    outputs = repo / "manifests/mlp/goldens/1.0.0/outputs.npz"
    with np.load(outputs) as data:
        np.savez(outputs, probs=data["probs"] * 2)
    with pytest.raises(BuildError) as caught:
        build(repo)
    for written in caught.value.report.records:
        loaded = BuildRecord.load(written.record_path, root=repo)
        assert loaded == written
        assert loaded.to_json() == {**written.to_json(), "tools": loaded.to_json()["tools"]}
    failing = BuildRecord.load(repo / ".modelreg/build/mlp/1.0.0/build.json", root=repo)
    assert [(p.stage, p.problem.file) for p in failing.problems] == [
        ("goldens", "manifests/mlp/versions/1.0.0.yaml")
    ]
    assert {e.target: e.status for e in failing.engines} == {
        "cpu": "built", "jetson": "built on device"
    }  # fmt: skip


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param(b"{", "not JSON", id="not json"),
        pytest.param(b"[]", "not a build record (kind is not BuildRecord)", id="a list"),
        pytest.param(
            b'{"kind": "BuildRecord", "apiVersion": "modelreg/v2"}',
            "not a build record (apiVersion 'modelreg/v2' is not modelreg/v1)",
            id="another format",
        ),
        pytest.param(
            b'{"kind": "BuildRecord", "apiVersion": "modelreg/v1", "model": "m", "version": "1.0.0",'
            b' "manifest": "x", "artifact": "y", "engines": [{"target": "t", "engine": "e",'
            b' "status": "exploded"}]}',
            "not a build record (engines.0.status: Input should be",
            id="an unknown engine status",
        ),
    ],
)
def test_a_record_that_is_not_a_build_record_is_one_line(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    path = tmp_path / "build.json"
    path.write_bytes(content)
    with pytest.raises(PipelineError) as caught:
        BuildRecord.load(path, root=tmp_path)
    assert len(str(caught.value).splitlines()) == 1
    assert reason in str(caught.value)


def test_a_build_record_is_not_read_through_a_link(repo: Path) -> None:
    """A folder on the way that is a link (committed by a pull request, say) is refused,
    not followed to a record someone else wrote."""
    from registry.errors import UnsafeFileError

    build(repo, versions=[("mlp", "1.1.0")])
    elsewhere = repo.parent / "elsewhere"
    shutil.copytree(repo / ".modelreg/build/mlp", elsewhere)
    shutil.rmtree(repo / ".modelreg/build/mlp")
    (repo / ".modelreg/build/mlp").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UnsafeFileError):
        BuildRecord.load(repo / ".modelreg/build/mlp/1.1.0/build.json", root=repo)
    assert BuildRecord.load(elsewhere / "1.1.0/build.json", root=elsewhere).version == "1.1.0"


def test_base_builds_only_versions_changed_since_ref(repo: Path, cli, example_models: Path) -> None:
    git(repo, "tag", "base")
    nothing = cli("build", "--base", "base", cwd=repo)
    assert nothing.code == 0, nothing.err
    assert nothing.out.strip() == "nothing to build: no version changed since base"

    assert cli("model", "add", "cnn", cwd=repo).code == 0
    r = cli("version", "add", "cnn", "1.0.0", "--artifact", str(example_models / "cnn/1.0.0.onnx"),
            cwd=repo)  # fmt: skip
    assert r.code == 0, r.err
    # a promotion edits model.yaml but not the signature: nothing of mlp rebuilds
    assert cli("promote", "mlp", "1.0.0", "--channel", "canary", cwd=repo).code == 0
    git(repo, "commit", "-qam", "cnn 1.0.0, mlp 1.0.0 to canary")

    def built(*args: str) -> list[tuple[str, str]]:
        result = cli("build", "--base", "base", "--json", *args, cwd=repo)
        assert result.code == 0, result.err
        return [(v["model"], v["version"]) for v in json.loads(result.out)["versions"]]

    assert built() == [("cnn", "1.0.0")]
    assert not (repo / ".modelreg/build/mlp").exists()

    # a new artifact for mlp 1.1.0 changes only its .dvc pointer (uncommitted counts)
    from pipelines import dvc

    shutil.copyfile(example_models / "mlp/1.0.0.onnx", repo / "models/mlp/1.1.0.onnx")
    dvc.add(repo, repo / "models/mlp/1.1.0.onnx")
    assert built() == [("cnn", "1.0.0"), ("mlp", "1.1.0")]

    bad = cli("build", "--base", "no-such-ref", cwd=repo)
    assert bad.code == 2
    assert bad.err.strip() == "modelreg: error: git ref 'no-such-ref' does not name a commit"


def test_unknown_version_and_bad_arguments(repo: Path, cli) -> None:
    r = cli("build", "mlp", "9.9.9", cwd=repo)
    assert r.code == 1
    expected = (
        "manifests/mlp/versions/9.9.9.yaml: version 9.9.9 of model 'mlp' is not declared "
        "(declared: 1.0.0, 1.1.0)"
    )
    assert _error_lines(r.err) == [expected]
    assert cli("build", "mlp", cwd=repo).code == 2
    assert cli("build", "mlp", "1.0.0", "--base", "HEAD", cwd=repo).code == 2


def _sig(
    inputs: list[tuple[str, str, list[Any]]], outputs: list[tuple[str, str, list[Any]]]
) -> Signature:
    def tensors(spec: list[tuple[str, str, list[Any]]]) -> list[dict[str, Any]]:
        return [{"name": n, "dtype": d, "shape": s} for n, d, s in spec]

    return Signature.model_validate({"inputs": tensors(inputs), "outputs": tensors(outputs)})


def test_compare_signatures_treats_symbolic_dims_as_wildcards() -> None:
    graph = _sig([("x", "float32", ["batch", 3, None])], [("y", "float32", [7, 2])])
    same = _sig([("x", "float32", ["n", 3, 224])], [("y", "float32", ["m", None])])
    assert compare_signatures(same, graph) == []
    other = _sig([("x", "float16", [1, 4, 224]), ("mask", "bool", [1])], [("y", "float32", [7])])
    assert [(m.loc, m.message) for m in compare_signatures(other, graph)] == [
        (("spec", "signature", "inputs", 0, "dtype"),
         "input 'x' is float32 in the graph but declared float16"),
        (("spec", "signature", "inputs", 0, "shape", 1),
         "input 'x' dimension 1 is 3 in the graph but declared 4 (graph shape [batch, 3, ?])"),
        (("spec", "signature", "inputs", 1, "name"),
         "declared input 'mask' is not in the graph (graph inputs: 'x')"),
        (("spec", "signature", "outputs", 0, "shape"),
         "output 'y' has rank 2 in the graph [7, 2] but declared rank 1 [7]"),
    ]  # fmt: skip
    missing = _sig([("x", "float32", ["b", 3, 5])], [("z", "float32", [7, 2])])
    assert [m.message for m in compare_signatures(missing, graph)] == [
        "declared output 'z' is not in the graph (graph outputs: 'y')",
        "graph output 'y' (float32[7, 2]) is not declared",
    ]


def test_compare_output_follows_numpy_allclose() -> None:
    expected = np.array([1.0, 100.0, 0.0], dtype=np.float32)
    rtol, atol = 1e-3, 1e-2
    inside = expected + np.array([0.0109, 0.1099, 0.0099], dtype=np.float32)
    assert compare_output(expected, inside, rtol, atol).ok
    assert np.allclose(inside, expected, rtol=rtol, atol=atol)
    outside = expected + np.array([0.0, 0.2, 0.0], dtype=np.float32)
    result = compare_output(expected, outside, rtol, atol)
    assert (result.ok, result.bad, result.total) == (False, 1, 3)
    assert result.max_abs_error == pytest.approx(0.2, rel=1e-3)
    assert not np.allclose(outside, expected, rtol=rtol, atol=atol)
    nan = compare_output(np.array([np.nan]), np.array([np.nan]), rtol, atol)
    assert not nan.ok  # allclose: NaN is never close, not even to NaN
    shape = compare_output(np.zeros((2, 3)), np.zeros((3, 2)), rtol, atol)
    assert (shape.ok, shape.reason) == (False, "shape is (3, 2), expected (2, 3)")
    assert compare_output(np.array([True, False]), np.array([True, False]), 0, 0).ok
    assert compare_output(np.array([7], dtype=np.int64), np.array([7], dtype=np.int64), 0, 0).ok


def test_build_times_each_version_against_its_parent(repo: Path, cli) -> None:
    """Issue 27 point 14: each version's run time on the runner, its parent's beside it
    (same setup, same inputs); a parent whose artifact is nowhere leaves the version's
    own figures and the reason."""
    r = cli("build", "--json", cwd=repo)
    assert r.code == 0, r.err
    first = _record(repo, "1.0.0")["latency"]
    assert (first["parent"], first["inputs"], first["setup"]) == (None, "goldens", "prepacked")
    assert (first["ratio_p50"], first["reason"], first["parent_p50_ms"]) == (None, None, None)
    assert 0 < first["p50_ms"] <= first["p99_ms"]
    second = _record(repo, "1.1.0")["latency"]
    assert (second["parent"], second["inputs"]) == ("1.0.0", "sample")  # 1.1.0 has no goldens
    assert second["ratio_p50"] == round(second["p50_ms"] / second["parent_p50_ms"], 3)
    assert second["ratio_p99"] == round(second["p99_ms"] / second["parent_p99_ms"], 3)
    assert 10 <= second["runs"] <= 200
    path = repo / ".modelreg/build/mlp/1.1.0/build.json"
    loaded = BuildRecord.load(path, root=repo).latency
    assert loaded is not None
    assert loaded.to_json() == second
    table = cli("build", cwd=repo).out.splitlines()
    assert "p50 vs parent" in table[0]
    assert re.search(r"^mlp +1\.0\.0 .* - +cpu: built", table[1])
    assert re.search(r"^mlp +1\.1\.0 .* \d+\.\d\dx +-$", table[2])

    _drop_artifact(repo, "1.0.0")  # never pushed: the remote does not have it either
    report = build(repo, versions=[("mlp", "1.1.0")])
    alone = report.records[0].latency
    assert alone is not None
    assert (alone.parent, alone.ratio_p50, alone.parent_p50_ms) == ("1.0.0", None, None)
    assert alone.reason is not None
    assert alone.reason.startswith("its artifact is not available (models/mlp/1.0.0.onnx: ")
    assert alone.text().endswith(f"); not compared with 1.0.0: {alone.reason}")
