"""The streaming encoder for ONNX external data files (private to :mod:`registry.delta`).

An external data file is raw tensor bytes at spans the graph names; it is no protobuf
message, so the tensors come from the caller (``registry.onnx_wire.external_initializers``
of each version's ``.onnx``).  The delta has the format of mode ``onnx`` (the decoder is
the same): for each tensor of the new file, in file order, 4 MiB pieces that equal the
base tensor of the same name, dtype and shape are COPYs, the others XOR patches (byte
planes, zstd), and a tensor the base lacks is PLANES; the bytes between tensors
(alignment padding) are literals.

Unlike the in-memory encoder, both files are read by ranges with ``pread`` and payloads
are spooled to a temporary file beside the output, so memory stays at a few pieces
whatever the model's size (a data file can be many GB).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Final

from registry.atomic import AtomicFile
from registry.delta._encode import CHUNK, MIN_TENSOR, _planes_payload, _xor_payload
from registry.delta._format import LITERAL_WINDOW_LOG, Header, Instruction, Mode, Op
from registry.errors import UsageError
from registry.onnx_wire import InitializerSpan

_READ: Final = 1 << 20


def _pread(fd: int, offset: int, size: int) -> bytes:
    """Exactly ``size`` bytes at ``offset``.

    Raises:
        OSError: the file is shorter (it changed while being read).
    """
    parts = []
    while size:
        piece = os.pread(fd, size, offset)
        if not piece:
            raise OSError(f"file ended at offset {offset}, before the span its graph names")
        parts.append(piece)
        offset += len(piece)
        size -= len(piece)
    return b"".join(parts)


def _file_sha256(fd: int, size: int) -> bytes:
    digest = hashlib.sha256()
    pos = 0
    while pos < size:
        piece = _pread(fd, pos, min(_READ << 2, size - pos))
        digest.update(piece)
        pos += len(piece)
    return digest.digest()


class _Writer:
    """Instructions, literals and payloads as they are produced, in new-file order."""

    def __init__(self, level: int, spool: IO[bytes]) -> None:
        import zstandard

        params = zstandard.ZstdCompressionParameters.from_level(
            level, window_log=LITERAL_WINDOW_LOG
        )
        self._literal = zstandard.ZstdCompressor(compression_params=params).compressobj()
        self.literal = bytearray()
        self.table: list[Instruction] = []
        self.spool = spool
        self.payload_size = 0
        self.level = level
        self.inserted = False

    def insert(self, data: bytes) -> None:
        self.inserted = True
        self.literal += self._literal.compress(data)
        last = self.table[-1] if self.table else None
        if last is not None and last.op is Op.INSERT and last.length + len(data) <= CHUNK:
            self.table[-1] = Instruction(Op.INSERT, 0, 0, last.length + len(data), 0)
        else:
            self.table.append(Instruction(Op.INSERT, 0, 0, len(data), 0))

    def copy(self, base_offset: int, length: int) -> None:
        last = self.table[-1] if self.table else None
        if (
            last is not None
            and last.op is Op.COPY
            and last.base_offset + last.length == base_offset
        ):
            self.table[-1] = Instruction(Op.COPY, 0, last.base_offset, last.length + length, 0)
        else:
            self.table.append(Instruction(Op.COPY, 0, base_offset, length, 0))

    def payload(self, op: Op, planes: int, base_offset: int, length: int, data: bytes) -> None:
        self.spool.write(data)
        self.payload_size += len(data)
        self.table.append(
            Instruction(op, planes, base_offset if op is Op.XOR else 0, length, len(data))
        )

    def literal_frame(self) -> bytes:
        return bytes(self.literal + self._literal.flush()) if self.inserted else b""


def encode(
    base: Path,
    new: Path,
    out: Path,
    base_tensors: Sequence[InitializerSpan],
    new_tensors: Sequence[InitializerSpan],
    *,
    level: int,
) -> Path:
    """See :func:`registry.delta.encode_external`."""
    ordered = sorted((t for t in new_tensors if t.length >= MIN_TENSOR), key=lambda t: t.offset)
    by_key = {t.key: t for t in base_tensors}
    base_fd = os.open(base, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        new_fd = os.open(new, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            base_size, new_size = os.fstat(base_fd).st_size, os.fstat(new_fd).st_size
            with tempfile.TemporaryFile(dir=out.parent) as spool:
                writer = _Writer(level, spool)
                new_digest = hashlib.sha256()
                pos = 0
                for t in ordered:
                    if t.offset < pos or t.offset + t.length > new_size:
                        raise UsageError(f"tensor {t.name!r}: span overlaps another or the end")
                    _literals(new_fd, pos, t.offset, writer, new_digest)
                    same = by_key.get(t.key)
                    if same is not None and (
                        same.length != t.length or same.offset + same.length > base_size
                    ):
                        same = None
                    _tensor(base_fd, new_fd, t, same=same, writer=writer, digest=new_digest)
                    pos = t.offset + t.length
                _literals(new_fd, pos, new_size, writer, new_digest)
                literal = writer.literal_frame()
                header = Header(
                    Mode.ONNX, len(writer.table), base_size, _file_sha256(base_fd, base_size),
                    new_size, new_digest.digest(), len(literal), writer.payload_size,
                )  # fmt: skip
                _assemble(out, header, writer, literal)
        finally:
            os.close(new_fd)
    finally:
        os.close(base_fd)
    return out


def _literals(fd: int, start: int, end: int, writer: _Writer, digest: hashlib._Hash) -> None:
    pos = start
    while pos < end:
        piece = _pread(fd, pos, min(CHUNK, end - pos))
        digest.update(piece)
        writer.insert(piece)
        pos += len(piece)


def _tensor(
    base_fd: int,
    new_fd: int,
    t: InitializerSpan,
    *,
    same: InitializerSpan | None,
    writer: _Writer,
    digest: hashlib._Hash,
) -> None:
    for done in range(0, t.length, CHUNK):
        size = min(CHUNK, t.length - done)
        piece = _pread(new_fd, t.offset + done, size)
        digest.update(piece)
        planes = t.element_size if size % t.element_size == 0 else 1
        if same is None:
            op, data = _planes_payload(memoryview(piece), planes, writer.level)
            writer.payload(op, planes, 0, size, data)
            continue
        base_offset = same.offset + done
        old = _pread(base_fd, base_offset, size)
        if old == piece:
            writer.copy(base_offset, size)
            continue
        op, data = _xor_payload(memoryview(old), memoryview(piece), planes, writer.level)
        writer.payload(op, planes, base_offset, size, data)


def _assemble(out: Path, header: Header, writer: _Writer, literal: bytes) -> None:
    seal = hashlib.sha256()
    with AtomicFile(out) as dest:

        def put(data: bytes) -> None:
            seal.update(data)
            dest.file.write(data)

        put(header.pack())
        put(b"".join(i.pack() for i in writer.table))
        put(literal)
        writer.spool.seek(0)
        while piece := writer.spool.read(_READ << 2):
            put(piece)
        dest.file.write(seal.digest())
