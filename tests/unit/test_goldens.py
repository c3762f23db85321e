"""``registry.goldens``: the one golden module of CI and devices.

Canonical ``.npz`` bytes (the same arrays, the same signed target), inline tensors of
every manifest dtype, the bfloat16 storage rule, and the tolerance compare that the
build, the diff and a device's self-test share.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from registry.errors import GoldenError
from registry.goldens import (
    bfloat16_to_float32,
    compare,
    inline_array,
    npz_bytes,
    read_npz,
    tensor_set,
)
from registry.schema import Tensor
from tests.conftest import REPO_ROOT

ARRAYS: dict[str, Any] = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "f16": np.array([0.5, -1.25], np.float16),
    "f64": np.array([[1e-300, np.nan], [np.inf, -0.0]]),
    "i8": np.array([-128, 127], np.int8),
    "u64": np.array([0, 2**64 - 1], np.uint64),
    "b": np.array([True, False, True]),
    "s": np.array(["a", "bcd", ""]),
    "scalar": np.float32(3.5),
    "empty": np.zeros((0, 5), np.int32),
}


def _inline(dtype: str, shape: list[int], data: list[Any]) -> Tensor:
    return Tensor.model_validate({"dtype": dtype, "shape": shape, "data": data})


def _read(data: bytes, tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "g.npz").write_bytes(data)
    return read_npz(tmp_path / "g.npz", "g.npz", root=tmp_path)


def test_npz_bytes_round_trip_through_the_bounded_reader(tmp_path: Path) -> None:
    found = _read(npz_bytes(ARRAYS), tmp_path)
    assert list(found) == sorted(ARRAYS)  # members in name order
    for name, array in ARRAYS.items():
        assert found[name].dtype == np.asarray(array).dtype, name
        np.testing.assert_array_equal(found[name], array)
    with np.load(tmp_path / "g.npz", allow_pickle=False) as npz:  # what numpy.savez writes
        np.testing.assert_array_equal(npz["f32"], ARRAYS["f32"])


def test_the_same_arrays_always_give_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    first = npz_bytes(ARRAYS)
    assert npz_bytes(dict(reversed(list(ARRAYS.items())))) == first
    # Memory layout and byte order are not part of the value.
    assert npz_bytes({"x": np.asfortranarray(ARRAYS["f32"])}) == npz_bytes({"x": ARRAYS["f32"]})
    assert npz_bytes({"x": ARRAYS["f32"].astype(">f4")}) == npz_bytes({"x": ARRAYS["f32"]})
    assert npz_bytes({"x": ARRAYS["f32"][:, ::2]}) == npz_bytes({"x": ARRAYS["f32"][:, ::2].copy()})
    # No clock in the bytes: a zip member named by string would carry the time.
    monkeypatch.setattr(time, "time", lambda: 2_000_000_000.0)
    monkeypatch.setattr(time, "localtime", lambda *_: time.gmtime(2_000_000_000))
    assert npz_bytes(ARRAYS) == first


def test_another_process_writes_the_same_bytes() -> None:
    code = (
        "import sys, numpy as np; from registry.goldens import npz_bytes;"
        "sys.stdout.buffer.write(npz_bytes({'x': np.arange(6, dtype=np.float32), 's': np.array(['a'])}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, check=True, cwd=REPO_ROOT
    ).stdout
    assert out == npz_bytes({"s": np.array(["a"]), "x": np.arange(6, dtype=np.float32)})


def test_string_outputs_as_onnx_runtime_returns_them_are_written_as_strings(tmp_path: Path) -> None:
    objects = np.array(["yes", "no"], dtype=object)
    assert npz_bytes({"label": objects}) == npz_bytes({"label": np.array(["yes", "no"])})
    with pytest.raises(ValueError, match="pickle"):
        npz_bytes({"x": np.array([{"a": 1}], dtype=object)})


@pytest.mark.parametrize(
    ("dtype", "data", "expected"),
    [
        ("float32", [0.1, -2], np.array([0.1, -2], np.float32)),
        ("float16", [0.5], np.array([0.5], np.float16)),
        ("float64", [0.1], np.array([0.1])),
        ("int8", [-128, 127], np.array([-128, 127], np.int8)),
        ("int16", [7], np.array([7], np.int16)),
        ("int32", [7], np.array([7], np.int32)),
        ("int64", [2**40], np.array([2**40], np.int64)),
        ("uint8", [255], np.array([255], np.uint8)),
        ("uint16", [65535], np.array([65535], np.uint16)),
        ("uint32", [7], np.array([7], np.uint32)),
        ("uint64", [2**63], np.array([2**63], np.uint64)),
        ("bool", [True, False], np.array([True, False])),
        ("string", ["a", "bc"], np.array(["a", "bc"])),
        ("bfloat16", [1.0, -2.0], np.array([0x3F80, 0xC000], np.uint16)),
    ],
)
def test_an_inline_tensor_becomes_an_array_of_its_dtype(
    dtype: str, data: list[Any], expected: Any, tmp_path: Path
) -> None:
    array = inline_array("x", _inline(dtype, [len(data)], data))
    assert array.dtype == expected.dtype
    np.testing.assert_array_equal(array, expected)
    # ... and reads back the same from the file a device gets.
    found = _read(npz_bytes({"x": array}), tmp_path)["x"]
    assert found.dtype == expected.dtype
    np.testing.assert_array_equal(found, expected)


def test_inline_shapes_are_applied() -> None:
    array = inline_array("x", _inline("int32", [2, 3], list(range(6))))
    np.testing.assert_array_equal(array, np.arange(6, dtype=np.int32).reshape(2, 3))
    assert inline_array("x", _inline("float32", [], [1.5])).shape == ()


@pytest.mark.parametrize(
    ("dtype", "data", "message"),
    [
        ("float32", ["x"], "inline tensor 'x': data does not fit float32 ("),
        ("int8", [300], "inline tensor 'x': data does not fit int8 ("),
        ("uint8", [-1], "inline tensor 'x': data does not fit uint8 ("),
        ("string", [1.5], "inline tensor 'x': data does not fit string (strings only)"),
        ("bfloat16", ["x"], "inline tensor 'x': data does not fit bfloat16 ("),
    ],
)
def test_inline_data_that_does_not_fit_is_one_line(
    dtype: str, data: list[Any], message: str
) -> None:
    with pytest.raises(GoldenError) as info:
        inline_array("x", _inline(dtype, [1], data))
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_tensor_set_reads_files_of_the_repository_or_inline_tensors(tmp_path: Path) -> None:
    (tmp_path / "g").mkdir()
    (tmp_path / "g/in.npz").write_bytes(npz_bytes({"input": ARRAYS["f32"]}))
    found = tensor_set("g/in.npz", tmp_path)
    np.testing.assert_array_equal(found["input"], ARRAYS["f32"])
    inline = tensor_set({"input": _inline("int64", [2], [1, 2])}, tmp_path)
    np.testing.assert_array_equal(inline["input"], np.array([1, 2], np.int64))
    (tmp_path / "g/link.npz").symlink_to(tmp_path / "g/in.npz")
    with pytest.raises(GoldenError, match=r"^g/link\.npz: "):
        tensor_set("g/link.npz", tmp_path)
    with pytest.raises(GoldenError, match=r"^g/none\.npz: does not exist$"):
        tensor_set("g/none.npz", tmp_path)


# --- bfloat16: stored as uint16 bits ---------------------------------------------------


@pytest.mark.parametrize(
    ("value", "bits"),
    [
        (1.0, 0x3F80),
        (-2.0, 0xC000),
        (1.00390625, 0x3F80),  # half-way between 0x3F80 and 0x3F81: to even
        (1.01171875, 0x3F82),  # half-way between 0x3F81 and 0x3F82: to even
        (1.00390625 + 2**-23, 0x3F81),  # just above half-way: up
        (float("inf"), 0x7F80),
        (float("-inf"), 0xFF80),
        (3.4028235e38, 0x7F80),  # the largest float32 rounds to infinity
        (1e-45, 0x0000),  # the smallest subnormal rounds to zero
        (-0.0, 0x8000),
    ],
)
def test_inline_bfloat16_rounds_to_nearest_even(value: float, bits: int) -> None:
    array = inline_array("x", _inline("bfloat16", [1], [value]))
    assert array.dtype == np.uint16
    assert int(array[0]) == bits, hex(int(array[0]))


def test_bfloat16_nan_stays_nan() -> None:
    array = inline_array("x", _inline("bfloat16", [1], [float("nan")]))
    assert np.isnan(bfloat16_to_float32(array))[0]


def test_bfloat16_bits_widen_exactly_and_round_trip() -> None:
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = bfloat16_to_float32(bits)
    assert values.dtype == np.float32
    finite = ~np.isnan(values)
    again = inline_array(
        "x", _inline("bfloat16", [int(finite.sum())], [float(v) for v in values[finite]])
    )
    np.testing.assert_array_equal(again, bits[finite])
    with pytest.raises(ValueError, match="stored as uint16 bits"):
        bfloat16_to_float32(np.array([1.0], np.float32))


def test_bfloat16_matches_ml_dtypes_where_installed() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = np.random.default_rng(7).standard_normal(4096).astype(np.float32) * 1e3
    ours = inline_array("x", _inline("bfloat16", [values.size], [float(v) for v in values]))
    theirs = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(ours, theirs)


# --- compare: numpy.allclose semantics ------------------------------------------------


def test_compare_follows_allclose() -> None:
    expected = np.array([1.0, 2.0, 100.0], np.float32)
    rtol, atol = 1e-3, 1e-4
    inside = expected + (atol + rtol * np.abs(expected)) * 0.9
    outside = expected + np.array([0.0, 0.0, 1.0], np.float32)
    assert compare(expected, inside, rtol, atol).ok
    found = compare(expected, outside, rtol, atol)
    assert (found.ok, found.bad, found.total, found.reason) == (False, 1, 3, None)
    assert found.max_abs_error == pytest.approx(1.0)
    assert not compare(np.array([np.nan]), np.array([np.nan]), rtol, atol).ok
    assert compare(np.array([7], np.int64), np.array([7], np.int32), 0, 0).ok


def test_compare_names_what_cannot_be_compared() -> None:
    shape = compare(np.zeros((2, 3)), np.zeros((3, 2)), 0, 0)
    assert (shape.ok, shape.max_abs_error, shape.reason) == (
        False,
        None,
        "shape is (3, 2), expected (2, 3)",
    )
    kind = compare(np.array(["a", "b"]), np.array([1.0, 2.0], np.float32), 0, 0)
    assert kind.reason == "dtype is float32, expected <U1"


def test_booleans_and_strings_must_be_equal() -> None:
    assert compare(np.array([True, False]), np.array([True, False]), 1, 1).ok
    found = compare(np.array([True, False]), np.array([True, True]), 1, 1)
    assert (found.ok, found.bad, found.max_abs_error) == (False, 1, None)
    # Strings from a file (``U``) against ONNX Runtime's outputs (objects): by value.
    assert compare(np.array(["a", "b"]), np.array(["a", "b"], dtype=object), 0, 0).ok
    assert not compare(np.array(["a", "b"]), np.array(["a", "c"], dtype=object), 0, 0).ok


def test_bfloat16_bits_are_compared_as_the_values_they_hold() -> None:
    one = inline_array("x", _inline("bfloat16", [1], [1.0]))
    near = inline_array("x", _inline("bfloat16", [1], [1.0078125]))  # the next bfloat16
    assert compare(one, near, 0.01, 0, dtype="bfloat16").ok
    assert not compare(one, near, 0.001, 0, dtype="bfloat16").ok
    # Against float outputs (a device that widened them already), the same.
    assert compare(one, np.array([1.0078125], np.float32), 0.01, 0, dtype="bfloat16").ok
    # Without the declared dtype the bits are just integers: off by one pattern.
    assert compare(one, near, 0, 0.5).max_abs_error == 1.0
