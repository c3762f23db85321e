"""Tests for the deterministic example ONNX models (modelreg.examples)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper, shape_inference

from modelreg import examples
from modelreg.examples import (
    EXAMPLE_VERSIONS,
    build_model,
    golden_inputs,
    model_bytes,
    run_onnxruntime,
    write_examples,
)

REPO = Path(__file__).resolve().parents[2]
SMALL = [(m, v) for m, versions in EXAMPLE_VERSIONS.items() for v in versions]
EXPECTED_OUT = {"mlp": ("probs", 4), "cnn": ("logits", 10)}


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    return [
        d.dim_param if d.HasField("dim_param") else d.dim_value
        for d in value_info.type.tensor_type.shape.dim
    ]


def _signature(model: onnx.ModelProto) -> tuple[list[tuple[str, list[int | str]]], ...]:
    return (
        [(vi.name, _dims(vi)) for vi in model.graph.input],
        [(vi.name, _dims(vi)) for vi in model.graph.output],
    )


def _nodes(model: onnx.ModelProto) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    return [(n.op_type, tuple(n.input), tuple(n.output)) for n in model.graph.node]


def _inits(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.graph.initializer}


@pytest.mark.parametrize(("model", "version"), SMALL)
def test_small_model_checks_and_infers(model: str, version: str) -> None:
    proto = build_model(model, version)
    onnx.checker.check_model(proto, full_check=True)
    inferred = shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    out_name, classes = EXPECTED_OUT[model]
    assert [vi.name for vi in inferred.graph.output] == [out_name]
    assert _dims(inferred.graph.output[0]) == ["batch", classes]
    assert proto.opset_import[0].version == 17
    assert proto.ir_version == 8
    assert proto.producer_name == "modelreg-examples"
    assert len(model_bytes(model, version)) < 64_000


@pytest.mark.parametrize(("model", "version"), SMALL)
def test_small_model_runs_on_onnxruntime(model: str, version: str) -> None:
    inputs = golden_inputs(model, version, cases=3, seed=7)
    outputs = run_onnxruntime(model_bytes(model, version), inputs)
    out_name, classes = EXPECTED_OUT[model]
    assert list(outputs) == [out_name]
    result = outputs[out_name]
    assert result.shape == (3, classes)
    assert result.dtype == np.float32
    assert np.isfinite(result).all()
    if model == "mlp":
        np.testing.assert_allclose(result.sum(axis=1), 1.0, rtol=1e-5)


_DIGESTS = """
import hashlib, sys
from modelreg.examples import EXAMPLE_VERSIONS, model_bytes
for m, versions in EXAMPLE_VERSIONS.items():
    for v in versions:
        print(m, v, hashlib.sha256(model_bytes(m, v)).hexdigest())
"""


def test_build_is_deterministic_across_processes() -> None:
    """Another interpreter, with another hash seed, builds the same bytes."""
    proc = subprocess.run(
        [sys.executable, "-c", _DIGESTS],
        cwd=REPO, env={**os.environ, "PYTHONHASHSEED": "4242", "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    theirs = {tuple(line.split()[:2]): line.split()[2] for line in proc.stdout.splitlines()}
    ours = {(m, v): hashlib.sha256(model_bytes(m, v)).hexdigest() for m, v in SMALL}
    assert theirs == ours


def test_versions_differ() -> None:
    for model, versions in EXAMPLE_VERSIONS.items():
        blobs = {model_bytes(model, v) for v in versions}
        assert len(blobs) == len(versions)


@pytest.mark.parametrize("model", list(EXAMPLE_VERSIONS))
def test_fine_tune_keeps_graph_and_changes_some_tensors(model: str) -> None:
    base, tuned = build_model(model, "1.0.0"), build_model(model, "1.1.0")
    assert _nodes(base) == _nodes(tuned)
    assert _signature(base) == _signature(tuned)
    a, b = _inits(base), _inits(tuned)
    assert list(a) == list(b)
    assert all(list(a[k].dims) == list(b[k].dims) for k in a)
    changed = [k for k in a if a[k].raw_data != b[k].raw_data]
    assert 0 < len(changed) < len(a)
    for key in changed:  # a fine-tune is a small perturbation, not a re-init
        old, new = numpy_helper.to_array(a[key]), numpy_helper.to_array(b[key])
        assert np.abs(new - old).max() < np.abs(old).max()


def test_mlp_v2_adds_layer_with_same_signature() -> None:
    v1, v2 = build_model("mlp", "1.0.0"), build_model("mlp", "2.0.0")
    assert len(v2.graph.node) > len(v1.graph.node)
    assert len(v2.graph.initializer) > len(v1.graph.initializer)
    assert _signature(v1) == _signature(v2)
    assert _signature(v1) == ([("input", ["batch", 16])], [("probs", ["batch", 4])])


def test_cnn_v2_takes_32x32_images() -> None:
    v1, v2 = build_model("cnn", "1.0.0"), build_model("cnn", "2.0.0")
    assert _dims(v1.graph.input[0]) == ["batch", 1, 28, 28]
    assert _dims(v2.graph.input[0]) == ["batch", 1, 32, 32]
    assert golden_inputs("cnn", "2.0.0", cases=5)["image"].shape == (5, 1, 32, 32)
    assert _signature(v1)[1] == _signature(v2)[1]


def test_golden_inputs_are_seeded() -> None:
    a = golden_inputs("mlp", "1.0.0", cases=4, seed=1)["input"]
    np.testing.assert_array_equal(a, golden_inputs("mlp", "1.0.0", cases=4, seed=1)["input"])
    assert not np.array_equal(a, golden_inputs("mlp", "1.0.0", cases=4, seed=2)["input"])
    assert a.shape == (4, 16)
    assert a.dtype == np.float32


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("rnn", "1.0.0"), "unknown example model 'rnn'.*cnn.*mlp"),
        (("mlp", "3.0.0"), "unknown version '3.0.0'.*1.0.0.*2.0.0"),
        (("mlp", "1.0.0", "tiny"), "unknown size 'tiny'.*small.*large.*huge"),
        (("cnn", "1.0.0", "huge"), "unknown size 'huge' for example 'cnn'"),
        (("cnn", "1.0.0", "large"), "unknown size 'large' for example 'cnn'"),
    ],
)
def test_invalid_arguments_raise(args: tuple[str, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_model(*args)


def test_invalid_golden_and_write_arguments_raise(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown version"):
        golden_inputs("cnn", "0.1.0")
    with pytest.raises(ValueError, match="cases"):
        golden_inputs("mlp", "1.0.0", cases=0)
    with pytest.raises(ValueError, match="unknown example model"):
        write_examples(tmp_path, models=["rnn"])
    with pytest.raises(
        ValueError,
        match=r"unknown size 'tiny'; choose one of \['huge', 'large', 'medium', 'small'\]",
    ):
        write_examples(tmp_path, size="tiny")
    with pytest.raises(ValueError, match="unknown size 'large' for example 'cnn'"):
        write_examples(tmp_path, size="large", models=["cnn"])
    assert list(tmp_path.iterdir()) == []


def test_write_examples_and_goldens_round_trip(tmp_path: Path) -> None:
    written = write_examples(tmp_path)
    assert [(f.model, f.version) for f in written] == SMALL
    for example in written:
        assert example.size == "small"
        assert example.path == tmp_path / example.model / f"{example.version}.onnx"
        data = example.path.read_bytes()
        assert data == model_bytes(example.model, example.version)
        assert example.golden_inputs is not None
        assert example.golden_outputs is not None
        with np.load(example.golden_inputs) as npz:
            inputs = {k: npz[k] for k in npz.files}
        with np.load(example.golden_outputs) as npz:
            expected = {k: npz[k] for k in npz.files}
        assert list(inputs) == [
            vi.name for vi in build_model(example.model, example.version).graph.input
        ]
        assert list(expected) == [EXPECTED_OUT[example.model][0]]
        actual = run_onnxruntime(data, inputs)
        assert actual.keys() == expected.keys()
        for name, value in expected.items():
            np.testing.assert_allclose(actual[name], value, rtol=1e-6, atol=1e-7)
    leftovers = [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []
    # Rewriting is byte-identical, goldens included (fixed zip timestamps).
    first = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    write_examples(tmp_path)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == first


def test_write_examples_without_goldens_subset(tmp_path: Path) -> None:
    written = write_examples(tmp_path, models=["cnn"], goldens=False)
    assert [f.version for f in written] == list(EXAMPLE_VERSIONS["cnn"])
    assert all(f.golden_inputs is None and f.golden_outputs is None for f in written)
    assert sorted(p.name for p in (tmp_path / "cnn").iterdir()) == [
        "1.0.0.onnx",
        "1.1.0.onnx",
        "2.0.0.onnx",
    ]
    assert not (tmp_path / "mlp").exists()


def test_cli_writes_and_lists_files(tmp_path: Path) -> None:
    script = REPO / "scripts" / "make_example_models.py"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path), "--models", "cnn"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 9  # 3 versions x (model, inputs, outputs)
    path, size, digest = lines[0].split("\t")
    assert Path(path) == tmp_path / "cnn" / "1.0.0.onnx"
    assert int(size) == Path(path).stat().st_size
    assert len(digest) == 64
    bad = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path), "--size", "large", "--models", "cnn"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert bad.returncode == 2
    assert "subset" in bad.stderr


@pytest.mark.slow
def test_large_mlp_is_100mb_with_17_percent_fine_tune() -> None:
    start = time.perf_counter()
    base = build_model("mlp", "1.0.0", "large")
    tuned = build_model("mlp", "1.1.0", "large")
    elapsed = time.perf_counter() - start
    size = base.ByteSize()
    assert 95_000_000 <= size <= 110_000_000
    assert tuned.ByteSize() == size
    assert not base.graph.initializer[0].external_data
    assert _nodes(base) == _nodes(tuned)
    a, b = _inits(base), _inits(tuned)
    assert list(a) == list(b)
    total = sum(len(t.raw_data) for t in a.values())
    changed = sum(len(a[k].raw_data) for k in a if a[k].raw_data != b[k].raw_data)
    assert 0.12 <= changed / total <= 0.22
    assert elapsed < 60, f"building two large models took {elapsed:.1f}s"
    # The large model still runs and yields a probability distribution.
    probs = run_onnxruntime(base.SerializeToString(), golden_inputs("mlp", "1.0.0"))["probs"]
    assert probs.shape == (2, 4)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


def test_module_exports() -> None:
    assert set(examples.__all__) >= {
        "EXAMPLE_VERSIONS",
        "ExampleFile",
        "build_model",
        "golden_inputs",
        "model_bytes",
        "run_onnxruntime",
        "write_examples",
    }
