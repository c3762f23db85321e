"""Pull requests that hand CI files it must not read, or files that would cost it the
machine (issue 8, points 5, 7 and 8), replayed through ``modelreg ci pr``,
``modelreg validate`` and ``modelreg build``.

Every link points at a file holding a planted canary: the refusal must name the link,
and the canary must appear nowhere (stderr, stdout, the PR comment, the step summary,
the JSON report).
"""

from __future__ import annotations

import functools
import io
import os
import re
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.adversarial.conftest import Fleet

pytestmark = pytest.mark.integration

CANARY = "SECRET-CANARY-1234"
VERSION = "manifests/mlp/versions/1.0.0.yaml"
LINKED = "is a symbolic link; links in a repository are never followed"
POSITIONED = re.compile(r"^[^\s:]+:\d+:\d+: ")


@pytest.fixture(autouse=True)
def _build_registered() -> None:
    # main.py is not ours to edit; register `build` the way tests/integration do.
    from modelreg.cli.build_cmd import build as build_command
    from modelreg.cli.main import cli as group

    if "build" not in group.commands:
        group.add_command(build_command)


def _secret(fleet: Fleet) -> Path:
    """A file outside the repository that holds the canary (a token on the runner)."""
    path = fleet.tmp / "runner-token"
    path.write_text(f"{CANARY}\n", encoding="utf-8")
    return path


def _plant_key_canary(fleet: Fleet) -> Path:
    """The signing key file, with the canary in it (as a key's bytes would be)."""
    key = fleet.root / ".modelreg/keys/targets.key"
    key.write_text(key.read_text() + f"# {CANARY}\n")
    return key


def _link(fleet: Fleet, rel: str, target: Path | str) -> None:
    path = fleet.root / rel
    if path.is_dir() and not path.is_symlink():
        import shutil

        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def _everything_said(fleet: Fleet, result: Any) -> str:
    """stderr, stdout, the PR comment, the JSON report and the step summary."""
    parts = [result.err, result.out]
    reports = (".modelreg/ci/pr-comment.md", ".modelreg/ci/pr-report.json")
    parts.extend(
        (fleet.root / rel).read_text(encoding="utf-8")
        for rel in reports
        if (fleet.root / rel).is_file()
    )
    summary = fleet.tmp / "summary.md"
    if summary.is_file():
        parts.append(summary.read_text(encoding="utf-8"))
    return "\n".join(parts)


def _refused_pr(fleet: Fleet, base: str, expected: str) -> list[str]:
    """Commit, run ``ci pr``; assert exit 1, ``expected`` in stderr and the comment, no canary."""
    fleet.commit("attack")
    result = fleet.ci_pr(base)
    assert result.code == 1, result.err
    lines = [line for line in result.err.splitlines() if expected in line]
    assert lines, result.err
    assert "internal error" not in result.err
    assert "Traceback" not in result.err
    assert expected in fleet.comment()
    assert CANARY not in _everything_said(fleet, result)
    return lines


# --- point 5: no reading through links -------------------------------------------------


@pytest.mark.parametrize("rel", ["manifests/mlp/model.yaml", VERSION])
def test_ci_pr_refuses_a_manifest_linked_to_the_signing_key(fleet: Fleet, rel: str) -> None:
    base = fleet.branch("manifest-link")
    key = _plant_key_canary(fleet)
    _link(fleet, rel, os.path.relpath(key, (fleet.root / rel).parent))
    (line,) = _refused_pr(fleet, base, LINKED)
    assert line == f"{rel}: {LINKED}"


def test_ci_pr_refuses_a_linked_dvc_pointer(fleet: Fleet) -> None:
    base = fleet.branch("pointer-link")
    _link(fleet, "models/mlp/1.0.0.onnx.dvc", _secret(fleet))
    (line,) = _refused_pr(fleet, base, LINKED)
    assert line == f"models/mlp/1.0.0.onnx.dvc: {LINKED}"


def test_ci_pr_refuses_a_linked_modelreg_yaml(fleet: Fleet) -> None:
    base = fleet.branch("config-link")
    _link(fleet, "modelreg.yaml", _secret(fleet))
    (line,) = _refused_pr(fleet, base, LINKED)
    assert line == f"modelreg.yaml: {LINKED}"


def test_ci_pr_refuses_a_linked_model_folder(fleet: Fleet) -> None:
    """manifests/evil -> a folder outside: nothing below it is read."""
    base = fleet.branch("folder-link")
    outside = fleet.tmp / "outside"
    (outside / "versions").mkdir(parents=True)
    (outside / "model.yaml").write_text(f"{CANARY}\n")
    (outside / "versions/1.0.0.yaml").write_text(f"{CANARY}\n")
    _link(fleet, "manifests/evil", outside)
    (line,) = _refused_pr(fleet, base, LINKED)
    assert line == f"manifests/evil: {LINKED}"


def test_ci_pr_refuses_a_linked_versions_folder(fleet: Fleet) -> None:
    base = fleet.branch("versions-link")
    outside = fleet.tmp / "outside"
    outside.mkdir()
    (outside / "2.0.0.yaml").write_text(f"{CANARY}\n")
    _link(fleet, "manifests/mlp/versions", outside)
    (line,) = _refused_pr(fleet, base, LINKED)
    assert line == f"manifests/mlp/versions: {LINKED}"


def test_ci_pr_refuses_a_linked_golden_file(fleet: Fleet) -> None:
    base = fleet.branch("golden-link")
    _link(fleet, "manifests/mlp/goldens/1.0.0/outputs.npz", _secret(fleet))
    (line,) = _refused_pr(fleet, base, LINKED)
    assert POSITIONED.match(line), line
    assert line.startswith(f"{VERSION}:")
    assert "golden file manifests/mlp/goldens/1.0.0/outputs.npz" in line


def test_ci_pr_refuses_an_artifact_linked_to_a_file_on_the_runner(fleet: Fleet) -> None:
    """The md5 oracle: a committed artifact link made build print its target's md5."""
    base = fleet.branch("artifact-link")
    secret = _secret(fleet)
    _link(fleet, "models/mlp/1.0.0.onnx", secret)
    fleet.commit("attack", "models/mlp/1.0.0.onnx", force=True)
    result = fleet.ci_pr(base)
    assert result.code == 1, result.err
    assert f"{VERSION}:9:11: spec.artifact.path: models/mlp/1.0.0.onnx {LINKED}" in (
        result.err.splitlines()
    )
    said = _everything_said(fleet, result)
    md5 = __import__("hashlib").md5(secret.read_bytes(), usedforsecurity=False).hexdigest()
    assert md5 not in said
    assert CANARY not in said


def test_build_refuses_an_artifact_link_and_never_hashes_its_target(fleet: Fleet, cli: Any) -> None:
    secret = _secret(fleet)
    _link(fleet, "models/mlp/1.0.0.onnx", secret)
    result = cli("build", "mlp", "1.0.0", cwd=fleet.root)
    assert result.code == 1, result.err
    md5 = __import__("hashlib").md5(secret.read_bytes(), usedforsecurity=False).hexdigest()
    assert md5 not in result.err + result.out
    assert f"models/mlp/1.0.0.onnx: {LINKED}" in result.err.splitlines()
    record = (fleet.root / ".modelreg/build/mlp/1.0.0/build.json").read_text()
    assert md5 not in record
    assert '"sha256": null' in record


def test_build_refuses_an_artifact_under_a_linked_folder(fleet: Fleet, cli: Any) -> None:
    """models/mlp -> a folder outside holding a forged pointer and its 'artifact'."""
    outside = fleet.tmp / "outside"
    outside.mkdir()
    secret = _secret(fleet)
    (outside / "1.0.0.onnx").write_bytes(secret.read_bytes())
    digest = __import__("hashlib").md5(secret.read_bytes(), usedforsecurity=False).hexdigest()
    (outside / "1.0.0.onnx.dvc").write_text(
        f"outs:\n- md5: {digest}\n  size: {secret.stat().st_size}\n  hash: md5\n"
        "  path: 1.0.0.onnx\n"
    )
    _link(fleet, "models/mlp", outside)
    result = cli("build", "mlp", "1.0.0", cwd=fleet.root)
    assert result.code == 1, result.err
    assert "folder models/mlp is a symbolic link" in result.err
    assert CANARY not in result.err + result.out


def test_validate_never_prints_a_linked_file(fleet: Fleet, cli: Any) -> None:
    key = _plant_key_canary(fleet)
    _link(fleet, "manifests/mlp/model.yaml", os.path.relpath(key, fleet.root / "manifests/mlp"))
    result = cli("validate", cwd=fleet.root)
    assert result.code == 1
    assert f"manifests/mlp/model.yaml: {LINKED}" in result.err.splitlines()
    assert CANARY not in result.err + result.out
    assert "PRIVATE KEY" not in result.err + result.out


# --- point 7: bounded golden files -------------------------------------------------------


@functools.cache
def _npz_bomb() -> bytes:
    """~1 MB of deflated zeros that holds (truly) a 1 GiB float32 array."""
    buf = io.BytesIO()
    header = _npy_header((1 << 28,), "<f4")
    zeros = bytes(1 << 25)
    with (
        zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive,
        archive.open("input.npy", "w", force_zip64=True) as member,
    ):
        member.write(header)
        for _ in range((1 << 30) // len(zeros)):
            member.write(zeros)
    return buf.getvalue()


def _npy_header(shape: tuple[int, ...], descr: str) -> bytes:
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}"
    text += " " * ((64 - (10 + len(text) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


def _npz_liar(shape: tuple[int, ...]) -> bytes:
    """A tiny .npz whose one header claims ``shape`` of float64 (29 TiB for 2**42)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("input.npy", _npy_header(shape, "<f8") + bytes(64))
    return buf.getvalue()


NEW_VERSION = "manifests/mlp/versions/1.1.0.yaml"


def _new_goldens(fleet: Fleet) -> Path:
    """The golden folder of a version the pull request adds (a released version's
    golden files cannot change at all: see test_ci_signing)."""
    r = fleet.cli("version", "add", "mlp", "1.1.0", "--parent", "1.0.0", "--artifact",
                  str(fleet.models / "mlp/1.1.0.onnx"), "--golden-inputs",
                  str(fleet.models / "mlp/1.1.0.inputs.npz"), cwd=fleet.root)  # fmt: skip
    assert r.code == 0, r.err
    return fleet.root / "manifests/mlp/goldens/1.1.0"


def test_ci_pr_refuses_a_golden_npz_bomb_before_reading_it(fleet: Fleet) -> None:
    import resource

    base = fleet.branch("npz-bomb")
    bomb = _npz_bomb()
    assert len(bomb) < 8 << 20
    (_new_goldens(fleet) / "inputs.npz").write_bytes(bomb)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    lines = _refused_pr(fleet, base, "golden files are limited to")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 512, f"peak RSS grew {grown_mib:.0f} MiB"
    assert all(POSITIONED.match(line) for line in lines), lines
    assert lines[0].startswith(f"{NEW_VERSION}:")
    assert "inputs.npz" in lines[0]


def test_ci_pr_reports_a_29_tib_npz_header_as_a_problem(fleet: Fleet) -> None:
    base = fleet.branch("npz-liar")
    (_new_goldens(fleet) / "outputs.npz").write_bytes(_npz_liar((1 << 42,)))
    lines = _refused_pr(fleet, base, "one golden array is limited to")
    assert POSITIONED.match(lines[0]), lines
    assert lines[0].startswith(f"{NEW_VERSION}:")
    assert "35184372088832 bytes" in lines[0]


# --- point 8: problems, not crashes ------------------------------------------------------


def _version_text(fleet: Fleet) -> str:
    return (fleet.root / VERSION).read_text(encoding="utf-8")


def test_ci_pr_reports_a_version_file_not_named_by_semver(fleet: Fleet) -> None:
    base = fleet.branch("latest")
    (fleet.root / "manifests/mlp/versions/latest.yaml").write_text(_version_text(fleet))
    (line,) = _refused_pr(fleet, base, "not a SemVer version")
    assert line == (
        "manifests/mlp/versions/latest.yaml:6:12: metadata.version: file name 'latest' is not "
        "a SemVer version; rename it 1.0.0.yaml"
    )


def test_ci_pr_reports_an_inline_golden_of_1e23_values(fleet: Fleet) -> None:
    base = fleet.branch("huge-inline")
    text = _version_text(fleet).replace(
        "inputs: manifests/mlp/goldens/1.0.0/inputs.npz",
        "inputs: {input: {dtype: float32, shape: [0, 100000000000000000000000], data: []}}",
    )
    (fleet.root / VERSION).write_text(text)
    (line,) = _refused_pr(fleet, base, "inline tensors hold at most 65536")
    assert POSITIONED.match(line), line
    assert line.startswith(f"{VERSION}:")
    assert "spec.goldens.cases[0].inputs.input" in line


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_ci_pr_refuses_non_finite_metrics(fleet: Fleet, value: str) -> None:
    base = fleet.branch("nan-metric")
    text = _version_text(fleet).replace("spec:\n", f"spec:\n  metrics:\n    acc: {value}\n", 1)
    (fleet.root / VERSION).write_text(text)
    (line,) = _refused_pr(fleet, base, "must be a finite number")
    assert line == f"{VERSION}:9:10: spec.metrics.acc: must be a finite number"


def test_build_reports_inline_data_that_does_not_fit_its_dtype(fleet: Fleet, cli: Any) -> None:
    text = _version_text(fleet).replace(
        "inputs: manifests/mlp/goldens/1.0.0/inputs.npz",
        "inputs: {input: {dtype: float32, shape: [1, 16], data: "
        + str(["x"] * 16).replace("'", '"')
        + "}}",
    )
    (fleet.root / VERSION).write_text(text)
    result = cli("build", "mlp", "1.0.0", cwd=fleet.root)
    assert result.code == 1, result.err
    assert "internal error" not in result.err
    (line,) = [x for x in result.err.splitlines() if "does not fit float32" in x]
    assert POSITIONED.match(line), line


# --- the pure checks of golden files ----------------------------------------------------


def test_directory_problem_caps_members_names_and_declared_sizes() -> None:
    from pipelines.goldens import NpzLimits, directory_problem

    limits = NpzLimits(max_members=2, max_total_bytes=1000)
    assert directory_problem([("a.npy", 500), ("b.npy", 500)], limits) is None
    assert directory_problem([("a.npy", 1), ("b.npy", 1), ("c.npy", 1)], limits) == (
        "holds 3 arrays; golden files hold at most 2"
    )
    assert directory_problem([("a.npy", 500), ("b.npy", 501)], limits) == (
        "declares 1001 bytes uncompressed; golden files are limited to 1000"
    )
    assert directory_problem([("a.pkl", 1)], limits) == "member 'a.pkl' is not a .npy array"
    assert directory_problem([("a.npy", 1), ("a.npy", 1)], limits) == "holds array 'a' twice"


def test_array_problem_checks_shape_times_itemsize_before_any_read() -> None:
    from pipelines.goldens import NpyHeader, NpzLimits, array_problem

    limits = NpzLimits(max_array_bytes=1024)
    ok = NpyHeader((16, 16), fortran_order=False, dtype=np.dtype("<f4"))
    assert array_problem("x", ok, 1024, limits) is None
    huge = NpyHeader((1 << 42,), fortran_order=False, dtype=np.dtype("<f8"))
    assert array_problem("x", huge, 64, limits) == (
        "array 'x' declares shape [4398046511104] of <f8 (35184372088832 bytes); "
        "one golden array is limited to 1024"
    )
    assert array_problem("x", ok, 1000, limits) == (
        "array 'x' declares 1024 bytes of data but the file holds 1000"
    )
    objects = NpyHeader((1,), fortran_order=False, dtype=np.dtype(object))
    assert "Python objects" in (array_problem("x", objects, 8, limits) or "")


def test_read_npz_round_trips_what_numpy_writes(tmp_path: Path) -> None:
    from pipelines.goldens import read_npz

    arrays: dict[str, np.ndarray[Any, Any]] = {
        "f": np.arange(12, dtype=np.float32).reshape(3, 4),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
        "s": np.array(["a", "bc"]),
        "empty": np.zeros((0, 5), np.float16),
    }
    np.savez_compressed(tmp_path / "g.npz", allow_pickle=False, **arrays)
    found = read_npz(tmp_path / "g.npz", "g.npz", root=tmp_path)
    assert sorted(found) == sorted(arrays)
    for name, array in arrays.items():
        assert found[name].dtype == array.dtype
        np.testing.assert_array_equal(found[name], array)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a zip", "not a readable .npz file"),
        (_npz_liar((4,)), "declares 32 bytes of data but the file holds 64"),
        (_npz_liar((1 << 42,)), "one golden array is limited to"),
    ],
)
def test_read_npz_refuses_in_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    from pipelines.errors import ArtifactError
    from pipelines.goldens import read_npz

    (tmp_path / "g.npz").write_bytes(content)
    with pytest.raises(ArtifactError) as info:
        read_npz(tmp_path / "g.npz", "g.npz", root=tmp_path)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_read_npz_caps_the_file_size_before_reading(tmp_path: Path) -> None:
    from pipelines.errors import ArtifactError
    from pipelines.goldens import NpzLimits, read_npz

    np.savez(tmp_path / "g.npz", x=np.zeros(1000))
    with pytest.raises(ArtifactError, match=r"golden files are limited to 100$"):
        read_npz(tmp_path / "g.npz", "g.npz", limits=NpzLimits(max_file_bytes=100))


def test_a_graph_whose_signature_cannot_be_declared_is_one_problem(fleet: Fleet, cli: Any) -> None:
    """A tensor the manifests cannot declare made ``version add`` crash with an internal
    error; it is one line about the artifact, naming why.  (A symbolic dimension longer
    than a manifest symbol was such a case; it is now recorded unnamed, as an exporter's
    expression is: issue 27, bug 1.)"""
    import onnx
    from onnx import TensorProto, helper

    from pipelines.errors import ArtifactError
    from pipelines.onnx import signature_from_model

    deep = ["b" * 300] + [1] * 16  # 17 dimensions: over the manifests' 16
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, deep)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, deep)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(
        ArtifactError, match=r"input 'x' cannot be declared: 17 dimensions, at most 16"
    ):
        signature_from_model(model, "odd.onnx")
    path = fleet.tmp / "odd.onnx"
    onnx.save(model, path)
    r = cli("model", "add", "odd", cwd=fleet.root)
    assert r.code == 0, r.err
    r = cli("version", "add", "odd", "1.0.0", "--artifact", str(path), cwd=fleet.root)
    assert r.code == 1
    assert "internal error" not in r.err
    assert len(r.err.strip().splitlines()) == 1
    assert "cannot be declared" in r.err


# --- ONNX external data: only plain files beside the model ------------------------------


def test_ci_pr_refuses_external_data_that_points_at_the_checkout(fleet: Fleet) -> None:
    """A weight whose bytes ``live`` in ``../../.git/config`` made the build load the
    checkout's git config (where actions/checkout keeps the token) into the model and
    print it back through the golden comparison."""
    import subprocess
    import sys

    import onnx

    with (fleet.root / ".git/config").open("a") as fh:
        fh.write(f"# {CANARY}\n")
    base = fleet.branch("external")
    r = fleet.cli("version", "add", "mlp", "1.1.0", "--artifact",
                  str(fleet.models / "mlp/1.1.0.onnx"), cwd=fleet.root)  # fmt: skip
    assert r.code == 0, r.err
    artifact = fleet.root / "models/mlp/1.1.0.onnx"
    model = onnx.load(str(artifact))
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    del weight.float_data[:]
    weight.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "../../.git/config"), ("offset", "0"), ("length", "64")):
        weight.external_data.add(key=key, value=value)
    artifact.write_bytes(model.SerializeToString())
    subprocess.run([sys.executable, "-m", "dvc", "add", "-q", str(artifact)], cwd=fleet.root,
                   check=True)  # fmt: skip
    (line,) = _refused_pr(fleet, base, "is a path; it must be a file name")
    assert line.startswith("models/mlp/1.1.0.onnx: ") or "models/mlp/1.1.0.onnx" in line, line
    assert f"tensor {weight.name!r}: external data location '../../.git/config' is a path" in line


def _npz_of(shape: tuple[int, ...], descr: object, data: bytes) -> bytes:
    """One array with a hand-written header: ``descr`` as numpy's header literal."""
    text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
    text += " " * ((64 - (10 + len(text) + 1) % 64) % 64) + "\n"
    header = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("input.npy", header + data)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("shape", "descr", "data"),
    [
        ((1 << 40,), "<U0", b""),  # zero-width: any shape is free, 0 bytes of data
        ((4,), "<c16", bytes(64)),  # complex: ORT cannot take it
        ((2,), "<M8[s]", bytes(16)),  # dates
        ((2,), "|V8", bytes(16)),  # raw void
        ((2,), "|S4", bytes(8)),  # raw bytes
        ((2,), [("a", "<f4"), ("b", "<i4")], bytes(16)),  # structured
        ((1,), [("a", "<f4", (2, 2))], bytes(16)),  # a sub-array field
    ],
)
def test_read_npz_refuses_dtypes_that_are_not_tensors(
    tmp_path: Path, shape: tuple[int, ...], descr: object, data: bytes
) -> None:
    from pipelines.errors import ArtifactError
    from pipelines.goldens import read_npz

    (tmp_path / "g.npz").write_bytes(_npz_of(shape, descr, data))
    with pytest.raises(ArtifactError) as info:
        read_npz(tmp_path / "g.npz", "g.npz", root=tmp_path)
    assert "golden files hold booleans, integers, floats and strings" in str(info.value)


def test_read_npz_gives_big_endian_arrays_in_the_machines_order(tmp_path: Path) -> None:
    from pipelines.goldens import read_npz

    values = np.arange(6, dtype=">f4").reshape(2, 3)
    np.savez(tmp_path / "g.npz", x=values)
    found = read_npz(tmp_path / "g.npz", "g.npz", root=tmp_path)["x"]
    assert found.dtype == np.dtype("=f4")
    np.testing.assert_array_equal(found, values)


def test_ci_pr_reports_a_golden_of_complex_numbers_as_a_problem(fleet: Fleet) -> None:
    base = fleet.branch("npz-complex")
    inputs = _new_goldens(fleet) / "inputs.npz"
    with np.load(inputs) as held:
        name = held.files[0]
        shape = held[name].shape
    arrays: dict[str, Any] = {name: np.ones(shape, np.complex64)}
    np.savez(inputs, allow_pickle=False, **arrays)
    (line,) = _refused_pr(fleet, base, "has dtype '<c8'")
    assert POSITIONED.match(line), line
    assert line.startswith(f"{NEW_VERSION}:")


def test_golden_outputs_of_strings_for_a_numeric_output_are_a_mismatch() -> None:
    from pipelines.build._goldens import compare_output

    found = compare_output(np.array(["a", "b"]), np.array([1.0, 2.0], np.float32), 0.0, 0.0)
    assert not found.ok
    assert found.reason == "dtype is float32, expected <U1"


def test_ci_pr_never_writes_its_report_through_a_committed_link(fleet: Fleet) -> None:
    base = fleet.branch("ci-link")
    outside = fleet.tmp / "runner-folder"
    outside.mkdir()
    _link(fleet, ".modelreg/ci", outside)
    fleet.commit("attack", ".modelreg/ci", force=True)
    result = fleet.ci_pr(base)
    assert result.code == 1
    assert ".modelreg/ci: is a symbolic link" in result.err
    assert list(outside.iterdir()) == []
    folder = fleet.root / ".modelreg/ci"
    assert folder.is_dir()
    assert not folder.is_symlink()
    assert ".modelreg/ci: is a symbolic link" in fleet.comment()


def test_a_file_larger_than_its_stat_size_is_read_to_the_cap_and_no_further() -> None:
    # /proc files are regular files that stat as 0 bytes: the first read is sized by
    # fstat, so what follows it must still be read, and still be capped.
    from registry.errors import FileTooLargeError
    from registry.safe_io import read_regular

    cmdline = Path("/proc/self/cmdline")
    assert cmdline.stat().st_size == 0
    expected = cmdline.read_bytes()
    assert len(expected) > 1
    assert read_regular(cmdline, max_bytes=1 << 20) == expected
    with pytest.raises(FileTooLargeError):
        read_regular(cmdline, max_bytes=len(expected) - 1)


def test_short_reads_never_truncate_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Linux returns at most 2 GiB - 4 KiB per read(), and FUSE file systems may return
    # less than asked at any size: a short read is not the end of a file.
    from registry.safe_io import read_regular

    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 40)
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: real_read(fd, min(n, 7)))
    assert read_regular(path, max_bytes=1 << 20) == path.read_bytes()
