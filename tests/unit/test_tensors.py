"""A model as its skeleton and its weights by digest (issue 25): the cut is exact and
canonical, the manifest refuses what does not add up, and an engine built from a
skeleton and its tensors answers as the whole file does, bit for bit, in every session
setup."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx import load_from_string as onnx_model

from edge_sync.engine.base import LoadRequest, TensorLayout
from edge_sync.engine.ort import OrtEngine
from edge_sync.engine.weights import TensorRef
from modelreg.examples import write_examples
from pipelines.publish._tensors import tensor_manifest
from registry.tensors import (
    MIN_TENSOR_BYTES,
    TensorCutError,
    external_locations,
    join,
    joined,
    split,
)
from registry.tensors import (
    STORE_LOCATION as STORE,
)
from signing.version_doc import MAX_TENSORS, TensorManifest, VersionDoc
from tests.edge.real_models import real_model_path


def _roundtrip(data: bytes) -> tuple[int, bytes]:
    cut = split(data)
    layout = joined(cut.skeleton)
    spans = [(p.offset, p.offset + p.length) for p in cut.pieces]
    whole = b"".join(bytes(c) for c in join(layout, lambda i, _p: data[slice(*spans[i])]))
    assert [(p.name, p.dtype, p.dims, p.length) for p in layout.pieces] == [
        (p.name, p.dtype, p.dims, p.length) for p in cut.pieces
    ]
    assert layout.length == len(data)
    return len(cut.pieces), whole


@pytest.mark.parametrize(
    ("name", "cut_some"),
    [("det", True), ("cls", False), ("silero", True)],
)
def test_real_models_cut_and_join_back_byte_for_byte(name: str, cut_some: bool) -> None:
    """PP-OCR keeps every weight in Constant nodes (cut by their output name); silero
    keeps its weights in an If node's subgraphs (cut there, each by its own name)."""
    data = real_model_path(name).read_bytes()
    pieces, whole = _roundtrip(data)
    assert whole == data
    assert (pieces > 0) is cut_some


def _model(tensor: TensorProto, *, constant: bool = False) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 128])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    inits = [tensor]
    if constant:
        nodes.insert(0, helper.make_node("Constant", [], ["w"], value=tensor))
        inits = []
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def _weight(rows: int = 128) -> np.ndarray[Any, Any]:
    return np.random.default_rng(0).standard_normal((rows, 128)).astype(np.float32)


def test_what_is_not_cut_stays_in_the_skeleton() -> None:
    big = numpy_helper.from_array(_weight(), "w")
    assert len(split(_model(big)).pieces) == 1
    small = numpy_helper.from_array(_weight(rows=127), "w")  # 65,024 bytes
    assert MIN_TENSOR_BYTES > 127 * 128 * 4
    assert split(_model(small)).pieces == ()
    typed = helper.make_tensor("w", TensorProto.FLOAT, [128, 128], _weight().ravel().tolist())
    assert split(_model(typed)).pieces == ()  # float_data, not raw bytes
    # raw_data (field 9) written before the dims (field 1): no canonical place to put
    # it back, so the tensor stays whole and the file still joins back exactly
    canonical = big.SerializeToString()
    raw_field = b"J" + _varint(len(big.raw_data)) + big.raw_data
    reordered = raw_field + canonical.replace(raw_field, b"")
    parsed = TensorProto()
    parsed.ParseFromString(reordered)
    assert np.array_equal(numpy_helper.to_array(parsed), numpy_helper.to_array(big))
    data = _model(big)
    swapped = data.replace(canonical, reordered)
    assert swapped != data
    assert split(swapped).pieces == ()
    assert _roundtrip(swapped) == (0, swapped)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_a_constant_node_is_cut_by_its_output_name() -> None:
    data = _model(numpy_helper.from_array(_weight(), "ignored"), constant=True)
    (piece,) = split(data).pieces
    assert (piece.name, piece.dims) == ("w", (128, 128))
    assert _roundtrip(data)[1] == data


def _branching(then_name: str, else_name: str) -> bytes:
    """``y = x @ w`` in either branch of an If, each branch holding its own weight as an
    initializer named ``then_name`` / ``else_name``."""

    def branch(label: str, weight: str, seed: int) -> Any:
        out = helper.make_tensor_value_info(f"y_{label}", TensorProto.FLOAT, [1, 128])
        tensor = numpy_helper.from_array(_weight() + seed, weight)
        node = helper.make_node("MatMul", ["x", weight], [f"y_{label}"])
        return helper.make_graph([node], label, [], [out], [tensor])

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128])
    c = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 128])
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("then", then_name, 0),
                            else_branch=branch("else", else_name, 1))  # fmt: skip
    graph = helper.make_graph([node], "g", [x, c], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def test_subgraph_tensors_are_cut_only_by_a_name_no_other_tensor_has() -> None:
    data = _branching("w_then", "w_else")
    assert sorted(p.name for p in split(data).pieces) == ["w_else", "w_then"]
    assert _roundtrip(data) == (2, data)
    # one name in both branches: given by name, a device could not tell them apart
    shared = _branching("w", "w")
    assert split(shared).pieces == ()
    assert _roundtrip(shared) == (0, shared)


def test_a_skeleton_whose_length_does_not_fit_its_shape_is_refused() -> None:
    cut = split(_model(numpy_helper.from_array(_weight(), "w")))
    length = str(128 * 128 * 4).encode()
    bad = cut.skeleton.replace(length, str(128 * 128 * 4 - 4).encode())
    with pytest.raises(TensorCutError, match="do not fit"):
        joined(bad)


def test_the_manifest_is_canonical_and_describes_the_file(tmp_path: Path) -> None:
    (files,) = [write_examples(tmp_path, "medium", models=["mlp"], goldens=False)]
    first = tensor_manifest(files[0].path)
    again = tensor_manifest(files[0].path)
    assert first is not None
    assert again is not None
    manifest, objects = first
    assert manifest.model_dump_json() == again[0].model_dump_json()
    data = files[0].path.read_bytes()
    assert len(manifest.tensors) == 6  # the 128 x 128 matrices; biases stay in the graph
    for t in manifest.tensors:
        assert hashlib.sha256(objects[t.sha256].read()).hexdigest() == t.sha256
    skeleton = objects[manifest.graph.sha256].read()
    layout = joined(skeleton)
    whole = b"".join(
        bytes(c) for c in join(layout, lambda i, _p: objects[manifest.tensors[i].sha256].read())
    )
    assert whole == data
    # a fine-tune of the last two layers changes only what it touched
    fine = tensor_manifest(files[1].path)
    assert fine is not None
    changed = {t.name for t in fine[0].tensors} - {
        t.name for t in fine[0].tensors if t.sha256 in {u.sha256 for u in manifest.tensors}
    }
    assert changed == {"fc6.weight"}  # fc7 (the 128 x 4 head) is under 64 KiB


def _doc(tensors: list[dict[str, Any]]) -> bytes:
    manifest = {"graph": {"sha256": "a" * 64, "length": 10}, "tensors": tensors}
    doc = {"model": "mlp", "version": "1.0.0", "artifact": "models/mlp/1.0.0.onnx",
           "tensors": manifest}  # fmt: skip
    return json.dumps(doc).encode()


def _entry(
    name: str = "w", sha: str = "b", length: int = 65536, shape: list[int] | None = None
) -> dict[str, Any]:
    return {"name": name, "dtype": "float32", "shape": shape or [128, 128], "length": length,
            "sha256": sha * 64}  # fmt: skip


@pytest.mark.parametrize(
    ("tensors", "reason"),
    [
        pytest.param([_entry(), _entry(sha="c")], "listed twice", id="a tensor listed twice with different digests"),
        pytest.param([_entry(length=65540)], "do not fit", id="a length that does not fit the shape"),
        pytest.param([_entry(length=16, shape=[2, 2])], "under the 65536 cut out", id="a tensor split would never cut"),
        pytest.param([_entry(length=0, shape=[0])], "greater than or equal to 1", id="an empty tensor (it would map nothing)"),
        pytest.param([{**_entry(), "file": "w.data"}], "needs an offset", id="a data file without an offset"),
        pytest.param([_entry(name=f"t{i}") for i in range(MAX_TENSORS + 1)], "at most 32768", id="too many tensors"),
    ],
)  # fmt: skip
def test_a_manifest_that_does_not_add_up_is_refused(
    tensors: list[dict[str, Any]], reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        VersionDoc.from_bytes(_doc(tensors))


def test_a_description_without_a_manifest_reads_as_before() -> None:
    doc = VersionDoc.from_bytes(b'{"model": "mlp", "version": "1.0.0", "artifact": "a.onnx"}')
    assert doc.tensors is None
    assert b"tensors" not in doc.to_bytes()
    assert TensorManifest.model_fields.keys() == {"graph", "tensors"}


@pytest.mark.parametrize("name", ["det", "medium", "silero"])
@pytest.mark.parametrize("share", [True, False], ids=["shared", "prepacked"])
def test_an_engine_from_tensors_answers_as_the_whole_file(
    tmp_path: Path, name: str, share: bool
) -> None:
    """Built from the skeleton and memory-mapped tensors, in the shared and the
    prepacked setup, the session gives the whole file's answers bit for bit."""
    if name in ("det", "silero"):
        path = real_model_path(name)
    else:
        path = write_examples(tmp_path, "medium", models=["mlp"], goldens=False)[0].path
    data = path.read_bytes()
    cut = split(data)
    graph = tmp_path / "skeleton"
    graph.write_bytes(cut.skeleton)
    refs = tuple(
        TensorRef(p.name, p.dtype, p.dims, hashlib.sha256(data[p.offset : p.offset + p.length]).hexdigest(),
                  path, p.offset, p.length, "blob")
        for p in cut.pieces
    )  # fmt: skip
    whole = OrtEngine(LoadRequest(name, "1", path, "sha"), share=share)
    held = OrtEngine(
        LoadRequest(name, "1", path, "sha", layout=TensorLayout(graph, refs)), share=share
    )
    rng = np.random.default_rng(1)
    cases = [{k: rng.random((1, 3, 64, 64), np.float32) for k in whole.sample_inputs()}]
    if name == "medium":
        cases = [{k: rng.random((2, 16), np.float32) for k in whole.sample_inputs()}]
    elif name == "silero":  # each rate runs the weights of one branch of its If
        cases = [
            {"input": rng.random((1, 512 if sr == 16000 else 256), np.float32) - 0.5,
             "state": rng.random((2, 1, 128), np.float32) * 0.1, "sr": np.array(sr, np.int64)}
            for sr in (16000, 8000)
        ]  # fmt: skip
    for inputs in cases:
        for a, b in zip(whole.run(inputs).values(), held.run(inputs).values(), strict=True):
            assert np.array_equal(a, b)
    if share:  # every tensor given to the session, none copied
        assert held.weights is not None
        assert len(held.weights.values) == len(cut.pieces)
    else:  # a private session read them itself
        assert held.weights is None
        assert held.memory_bytes == sum(p.length for p in cut.pieces)


def test_every_external_location_is_found_wherever_the_tensor_is(tmp_path: Path) -> None:
    """A skeleton may name only the tensor store: a tensor anywhere else in the model
    (a Constant, a subgraph) naming another file would have ONNX Runtime read it."""
    from edge_sync.sync.tensors import _only_the_store
    from signing.errors import VerificationError

    def external(name: str, location: str) -> TensorProto:
        t = helper.make_tensor(name, TensorProto.FLOAT, [2], [0.0, 0.0])
        t.ClearField("float_data")
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("length", "8")):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        return t

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    branch = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=external("deep", "../state.json"))],
        "then", [], [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])],
    )  # fmt: skip
    nodes = [
        helper.make_node("Constant", [], ["k"], value=external("k", "other.bin")),
        helper.make_node("If", ["cond"], ["z"], then_branch=branch, else_branch=branch),
        helper.make_node("Add", ["x", "k"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y], [external("w", STORE)])
    data = helper.make_model(graph).SerializeToString()
    assert external_locations(data) == {STORE, "other.bin", "../state.json"}
    with pytest.raises(VerificationError, match="names external data files"):
        _only_the_store(data, "skeleton")
    assert external_locations(split(_model(numpy_helper.from_array(_weight(), "w"))).skeleton) == {
        STORE
    }


def test_string_attributes_and_function_defaults_are_walked_as_what_they_are() -> None:
    """A string list (sklearn-onnx's class labels) is no tensor; a function's default
    attribute value is one, and may name a file."""
    node = helper.make_node("Foo", ["x"], ["y"], domain="d", labels=["NOTSET", "abc"])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([node], "g", [x], [y])
    assert external_locations(helper.make_model(graph).SerializeToString()) == set()
    default = helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0])
    default.ClearField("float_data")
    default.data_location = TensorProto.EXTERNAL
    entry = default.external_data.add()
    entry.key, entry.value = "location", "another-blob"
    body = [helper.make_node("Identity", ["a"], ["b"])]
    function = helper.make_function("d", "F", ["a"], ["b"], body, [helper.make_opsetid("", 17)])
    attribute = function.attribute_proto.add()
    attribute.name, attribute.type = "v", 4
    attribute.t.CopyFrom(default)
    model = helper.make_model(graph, functions=[function])
    assert external_locations(model.SerializeToString()) == {"another-blob"}


def test_no_manifest_describes_bytes_other_than_the_signed_ones(tmp_path: Path) -> None:
    path = write_examples(tmp_path, "medium", models=["mlp"], goldens=False)[0].path
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert tensor_manifest(path, digest) is not None
    assert tensor_manifest(path, "0" * 64) is None  # a local file that is not the release


def test_a_layout_that_names_no_digest_is_refused(tmp_path: Path) -> None:
    from edge_sync.sync.tensors import LAYOUTS_DIR, Placed, load_layout, save_layout

    good = Placed("w", "float32", (2,), "a" * 64, "b" * 64, 0, 8)
    save_layout(tmp_path, "mlp", "1.0.0", "c" * 64, [good])
    assert load_layout(tmp_path, "mlp", "1.0.0") == ("c" * 64, [good])
    external = Placed("w", "float32", (2,), "a" * 64, "b" * 64, 0, 8, "m.data", 64)
    save_layout(tmp_path, "mlp", "1.0.0", "c" * 64, [external])
    assert load_layout(tmp_path, "mlp", "1.0.0") == ("c" * 64, [external])
    for bad in (Placed("w", "float32", (2,), "a" * 64, "../../etc/passwd", 0, 8),
                Placed("w", "complex", (2,), "a" * 64, "b" * 64, 0, 8),
                Placed("w", "float32", (2,), "a" * 64, "b" * 64, -1, 8),
                Placed("w", "float32", (2,), "a" * 64, "b" * 64, 0, 8, "../m.data", 0),
                Placed("w", "float32", (2,), "a" * 64, "b" * 64, 0, 8, "m.data", -8)):  # fmt: skip
        save_layout(tmp_path, "mlp", "1.0.0", "c" * 64, [bad])
        with pytest.raises(OSError, match="not a tensor layout"):
            load_layout(tmp_path, "mlp", "1.0.0")
    assert (tmp_path / LAYOUTS_DIR / "mlp-1.0.0.json").is_file()


def test_ci_describes_no_file_a_pull_request_could_point_elsewhere(tmp_path: Path) -> None:
    """A pull request's artifact that is a link (to a CI secret, say) is never read to
    publish its bytes as objects; a model whose tensors name an external file gets no
    manifest (devices take the whole file)."""
    from registry.errors import UnsafeFileError

    secret = tmp_path / "secret"
    secret.write_bytes(_model(numpy_helper.from_array(_weight(), "w")))
    link = tmp_path / "model.onnx"
    link.symlink_to(secret)
    with pytest.raises(UnsafeFileError):
        tensor_manifest(link)
    assert tensor_manifest(secret) is not None  # the same bytes, as a file: described
    outside = TensorProto()
    outside.CopyFrom(numpy_helper.from_array(_weight(), "w2"))
    outside.ClearField("raw_data")
    outside.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("length", str(128 * 128 * 4))):
        entry = outside.external_data.add()
        entry.key, entry.value = key, value
    model = onnx_model(_model(numpy_helper.from_array(_weight(), "w")))
    model.graph.initializer.append(outside)
    mixed = tmp_path / "mixed.onnx"
    mixed.write_bytes(model.SerializeToString())
    assert len(split(mixed.read_bytes()).pieces) == 1  # "w" alone is cut
    assert tensor_manifest(mixed) is None


def test_a_node_without_cut_tensors_keeps_its_bytes_as_written() -> None:
    """A node none of whose attributes holds a cut tensor is left byte for byte, even
    written with a length prefix longer than it needs (protobuf allows it): the file
    still joins back exactly, so CI still describes it."""
    from onnx import AttributeProto, GraphProto, ModelProto, NodeProto

    attribute = helper.make_attribute("to", TensorProto.FLOAT).SerializeToString()
    assert len(attribute) < 0x80
    padded = bytes([len(attribute) | 0x80, 0])  # the same length in two bytes
    node = helper.make_node("Cast", ["y0"], ["y"]).SerializeToString()
    node += b"\x2a" + padded + attribute  # field 5 (attribute), length-delimited
    parsed = NodeProto()
    parsed.ParseFromString(node)
    assert parsed.attribute[0].type == AttributeProto.INT
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 128])
    weight = numpy_helper.from_array(_weight(), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y0"])], "g", [x], [y], [weight]
    )
    graph_bytes = graph.SerializeToString() + b"\x0a" + _varint(len(node)) + node
    GraphProto().ParseFromString(graph_bytes)
    model = helper.make_model(helper.make_graph([], "empty", [], []))
    model.ClearField("graph")
    data = model.SerializeToString() + b"\x3a" + _varint(len(graph_bytes)) + graph_bytes
    ModelProto().ParseFromString(data)
    assert _roundtrip(data) == (1, data)


class _NoBulkReads:
    """A model's bytes that refuse any read longer than ``limit``: what :func:`split`
    copies (a tensor's bytes must never be)."""

    def __init__(self, data: bytes, limit: int) -> None:
        self.data, self.limit = memoryview(data), limit

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            start, stop, _ = key.indices(len(self.data))
            if stop - start > self.limit:
                raise AssertionError(f"read {stop - start} bytes at {start}")
        return self.data[key]


def test_the_cut_reads_no_tensor_bytes() -> None:
    """Cutting a model (a device cuts a 1 GB file it installed whole) walks its fields
    in place: no tensor's bytes are read, in the main graph or in a subgraph."""
    for data in (_branching("w_then", "w_else"), _model(numpy_helper.from_array(_weight(), "w"))):
        cut = split(_NoBulkReads(data, MIN_TENSOR_BYTES // 2))
        assert cut.pieces
        assert cut == split(data)


def _external(tmp_path: Path, *, gap: int = 0, tail: bytes = b"") -> tuple[Path, Path]:
    """A model stored with external data as ONNX writes it (tensors from 1 KiB in
    ``m.data``, a 12-byte one inline), optionally with ``gap`` zero bytes before each
    tensor (as writers that align offsets leave) and ``tail`` after the last."""
    import onnx
    from onnx.external_data_helper import set_external_data

    rng = np.random.default_rng(3)
    weights = {
        "w": rng.random((64, 300), dtype=np.float32),
        "b": rng.random(300, dtype=np.float32),
        "s": rng.random(3, dtype=np.float32),
    }
    inits = [numpy_helper.from_array(a, n) for n, a in weights.items()]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 300])],
        inits,
    )
    model = helper.make_model(graph)
    data = bytearray()
    for tensor in model.graph.initializer:
        if len(tensor.raw_data) < 1024:
            continue
        data += bytes(gap)
        set_external_data(tensor, "m.data", offset=len(data), length=len(tensor.raw_data))
        data += tensor.raw_data
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
    folder = tmp_path / f"ext-{gap}-{len(tail)}"
    folder.mkdir()
    (folder / "m.data").write_bytes(bytes(data) + tail)
    onnx.save_model(model, folder / "m.onnx")
    return folder / "m.onnx", folder / "m.data"


@pytest.mark.parametrize("gap", [0, 4000], ids=["packed", "aligned"])
def test_a_model_with_external_data_is_cut_and_both_files_join_back(
    tmp_path: Path, gap: int
) -> None:
    from registry.tensors import data_files, join_data

    onnx_file, data_file = _external(tmp_path, gap=gap)
    found = tensor_manifest(onnx_file, None, {"m.data": (data_file, None)})
    assert found is not None
    manifest, objects = found
    # every tensor of the data file, whatever its size; the 12-byte inline one stays
    assert [(t.name, t.file) for t in manifest.tensors] == [("w", "m.data"), ("b", "m.data")]
    assert manifest.tensors[1].offset == gap * 2 + 64 * 300 * 4
    data = data_file.read_bytes()
    for t in manifest.tensors:
        assert objects[t.sha256].read() == data[t.offset :][: t.length]
    places = manifest.placed()
    layout = joined(objects[manifest.graph.sha256].read(), lambda i, _p: places.get(i))
    assert b"".join(bytes(c) for c in join(layout, lambda i, _p: b"")) == onnx_file.read_bytes()
    (order,) = data_files(layout.pieces).values()
    read = lambda i, _p: objects[manifest.tensors[i].sha256].read()  # noqa: E731
    assert b"".join(bytes(c) for c in join_data(layout.pieces, order, read)) == data
    # the description that carries it reads back; its bytes are canonical
    doc = VersionDoc(model="mlp", version="1.0.0", artifact="a", tensors=manifest,
                     external_data={"m.data": "t"})  # fmt: skip
    assert VersionDoc.from_bytes(doc.to_bytes()) == doc
    assert b'"file": "m.data"' in doc.to_bytes()


def test_external_data_that_holds_more_than_its_tensors_gets_no_manifest(tmp_path: Path) -> None:
    onnx_file, data_file = _external(tmp_path, tail=b"\x01")
    assert tensor_manifest(onnx_file, None, {"m.data": (data_file, None)}) is None
    onnx_file, data_file = _external(tmp_path, gap=8)
    digest = hashlib.sha256(data_file.read_bytes()).hexdigest()
    assert tensor_manifest(onnx_file, None, {"m.data": (data_file, digest)}) is not None
    spoiled = bytearray(data_file.read_bytes())
    spoiled[3] = 1  # a byte between tensors that is not zero
    data_file.write_bytes(bytes(spoiled))
    assert tensor_manifest(onnx_file, None, {"m.data": (data_file, None)}) is None
    # a data file the version does not declare: its tensors stay external, so none
    assert tensor_manifest(onnx_file, None, {}) is None


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        pytest.param({"file": "other.data"}, "no data file of the version", id="an undeclared file"),
        pytest.param({"offset": 100}, "overlap", id="two tensors over the same bytes"),
    ],
)  # fmt: skip
def test_a_manifest_that_places_tensors_wrongly_is_refused(
    edit: dict[str, Any], reason: str
) -> None:
    first = {**_entry(), "file": "m.data", "offset": 0}
    second = {**_entry(name="v", sha="c"), "file": "m.data", "offset": 65536, **edit}
    doc = json.loads(_doc([first, second]))
    doc["external_data"] = {"m.data": "models/mlp/1.0.0.data/m.data"}
    with pytest.raises(ValueError, match=reason):
        VersionDoc.from_bytes(json.dumps(doc).encode())


def test_a_pull_request_whose_tensors_overlap_in_a_data_file_gets_no_manifest(
    tmp_path: Path,
) -> None:
    """Two initializers pointing at the same bytes of the data file: CI publishes no
    manifest (the whole-file route), and never fails on it."""
    import onnx

    onnx_file, data_file = _external(tmp_path)
    model = onnx.load(str(onnx_file), load_external_data=False)
    b = next(t for t in model.graph.initializer if t.name == "b")
    for entry in b.external_data:
        if entry.key == "offset":
            entry.value = "0"  # over w's first bytes
    onnx.save_model(model, str(onnx_file))
    assert tensor_manifest(onnx_file, None, {"m.data": (data_file, None)}) is None
