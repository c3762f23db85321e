"""Golden tensors: read ``.npz`` files within caps, write them canonically, compare (stable API).

One module for every side that handles golden cases: the build runs them
(``pipelines.build``), the semantic diff measures drift on them
(``pipelines.diff``), ``publish`` re-writes them as signed targets, and a device
runs them as its self-test before a swap.  It imports numpy only (lazily), never ONNX
Runtime, MLflow, DVC nor ``pipelines``: a device has none of them.

Reading.  A golden file is untrusted input (it arrives with a pull request, or from
the artifact remote): :func:`read_npz` opens it through ``registry.safe_io`` (no link,
a size cap), then checks the zip's directory (member count, declared uncompressed
sizes) and each member's ``.npy`` header (shape x itemsize) against :class:`NpzLimits`
*before* it allocates or reads a single array.  A 2 MB file that declares 2 GB of
zeros, or one header that claims 29 TiB, is refused with one line instead of taking
the machine's memory.  ``numpy.load`` is never used on such files: it allocates
whatever the header says first, and it can unpickle.  The checks on directory and
headers are pure functions (:func:`directory_problem`, :func:`array_problem`).

Writing.  :func:`npz_bytes` writes what ``numpy.savez`` writes (stored members,
``.npy`` format, no pickle) with the arrays in name order, C order, little-endian,
and a fixed zip date: the same arrays always give the same bytes, so publishing a
version again signs nothing new.

bfloat16.  numpy has no bfloat16 type.  A bfloat16 tensor is stored as its raw bit
patterns, ``uint16`` (the upper half of the float32 with the same value), never as
float32: bits are exact for every value (NaN payloads included), are what ONNX itself
stores, and are what ONNX Runtime takes for a bfloat16 input
(``OrtValue.ortvalue_from_numpy_with_onnx_type(bits, TensorProto.BFLOAT16)``).  The
declared dtype (the version's signature, or the manifest's inline tensor) says that
a ``uint16`` array is bfloat16: :func:`inline_array` rounds inline values to bfloat16
bits (to nearest, ties to even), :func:`bfloat16_to_float32` widens bits exactly, and
:func:`compare` with ``dtype="bfloat16"`` compares bit arrays as the values they hold.

Comparing.  :func:`compare` follows ``numpy.allclose``:
``|actual - expected| <= atol + rtol * |expected|`` element-wise, NaN never equal;
numbers are compared in float64, booleans and strings must be equal.
"""

from __future__ import annotations

import io
import math
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from registry.errors import FileTooLargeError, GoldenError, UnsafeFileError, one_line, quote
from registry.safe_io import open_regular

if TYPE_CHECKING:
    import numpy.typing as npt

    from registry.schema import Tensor, TensorSet

    Array = npt.NDArray[Any]

__all__ = [
    "DEFAULT_NPZ_LIMITS",
    "Comparison",
    "NpyHeader",
    "NpzLimits",
    "array_problem",
    "bfloat16_to_float32",
    "compare",
    "directory_problem",
    "inline_array",
    "npz_bytes",
    "read_npz",
    "tensor_set",
]

_NPY: Final = ".npy"
_KINDS: Final = "biufU"
"""numpy dtype kinds a golden array may have: what ONNX tensors hold.  Structured and
sub-array dtypes (``V``), complex numbers, dates, raw bytes and zero-width types are
refused: ONNX Runtime cannot take them, and a zero-width type makes any shape free."""
_TEXT: Final = "UO"
"""Kinds that hold strings: ``U`` as files and inline tensors hold them, ``O`` as ONNX
Runtime returns string outputs."""
_MiB: Final = 1 << 20
_SHOWN_ERROR: Final = 120
_ZIP_DATE: Final = (1980, 1, 1, 0, 0, 0)
"""The zip date of every member :func:`npz_bytes` writes (the earliest zip can state)."""


@dataclass(frozen=True, slots=True)
class NpzLimits:
    """Caps on a golden ``.npz`` file, all checked before any array is read.

    Golden cases are a handful of test tensors; these caps leave room for image
    batches and long sequences while keeping ``ci pr`` (which reads each file in the
    build and again in the diff) and a device's self-test within their memory.

    Attributes:
        max_file_bytes: size of the file itself.
        max_members: arrays in one file.
        max_array_bytes: one array's declared shape x itemsize.
        max_total_bytes: the zip's declared uncompressed sizes, summed (``.npy``
            headers included); every array's bytes are within it.
        max_header_bytes: one ``.npy`` header (numpy's own default cap).
    """

    max_file_bytes: int = 256 * _MiB
    max_members: int = 256
    max_array_bytes: int = 128 * _MiB
    max_total_bytes: int = 256 * _MiB
    max_header_bytes: int = 10_000


DEFAULT_NPZ_LIMITS: Final = NpzLimits()


@dataclass(frozen=True, slots=True)
class NpyHeader:
    """What a ``.npy`` header declares.

    Attributes:
        shape: the array's shape.
        fortran_order: column-major data.
        dtype: the element type (a ``numpy.dtype``).
    """

    shape: tuple[int, ...]
    fortran_order: bool
    dtype: Any

    @property
    def count(self) -> int:
        """Elements the shape holds."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the data must hold."""
        return self.count * int(self.dtype.itemsize)


def directory_problem(members: Sequence[tuple[str, int]], limits: NpzLimits) -> str | None:
    """Why an archive with these (name, declared uncompressed size) members is refused.

    Args:
        members: the zip's central directory, in order.
        limits: the caps.

    Returns:
        One line, or None when the directory is acceptable.
    """
    if len(members) > limits.max_members:
        return f"holds {len(members)} arrays; golden files hold at most {limits.max_members}"
    seen: set[str] = set()
    total = 0
    for name, size in members:
        if not name.endswith(_NPY):
            return f"member {quote(name)} is not a .npy array"
        key = name.removesuffix(_NPY)
        if key in seen:
            return f"holds array {quote(key)} twice"
        seen.add(key)
        total += size
    if total > limits.max_total_bytes:
        return (
            f"declares {total} bytes uncompressed; golden files are limited to "
            f"{limits.max_total_bytes}"
        )
    return None


def array_problem(name: str, header: NpyHeader, data_bytes: int, limits: NpzLimits) -> str | None:
    """Why array ``name`` with this header is refused, before any of its data is read.

    Args:
        name: the array's name (its tensor name).
        header: what its ``.npy`` header declares.
        data_bytes: the bytes after the header, from the zip's declared size.
        limits: the caps.

    Returns:
        One line, or None when the array may be read.
    """
    where = f"array {quote(name)}"
    if header.dtype.hasobject:
        return f"{where} holds Python objects; golden files hold plain numbers and strings"
    if header.dtype.kind not in _KINDS or header.dtype.itemsize == 0:
        return (
            f"{where} has dtype {quote(header.dtype.str)}; golden files hold booleans, "
            "integers, floats and strings"
        )
    if any(d < 0 for d in header.shape):
        return f"{where} declares a negative dimension"
    if header.nbytes > limits.max_array_bytes:
        return (
            f"{where} declares shape {_shape(header.shape)} of {header.dtype.str} "
            f"({header.nbytes} bytes); one golden array is limited to {limits.max_array_bytes}"
        )
    if header.nbytes != data_bytes:
        return f"{where} declares {header.nbytes} bytes of data but the file holds {data_bytes}"
    return None


def _shape(shape: tuple[int, ...]) -> str:
    text = "[" + ", ".join(str(d) for d in shape) + "]"
    return text if len(text) <= _SHOWN_ERROR else text[: _SHOWN_ERROR - 4] + "...]"


def read_npz(
    path: Path, display: str, *, root: Path | None = None, limits: NpzLimits = DEFAULT_NPZ_LIMITS
) -> dict[str, Array]:
    """The arrays of an ``.npz`` file, by name, read within ``limits``.

    Args:
        path: the file.
        display: its name in messages.
        root: the repository root, when the file is one of its files: no folder
            between the root and the file may be a link.
        limits: the caps.

    Returns:
        Every array, keyed by its name without ``.npy``, in the machine's byte order.

    Raises:
        GoldenError: a link, missing, not a regular file, over a cap, or not a
            readable ``.npz`` of plain arrays (one line, never the file's content).
    """
    try:
        fh = open_regular(path, root=root, max_bytes=limits.max_file_bytes)
    except FileTooLargeError as e:
        raise GoldenError(
            display, f"is {e.size} bytes; golden files are limited to {e.limit}"
        ) from None
    except UnsafeFileError as e:
        raise GoldenError(display, e.reason) from None
    except FileNotFoundError:
        raise GoldenError(display, "does not exist") from None
    except OSError as e:
        raise GoldenError(display, f"cannot be read ({e.strerror or 'I/O error'})") from None
    with fh:
        return _read_archive(fh, display, limits)


# What zipfile, zlib and numpy's header parser raise on a malformed file: a member
# compressed with a method zipfile lacks (NotImplementedError), an encrypted one
# (RuntimeError), a bad deflate stream (zlib.error), a header that is not a dict.
_MALFORMED: Final = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    ValueError,
    EOFError,
    NotImplementedError,
    RuntimeError,
    OSError,
    SyntaxError,
)


def _read_archive(fh: IO[bytes], display: str, limits: NpzLimits) -> dict[str, Any]:
    try:
        with zipfile.ZipFile(fh) as archive:
            infos = archive.infolist()
            refused = directory_problem([(i.filename, i.file_size) for i in infos], limits)
            if refused is not None:
                raise GoldenError(display, refused)
            arrays: dict[str, Any] = {}
            for info in infos:
                name = info.filename.removesuffix(_NPY)
                with archive.open(info) as member:
                    arrays[name] = _read_member(member, name, info.file_size, display, limits)
            return arrays
    except _MALFORMED as e:
        reason = one_line(str(e), _SHOWN_ERROR) or type(e).__name__
        raise GoldenError(display, f"not a readable .npz file ({reason})") from None


def _read_member(
    member: IO[bytes], name: str, declared: int, display: str, limits: NpzLimits
) -> Any:
    import numpy as np

    header = _read_header(member, limits)
    refused = array_problem(name, header, declared - member.tell(), limits)
    if refused is not None:
        raise GoldenError(display, refused)
    # Read into a buffer of exactly the checked size: never more than the header said.
    buffer = bytearray(header.nbytes)
    view = memoryview(buffer)
    done = 0
    while done < header.nbytes:
        got = member.readinto(view[done:])  # type: ignore[attr-defined]
        if not got:
            raise GoldenError(display, f"array {quote(name)} is truncated")
        done += got
    array = np.frombuffer(buffer, dtype=header.dtype, count=header.count)
    if not header.dtype.isnative:  # ONNX Runtime reads tensors in the machine's order
        array = array.astype(header.dtype.newbyteorder("="))
    if header.fortran_order:
        return array.reshape(header.shape[::-1]).transpose()
    return array.reshape(header.shape)


def _read_header(member: IO[bytes], limits: NpzLimits) -> NpyHeader:
    from numpy.lib import format as npy

    version = npy.read_magic(member)
    if version == (1, 0):
        shape, fortran, dtype = npy.read_array_header_1_0(
            member, max_header_size=limits.max_header_bytes
        )
    elif version == (2, 0):
        shape, fortran, dtype = npy.read_array_header_2_0(
            member, max_header_size=limits.max_header_bytes
        )
    else:
        raise ValueError(f".npy format version {version[0]}.{version[1]} is not supported")
    return NpyHeader(tuple(int(d) for d in shape), bool(fortran), dtype)


def npz_bytes(arrays: Mapping[str, Any]) -> bytes:
    """The canonical ``.npz`` of ``arrays``: the same arrays always give the same bytes.

    What ``numpy.savez`` writes (stored ``.npy`` members, no pickle), with the members
    in name order, each array in C order and little-endian, and a fixed zip date.
    Arrays of Python strings (as ONNX Runtime returns string outputs) are written as
    numpy strings.

    Args:
        arrays: arrays (or anything ``numpy.asarray`` takes) by tensor name.

    Raises:
        ValueError: an array holds Python objects (they would need pickle).
    """
    import numpy as np
    from numpy.lib import format as npy

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        for name in sorted(arrays):
            array = np.ascontiguousarray(arrays[name])
            if array.dtype.hasobject and all(isinstance(v, str) for v in array.flat):
                array = array.astype(str)  # ONNX Runtime's string outputs
            array = array.astype(array.dtype.newbyteorder("<"), copy=False)
            info = zipfile.ZipInfo(f"{name}{_NPY}", date_time=_ZIP_DATE)
            with archive.open(info, "w", force_zip64=True) as member:
                npy.write_array(member, array, allow_pickle=False)
    return buf.getvalue()


def _bfloat16_bits(values: Array) -> Array:
    """float32 values rounded to bfloat16 (to nearest, ties to even), as uint16 bits."""
    import numpy as np

    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    # A NaN stays a (quiet) NaN: rounding could carry its payload into the exponent.
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    rounded = np.where(nan, (bits >> 16) | 0x40, rounded)
    return rounded.astype(np.uint16)


def bfloat16_to_float32(bits: Any) -> Array:
    """The float32 values that bfloat16 bit patterns (``uint16``) stand for (exact).

    Raises:
        ValueError: ``bits`` is not an array of ``uint16``.
    """
    import numpy as np

    array = np.asarray(bits)
    if array.dtype != np.uint16:
        raise ValueError(f"bfloat16 values are stored as uint16 bits, not {array.dtype}")
    return (array.astype(np.uint32) << 16).view(np.float32)


def inline_array(name: str, tensor: Tensor) -> Array:
    """The array of an inline tensor of a manifest, of its declared dtype and shape.

    Strings become a numpy string array (``U``), bfloat16 values their ``uint16`` bits
    (see the module docstring).

    Raises:
        GoldenError: the data does not fit the dtype (``"x"`` for a float32 tensor,
            300 for an int8 one, a number for a string one).
    """
    import numpy as np

    where = f"inline tensor {quote(name)}"
    if tensor.dtype == "string" and not all(isinstance(v, str) for v in tensor.data):
        raise GoldenError(where, "data does not fit string (strings only)")
    try:
        if tensor.dtype == "bfloat16":
            array = _bfloat16_bits(np.asarray(tensor.data, dtype=np.float32))
        else:
            dtype = np.dtype(str) if tensor.dtype == "string" else np.dtype(tensor.dtype)
            array = np.asarray(tensor.data, dtype=dtype)
        return array.reshape(tensor.shape)
    except (ValueError, TypeError, OverflowError) as e:
        raise GoldenError(
            where, f"data does not fit {tensor.dtype} ({one_line(str(e), _SHOWN_ERROR)})"
        ) from None


def tensor_set(value: TensorSet, root: Path) -> dict[str, Array]:
    """The arrays of one side of a golden case: an ``.npz`` file of the repository at
    ``root`` (read with :func:`read_npz`) or inline tensors (:func:`inline_array`).

    Raises:
        GoldenError: the file or a tensor cannot be read or converted.
    """
    if isinstance(value, str):
        return read_npz(root / value, value, root=root)
    return {name: inline_array(name, t) for name, t in value.items()}


@dataclass(frozen=True, slots=True)
class Comparison:
    """One output of one case against its expected value.

    Attributes:
        ok: within tolerance everywhere.
        max_abs_error: the largest ``|actual - expected|`` (None when not comparable,
            or for booleans and strings, which are compared for equality).
        bad: how many values are out of tolerance.
        total: how many values there are.
        reason: why the arrays could not be compared (shape or dtype), else None.
    """

    ok: bool
    max_abs_error: float | None
    bad: int
    total: int
    reason: str | None = None


def compare(
    expected: Any, actual: Any, rtol: float, atol: float, *, dtype: str | None = None
) -> Comparison:
    """Compare two arrays with ``numpy.allclose`` semantics (pure).

    Numbers are compared in float64 (so integer outputs compare exactly unless the
    tolerances allow otherwise); booleans and strings must be equal.

    Args:
        expected: the golden value.
        actual: what the model computed.
        rtol: relative tolerance.
        atol: absolute tolerance.
        dtype: the tensor's declared dtype, when it matters to read the arrays:
            ``"bfloat16"`` compares ``uint16`` bit patterns as the values they hold.

    Returns:
        The comparison; ``reason`` is set when the shapes or kinds differ.

    Raises:
        ValueError: ``dtype`` is bfloat16 and an array is neither uint16 bits nor floats.
    """
    import numpy as np

    exp, act = np.asarray(expected), np.asarray(actual)
    if dtype == "bfloat16":
        exp = bfloat16_to_float32(exp) if exp.dtype.kind == "u" else exp
        act = bfloat16_to_float32(act) if act.dtype.kind == "u" else act
    if exp.shape != act.shape:
        reason = f"shape is {act.shape}, expected {exp.shape}"
        return Comparison(ok=False, max_abs_error=None, bad=exp.size, total=exp.size, reason=reason)
    numeric = all(np.issubdtype(a.dtype, np.number) for a in (exp, act))
    if not numeric and (exp.dtype.kind in _TEXT) != (act.dtype.kind in _TEXT):
        reason = f"dtype is {act.dtype}, expected {exp.dtype}"
        return Comparison(ok=False, max_abs_error=None, bad=exp.size, total=exp.size, reason=reason)
    if not numeric:
        equal = exp == act
        bad = int(np.size(equal) - np.count_nonzero(equal))
        return Comparison(bad == 0, None, bad, int(exp.size))
    e64, a64 = exp.astype(np.float64), act.astype(np.float64)
    close = np.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=False)
    bad = int(close.size - np.count_nonzero(close))
    err = np.abs(a64 - e64)
    max_err = float(np.max(err)) if err.size else 0.0
    return Comparison(bad == 0, max_err, bad, int(exp.size))
