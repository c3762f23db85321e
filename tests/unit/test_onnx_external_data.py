"""ONNX external data: a graph initializer may keep its bytes in a plain file beside the
``.onnx``; every other reference (a path, a link, a span past the file's end, overlapping
spans, a tensor in a node attribute, subgraph or function) is refused with one line,
before anything reads it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from pipelines.build._checks import check_onnx
from pipelines.errors import ArtifactError
from pipelines.onnx import load_onnx, read_signature


def _external(name: str, location: str = "../../.git/config") -> TensorProto:
    tensor = helper.make_tensor(name, TensorProto.FLOAT, [2], [1.0, 2.0])
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    tensor.external_data.add(key="length", value="8")
    return tensor


def _model(graph: onnx.GraphProto, **kwargs: Any) -> onnx.ModelProto:
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], **kwargs)


def _io() -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    return [x], [y]


def _initializer_model() -> onnx.ModelProto:
    inputs, outputs = _io()
    node = helper.make_node("Add", ["x", "w"], ["y"])
    return _model(helper.make_graph([node], "g", inputs, outputs, [_external("w")]))


def _constant_model() -> onnx.ModelProto:
    inputs, outputs = _io()
    const = helper.make_node("Constant", [], ["w"], value=_external("c"))
    add = helper.make_node("Add", ["x", "w"], ["y"])
    return _model(helper.make_graph([const, add], "g", inputs, outputs))


def _subgraph_model() -> onnx.ModelProto:
    inputs, outputs = _io()
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    branch_out = helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])
    then = helper.make_graph(
        [helper.make_node("Identity", ["inner"], ["b"])], "then", [], [branch_out],
        [_external("inner")],
    )  # fmt: skip
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["b"])], "else", [], [branch_out]
    )
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)
    return _model(helper.make_graph([node], "g", [*inputs, cond], outputs))


def _function_model() -> onnx.ModelProto:
    inputs, outputs = _io()
    const = helper.make_node("Constant", [], ["w"], value=_external("f"))
    add = helper.make_node("Add", ["x", "w"], ["y"])
    function = helper.make_function(
        "local", "AddW", ["x"], ["y"], [const, add], [helper.make_opsetid("", 17)]
    )
    call = helper.make_node("AddW", ["x"], ["y"], domain="local")
    return _model(helper.make_graph([call], "g", inputs, outputs), functions=[function])


def _loads(path: Path) -> list[Any]:
    return [
        lambda: check_onnx(path, "model.onnx"),
        lambda: load_onnx(path, "model.onnx"),
        lambda: read_signature(path, "model.onnx"),
    ]


@pytest.mark.parametrize(
    ("build", "tensor"),
    [
        (_constant_model, "c"),
        (_subgraph_model, "inner"),
        (_function_model, "f"),
    ],
)
def test_external_data_outside_the_graph_initializers_is_refused(
    build: Any, tensor: str, tmp_path: Path
) -> None:
    model = build()
    model.opset_import.append(helper.make_opsetid("local", 1))
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    expected = (
        f"model.onnx: tensor {tensor!r} is stored in another file ('../../.git/config') but is "
        "not a graph initializer; only the graph's initializers may be external data"
    )
    for load in (*_loads(path), lambda: load_onnx(path.read_bytes(), "model.onnx")):
        with pytest.raises(ArtifactError) as caught:
            load()
        assert str(caught.value) == expected


def test_external_data_of_a_model_given_as_bytes_is_refused(tmp_path: Path) -> None:
    data = _initializer_model().SerializeToString()
    with pytest.raises(ArtifactError) as caught:
        load_onnx(data, "model.onnx")
    assert str(caught.value) == (
        "model.onnx: tensor 'w' is stored in another file ('../../.git/config'); a model given "
        "as bytes has no folder to find it in"
    )


def _with_entries(tmp_path: Path, entries: list[tuple[str, str]], data: bytes = bytes(64)) -> Path:
    """A model whose initializer ``w`` (float32[2]) has exactly ``entries``."""
    (tmp_path / "w.bin").write_bytes(data)
    model = _initializer_model()
    weight = model.graph.initializer[0]
    del weight.external_data[:]
    for key, value in entries:
        weight.external_data.add(key=key, value=value)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([("location", "../../.git/config")],
         ("tensor 'w': external data location '../../.git/config' is a path; it must be a file "
          "name in the model's folder")),
        ([("location", "/etc/passwd")], "external data location '/etc/passwd' is a path"),
        ([("location", "..\\x")], "is a path"),
        ([("location", "..")], "external data location '..' starts with '.'"),
        ([("location", ".git")], "external data location '.git' starts with '.'"),
        ([("location", "")], "external data location '' is empty"),
        ([("location", "w\x00.bin")], "holds a control character"),
        ([("location", "model.onnx")], "names the model file itself"),
        ([("location", "model.onnx.dvc")], "names a DVC pointer"),
        ([("location", "w.bin"), ("location", "w.bin")], "external data key 'location' repeated"),
        ([("location", "w.bin"), ("basepath", "/")], "unknown external data key 'basepath'"),
        ([("location", "w.bin"), ("offset", "-8")], "external data offset '-8' is not a size"),
        ([("location", "w.bin"), ("offset", "0x10")], "external data offset '0x10' is not a size"),
        ([("location", "w.bin"), ("length", "64")],
         "external data length 64 is not its shape's 8 bytes"),
        ([("location", "w.bin"), ("offset", "60"), ("length", "8")],
         "tensor 'w': bytes 60..68 lie beyond the end of 'w.bin' (64 bytes)"),
        ([("location", "w.bin"), ("offset", "99999999999999999999")], "is not a size"),
        ([("location", "missing.bin")], "external data file 'missing.bin' is missing"),
    ],
)  # fmt: skip
def test_unsafe_external_data_references_are_refused_with_one_line(
    tmp_path: Path, entries: list[tuple[str, str]], message: str
) -> None:
    path = _with_entries(tmp_path, entries)
    for load in _loads(path):
        with pytest.raises(ArtifactError) as caught:
            load()
        text = str(caught.value)
        assert text.startswith("model.onnx: "), text
        assert message in text
        assert "\n" not in text


def test_an_external_data_file_that_is_a_link_or_a_folder_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"token=hunter2\n")
    path = _with_entries(tmp_path, [("location", "w.bin")])
    (tmp_path / "w.bin").unlink()
    (tmp_path / "w.bin").symlink_to(secret)
    for load in _loads(path):
        with pytest.raises(
            ArtifactError, match=re.escape("'w.bin' is a symbolic link; links are never")
        ):
            load()
    (tmp_path / "w.bin").unlink()
    (tmp_path / "w.bin").mkdir()
    for load in _loads(path):
        with pytest.raises(ArtifactError, match=re.escape("'w.bin' is not a regular file")):
            load()


def test_overlapping_external_tensors_are_refused(tmp_path: Path) -> None:
    inputs, outputs = _io()
    first, second = _external("a", "w.bin"), _external("b", "w.bin")
    first.external_data.add(key="offset", value="0")
    second.external_data.add(key="offset", value="4")
    (tmp_path / "w.bin").write_bytes(bytes(16))
    nodes = [helper.make_node("Add", ["x", "a"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])]
    model = _model(helper.make_graph(nodes, "g", inputs, outputs, [first, second]))
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    for load in _loads(path):
        with pytest.raises(ArtifactError) as caught:
            load()
        assert str(caught.value) == (
            "model.onnx: tensors 'a' and 'b' overlap in 'w.bin'; each byte of external data "
            "belongs to one tensor"
        )


def test_a_model_with_external_data_beside_it_loads_and_runs(tmp_path: Path) -> None:
    import numpy as np
    import onnxruntime as ort

    from modelreg.examples import build_model, save_external
    from pipelines.onnx import load_onnx_external

    path = tmp_path / "1.0.0.onnx"
    data = save_external(build_model("mlp", "1.0.0"), path)
    assert data == tmp_path / "1.0.0.onnx.data"
    checked = check_onnx(path, "1.0.0.onnx")
    assert [t.name for t in checked.graph.output] == ["probs"]
    model, external = load_onnx_external(path, "1.0.0.onnx")
    assert external.files == ("1.0.0.onnx.data",)
    assert external.sizes == (data.stat().st_size,)
    assert (
        len(external.tensors)
        == len([t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL])
        > 0
    )
    assert read_signature(path).inputs[0].name == "input"
    x = np.ones((2, 16), np.float32)
    whole = ort.InferenceSession(
        build_model("mlp", "1.0.0").SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, {"input": x})[0]
    split = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"input": x}
    )[0]
    np.testing.assert_array_equal(whole, split)


def test_a_self_contained_model_passes(tmp_path: Path) -> None:
    inputs, outputs = _io()
    weight = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    node = helper.make_node("Add", ["x", "w"], ["y"])
    path = tmp_path / "model.onnx"
    path.write_bytes(
        _model(helper.make_graph([node], "g", inputs, outputs, [weight])).SerializeToString()
    )
    checked = check_onnx(path, "model.onnx")
    assert [i.name for i in checked.graph.initializer] == ["w"]
