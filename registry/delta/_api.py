"""The public functions of :mod:`registry.delta`; the implementation modules are
imported inside them, which keeps ``import registry.delta`` free of numpy and zstandard
until a delta is actually made or applied."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, overload

from registry.delta import _format
from registry.delta._format import DEFAULT_LIMITS, DeltaHeader, DeltaLimits
from registry.errors import UsageError

if TYPE_CHECKING:
    from registry.onnx_wire import InitializerSpan


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
    from registry.delta import _encode as _delta_encode

    if not 1 <= level <= 22:
        raise UsageError(f"zstd level must be within 1..22, got {level}")
    return _delta_encode.encode(base, new, level=level)


def encode_external(
    base: Path,
    new: Path,
    out: Path,
    base_tensors: Sequence[InitializerSpan],
    new_tensors: Sequence[InitializerSpan],
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
    from registry.delta import _external as _delta_external

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
    limits: DeltaLimits = DEFAULT_LIMITS,
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
    from registry.delta import _decode as _delta_decode

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
    if isinstance(delta, Path):
        with delta.open("rb") as fh:
            head = fh.read(_format.HEADER_SIZE)
    else:
        head = bytes(delta[: _format.HEADER_SIZE])
    return _format.unpack_header(head).public()
