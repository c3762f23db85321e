"""Byte layout of the delta format and the checks of a parsed delta (no I/O).

Private to :mod:`registry.delta`, whose docstring draws the layout.  Everything here is a
pure function of bytes and integers, so every malformed case is tested without files.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Final, Literal

from registry.delta.errors import CorruptDeltaError

MAGIC: Final = b"\x89MRDLT\r\n"
_HEADER: Final = struct.Struct("<8sHBBIQ32sQ32sQQ")
_INSTRUCTION: Final = struct.Struct("<BBHIQQQ")
HEADER_SIZE: Final = _HEADER.size
INSTRUCTION_SIZE: Final = _INSTRUCTION.size
TRAILER_SIZE: Final = 32
PLANE_WIDTHS: Final = frozenset({1, 2, 4, 8})
LITERAL_WINDOW_LOG: Final = 23
"""The literal stream is decoded incrementally: its zstd window (8 MiB) is decoder memory."""

FORMAT_VERSION = 1
"""The delta format version :func:`encode` writes and :func:`decode` reads."""


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


DEFAULT_LIMITS: Final = DeltaLimits()
"""The decoder's default bounds (frozen, so one shared instance is safe)."""


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


class Mode(IntEnum):
    """How the new file is described."""

    ONNX = 1
    PATCH = 2


class Op(IntEnum):
    """Instruction opcodes of mode ONNX."""

    COPY = 1
    INSERT = 2
    XOR = 3
    PLANES = 4


@dataclass(frozen=True, slots=True)
class Header:
    """The fixed-size header, digests as raw bytes."""

    mode: Mode
    count: int
    base_size: int
    base_sha256: bytes
    new_size: int
    new_sha256: bytes
    literal_size: int
    payload_size: int

    def pack(self) -> bytes:
        """The 112 header bytes."""
        return _HEADER.pack(
            MAGIC,
            FORMAT_VERSION,
            self.mode,
            0,
            self.count,
            self.base_size,
            self.base_sha256,
            self.new_size,
            self.new_sha256,
            self.literal_size,
            self.payload_size,
        )

    @property
    def delta_size(self) -> int:
        """The exact length a delta with this header has."""
        return (
            HEADER_SIZE
            + self.count * INSTRUCTION_SIZE
            + self.literal_size
            + self.payload_size
            + TRAILER_SIZE
        )

    @property
    def literal_offset(self) -> int:
        """Where the literal section starts in the delta."""
        return HEADER_SIZE + self.count * INSTRUCTION_SIZE

    @property
    def payload_offset(self) -> int:
        """Where the payload section starts in the delta."""
        return self.literal_offset + self.literal_size

    def public(self) -> DeltaHeader:
        """The header as the public API shows it."""
        return DeltaHeader(
            format_version=FORMAT_VERSION,
            mode="onnx" if self.mode is Mode.ONNX else "patch",
            instructions=self.count,
            base_size=self.base_size,
            base_sha256=self.base_sha256.hex(),
            new_size=self.new_size,
            new_sha256=self.new_sha256.hex(),
        )


@dataclass(frozen=True, slots=True)
class Instruction:
    """One instruction; see the layout in :mod:`registry.delta` for what a, b, c mean."""

    op: Op
    planes: int = 0
    base_offset: int = 0
    length: int = 0
    payload_size: int = 0

    def pack(self) -> bytes:
        """The 32 bytes of this instruction."""
        return _INSTRUCTION.pack(
            self.op, self.planes, 0, 0, self.base_offset, self.length, self.payload_size
        )


def unpack_header(data: bytes) -> Header:
    """Parse and check the fixed-size header.

    Raises:
        CorruptDeltaError: too short, wrong magic, unknown version, mode or flags.
    """
    if len(data) < HEADER_SIZE:
        raise CorruptDeltaError(f"delta is {len(data)} bytes, shorter than its header")
    (magic, version, mode, flags, count, base_size, base_sha, new_size, new_sha, lit, pay) = (
        _HEADER.unpack_from(data)
    )
    if magic != MAGIC:
        raise CorruptDeltaError("not a modelreg delta (bad magic)")
    if version != FORMAT_VERSION:
        raise CorruptDeltaError(
            f"delta format version {version} is not supported (this decoder reads {FORMAT_VERSION})"
        )
    if mode not in Mode.__members__.values():
        raise CorruptDeltaError(f"unknown delta mode {mode}")
    if flags != 0:
        raise CorruptDeltaError(f"unknown delta flags {flags:#04x}")
    return Header(Mode(mode), count, base_size, base_sha, new_size, new_sha, lit, pay)


def check_header(header: Header, delta_size: int, limits: DeltaLimits) -> None:
    """Check the header against the delta's real length and the limits.

    Raises:
        CorruptDeltaError: the lengths disagree or a limit is exceeded.
    """
    if header.count > limits.max_instructions:
        raise CorruptDeltaError(
            f"delta has {header.count} instructions, over the limit of {limits.max_instructions}"
        )
    if header.new_size > limits.max_output_size:
        raise CorruptDeltaError(
            f"delta rebuilds {header.new_size} bytes, over the limit of {limits.max_output_size}"
        )
    if header.delta_size != delta_size:
        raise CorruptDeltaError(
            f"delta is {delta_size} bytes but its header describes {header.delta_size}"
        )
    if header.mode is Mode.PATCH and (header.count or header.payload_size):
        raise CorruptDeltaError("a patch-mode delta has instructions or payloads")


def unpack_instructions(table: bytes | memoryview, count: int) -> list[Instruction]:
    """Parse ``count`` instruction records.

    Raises:
        CorruptDeltaError: an unknown opcode or non-zero reserved bytes.
    """
    if len(table) != count * INSTRUCTION_SIZE:
        raise CorruptDeltaError("instruction table has the wrong length")
    out: list[Instruction] = []
    for op, planes, r16, r32, a, b, c in _INSTRUCTION.iter_unpack(table):
        if op not in Op.__members__.values():
            raise CorruptDeltaError(f"instruction {len(out)}: unknown opcode {op}")
        if r16 or r32:
            raise CorruptDeltaError(f"instruction {len(out)}: reserved bytes are not zero")
        out.append(Instruction(Op(op), planes, a, b, c))
    return out


def payload_bound(size: int) -> int:
    """The most bytes a zstd frame of ``size`` input bytes can take (ZSTD_compressBound)."""
    margin = ((128 << 10) - size) >> 11 if size < (128 << 10) else 0
    return size + (size >> 8) + margin + 64


def check_instructions(
    header: Header, instructions: Sequence[Instruction], limits: DeltaLimits
) -> None:
    """Check that the instructions rebuild exactly ``new_size`` bytes within bounds.

    Every base range lies inside the base, every instruction is non-empty and within
    ``limits.max_instruction_size`` (COPY streams, so only its range is checked), and the
    payload and literal sections are used exactly.

    Raises:
        CorruptDeltaError: the first instruction that breaks a rule, or the totals disagree.
    """
    total = literal = payload = 0
    for i, ins in enumerate(instructions):
        _check_one(f"instruction {i} ({ins.op.name})", ins, header, limits)
        if ins.op is Op.INSERT:
            literal += ins.length
        payload += ins.payload_size
        total += ins.length
        if total > header.new_size:
            raise CorruptDeltaError(f"instruction {i}: writes past the new file's length")
    if total != header.new_size:
        raise CorruptDeltaError(f"instructions rebuild {total} bytes, not {header.new_size}")
    if payload != header.payload_size:
        raise CorruptDeltaError("payload section length disagrees with the instructions")
    if (literal == 0) != (header.literal_size == 0):
        raise CorruptDeltaError("literal section length disagrees with the instructions")


def _check_one(where: str, ins: Instruction, header: Header, limits: DeltaLimits) -> None:
    if ins.length == 0:
        raise CorruptDeltaError(f"{where}: empty")
    if ins.op in (Op.COPY, Op.XOR):
        if ins.base_offset > header.base_size or ins.length > header.base_size - ins.base_offset:
            raise CorruptDeltaError(f"{where}: base range runs past the base file")
    elif ins.base_offset:
        raise CorruptDeltaError(f"{where}: has a base offset")
    if ins.op is not Op.COPY and ins.length > limits.max_instruction_size:
        raise CorruptDeltaError(
            f"{where}: {ins.length} bytes, over the limit of {limits.max_instruction_size}"
        )
    if ins.op in (Op.XOR, Op.PLANES):
        if ins.planes not in PLANE_WIDTHS or ins.length % ins.planes:
            raise CorruptDeltaError(f"{where}: bad plane width {ins.planes}")
        if not 0 < ins.payload_size <= payload_bound(ins.length):
            raise CorruptDeltaError(f"{where}: bad payload length {ins.payload_size}")
    elif ins.planes or ins.payload_size:
        raise CorruptDeltaError(f"{where}: has a plane width or payload")
