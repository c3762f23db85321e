"""A version's artifact is one self-contained ONNX file: a tensor stored in another file
is refused wherever it hides (initializers, sparse initializers, node attributes,
subgraphs, functions), before anything reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from pipelines.build_checks import check_onnx
from pipelines.errors import ArtifactError
from pipelines.onnx_signature import load_onnx, read_signature


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


@pytest.mark.parametrize(
    ("build", "tensor"),
    [
        (_initializer_model, "w"),
        (_constant_model, "c"),
        (_subgraph_model, "inner"),
        (_function_model, "f"),
    ],
)
def test_external_data_is_refused_wherever_it_hides(
    build: Any, tensor: str, tmp_path: Path
) -> None:
    model = build()
    model.opset_import.append(helper.make_opsetid("local", 1))
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    expected = f"tensor {tensor!r} is stored in another file ('../../.git/config')"
    for load in (
        lambda: check_onnx(path, "model.onnx"),
        lambda: load_onnx(path, "model.onnx"),
        lambda: load_onnx(path.read_bytes(), "model.onnx"),
        lambda: read_signature(path, "model.onnx"),
    ):
        with pytest.raises(ArtifactError, match="is stored in another file") as caught:
            load()
        assert expected in str(caught.value)


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
