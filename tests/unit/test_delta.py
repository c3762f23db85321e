"""The delta codec (``registry.delta``): byte-exact round trips, typed errors, bounded memory.

Every decode either returns exactly the new file or raises a ``DeltaError``: the corruption
tests check both halves of that promise, including with the delta's own checksum recomputed
so that the structural checks, not the trailer, have to catch the damage.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from benchmarks._util import decode_peak_rss
from modelreg.examples import EXAMPLE_VERSIONS, model_bytes
from registry.delta import (
    BaseMismatchError,
    CorruptDeltaError,
    DeltaError,
    DeltaLimits,
    decode,
    encode,
    read_header,
)
from registry.delta import _format as fmt
from registry.delta._encode import CHUNK, plan
from registry.onnx_wire import initializers

REPO = Path(__file__).resolve().parents[2]
OVERHEAD = fmt.HEADER_SIZE + fmt.INSTRUCTION_SIZE + fmt.TRAILER_SIZE


def _reseal(delta: bytes | bytearray) -> bytes:
    """``delta`` with its trailer recomputed: damage the checksum no longer catches."""
    body = bytes(delta[: -fmt.TRAILER_SIZE])
    return body + hashlib.sha256(body).digest()


def _decodes_exactly_or_fails(base: bytes, delta: bytes, new: bytes) -> None:
    try:
        got = decode(base, delta)
    except DeltaError:
        return
    assert got == new, "a damaged delta produced wrong bytes"


def _ops(base: bytes, new: bytes) -> list[fmt.Op]:
    steps = plan(memoryview(base), memoryview(new))
    assert steps is not None
    return [s.op for s in steps]


# --- the example models -------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "base_version", "new_version"),
    [
        (model, a, b)
        for model, versions in EXAMPLE_VERSIONS.items()
        for a, b in itertools.product(versions, repeat=2)
    ],
)
def test_example_models_round_trip(model: str, base_version: str, new_version: str) -> None:
    base, new = model_bytes(model, base_version), model_bytes(model, new_version)
    delta = encode(base, new)
    header = read_header(delta)
    assert header.mode == "onnx"
    assert header.new_size == len(new)
    assert header.new_sha256 == hashlib.sha256(new).hexdigest()
    assert header.base_sha256 == hashlib.sha256(base).hexdigest()
    assert decode(base, delta) == new
    assert decode(base, delta, expected_sha256=header.new_sha256) == new


def test_fine_tune_delta_is_small_and_xor_patched() -> None:
    base, new = model_bytes("mlp", "1.0.0"), model_bytes("mlp", "1.1.0")
    delta = encode(base, new)
    assert len(delta) < 0.2 * len(new)
    ops = _ops(base, new)
    # fc6.weight; the head (512 bytes) and biases are below MIN_TENSOR, so literals
    assert ops.count(fmt.Op.XOR) == 1
    assert fmt.Op.PLANES not in ops


def test_identical_files_are_one_copy() -> None:
    data = model_bytes("cnn", "1.0.0")
    delta = encode(data, data)
    assert read_header(delta).instructions == 1
    assert len(delta) == OVERHEAD
    assert decode(data, delta) == data


def test_renamed_tensor_is_copied() -> None:
    arr = np.arange(4096, dtype=np.float32)
    base = _model({"a": arr})
    new = _model({"b": arr})
    assert fmt.Op.PLANES not in _ops(base, new)
    assert fmt.Op.XOR not in _ops(base, new)
    assert decode(base, encode(base, new)) == new


def test_tensor_larger_than_a_chunk_is_split() -> None:
    rng = np.random.default_rng(7)
    weights = rng.standard_normal((5 * CHUNK) // 8 + 123, dtype=np.float32)  # 2.5 chunks
    tuned = weights.copy()
    tuned[::3] += np.float32(0.01)
    base, new = _model({"w": weights}), _model({"w": tuned})
    ops = _ops(base, new)
    assert ops.count(fmt.Op.XOR) == 3
    delta = encode(base, new)
    assert decode(base, delta) == new


@pytest.mark.parametrize(
    ("base", "new"),
    [
        (b"", b""),
        (b"", model_bytes("cnn", "1.0.0")),
        (model_bytes("cnn", "1.0.0"), b""),
    ],
    ids=["both-empty", "empty-base", "empty-new"],
)
def test_empty_files(base: bytes, new: bytes) -> None:
    assert decode(base, encode(base, new)) == new


def test_non_onnx_files_fall_back_to_a_zstd_patch() -> None:
    rng = np.random.default_rng(3)
    base = rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    new = base[:1000] + b"inserted" + base[1000:200_000] + base[250_000:]
    delta = encode(base, new)
    assert read_header(delta).mode == "patch"
    assert len(delta) < 2000
    assert decode(base, delta) == new


def test_one_side_not_onnx_falls_back() -> None:
    onnx_file = model_bytes("mlp", "1.0.0")
    other = b"\x07" * 5000  # field 0 is not valid protobuf
    for base, new in ((other, onnx_file), (onnx_file, other)):
        delta = encode(base, new)
        assert read_header(delta).mode == "patch"
        assert decode(base, delta) == new


def test_level_is_checked() -> None:
    with pytest.raises(ValueError, match="level"):
        encode(b"a", b"b", level=0)


def test_paths_in_and_out(tmp_path: Path) -> None:
    base, new = model_bytes("mlp", "1.1.0"), model_bytes("mlp", "2.0.0")
    (tmp_path / "base.onnx").write_bytes(base)
    (tmp_path / "new.onnx").write_bytes(new)
    delta = encode(tmp_path / "base.onnx", tmp_path / "new.onnx")
    (tmp_path / "d.mrdelta").write_bytes(delta)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    assert decode(tmp_path / "base.onnx", tmp_path / "d.mrdelta", out) == out
    assert out.read_bytes() == new
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.onnx"]
    assert read_header(tmp_path / "d.mrdelta") == read_header(delta)


def test_decode_in_place_over_the_base(tmp_path: Path) -> None:
    base, new = model_bytes("mlp", "1.0.0"), model_bytes("mlp", "1.1.0")
    model = tmp_path / "model.onnx"
    model.write_bytes(base)
    model.chmod(0o640)
    decode(model, encode(base, new), model)
    assert model.read_bytes() == new
    assert model.stat().st_mode & 0o777 == 0o640


# --- wrong inputs: typed errors, nothing written ---------------------------------------


def test_wrong_base_same_length() -> None:
    base, new = model_bytes("mlp", "1.0.0"), model_bytes("mlp", "1.1.0")
    other = model_bytes("mlp", "1.1.0")
    assert len(other) == len(base)
    with pytest.raises(BaseMismatchError) as info:
        decode(other, encode(base, new))
    assert info.value.expected_sha256 == hashlib.sha256(base).hexdigest()
    assert info.value.actual_sha256 == hashlib.sha256(other).hexdigest()


def test_wrong_base_other_length() -> None:
    base, new = model_bytes("cnn", "1.0.0"), model_bytes("cnn", "1.1.0")
    with pytest.raises(BaseMismatchError) as info:
        decode(base + b"x", encode(base, new))
    assert info.value.actual_sha256 is None


def test_wrong_base_patch_mode() -> None:
    base = os.urandom(5000)
    new = base[:3000] + b"edit" + base[3000:]
    with pytest.raises(BaseMismatchError):
        decode(os.urandom(len(base)), encode(base, new))


def test_unused_base_bytes_do_not_matter() -> None:
    """The result is verified, not the base: a base that differs only where the delta never
    reads still rebuilds the right file (the base digest names the cause of failures)."""
    base = bytes(5000)
    new = b"fresh" * 100  # shares nothing with the base
    delta = encode(base, new)
    assert decode(b"\1" * len(base), delta) == new


def test_failed_decode_leaves_out_untouched(tmp_path: Path) -> None:
    base, new = model_bytes("mlp", "1.0.0"), model_bytes("mlp", "1.1.0")
    out = tmp_path / "model.onnx"
    out.write_bytes(b"previous model")
    with pytest.raises(BaseMismatchError):
        decode(new, encode(base, new), out)
    assert out.read_bytes() == b"previous model"
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]


def test_expected_digest_is_enforced() -> None:
    base, new = model_bytes("cnn", "1.0.0"), model_bytes("cnn", "1.1.0")
    delta = encode(base, new)
    with pytest.raises(CorruptDeltaError, match="not the expected"):
        decode(base, delta, expected_sha256=hashlib.sha256(base).hexdigest())
    assert decode(base, delta, expected_sha256=hashlib.sha256(new).hexdigest().upper()) == new
    with pytest.raises(ValueError, match="hex SHA-256"):
        decode(base, delta, expected_sha256="abc")


def test_every_truncation_is_rejected() -> None:
    base, new = model_bytes("cnn", "1.0.0"), model_bytes("cnn", "1.1.0")
    delta = encode(base, new)
    for size in range(len(delta)):
        with pytest.raises(CorruptDeltaError):
            decode(base, delta[:size])
    with pytest.raises(CorruptDeltaError):
        decode(base, delta + b"\0")


@pytest.mark.parametrize(("base_version", "new_version"), [("1.0.0", "1.1.0"), ("1.1.0", "2.0.0")])
def test_every_flipped_byte_is_rejected(base_version: str, new_version: str) -> None:
    base, new = model_bytes("cnn", base_version), model_bytes("cnn", new_version)
    delta = encode(base, new)
    for i in range(len(delta)):
        damaged = bytearray(delta)
        damaged[i] ^= 0x10
        with pytest.raises(CorruptDeltaError):
            decode(base, bytes(damaged))


@pytest.mark.parametrize(
    ("base", "new"),
    [
        (model_bytes("cnn", "1.0.0"), model_bytes("cnn", "1.1.0")),
        (model_bytes("mlp", "1.1.0"), model_bytes("mlp", "2.0.0")),
        (bytes(range(256)) * 40, bytes(range(256)) * 20 + b"new" + bytes(range(256)) * 19),
    ],
    ids=["cnn-fine-tune", "mlp-graph-change", "patch-mode"],
)
def test_damage_behind_a_valid_checksum_never_yields_wrong_bytes(base: bytes, new: bytes) -> None:
    delta = encode(base, new)
    header = fmt.unpack_header(delta)
    body = len(delta) - fmt.TRAILER_SIZE
    # Every byte of the header and instruction table; a sample of the compressed sections.
    step = max(1, (body - header.literal_offset) // 400)
    positions = [*range(header.literal_offset), *range(header.literal_offset, body, step)]
    for i in positions:
        for mask in (0x01, 0x80):
            damaged = bytearray(delta)
            damaged[i] ^= mask
            _decodes_exactly_or_fails(base, _reseal(damaged), new)


def test_truncated_sections_behind_a_valid_checksum() -> None:
    base, new = model_bytes("mlp", "1.0.0"), model_bytes("mlp", "2.0.0")
    delta = encode(base, new)
    body = delta[: -fmt.TRAILER_SIZE]
    for size in range(0, len(body), 7):
        _decodes_exactly_or_fails(base, _reseal(body[:size] + b"\0" * 32), new)


def test_bad_magic_and_version() -> None:
    delta = encode(b"base", b"new")
    with pytest.raises(CorruptDeltaError, match="magic"):
        read_header(b"X" + delta[1:])
    future = bytearray(delta)
    future[8] = 2
    with pytest.raises(CorruptDeltaError, match="version 2"):
        decode(b"base", _reseal(future))
    with pytest.raises(CorruptDeltaError, match="shorter than its header"):
        read_header(delta[:20])


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (DeltaLimits(max_instructions=2), "instructions, over the limit"),
        (DeltaLimits(max_output_size=1000), "over the limit of 1000"),
        (DeltaLimits(max_instruction_size=1024), "over the limit of 1024"),
    ],
)
def test_limits_are_enforced(limits: DeltaLimits, message: str) -> None:
    base, new = model_bytes("mlp", "1.0.0"), model_bytes("mlp", "1.1.0")
    with pytest.raises(CorruptDeltaError, match=message):
        decode(base, encode(base, new), limits=limits)


def test_patch_window_limit() -> None:
    base, new = os.urandom(5000), os.urandom(5000)
    with pytest.raises(CorruptDeltaError, match="window"):
        decode(base, encode(base, new), limits=DeltaLimits(max_window_size=1024))


# --- the format checks, without files -----------------------------------------------


def _header(**changes: int) -> fmt.Header:
    fields = {"count": 1, "base_size": 100, "new_size": 10, "literal_size": 0, "payload_size": 0}
    fields.update(changes)
    return fmt.Header(mode=fmt.Mode.ONNX, base_sha256=b"\0" * 32, new_sha256=b"\0" * 32, **fields)


@pytest.mark.parametrize(
    ("instruction", "header", "message"),
    [
        (fmt.Instruction(fmt.Op.COPY, 0, 95, 10), _header(), "runs past the base"),
        (fmt.Instruction(fmt.Op.COPY, 0, 2**64 - 1, 10), _header(), "runs past the base"),
        (fmt.Instruction(fmt.Op.COPY, 0, 0, 0), _header(), "empty"),
        (fmt.Instruction(fmt.Op.COPY, 0, 0, 9), _header(), "rebuild 9 bytes"),
        (fmt.Instruction(fmt.Op.COPY, 0, 0, 11), _header(), "past the new file"),
        (fmt.Instruction(fmt.Op.COPY, 4, 0, 10), _header(), "plane width or payload"),
        (fmt.Instruction(fmt.Op.INSERT, 0, 5, 10), _header(), "base offset"),
        (fmt.Instruction(fmt.Op.INSERT, 0, 0, 10), _header(), "literal section"),
        (fmt.Instruction(fmt.Op.XOR, 3, 0, 10, 5), _header(payload_size=5), "plane width"),
        (fmt.Instruction(fmt.Op.XOR, 4, 0, 10, 5), _header(payload_size=5), "plane width"),
        (fmt.Instruction(fmt.Op.PLANES, 2, 0, 10, 0), _header(), "payload length"),
        (fmt.Instruction(fmt.Op.PLANES, 2, 0, 10, 10**6), _header(), "payload length"),
        (fmt.Instruction(fmt.Op.PLANES, 2, 0, 10, 5), _header(payload_size=6), "payload section"),
    ],
)
def test_check_instructions_rejects(
    instruction: fmt.Instruction, header: fmt.Header, message: str
) -> None:
    with pytest.raises(CorruptDeltaError, match=message):
        fmt.check_instructions(header, [instruction], DeltaLimits())


def test_unpack_instructions_rejects_unknown_opcode_and_reserved_bytes() -> None:
    good = fmt.Instruction(fmt.Op.COPY, 0, 0, 10).pack()
    assert fmt.unpack_instructions(good, 1) == [fmt.Instruction(fmt.Op.COPY, 0, 0, 10)]
    with pytest.raises(CorruptDeltaError, match="opcode"):
        fmt.unpack_instructions(b"\x09" + good[1:], 1)
    with pytest.raises(CorruptDeltaError, match="reserved"):
        fmt.unpack_instructions(good[:3] + b"\x01" + good[4:], 1)


def test_wire_parser_reads_packed_dims() -> None:
    raw = bytes(2048)
    packed_dims = bytes([0x0A, 3, 16, 0x80, 0x01])  # packed dims [16, 128]
    tensor = packed_dims + b"\x10\x01" + b"\x42\x01w" + b"\x4a\x80\x10" + raw
    graph = b"\x2a" + _varint(len(tensor)) + tensor
    model = b"\x08\x08" + b"\x3a" + _varint(len(graph)) + graph
    (found,) = initializers(memoryview(model))
    assert (found.name, found.data_type, found.dims, found.length) == (b"w", 1, (16, 128), 2048)
    assert model[found.offset : found.offset + found.length] == raw


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def test_decoder_never_imports_onnx(tmp_path: Path) -> None:
    base, new = model_bytes("mlp", "1.0.0"), model_bytes("mlp", "2.0.0")
    (tmp_path / "base").write_bytes(base)
    (tmp_path / "delta").write_bytes(encode(base, new))
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        sys.modules["onnx"] = None  # any import of onnx now fails
        from registry.delta import decode
        out = decode(Path("base"), Path("delta"), Path("out"))
        assert "onnx" not in [m for m in sys.modules if sys.modules[m] is not None]
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, check=True)
    assert (tmp_path / "out").read_bytes() == new


# --- properties: random ONNX models and random edits -----------------------------------

_DTYPES: dict[int, type[np.generic]] = {
    TensorProto.FLOAT: np.float32,
    TensorProto.FLOAT16: np.float16,
    TensorProto.INT64: np.int64,
}


def _model(tensors: dict[str, np.ndarray], typed: dict[str, list[int]] | None = None) -> bytes:
    inits = [numpy_helper.from_array(arr, name=name) for name, arr in tensors.items()]
    for name, values in (typed or {}).items():  # int64_data, not raw_data: plain framing
        inits.append(helper.make_tensor(name, TensorProto.INT64, [len(values)], values))
    graph = helper.make_graph([], "g", [], [], initializer=inits)
    model = helper.make_model(graph, producer_name="hypothesis")
    data: bytes = model.SerializeToString(deterministic=True)
    return data


def _values(rng: np.random.Generator, dtype: int, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == TensorProto.INT64:
        return rng.integers(-(2**40), 2**40, shape, dtype=np.int64)
    return rng.standard_normal(shape).astype(_DTYPES[dtype])


_tensor_spec = st.tuples(
    st.sampled_from(sorted(_DTYPES)),
    st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple),
)
_edit = st.sampled_from(["keep", "tune", "replace", "reshape", "drop", "rename"])


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    specs=st.lists(_tensor_spec, min_size=0, max_size=6),
    edits=st.lists(_edit, min_size=6, max_size=6),
    added=st.lists(_tensor_spec, max_size=3),
    seed=st.integers(0, 2**32 - 1),
    typed=st.lists(st.integers(-(2**62), 2**62), max_size=20),
    reorder=st.booleans(),
)
def test_random_models_round_trip(
    *,
    specs: list[tuple[int, tuple[int, ...]]],
    edits: list[str],
    added: list[tuple[int, tuple[int, ...]]],
    seed: int,
    typed: list[int],
    reorder: bool,
) -> None:
    rng = np.random.default_rng(seed)
    base_tensors = {f"t{i}": _values(rng, dt, shape) for i, (dt, shape) in enumerate(specs)}
    new_tensors: dict[str, np.ndarray] = {}
    for (name, arr), edit in zip(base_tensors.items(), edits, strict=False):
        if edit == "keep":
            new_tensors[name] = arr
        elif edit == "tune":
            tuned = arr.copy().reshape(-1)
            tuned[:: max(1, tuned.size // 7)] += tuned.dtype.type(1)
            new_tensors[name] = tuned.reshape(arr.shape)
        elif edit == "replace":
            new_tensors[name] = _values(rng, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape)
        elif edit == "reshape":
            new_tensors[name] = arr.reshape(-1)[: max(1, arr.size - 1)]
        elif edit == "rename":
            new_tensors[name + "_renamed"] = arr
    for i, (dt, shape) in enumerate(added):
        new_tensors[f"added{i}"] = _values(rng, dt, shape)
    if reorder:
        new_tensors = dict(reversed(new_tensors.items()))
    base = _model(base_tensors, {"typed": typed})
    new = _model(new_tensors, {"typed": typed[::-1]})
    onnx.load_model_from_string(new)  # the generator makes real ONNX
    delta = encode(base, new)
    assert decode(base, delta) == new


@settings(max_examples=40, deadline=None)
@given(base=st.binary(max_size=3000), new=st.binary(max_size=3000))
def test_random_bytes_round_trip(base: bytes, new: bytes) -> None:
    assert decode(base, encode(base, new)) == new


# --- the large model: bounded memory --------------------------------------------------


@pytest.mark.slow
def test_large_model_decodes_to_a_file_in_bounded_memory(tmp_path: Path) -> None:
    """Decoding a ~100 MB model to a file adds ~35 MB of RSS, bounded by the chunk size,
    not the model size (`make bench` measures a 1 GiB model against the 300 MB goal)."""
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc to read the peak RSS")
    base, new = tmp_path / "1.0.0.onnx", tmp_path / "1.1.0.onnx"
    base.write_bytes(model_bytes("mlp", "1.0.0", size="large"))
    new.write_bytes(model_bytes("mlp", "1.1.0", size="large"))
    delta = tmp_path / "d.mrdelta"
    delta.write_bytes(encode(base, new))
    assert delta.stat().st_size < 0.15 * new.stat().st_size
    out = tmp_path / "out.onnx"
    extra = decode_peak_rss(base, delta, out)
    assert extra < 100 << 20, f"decode added {extra / 1e6:.0f} MB of RSS"
    assert out.read_bytes() == new.read_bytes()
