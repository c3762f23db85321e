"""The delta decoder: check everything, then stream the new file out while hashing it.

Private to :mod:`registry.delta` (see its docstring for the format).  Runs on devices, so it
needs only numpy and zstandard, reads both inputs by ranges (``os.preadv`` on files, never
a whole-file read or mmap, whose pages would count against the process) and keeps at most
a few instruction-sized buffers alive.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from registry.atomic import AtomicFile
from registry.delta._format import (
    HEADER_SIZE,
    INSTRUCTION_SIZE,
    LITERAL_WINDOW_LOG,
    TRAILER_SIZE,
    DeltaLimits,
    Header,
    Instruction,
    Mode,
    Op,
    check_header,
    check_instructions,
    unpack_header,
    unpack_instructions,
)
from registry.delta.errors import BaseMismatchError, CorruptDeltaError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import zstandard

_READ: Final = 4 << 20
_PLANE_BLOCK: Final = 1 << 16


class _Source:
    """Random access to an input held in memory or in a file."""

    def __init__(self, data: bytes | Path) -> None:
        self._fd: int | None = None
        self._view: memoryview | None = None
        if isinstance(data, Path):
            self._fd = os.open(data, os.O_RDONLY)
            self.size = os.fstat(self._fd).st_size
        else:
            self._view = memoryview(data)
            self.size = len(self._view)

    def read(self, offset: int, size: int) -> memoryview:
        """``size`` bytes from ``offset`` (the caller keeps the range inside the input)."""
        if self._view is not None:
            return self._view[offset : offset + size]
        buf = memoryview(bytearray(size))
        self.readinto(offset, buf)
        return buf

    def readinto(self, offset: int, buf: memoryview) -> None:
        """Fill ``buf`` from ``offset``.

        Raises:
            OSError: the file ended early (it changed while being read).
        """
        if self._view is not None:
            buf[:] = self._view[offset : offset + len(buf)]
            return
        assert self._fd is not None  # noqa: S101 - one of the two is always set
        done = 0
        while done < len(buf):
            got = os.preadv(self._fd, [buf[done:]], offset + done)
            if got == 0:
                raise OSError(f"input shrank while being read (at offset {offset + done})")
            done += got

    def chunks(self, start: int, end: int) -> Iterator[memoryview]:
        """The bytes ``[start, end)`` in pieces of at most 4 MiB."""
        if self._view is not None:
            for pos in range(start, end, _READ):
                yield self._view[pos : min(end, pos + _READ)]
            return
        buf = memoryview(bytearray(min(_READ, max(end - start, 0))))
        for pos in range(start, end, _READ):
            piece = buf[: min(_READ, end - pos)]
            self.readinto(pos, piece)
            yield piece

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _Section(io.RawIOBase):
    """A raw reader over ``[start, end)`` of a source, to feed zstd stream readers."""

    def __init__(self, source: _Source, start: int, end: int) -> None:
        super().__init__()
        self._source, self._pos, self._end = source, start, end

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:  # any writable buffer (typeshed's alias is private)
        view = memoryview(buffer).cast("B")
        size = min(len(view), self._end - self._pos)
        self._source.readinto(self._pos, view[:size])
        self._pos += size
        return size


def _section(source: _Source, start: int, end: int) -> io.BufferedReader:
    return io.BufferedReader(_Section(source, start, end), buffer_size=1 << 16)


class _Output:
    """Where the new file goes, hashed as it is written.

    With ``out``, a temporary file beside it (:class:`registry.atomic.AtomicFile`) that
    :meth:`commit` puts in place; without, memory.
    """

    def __init__(self, out: Path | None) -> None:
        self.digest = hashlib.sha256()
        self.written = 0
        self._memory = io.BytesIO()
        self._file = AtomicFile(out, buffering=1 << 20) if out is not None else None

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        self.digest.update(view)
        self.written += view.nbytes
        if self._file is not None:
            self._file.write(view)
        else:
            self._memory.write(view)

    def commit(self) -> bytes | Path:
        """Put the verified file in place (or return the bytes)."""
        if self._file is None:
            return self._memory.getvalue()
        out, self._file = self._file, None
        return out.commit()

    def abort(self) -> None:
        """Drop the partial output (nothing to do once committed)."""
        if self._file is not None:
            self._file.abort()
            self._file = None


def decode(
    base: bytes | Path,
    delta: bytes | Path,
    out: Path | None,
    *,
    expected_sha256: str | None,
    limits: DeltaLimits,
) -> bytes | Path:
    """See :func:`registry.delta.decode`."""
    d = _Source(delta)
    try:
        header, instructions = _checked(d, expected_sha256, limits)
        b = _Source(base)
        try:
            return _rebuild(header, instructions, b, d, out=out, limits=limits)
        finally:
            b.close()
    finally:
        d.close()


def _checked(
    d: _Source, expected_sha256: str | None, limits: DeltaLimits
) -> tuple[Header, list[Instruction]]:
    """The header and instructions of ``d``, once every check that needs no base passed."""
    header = unpack_header(bytes(d.read(0, min(HEADER_SIZE, d.size))))
    check_header(header, d.size, limits)
    trailer = hashlib.sha256()
    for piece in d.chunks(0, d.size - TRAILER_SIZE):
        trailer.update(piece)
    if trailer.digest() != bytes(d.read(d.size - TRAILER_SIZE, TRAILER_SIZE)):
        raise CorruptDeltaError("delta checksum mismatch: the delta is corrupted")
    new_hex = header.new_sha256.hex()
    if expected_sha256 is not None and new_hex != expected_sha256:
        raise CorruptDeltaError(
            f"delta rebuilds a file with SHA-256 {new_hex}, not the expected {expected_sha256}"
        )
    instructions: list[Instruction] = []
    if header.mode is Mode.ONNX:
        table = d.read(HEADER_SIZE, header.count * INSTRUCTION_SIZE)
        instructions = unpack_instructions(table, header.count)
        check_instructions(header, instructions, limits)
    return header, instructions


def _rebuild(
    header: Header,
    instructions: list[Instruction],
    b: _Source,
    d: _Source,
    *,
    out: Path | None,
    limits: DeltaLimits,
) -> bytes | Path:
    if b.size != header.base_size:
        raise BaseMismatchError(
            f"base is {b.size} bytes; the delta was made against {header.base_size} bytes",
            header.base_sha256.hex(),
            None,
        )
    output = _Output(out)
    try:
        try:
            if header.mode is Mode.ONNX:
                _apply(header, instructions, b, d, output)
            else:
                _apply_patch(header, b, d, output, limits)
            _check_output(header, output)
        except CorruptDeltaError as e:
            # A result with the signed digest is right whatever base produced it, so the
            # base is hashed only now, to name the cause: a wrong base also garbles the result.
            _check_base(header, b, e)
            raise
        return output.commit()
    except BaseException:
        output.abort()
        raise


def _check_output(header: Header, output: _Output) -> None:
    if output.written != header.new_size or output.digest.digest() != header.new_sha256:
        raise CorruptDeltaError(
            f"rebuilt file has SHA-256 {output.digest.hexdigest()}, not {header.new_sha256.hex()}"
        )


def _check_base(header: Header, b: _Source, cause: CorruptDeltaError) -> None:
    digest = hashlib.sha256()
    for piece in b.chunks(0, b.size):
        digest.update(piece)
    if digest.digest() != header.base_sha256:
        raise BaseMismatchError(
            f"base has SHA-256 {digest.hexdigest()}; the delta was made against "
            f"{header.base_sha256.hex()}",
            header.base_sha256.hex(),
            digest.hexdigest(),
        ) from cause


def _decompress(payload: memoryview, size: int) -> bytes:
    import zstandard

    try:
        declared = zstandard.frame_content_size(payload)
        if declared != size:  # also refuses frames that do not declare their size
            raise CorruptDeltaError(f"payload frame declares {declared} bytes, not {size}")
        data = zstandard.ZstdDecompressor().decompress(payload, allow_extra_data=False)
    except zstandard.ZstdError as e:
        raise CorruptDeltaError(f"payload frame does not decompress: {e}") from e
    if len(data) != size:
        raise CorruptDeltaError(f"payload frame holds {len(data)} bytes, not {size}")
    return data


def merge_planes(planes: npt.NDArray[np.uint8], width: int) -> npt.NDArray[np.uint8]:
    """Undo :func:`registry.delta._encode.split_planes` into a new, writable array."""
    import numpy as np

    count = len(planes) // width
    src = planes.reshape(width, count)
    out = np.empty((count, width), np.uint8)
    # Block by block: a whole-array transposed copy strides through memory and runs
    # several times slower.
    for start in range(0, count, _PLANE_BLOCK):
        out[start : start + _PLANE_BLOCK] = src[:, start : start + _PLANE_BLOCK].T
    return out.reshape(-1)


def _apply(
    header: Header, instructions: list[Instruction], b: _Source, d: _Source, output: _Output
) -> None:
    import numpy as np
    import zstandard

    literals: zstandard.ZstdDecompressionReader | None = None
    if header.literal_size:
        section = _section(d, header.literal_offset, header.payload_offset)
        dctx = zstandard.ZstdDecompressor(max_window_size=1 << LITERAL_WINDOW_LOG)
        literals = dctx.stream_reader(section, read_size=1 << 16, read_across_frames=True)
    payload_at = header.payload_offset
    try:
        for ins in instructions:
            if ins.op is Op.COPY:
                for piece in b.chunks(ins.base_offset, ins.base_offset + ins.length):
                    output.write(piece)
            elif ins.op is Op.INSERT:
                _copy_literals(literals, ins.length, output)
            else:
                payload = d.read(payload_at, ins.payload_size)
                payload_at += ins.payload_size
                data = np.frombuffer(_decompress(payload, ins.length), np.uint8)
                values = merge_planes(data, ins.planes) if ins.planes > 1 else data.copy()
                if ins.op is Op.XOR:
                    base_part = b.read(ins.base_offset, ins.length)
                    np.bitwise_xor(values, np.frombuffer(base_part, np.uint8), out=values)
                output.write(values.data)
        if literals is not None and literals.read(1):
            raise CorruptDeltaError("literal stream holds more bytes than the instructions use")
    except zstandard.ZstdError as e:
        raise CorruptDeltaError(f"literal stream does not decompress: {e}") from e


def _copy_literals(
    literals: zstandard.ZstdDecompressionReader | None, size: int, output: _Output
) -> None:
    while size:
        piece = literals.read(min(size, _READ)) if literals is not None else b""
        if not piece:
            raise CorruptDeltaError("literal stream ends before the instructions do")
        output.write(piece)
        size -= len(piece)


def _apply_patch(
    header: Header, b: _Source, d: _Source, output: _Output, limits: DeltaLimits
) -> None:
    import zstandard

    start, end = header.literal_offset, header.payload_offset
    try:
        params = zstandard.get_frame_parameters(bytes(d.read(start, min(18, end - start))))
    except zstandard.ZstdError as e:
        raise CorruptDeltaError(f"patch frame header is invalid: {e}") from e
    if params.content_size != header.new_size:
        raise CorruptDeltaError(
            f"patch frame declares {params.content_size} bytes, not {header.new_size}"
        )
    if params.window_size > limits.max_window_size:
        raise CorruptDeltaError(
            f"patch frame needs a {params.window_size}-byte window, over the limit of "
            f"{limits.max_window_size}"
        )
    # zstd needs the whole base as the dictionary: this mode's memory is the base's size.
    dictionary = None
    if header.base_size:
        base_bytes = bytes(b.read(0, header.base_size))
        dictionary = zstandard.ZstdCompressionDict(
            base_bytes, dict_type=zstandard.DICT_TYPE_RAWCONTENT
        )
        del base_bytes
    dctx = zstandard.ZstdDecompressor(dict_data=dictionary, max_window_size=limits.max_window_size)
    try:
        reader = dctx.stream_reader(_section(d, start, end), read_across_frames=True)
        while piece := reader.read(_READ):
            if output.written + len(piece) > header.new_size:
                raise CorruptDeltaError("patch frame holds more bytes than its header says")
            output.write(piece)
    except zstandard.ZstdError as e:
        raise CorruptDeltaError(f"patch frame does not decompress: {e}") from e
