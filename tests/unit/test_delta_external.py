"""Deltas between ONNX external data files: tensor-aware (COPY unchanged pieces, XOR
changed tensors, PLANES for new ones), byte-exact, streamed, and applied by the same
decoder as every delta."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from modelreg.examples import build_model, save_external
from registry.delta import BaseMismatchError, decode, encode_external, read_header
from registry.delta._format import Op, unpack_header
from registry.onnx_wire import InitializerSpan, external_initializers


def _saved(folder: Path, version: str, size: str = "small") -> tuple[Path, list[InitializerSpan]]:
    folder.mkdir(exist_ok=True)
    path = folder / f"{version}.onnx"
    data = save_external(build_model("mlp", version, size), path)
    return data, [s.tensor for s in external_initializers(path.read_bytes())]


def _ops(delta: Path) -> list[Op]:
    import struct

    raw = delta.read_bytes()
    header = unpack_header(raw[:112])
    return [Op(struct.unpack_from("<B", raw, 112 + 32 * i)[0]) for i in range(header.count)]


@pytest.mark.parametrize(("old", "new"), [("1.0.0", "1.1.0"), ("1.1.0", "2.0.0")])
def test_external_data_delta_round_trips_byte_exact(tmp_path: Path, old: str, new: str) -> None:
    base, base_tensors = _saved(tmp_path / "a", old)
    target, new_tensors = _saved(tmp_path / "b", new)
    delta = encode_external(base, target, tmp_path / "d.delta", base_tensors, new_tensors)
    header = read_header(delta)
    want = hashlib.sha256(target.read_bytes()).hexdigest()
    assert header.new_sha256 == want
    assert header.base_sha256 == hashlib.sha256(base.read_bytes()).hexdigest()
    assert decode(base, delta, expected_sha256=want) == target.read_bytes()
    out = decode(base, delta, tmp_path / "rebuilt", expected_sha256=want)
    assert out.read_bytes() == target.read_bytes()


def test_a_fine_tune_copies_unchanged_tensors_and_xors_the_changed(tmp_path: Path) -> None:
    base, base_tensors = _saved(tmp_path / "a", "1.0.0")
    target, new_tensors = _saved(tmp_path / "b", "1.1.0")
    delta = encode_external(base, target, tmp_path / "d.delta", base_tensors, new_tensors)
    ops = _ops(delta)
    assert Op.COPY in ops
    assert Op.XOR in ops
    assert Op.PLANES not in ops  # every tensor of 1.1.0 exists in 1.0.0
    assert delta.stat().st_size < target.stat().st_size // 2


def test_a_tensor_the_base_lacks_is_sent_as_planes(tmp_path: Path) -> None:
    base, base_tensors = _saved(tmp_path / "a", "1.0.0")
    target, new_tensors = _saved(tmp_path / "b", "1.1.0")
    renamed = [
        InitializerSpan(b"x" + t.name, t.data_type, t.dims, t.offset, t.length)
        for t in base_tensors
    ]
    delta = encode_external(base, target, tmp_path / "d.delta", renamed, new_tensors)
    assert Op.PLANES in _ops(delta)
    assert decode(base, delta) == target.read_bytes()


def test_an_external_delta_refuses_the_wrong_base(tmp_path: Path) -> None:
    base, base_tensors = _saved(tmp_path / "a", "1.0.0")
    target, new_tensors = _saved(tmp_path / "b", "1.1.0")
    delta = encode_external(base, target, tmp_path / "d.delta", base_tensors, new_tensors)
    with pytest.raises(BaseMismatchError):
        decode(target, delta)


def test_overlapping_new_spans_are_misuse(tmp_path: Path) -> None:
    base, base_tensors = _saved(tmp_path / "a", "1.0.0")
    target, new_tensors = _saved(tmp_path / "b", "1.1.0")
    first = new_tensors[0]
    clash = InitializerSpan(b"clash", first.data_type, first.dims, first.offset + 4, first.length)
    with pytest.raises(ValueError, match="span overlaps another or the end"):
        encode_external(base, target, tmp_path / "d.delta", base_tensors, [first, clash])
    assert not (tmp_path / "d.delta").exists()


def test_external_initializers_reads_the_spans_the_graph_names(tmp_path: Path) -> None:
    import onnx

    _saved(tmp_path, "1.0.0")
    model = onnx.load(str(tmp_path / "1.0.0.onnx"), load_external_data=False)
    spans = external_initializers((tmp_path / "1.0.0.onnx").read_bytes())
    expected = {
        t.name: {e.key: e.value for e in t.external_data}
        for t in model.graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
    }
    assert {s.tensor.name.decode() for s in spans} == set(expected)
    for s in spans:
        entry = expected[s.tensor.name.decode()]
        assert s.location == entry["location"] == "1.0.0.onnx.data"
        assert (s.tensor.offset, s.tensor.length) == (int(entry["offset"]), int(entry["length"]))
