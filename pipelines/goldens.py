"""Golden tests: read golden ``.npz`` files within caps, and record expected outputs.

A golden file arrives with a pull request, so it is read the way a device reads the
network: ``read_npz`` opens it through ``registry.safe_io`` (no link, a size cap), then
checks the zip's directory (member count, declared uncompressed sizes) and each
member's ``.npy`` header (shape x itemsize) against :class:`NpzLimits` *before* it
allocates or reads a single array.  A 2 MB file that declares 2 GB of zeros, or one
header that claims 29 TiB, is refused with one line instead of taking the machine's
memory.  ``numpy.load`` is never used on such files: it allocates whatever the header
says first.

The checks on directory and headers are pure functions (``directory_problem``,
``array_problem``), tested apart from the I/O.
"""

from __future__ import annotations

import io
import math
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from pipelines.build_checks import one_line, ort_errors
from pipelines.errors import ArtifactError
from registry.errors import FileTooLargeError, UnsafeFileError, quote
from registry.safe_io import open_regular

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

_NPY: Final = ".npy"
_KINDS: Final = "biufU"
"""numpy dtype kinds a golden array may have: what ONNX tensors hold.  Structured and
sub-array dtypes (``V``), complex numbers, dates, raw bytes and zero-width types are
refused: ONNX Runtime cannot take them, and a zero-width type makes any shape free."""
_MiB: Final = 1 << 20
_SHOWN_ERROR: Final = 120


@dataclass(frozen=True, slots=True)
class NpzLimits:
    """Caps on a golden ``.npz`` file, all checked before any array is read.

    Golden cases are a handful of test tensors; these caps leave room for image
    batches and long sequences while keeping ``ci pr`` (which reads each file in the
    build and again in the diff) within a runner's memory.

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
) -> dict[str, npt.NDArray[Any]]:
    """The arrays of an ``.npz`` file, by name, read within ``limits``.

    Args:
        path: the file.
        display: its name in messages.
        root: the repository root, when the file is one of its files: no folder
            between the root and the file may be a link.
        limits: the caps.

    Returns:
        Every array, keyed by its name without ``.npy``.

    Raises:
        ArtifactError: a link, missing, not a regular file, over a cap, or not a
            readable ``.npz`` of plain arrays (one line, never the file's content).
    """
    try:
        fh = open_regular(path, root=root, max_bytes=limits.max_file_bytes)
    except FileTooLargeError as e:
        raise ArtifactError(
            display, f"is {e.size} bytes; golden files are limited to {e.limit}"
        ) from None
    except UnsafeFileError as e:
        raise ArtifactError(display, e.reason) from None
    except FileNotFoundError:
        raise ArtifactError(display, "does not exist") from None
    except OSError as e:
        raise ArtifactError(display, f"cannot be read ({e.strerror or 'I/O error'})") from None
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
                raise ArtifactError(display, refused)
            arrays: dict[str, Any] = {}
            for info in infos:
                name = info.filename.removesuffix(_NPY)
                with archive.open(info) as member:
                    arrays[name] = _read_member(member, name, info.file_size, display, limits)
            return arrays
    except _MALFORMED as e:
        reason = one_line(str(e), _SHOWN_ERROR) or type(e).__name__
        raise ArtifactError(display, f"not a readable .npz file ({reason})") from None


def _read_member(
    member: IO[bytes], name: str, declared: int, display: str, limits: NpzLimits
) -> Any:
    import numpy as np

    header = _read_header(member, limits)
    refused = array_problem(name, header, declared - member.tell(), limits)
    if refused is not None:
        raise ArtifactError(display, refused)
    # Read into a buffer of exactly the checked size: never more than the header said.
    buffer = bytearray(header.nbytes)
    view = memoryview(buffer)
    done = 0
    while done < header.nbytes:
        got = member.readinto(view[done:])  # type: ignore[attr-defined]
        if not got:
            raise ArtifactError(display, f"array {quote(name)} is truncated")
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


def record_outputs(model: Path, inputs_npz: Path) -> tuple[bytes, bytes]:
    """Run ``model`` on the arrays of ``inputs_npz`` (CPU, ONNX Runtime).

    Returns:
        (inputs, outputs) as ``.npz`` bytes, arrays keyed by tensor name.

    Raises:
        ArtifactError: the inputs are not a readable ``.npz`` within caps, don't match
            the model, or the model does not run.
    """
    import onnxruntime as ort

    inputs = read_npz(inputs_npz, str(inputs_npz))
    try:
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        wanted = {i.name for i in session.get_inputs()}
        if set(inputs) != wanted:
            raise ArtifactError(
                str(inputs_npz),
                f"holds arrays {sorted(inputs)} but the model takes {sorted(wanted)}",
            )
        names = [o.name for o in session.get_outputs()]
        values = session.run(names, inputs)
    except ort_errors() as e:
        raise ArtifactError(str(model), f"ONNX Runtime failed: {e}") from None
    return _npz(inputs), _npz(dict(zip(names, values, strict=True)))


def _npz(arrays: dict[str, np.ndarray[Any, Any]]) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **arrays)
    return buf.getvalue()
