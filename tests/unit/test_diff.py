"""The semantic model diff: findings on the example models, classification rules, reports."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from modelreg.examples import model_bytes
from pipelines.diff import (
    MarkdownLimits,
    MetricDelta,
    append_step_summary,
    diff_models,
    diff_versions,
    summary,
    to_json,
    to_markdown,
)
from pipelines.diff._compare import compare_tensors, diff_nodes, diff_signature
from pipelines.errors import ArtifactError, PipelineError
from registry.errors import ManifestError
from registry.render import md_code, md_code_block, md_text
from registry.schema import Goldens, ModelVersion, TensorSpec
from tests.conftest import REPO_ROOT, assert_golden

METRICS: dict[tuple[str, str], dict[str, float]] = {
    ("mlp", "1.0.0"): {"accuracy": 0.912, "f1": 0.905},
    ("mlp", "1.1.0"): {"accuracy": 0.924, "f1": 0.918},
    ("mlp", "2.0.0"): {"accuracy": 0.931, "f1": 0.927, "latency_ms": 0.41},
    ("cnn", "1.0.0"): {"accuracy": 0.88},
    ("cnn", "2.0.0"): {"accuracy": 0.902},
}
PAIRS = [("mlp", "1.0.0", "1.1.0"), ("mlp", "1.1.0", "2.0.0"), ("cnn", "1.0.0", "2.0.0")]


def manifest(model: str, version: str) -> ModelVersion:
    """A ModelVersion whose goldens point at the example_models files."""
    case = {
        "name": "default",
        "inputs": f"{model}/{version}.inputs.npz",
        "outputs": f"{model}/{version}.outputs.npz",
    }
    return ModelVersion.model_validate(
        {
            "apiVersion": "modelreg/v1",
            "kind": "ModelVersion",
            "metadata": {"name": model, "version": version},
            "spec": {
                "artifact": f"models/{model}/{version}.onnx",
                "metrics": METRICS[model, version],
                "goldens": {"cases": [case]},
            },
        }
    )


def example_diff(examples: Path, model: str, old: str, new: str) -> Any:
    new_manifest = manifest(model, new)
    return diff_models(
        examples / model / f"{old}.onnx",
        examples / model / f"{new}.onnx",
        old_manifest=manifest(model, old),
        new_manifest=new_manifest,
        goldens=new_manifest.spec.goldens,
        golden_root=examples,
    )


def ops(diff: Any) -> dict[str, tuple[int, int, int, int, int]]:
    return {o.op_type: (o.old, o.new, o.added, o.removed, o.changed) for o in diff.graph.ops}


# --- the example models ----------------------------------------------------------------


def test_fine_tune_is_weights_only(example_models: Path) -> None:
    diff = example_diff(example_models, "mlp", "1.0.0", "1.1.0")
    assert diff.verdict == "weights only"
    assert not diff.breaking
    assert diff.signature == ()
    assert diff.opsets == ()
    assert diff.graph.nodes == ()
    assert ops(diff) == {
        "Add": (8, 8, 0, 0, 0),
        "MatMul": (8, 8, 0, 0, 0),
        "Relu": (7, 7, 0, 0, 0),
        "Softmax": (1, 1, 0, 0, 0),
    }
    w = diff.weights
    assert sorted(c.tensor.name for c in w.changed) == [
        "fc6.bias",
        "fc6.weight",
        "fc7.bias",
        "fc7.weight",
    ]
    assert (w.added, w.removed, w.reshaped) == ((), (), ())
    assert w.unchanged == 12
    assert w.changed_bytes == (32 * 32 + 32 + 32 * 4 + 4) * 4
    for change in w.changed:
        assert change.max_abs is not None
        assert 0 < change.max_abs < 0.1  # fine-tune noise, not a retrain
        assert change.rel_l2 is not None
        assert change.rel_l2 > 0
    assert diff.old.file_bytes == diff.new.file_bytes
    assert diff.old.sha256 != diff.new.sha256


def test_fine_tune_metric_deltas(example_models: Path) -> None:
    diff = example_diff(example_models, "mlp", "1.0.0", "1.1.0")
    by_name = {m.name: m for m in diff.metrics}
    assert list(by_name) == ["accuracy", "f1"]
    acc = by_name["accuracy"]
    assert (acc.old, acc.new) == (0.912, 0.924)
    assert acc.delta == pytest.approx(0.012)
    assert acc.relative == pytest.approx(0.012 / 0.912)
    assert by_name["f1"].delta == pytest.approx(0.013)


def test_fine_tune_golden_drift_runs_both_models(example_models: Path) -> None:
    diff = example_diff(example_models, "mlp", "1.0.0", "1.1.0")
    assert diff.drift is not None
    assert diff.drift.skipped == ()
    [drift] = diff.drift.outputs
    assert (drift.case, drift.output) == ("default", "probs")
    assert drift.max_abs is not None
    assert 0 < drift.max_abs < 1
    assert drift.relative is not None
    # the new goldens were recorded from 1.1.0; 1.0.0 is close but not within 1e-4
    assert drift.within_tolerance is False


def test_added_layer_is_graph_change(example_models: Path) -> None:
    diff = example_diff(example_models, "mlp", "1.1.0", "2.0.0")
    assert diff.verdict == "graph change"
    assert diff.signature == ()
    assert ops(diff) == {
        "Add": (8, 9, 1, 0, 0),
        "MatMul": (8, 9, 1, 0, 0),
        "Relu": (7, 8, 1, 0, 0),
        "Softmax": (1, 1, 0, 0, 1),
    }
    nodes = {(n.kind, n.node) for n in diff.graph.nodes}
    assert nodes == {
        ("added", "fc8/MatMul"),
        ("added", "fc8/Add"),
        ("added", "fc7/Relu"),
        ("changed", "Softmax"),
    }
    [softmax] = [n for n in diff.graph.nodes if n.kind == "changed"]
    assert softmax.detail == "inputs fc7/add → fc8/add"
    w = diff.weights
    assert [t.name for t in w.added] == ["fc8.bias", "fc8.weight"]
    assert [(r.old.shape, r.new.shape) for r in w.reshaped] == [((4,), (8,)), ((32, 4), (32, 8))]
    # 1.1.0 fine-tuned fc6; 2.0.0 branched from the 1.0.0 weights there
    assert [c.tensor.name for c in w.changed] == ["fc6.bias", "fc6.weight"]
    assert diff.new.file_bytes > diff.old.file_bytes
    latency = next(m for m in diff.metrics if m.name == "latency_ms")
    assert (latency.old, latency.new, latency.delta) == (None, 0.41, None)


def test_op_counts_balance(example_models: Path) -> None:
    for model, old, new in PAIRS:
        for op in example_diff(example_models, model, old, new).graph.ops:
            assert op.old - op.removed + op.added == op.new, op


def test_input_resize_is_breaking_and_skips_drift(example_models: Path) -> None:
    diff = example_diff(example_models, "cnn", "1.0.0", "2.0.0")
    assert diff.verdict == "breaking I/O change"
    assert diff.breaking
    [change] = diff.signature
    assert (change.side, change.tensor, change.kind, change.breaking) == (
        "input",
        "image",
        "fixed-dim",
        True,
    )
    assert change.old == "float32[batch,1,28,28]"
    assert change.new == "float32[batch,1,32,32]"
    assert change.detail == "dim 2: 28 → 32, dim 3: 28 → 32"
    assert diff.graph.nodes == ()
    assert len(diff.weights.changed) == 6  # retrained for 32x32
    assert diff.drift is not None
    assert diff.drift.outputs == ()
    assert diff.drift.within_tolerance is None  # nothing measured is not a pass
    [skipped] = diff.drift.skipped
    assert skipped.case == "default"
    assert "input signature changed: image dim 2: 28 → 32" in skipped.reason


@pytest.mark.parametrize(("model", "old", "new"), PAIRS)
def test_markdown_golden(example_models: Path, model: str, old: str, new: str) -> None:
    text = to_markdown(example_diff(example_models, model, old, new))
    assert_golden(f"diff_{model}_{old}_{new}.md", text)


def test_summary_lines(example_models: Path) -> None:
    lines = [summary(example_diff(example_models, *pair)) for pair in PAIRS]
    assert lines[0].startswith("**Weights only**: 4 of 16 tensors changed")
    assert lines[1].startswith("**Graph change**: 3 nodes added, 1 node changed")
    assert lines[2].startswith("**Breaking I/O change**: input `image` dim 2: 28 → 32")
    assert "also 6 of 6 tensors changed" in lines[2]


def test_json_is_stable_and_strict(example_models: Path) -> None:
    diff = example_diff(example_models, "mlp", "1.1.0", "2.0.0")
    data = to_json(diff)
    assert list(data) == [
        "format",
        "model",
        "old",
        "new",
        "verdict",
        "breaking",
        "opsets",
        "signature",
        "graph",
        "weights",
        "metrics",
        "drift",
    ]
    assert data["format"] == "modelreg.diff/v1"
    assert data["verdict"] == "graph change"
    assert data["old"]["label"] == "1.1.0"
    assert data["graph"]["ops"][0] == {
        "op_type": "Add",
        "old": 8,
        "new": 9,
        "added": 1,
        "removed": 0,
        "changed": 0,
    }
    assert data["weights"]["added"][0] == {
        "name": "fc8.bias",
        "dtype": "float32",
        "shape": [4],
        "nbytes": 16,
    }
    assert data["metrics"][0]["delta"] == pytest.approx(0.007)
    text = json.dumps(data, allow_nan=False, sort_keys=False)
    assert json.loads(text) == data
    assert to_json(diff) == data  # deterministic


def test_bytes_and_paths_give_the_same_diff(example_models: Path) -> None:
    from_bytes = diff_models(model_bytes("mlp", "1.0.0"), model_bytes("mlp", "1.1.0"))
    from_paths = diff_models(example_models / "mlp/1.0.0.onnx", example_models / "mlp/1.1.0.onnx")
    assert from_bytes == from_paths
    assert (from_bytes.name, from_bytes.old_label, from_bytes.new_label) == ("", "old", "new")
    assert from_bytes.metrics == ()
    assert from_bytes.drift is None


def test_identical_and_metadata_only() -> None:
    data = model_bytes("cnn", "1.0.0")
    assert diff_models(data, data).verdict == "identical"
    model = onnx.load_from_string(data)
    model.doc_string = "re-exported"
    other = model.SerializeToString()
    assert diff_models(data, other).verdict == "metadata only"


def test_opset_upgrade_is_a_graph_change() -> None:
    data = model_bytes("cnn", "1.0.0")
    model = onnx.load_from_string(data)
    model.opset_import[0].version = 18
    diff = diff_models(data, model.SerializeToString())
    assert diff.verdict == "graph change"
    assert [(o.domain, o.old, o.new) for o in diff.opsets] == [("ai.onnx", 17, 18)]
    assert "opset ai.onnx 17 → 18" in summary(diff)


def test_not_onnx_is_an_artifact_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00not a model")
    with pytest.raises(ArtifactError, match=r"junk\.onnx: not an ONNX model"):
        diff_models(junk, model_bytes("mlp", "1.0.0"))
    with pytest.raises(ArtifactError, match="cannot read"):
        diff_models(tmp_path / "absent.onnx", model_bytes("mlp", "1.0.0"))


# --- classification rules --------------------------------------------------------------


def spec(name: str, *shape: int | str | None, dtype: str = "float32") -> TensorSpec:
    return TensorSpec.model_validate({"name": name, "dtype": dtype, "shape": list(shape)})


X = spec("x", "batch", 16)
Y = spec("y", "batch", 4)


@pytest.mark.parametrize(
    ("old_io", "new_io", "kind", "breaking"),
    [
        (([X], [Y]), ([spec("x", "batch", None)], [Y]), "dim-relaxed", False),
        (([spec("x", "n", 16)], [Y]), ([spec("x", "batch", 16)], [Y]), "dim-renamed", False),
        (([X], [Y]), ([spec("x", 1, 16)], [Y]), "dim-narrowed", True),
        (([X], [Y]), ([X], [spec("y", "batch", "classes")]), "dim-relaxed", True),
        (([X], [spec("y", "batch", "k")]), ([X], [Y]), "dim-narrowed", False),
        (([X], [Y]), ([spec("x", "batch", 32)], [Y]), "fixed-dim", True),
        (([X], [Y]), ([spec("x", "batch", 16, 1)], [Y]), "rank", True),
        (([X], [Y]), ([spec("x", "batch", 16, dtype="float16")], [Y]), "dtype", True),
        (([X], [Y]), ([X, spec("mask", "batch")], [Y]), "added", True),
        (([X], [Y]), ([X], [Y, spec("logits", "batch", 4)]), "added", False),
        (([X, spec("mask", "batch")], [Y]), ([X], [Y]), "removed", True),
        (([X], [Y, spec("logits", "batch", 4)]), ([X], [Y]), "removed", True),
    ],
)
def test_signature_classification(
    old_io: tuple[list[TensorSpec], list[TensorSpec]],
    new_io: tuple[list[TensorSpec], list[TensorSpec]],
    kind: str,
    breaking: bool,
) -> None:
    [change] = diff_signature(*old_io, *new_io)
    assert (change.kind, change.breaking) == (kind, breaking)


def test_signature_reports_every_change_inputs_first() -> None:
    changes = diff_signature(
        [X], [Y], [spec("x", "batch", 8, dtype="int64")], [spec("y", "batch", 4), spec("z", 1)]
    )
    assert [(c.side, c.tensor, c.kind) for c in changes] == [
        ("input", "x", "dtype"),
        ("input", "x", "fixed-dim"),
        ("output", "z", "added"),
    ]


def node(op: str, inputs: list[str], outputs: list[str], name: str = "", **attrs: Any) -> Any:
    return helper.make_node(op, inputs, outputs, name or None, **attrs)


def test_unnamed_nodes_match_by_structure() -> None:
    old = [node("Relu", ["a"], ["b"]), node("Softmax", ["b"], ["c"], axis=1)]
    reordered = list(reversed(old))
    assert diff_nodes(old, reordered).nodes == ()
    changed = [node("Relu", ["a"], ["b"]), node("Softmax", ["b"], ["c"], axis=0)]
    [change] = diff_nodes(old, changed).nodes
    assert (change.kind, change.op_type, change.detail) == ("changed", "Softmax", "attributes axis")
    assert change.node == "Softmax → c"
    rewired = [node("Relu", ["a"], ["b"]), node("Softmax", ["a"], ["c"], axis=1)]
    assert sorted(c.kind for c in diff_nodes(old, rewired).nodes) == ["added", "removed"]


def test_duplicate_names_fall_back_to_structure() -> None:
    old = [node("Relu", ["a"], ["b"], "act"), node("Relu", ["b"], ["c"], "act")]
    new = [node("Relu", ["b"], ["c"], "act"), node("Relu", ["a"], ["b"], "act")]
    assert diff_nodes(old, new).nodes == ()


def test_op_type_change_under_one_name_is_remove_plus_add() -> None:
    old = [node("Relu", ["a"], ["b"], "act")]
    new = [node("Gelu", ["a"], ["b"], "act", domain="com.microsoft")]
    graph = diff_nodes(old, new)
    assert [(c.kind, c.op_type, c.detail) for c in graph.nodes] == [
        ("removed", "Relu", "now com.microsoft.Gelu"),
        ("added", "com.microsoft.Gelu", "was Relu"),
    ]
    assert {o.op_type: (o.old, o.new, o.added, o.removed) for o in graph.ops} == {
        "Relu": (1, 0, 0, 1),
        "com.microsoft.Gelu": (0, 1, 1, 0),
    }


def test_tensor_change_measures() -> None:
    old = np.array([3.0, 4.0], dtype=np.float32)
    new = np.array([3.0, 4.5], dtype=np.float32)
    change = compare_tensors("w", old, new)
    assert change is not None
    assert change.max_abs == pytest.approx(0.5)
    assert change.rel_l2 == pytest.approx(0.5 / 5.0)
    assert compare_tensors("w", old, old.copy()) is None
    zero = compare_tensors("w", np.zeros(2, np.float32), new)
    assert zero is not None
    assert zero.rel_l2 is None
    nan = np.array([np.nan], dtype=np.float32)
    assert compare_tensors("w", nan, nan.copy()) is None


# --- goldens in other shapes -----------------------------------------------------------


def test_inline_goldens_and_missing_files(example_models: Path) -> None:
    rows = np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32)
    goldens = Goldens.model_validate(
        {
            "rtol": 0.5,
            "atol": 0.5,
            "cases": [
                {
                    "name": "inline",
                    "inputs": {
                        "input": {
                            "dtype": "float32",
                            "shape": [1, 16],
                            "data": [float(v) for v in rows.ravel()],
                        }
                    },
                    "outputs": "unused.npz",
                },
                {"name": "gone", "inputs": "mlp/absent.npz", "outputs": "unused.npz"},
                {"name": "wrong", "inputs": "cnn/1.0.0.inputs.npz", "outputs": "unused.npz"},
            ],
        }
    )
    diff = diff_models(
        model_bytes("mlp", "1.0.0"),
        model_bytes("mlp", "1.1.0"),
        goldens=goldens,
        golden_root=example_models,
    )
    assert diff.drift is not None
    [measured] = diff.drift.outputs
    assert measured.case == "inline"
    assert measured.within_tolerance  # loose tolerances
    skipped = {s.case: s.reason for s in diff.drift.skipped}
    assert skipped["gone"] == "mlp/absent.npz: does not exist"
    assert skipped["wrong"] == "the old model takes ['input'], the goldens hold ['image']"
    text = to_markdown(diff)
    assert "Not measured for `gone`: mlp/absent.npz: does not exist." in text


# --- the workspace ---------------------------------------------------------------------


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A copy of this repository's manifests, with the example artifacts written in."""
    root = tmp_path / "ws"
    root.mkdir()
    shutil.copy(REPO_ROOT / "modelreg.yaml", root / "modelreg.yaml")
    shutil.copytree(REPO_ROOT / "manifests", root / "manifests")
    for model in ("mlp", "cnn"):
        (root / "models" / model).mkdir(parents=True)
        for version in ("1.0.0", "1.1.0", "2.0.0"):
            (root / "models" / model / f"{version}.onnx").write_bytes(model_bytes(model, version))
            pointer = f"models/{model}/{version}.onnx.dvc"
            shutil.copy(REPO_ROOT / pointer, root / pointer)
    return root


def test_diff_versions_reads_the_workspace(workspace: Path) -> None:
    diff = diff_versions(workspace, "mlp", "1.0.0", "1.1.0")
    assert (diff.name, diff.old_label, diff.new_label) == ("mlp", "1.0.0", "1.1.0")
    assert diff.verdict == "weights only"
    assert [m.name for m in diff.metrics] == ["accuracy", "f1"]
    assert diff.drift is not None
    assert [(o.case, o.output) for o in diff.drift.outputs] == [("default", "probs")]


def test_diff_versions_pulls_a_missing_artifact_or_says_why_not(workspace: Path) -> None:
    (workspace / "models/mlp/1.1.0.onnx").unlink()
    with pytest.raises(ArtifactError) as info:  # not a DVC repository: nothing to pull from
        diff_versions(workspace, "mlp", "1.0.0", "1.1.0")
    message = str(info.value)
    assert re.search(
        r"models/mlp/1\.1\.0\.onnx: dvc pull failed: you are not inside of a DVC repository "
        r"\(checked up to mount point '[^']*'\)$",
        message,
    ), message
    assert "\n" not in message


def test_diff_versions_refuses_a_file_its_pointer_does_not_name(workspace: Path) -> None:
    artifact = workspace / "models/mlp/1.1.0.onnx"
    artifact.write_bytes(artifact.read_bytes() + b"\0")
    with pytest.raises(ArtifactError, match=r"does not match \S*models/mlp/1\.1\.0\.onnx\.dvc"):
        diff_versions(workspace, "mlp", "1.0.0", "1.1.0")


def test_diff_versions_unknown_version(workspace: Path) -> None:
    with pytest.raises(ManifestError, match=r"version 9\.9\.9 is not declared for model 'mlp'"):
        diff_versions(workspace, "mlp", "1.0.0", "9.9.9")


# --- rendering details -----------------------------------------------------------------


def test_tables_are_capped_and_cells_escaped(example_models: Path) -> None:
    diff = example_diff(example_models, "cnn", "1.0.0", "2.0.0")
    text = to_markdown(diff, limits=MarkdownLimits(rows=2))
    assert "| … and 4 more |" in text
    assert text == to_markdown(diff, limits=MarkdownLimits(rows=2))
    old = [node("Relu", ["a"], ["b"], "weird|name\nsecond line")]
    graph = diff_nodes(old, [])
    wrapped = diff_models(model_bytes("cnn", "1.0.0"), model_bytes("cnn", "1.0.0"))
    rendered = to_markdown(replace(wrapped, graph=graph), title="T")
    assert "`weird\\|name second line`" in rendered
    assert rendered.startswith("### T\n")


def test_step_summary_appends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert append_step_summary("# nothing", {}) is None
    target = tmp_path / "summary.md"
    target.write_text("earlier step\n")
    env = {"GITHUB_STEP_SUMMARY": str(target)}
    assert append_step_summary("### one", env) == target
    append_step_summary("### two\n", env)
    assert target.read_text() == "earlier step\n### one\n\n### two\n\n"
    # Only the environment it is given: the process's own is not read.
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "other.md"))
    assert append_step_summary("### three", {}) is None
    assert not (tmp_path / "other.md").exists()
    missing = {"GITHUB_STEP_SUMMARY": str(tmp_path / "missing-dir" / "s.md")}
    with pytest.raises(PipelineError, match="cannot append the job summary"):
        append_step_summary("x", missing)


def test_report_helpers_handle_onnx_without_names() -> None:
    # A graph built by hand with no node names still renders every change.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
    )
    old = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    new = onnx.ModelProto()
    new.CopyFrom(old)
    new.graph.node[0].op_type = "Sigmoid"
    diff = diff_models(old.SerializeToString(), new.SerializeToString())
    assert diff.verdict == "graph change"
    text = to_markdown(diff)
    # unnamed: matched by structure, so another op is another node
    assert "| removed | `Relu → y` | `Relu` |  |" in text
    assert "| added | `Sigmoid → y` | `Sigmoid` |  |" in text


# --- untrusted values are data, not markup -----------------------------------------------

HOSTILE = "\n## ✅ approved by @admin\n![x](https://evil) <img src=x> **ok** | `c` $x$ &amp; [l](u)"
"""A doc string / name a pull request's model may carry (issue 8, point 9)."""


def _markdown() -> Any:
    from markdown_it import MarkdownIt  # CommonMark + GFM tables, as GitHub renders them

    return MarkdownIt("commonmark").enable("table").enable("strikethrough")


def _inline(tokens: list[Any]) -> list[Any]:
    return [c for t in tokens if t.type == "inline" for c in t.children or []]


def _normalized(value: str) -> str:
    return " ".join(value.split())


PLAIN_OR_MARKUP = st.lists(
    st.sampled_from([*"ab19 .:/@\\`*_[]()<>|~#!&$-+=\"'\n\té", "www.", "://", "&amp;", "<b>"]),
    max_size=40,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(PLAIN_OR_MARKUP)
def test_md_text_renders_as_exactly_its_characters(value: str) -> None:
    md = _markdown()
    expected = _normalized(value).replace("@", "@\u200b")
    for source, shown in (
        (f"x {md_text(value)}", f"x {expected}".rstrip()),
        (f"| h |\n|--|\n| {md_text(value)} |", f"h{expected}"),
    ):
        tokens = md.parse(source)
        assert [t.type for t in tokens].count("paragraph_open") <= 1
        children = _inline(tokens)
        assert {c.type for c in children} <= {"text"}, (value, source)
        assert "".join(c.content for c in children) == shown, (value, source)
    # first on a line it is no block either (list, heading, quote, rule, setext)
    tokens = md.parse(md_text(value) + "\n")
    assert [t.type for t in tokens] in ([], ["paragraph_open", "inline", "paragraph_close"])


@settings(max_examples=400, deadline=None)
@given(PLAIN_OR_MARKUP)
def test_md_code_is_one_code_span_that_nothing_leaves(value: str) -> None:
    md = _markdown()
    expected = _normalized(value)
    children = _inline(md.parse(f"| h |\n|--|\n| {md_code(value)} |"))
    assert [c.type for c in children[1:]] == ["code_inline"], (value, md_code(value))
    assert children[1].content == (expected or " ")
    children = _inline(md.parse(f"x {md_code(value)} y"))
    assert [c.type for c in children] == ["text", "code_inline", "text"]
    assert children[1].content == (expected or " ").replace("|", "\\|")


def test_md_code_block_cannot_be_closed_from_inside() -> None:
    text = "line one\n```\n## heading?\n````\n<b>x</b>"
    block = md_code_block(text)
    tokens = _markdown().parse(block + "\n\nafter")
    assert [t.type for t in tokens][:1] == ["fence"]
    assert tokens[0].content == text + "\n"
    assert md_code_block("plain").startswith("```\n")


def test_md_text_cuts_long_values_and_drops_invisible_characters() -> None:
    assert md_text("a" * 500) == "a" * 199 + "…"
    assert md_code("\u202egnp.exe\u200b") == "`gnp.exe`"  # a bidi override could reorder it
    assert md_text("1.0.0") == "1.0.0"
    assert md_text("1. item") == "1\\. item"
    assert md_text("---") == "\\---"


def test_md_text_shows_emoji_shortcodes_as_typed() -> None:
    """``:white_check_mark:`` would render as a check mark beside a reviewer's name."""
    value = ":white_check_mark: approved :+1: at 10:30"
    source = md_text(value)
    assert source.startswith("\\:white\\_check\\_mark:")
    assert "\\:+1:" in source
    children = _inline(_markdown().parse(source))
    assert "".join(c.content for c in children) == value


def test_md_cut_keeps_a_comment_within_githubs_limit() -> None:
    from registry.render import MarkdownLimits, md_cut

    limits = MarkdownLimits(comment_chars=200)
    assert md_cut("short\n", "*cut*", limits=limits) == "short\n"
    long = "## head\n\n" + md_code_block("\n".join(f"problem {i}" for i in range(100)))
    cut = md_cut(long, "*cut here*", limits=limits)
    assert len(cut) <= 200
    assert cut.endswith("\n*cut here*\n")
    tokens = _markdown().parse(cut)
    fences = [t for t in tokens if t.type == "fence"]
    assert len(fences) == 1
    assert fences[0].content.startswith("problem 0\n")
    assert tokens[-2].type == "inline"
    assert tokens[-2].content == "*cut here*"


def _hostile_model(producer: str, *, hostile: bool) -> bytes:
    name = (lambda s: f"{s}{HOSTILE}") if hostile else (lambda s: s)
    weight = helper.make_tensor(name("w"), TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", name("w")], [name("y")], name("add")),
         helper.make_node(name("Op"), [name("y")], [name("z")], name("n"), domain=name("dom"))],
        name("graph"),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info(name("z"), TensorProto.FLOAT, ["N", 3])],
        [weight],
        doc_string=HOSTILE,
    )  # fmt: skip
    model = helper.make_model(
        graph,
        producer_name=producer,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(name("dom"), 1)],
        doc_string=HOSTILE,
    )
    data: bytes = model.SerializeToString()
    return data


def _rendered(inline: Any) -> str:
    return "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))


def _table_rows(tokens: list[Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for i, t in enumerate(tokens):
        if t.type == "tr_open":
            rows.append([])
        elif t.type in ("td_open", "th_open"):
            rows[-1].append(_rendered(tokens[i + 1]))
    return rows


def test_a_model_cannot_write_markup_into_the_report() -> None:
    old = _hostile_model("exporter", hostile=False)
    new = _hostile_model("exporter" + HOSTILE, hostile=True)
    diff = replace(
        diff_models(old, new),
        name="mlp",
        old_label="1.0.0",
        new_label="1.1.0" + HOSTILE,
        metrics=(MetricDelta("acc" + HOSTILE, 0.5, 0.6),),
    )
    text = to_markdown(diff)
    tokens = _markdown().parse(text)
    shown = _normalized(HOSTILE).replace("@", "@\u200b")
    headings = [_rendered(tokens[i + 1]) for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings == [
        f"Model diff: mlp 1.0.0 → 1.1.0 {shown}",
        "I/O signature",
        "Graph",
        "Weights",
        "Metrics",
    ]
    children = _inline(tokens)
    kinds = {c.type for c in children}
    assert not kinds & {"link_open", "image", "html_inline", "s_open", "em_open"}, kinds
    assert not any(t.type == "html_block" for t in tokens)
    strong = [children[i + 1].content for i, c in enumerate(children) if c.type == "strong_open"]
    assert set(strong) == {"Breaking I/O change", "breaking"}, strong
    # no mention outside code; the hostile text is still there for a reviewer to read
    assert not any("@admin" in c.content for c in children if c.type == "text")
    rows = _table_rows(tokens)
    # each value stays whole in its cell ("|" did not split it), headers included
    assert rows[0] == ["", "1.0.0", f"1.1.0 {shown}", "Change"]
    assert ["Producer", "exporter", f"exporter {shown}", ""] in rows
    assert [f"Opset {_normalized('dom' + HOSTILE)}", "-", "1", ""] in rows
    assert [_normalized("add" + HOSTILE), "Add"] in [r[1:3] for r in rows if r[0] == "added"]
    assert [_normalized("acc" + HOSTILE), "0.5", "0.6", "+0.1", "+20.00 %"] in rows
    assert [_normalized("w" + HOSTILE), "added", "float32[3]", "12 B", "", ""] in rows


def test_step_summary_is_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "summary.md"
    env = {"GITHUB_STEP_SUMMARY": str(target), "MLFLOW_TRACKING_TOKEN": "tok-in-the-environment"}
    append_step_summary(
        "pull from https://TOKEN123456@127.0.0.1:9/x failed (tok-in-the-environment)", env
    )
    assert target.read_text() == "pull from https://***@127.0.0.1:9/x failed (***)\n\n"


def test_the_size_of_a_model_with_external_data_counts_its_data_files(
    external_models: Path,
) -> None:
    """Issue 27, point 14: a model stored with external data was shown as its few-KB
    graph; the overview's size now counts the data files (JSON: ``data_bytes``)."""
    old, new = external_models / "1.0.0/model.onnx", external_models / "1.1.0/model.onnx"
    diff = diff_models(old, new)
    data = (external_models / "1.1.0/model.onnx.data").stat().st_size
    assert data > 0
    assert diff.new.data_bytes == data
    assert diff.new.file_bytes == new.stat().st_size
    total = diff.new.file_bytes + diff.new.data_bytes
    assert "File size (with external data)" in to_markdown(diff)
    assert to_json(diff)["new"]["data_bytes"] == data
    assert total > diff.new.weight_bytes  # the weights are in the data file
    # a self-contained model: no external data, the row as before
    plain = diff_models(model_bytes("mlp", "1.0.0"), model_bytes("mlp", "1.1.0"))
    assert plain.new.data_bytes == 0
    assert "(with external data)" not in to_markdown(plain)
