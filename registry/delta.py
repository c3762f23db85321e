"""Byte-exact, ONNX-aware binary deltas between two model files (stable API).

``encode(base, new)`` runs on CI and describes ``new`` as instructions against ``base``;
``decode(base, delta)`` runs on the device and rebuilds ``new`` bit for bit, verified
against the SHA-256 of ``new`` that the delta carries (and, optionally, the signed digest
from TUF).  The decoder needs ``numpy`` and ``zstandard`` only, never ``onnx``.

How ``new`` is described (mode ``onnx``, when both files parse as ONNX models):

* ``COPY base_offset length``: unchanged bytes, taken from the base file;
* ``XOR base_offset length planes``: a tensor present in both files with the same name,
  dtype and shape; the payload is the XOR of the two byte ranges, split into byte planes
  (for float32: every value's byte 0, then every byte 1, ...) and zstd-compressed, because
  a fine-tune leaves sign and exponent bytes mostly unchanged;
* ``PLANES length planes``: a new tensor, byte-plane split and zstd-compressed;
* ``INSERT length``: literal bytes (protobuf framing, graph nodes) taken in order from one
  zstd-compressed literal stream.

An ONNX external data file (raw tensor bytes at spans its ``.onnx`` names) gets mode
``onnx`` too, from :func:`encode_external`: the caller gives both files' tensors (from
``registry.onnx_wire.external_initializers``), the bytes between them are literals, and
the encoder streams both files by ranges (memory: a few 4 MiB pieces, whatever the size).

A file that does not parse as ONNX gets mode ``patch``: one zstd frame of ``new`` compressed
with ``base`` as a raw-content dictionary (what ``zstd --patch-from`` does).

Byte layout of format version 1 (integers little-endian)::

    offset        size  field
    0             8     magic b"\\x89MRDLT\\r\\n"
    8             2     format version (1)
    10            1     mode: 1 = onnx instructions, 2 = zstd patch
    11            1     flags (0)
    12            4     instruction count N (0 in mode patch)
    16            8     base length
    24            32    base SHA-256
    56            8     new length
    64            32    new SHA-256
    96            8     literal section length L
    104           8     payload section length P
    112           32*N  instructions: op u8, planes u8, reserved u16 + u32 (0),
                        a u64, b u64, c u64
                          COPY   (1): a = base offset, b = length
                          INSERT (2): b = length (from the literal stream)
                          XOR    (3): a = base offset, b = length, c = payload length
                          PLANES (4): b = length, c = payload length
    112+32N       L     literal section: one zstd frame (the patch frame in mode patch)
    ...           P     payload section: the XOR/PLANES zstd frames, in instruction order
    end-32        32    SHA-256 of every byte before it

Decoding checks the trailer first (any flipped or missing byte is a
:class:`CorruptDeltaError` before a byte is written), then the whole instruction table
against :class:`DeltaLimits` and the header, and the base's length; then it streams the
output, hashing it, to a temporary file beside ``out`` (renamed into place only once its
SHA-256 matches) or to memory.  The base's own SHA-256 is computed only when the result's
is wrong, to tell a wrong base (:class:`BaseMismatchError`) from a corrupt delta: a result
with the expected digest is right whatever base produced it, and skipping a full read and
hash of the base is a third of the decoding time.

Memory stays bounded by the largest instruction (4 MiB as written, ``max_instruction_size``
as accepted) plus the literal stream's 8 MiB zstd window, whatever the model size; inputs
given as paths are read by ranges.  Mode ``patch`` is the exception: zstd needs the whole
base as its dictionary and a window spanning both files.

Exceptions::

    RegistryError
    └── DeltaError              a delta cannot be applied
        ├── CorruptDeltaError   malformed, truncated, over a limit, or yields the wrong digest
        └── BaseMismatchError   the base given is not the file the delta was made against

Misuse (a bad argument) raises ``ValueError``; I/O failures raise ``OSError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

from registry.errors import RegistryError, UsageError

if TYPE_CHECKING:
    from registry.onnx_wire import Tensor

# The implementation modules import the exceptions and limits defined here, so they are
# imported inside the functions below; that also keeps ``import registry.delta`` free of
# numpy and zstandard until a delta is actually made or applied.

__all__ = [
    "BaseMismatchError",
    "CorruptDeltaError",
    "DeltaError",
    "DeltaHeader",
    "DeltaLimits",
    "decode",
    "encode",
    "encode_external",
    "read_header",
]

FORMAT_VERSION = 1
"""The delta format version :func:`encode` writes and :func:`decode` reads."""


class DeltaError(RegistryError):
    """A delta cannot be applied; nothing was written to the output path."""


class CorruptDeltaError(DeltaError):
    """The delta is malformed, truncated, over a limit, or does not yield the expected file."""


class BaseMismatchError(DeltaError):
    """The base file is not the one the delta was made against.

    Attributes:
        expected_sha256: the base digest recorded in the delta.
        actual_sha256: the digest of the base given, or None when its length already differed.
    """

    def __init__(self, message: str, expected_sha256: str, actual_sha256: str | None) -> None:
        self.expected_sha256 = expected_sha256
        self.actual_sha256 = actual_sha256
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class DeltaLimits:
    """Bounds the decoder enforces on untrusted deltas before acting on them.

    Attributes:
        max_instructions: instructions in one delta.
        max_output_size: bytes of the rebuilt file.
        max_instruction_size: bytes one INSERT, XOR or PLANES instruction may produce;
            this bounds the decoder's memory in mode ``onnx``.
        max_window_size: zstd window the decoder may allocate for a mode ``patch`` delta
            (which must span base and new file).
    """

    max_instructions: int = 1 << 20
    max_output_size: int = 1 << 36
    max_instruction_size: int = 64 << 20
    max_window_size: int = 1 << 31


@dataclass(frozen=True, slots=True)
class DeltaHeader:
    """What a delta says about itself (read by :func:`read_header`).

    Attributes:
        format_version: the format version of the delta.
        mode: ``"onnx"`` (instructions) or ``"patch"`` (generic zstd patch).
        instructions: how many instructions the delta holds (0 in mode ``patch``).
        base_size: length in bytes of the base file it applies to.
        base_sha256: hex SHA-256 of that base file.
        new_size: length in bytes of the file it rebuilds.
        new_sha256: hex SHA-256 of the file it rebuilds.
    """

    format_version: int
    mode: Literal["onnx", "patch"]
    instructions: int
    base_size: int
    base_sha256: str
    new_size: int
    new_sha256: str


def encode(base: bytes | Path, new: bytes | Path, *, level: int = 3) -> bytes:
    """Describe ``new`` as a delta against ``base``.

    Args:
        base: the file the device has (bytes, or a path to read).
        new: the file the device should end up with.
        level: zstd compression level of payloads and literals (1-22).

    Returns:
        The delta, in format version :data:`FORMAT_VERSION`.

    Raises:
        ValueError: ``level`` is out of range.
        OSError: a path cannot be read.
    """
    from registry import _delta_encode

    if not 1 <= level <= 22:
        raise UsageError(f"zstd level must be within 1..22, got {level}")
    return _delta_encode.encode(base, new, level=level)


def encode_external(
    base: Path,
    new: Path,
    out: Path,
    base_tensors: Sequence[Tensor],
    new_tensors: Sequence[Tensor],
    *,
    level: int = 3,
) -> Path:
    """Write a delta between two ONNX external data files to ``out`` (atomically).

    Tensors of the same name, dtype and shape are compared 4 MiB at a time: equal
    pieces are copied from ``base``, changed ones XOR-patched; tensors ``base`` lacks
    are byte-plane compressed.  :func:`decode` applies the result.

    Args:
        base: the data file the device has.
        new: the data file the device should end up with.
        out: where to write the delta (a temporary spool is made beside it).
        base_tensors: the spans of ``base``'s tensors (``offset``/``length`` in it).
        new_tensors: the spans of ``new``'s tensors; none may overlap another.
        level: zstd compression level (1-22).

    Returns:
        ``out``.

    Raises:
        ValueError: ``level`` is out of range, or a span of ``new`` overlaps another or
            runs past its end.
        OSError: a file cannot be read, or ``out`` cannot be written.
    """
    from registry import _delta_external

    if not 1 <= level <= 22:
        raise UsageError(f"zstd level must be within 1..22, got {level}")
    return _delta_external.encode(base, new, out, base_tensors, new_tensors, level=level)


@overload
def decode(
    base: bytes | Path,
    delta: bytes | Path,
    out: None = None,
    *,
    expected_sha256: str | None = None,
    limits: DeltaLimits = ...,
) -> bytes: ...


@overload
def decode(
    base: bytes | Path,
    delta: bytes | Path,
    out: Path,
    *,
    expected_sha256: str | None = None,
    limits: DeltaLimits = ...,
) -> Path: ...


def decode(
    base: bytes | Path,
    delta: bytes | Path,
    out: Path | None = None,
    *,
    expected_sha256: str | None = None,
    limits: DeltaLimits = DeltaLimits(),  # frozen, so one shared default is safe
) -> bytes | Path:
    """Rebuild the new file from ``base`` and ``delta``, verified by its SHA-256.

    Args:
        base: the file the delta was made against (bytes, or a path read by ranges).
        delta: the delta (bytes, or a path read by ranges).
        out: where to write the new file atomically; None returns it as bytes.
        expected_sha256: hex SHA-256 the result must have (the signed digest from the
            TUF targets metadata); checked against the delta's header before decoding.
        limits: bounds on what the delta may ask for.

    Returns:
        ``out`` once the verified file is in place, or the new file's bytes.

    Raises:
        CorruptDeltaError: the delta is malformed, truncated, corrupted or over a limit,
            or rebuilds a file whose digest is not the one expected.
        BaseMismatchError: ``base`` is not the file the delta was made against.
        OSError: a file cannot be read, or ``out`` cannot be written.
    """
    from registry import _delta_decode

    if expected_sha256 is not None:
        expected_sha256 = expected_sha256.lower()
        if len(expected_sha256) != 64 or any(c not in "0123456789abcdef" for c in expected_sha256):
            raise UsageError(f"expected_sha256 is not a hex SHA-256: {expected_sha256!r}")
    return _delta_decode.decode(base, delta, out, expected_sha256=expected_sha256, limits=limits)


def read_header(delta: bytes | Path) -> DeltaHeader:
    """The header of ``delta``, e.g. to find which base file it needs.

    Only the fixed-size header is read and checked; :func:`decode` verifies the rest.

    Raises:
        CorruptDeltaError: the delta is too short or not a delta of a known version.
        OSError: the path cannot be read.
    """
    from registry import _delta_format

    if isinstance(delta, Path):
        with delta.open("rb") as fh:
            head = fh.read(_delta_format.HEADER_SIZE)
    else:
        head = bytes(delta[: _delta_format.HEADER_SIZE])
    return _delta_format.unpack_header(head).public()
