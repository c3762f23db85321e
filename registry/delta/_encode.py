"""The delta encoder: match tensors, plan instructions, compress payloads in parallel.

Private to :mod:`registry.delta` (see its docstring for the format).  The encoder runs on CI
and holds both files in memory; slices are memoryviews, so no tensor is copied except into
the XOR and byte-plane buffers that are compressed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from registry.delta._format import (
    LITERAL_WINDOW_LOG,
    DeltaLimits,
    Header,
    Instruction,
    Mode,
    Op,
)
from registry.onnx_wire import InitializerSpan, WireFormatError, initializers

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

CHUNK: Final = 4 << 20
"""Most bytes one INSERT, XOR or PLANES instruction rebuilds: the decoder's working set."""

MIN_TENSOR: Final = 1024
"""Tensors smaller than this are left to the framing: an instruction would cost more."""

MIN_COPY: Final = 48
"""Shorter matches are sent as literals: a COPY record is 32 bytes, literals compress."""

_XOR_RETRY: Final = 0.8
"""A chunk whose XOR payload is this large (relative to the data) is also tried as PLANES:
a tensor retrained from scratch has the same name and shape but nothing in common."""


@dataclass(frozen=True, slots=True)
class Step:
    """One planned instruction, positioned in both files."""

    op: Op
    new_offset: int
    length: int
    base_offset: int = 0
    planes: int = 1


def _load(source: bytes | Path) -> memoryview:
    return memoryview(source.read_bytes() if isinstance(source, Path) else source)


def encode(base: bytes | Path, new: bytes | Path, *, level: int) -> bytes:
    """See :func:`registry.delta.encode`."""
    b, n = _load(base), _load(new)
    steps = plan(b, n)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        base_digest = pool.submit(_sha256, b)
        new_digest = pool.submit(_sha256, n)
        if steps is None:
            body = pool.submit(_patch_frame, b, n, level)
            header = Header(
                Mode.PATCH, 0, len(b), base_digest.result(), len(n), new_digest.result(),
                len(body.result()), 0,
            )  # fmt: skip
            return _seal([header.pack(), body.result()])
        return _assemble(pool, b, n, steps, level=level, digests=(base_digest, new_digest))


def _sha256(data: memoryview) -> bytes:
    return hashlib.sha256(data).digest()


def _seal(parts: list[bytes]) -> bytes:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    parts.append(digest.digest())
    return b"".join(parts)


def _assemble(
    pool: ThreadPoolExecutor,
    b: memoryview,
    n: memoryview,
    steps: list[Step],
    *,
    level: int,
    digests: tuple[Future[bytes], Future[bytes]],
) -> bytes:
    literals = [n[s.new_offset : s.new_offset + s.length] for s in steps if s.op is Op.INSERT]
    literal = pool.submit(_literal_frame, literals, level)
    jobs: list[Future[tuple[Op, bytes]]] = []
    for s in steps:
        new_part = n[s.new_offset : s.new_offset + s.length]
        if s.op is Op.XOR:
            base_part = b[s.base_offset : s.base_offset + s.length]
            jobs.append(pool.submit(_xor_payload, base_part, new_part, s.planes, level))
        elif s.op is Op.PLANES:
            jobs.append(pool.submit(_planes_payload, new_part, s.planes, level))
    table: list[bytes] = []
    payloads: list[bytes] = []
    results = iter(jobs)
    for s in steps:
        if s.op in (Op.XOR, Op.PLANES):
            op, payload = next(results).result()
            payloads.append(payload)
            base_offset = s.base_offset if op is Op.XOR else 0
            table.append(Instruction(op, s.planes, base_offset, s.length, len(payload)).pack())
        else:
            table.append(Instruction(s.op, 0, s.base_offset, s.length, 0).pack())
    literal_frame = literal.result()
    header = Header(
        Mode.ONNX,
        len(steps),
        len(b),
        digests[0].result(),
        len(n),
        digests[1].result(),
        len(literal_frame),
        sum(len(p) for p in payloads),
    )
    return _seal([header.pack(), b"".join(table), literal_frame, *payloads])


# --- planning -------------------------------------------------------------------------


def plan(b: memoryview, n: memoryview) -> list[Step] | None:
    """The instructions that rebuild ``n`` from ``b``, or None when ONNX mode does not apply.

    ONNX mode needs both files to parse as protobuf messages and ``n`` to hold at least one
    inline tensor of ``MIN_TENSOR`` bytes; otherwise a generic patch does better.
    """
    try:
        base_tensors = [t for t in initializers(b) if t.length >= MIN_TENSOR]
        new_tensors = [t for t in initializers(n) if t.length >= MIN_TENSOR]
    except WireFormatError:
        return None
    if not new_tensors:
        return None
    match = _Matcher(b, n, base_tensors)
    steps: list[Step] = []
    done = 0  # new offset reached so far
    anchor: int | None = 0  # base offset aligned with ``done``; None once unknown
    for tensor in new_tensors:
        step = match(tensor)
        aligned = step.base_offset if step.op in (Op.COPY, Op.XOR) else None
        steps += _gap(b, n, done, tensor.offset, before=anchor, after=aligned)
        steps.append(step)
        done = tensor.offset + tensor.length
        anchor = None if aligned is None else aligned + tensor.length
    steps += _gap(b, n, done, len(n), before=anchor, after=len(b))
    steps = _chunked(_normalized(steps))
    # A model of countless tiny tensors would exceed what decoders accept by default.
    return steps if len(steps) <= DeltaLimits().max_instructions else None


class _Matcher:
    """Finds, for a tensor of the new file, the instruction that rebuilds it."""

    def __init__(self, b: memoryview, n: memoryview, base_tensors: list[InitializerSpan]) -> None:
        self._b, self._n = b, n
        self._by_key: dict[tuple[bytes, int, tuple[int, ...]], InitializerSpan] = {}
        self._by_length: dict[int, list[InitializerSpan]] = {}
        for t in base_tensors:
            self._by_key.setdefault(t.key, t)
            self._by_length.setdefault(t.length, []).append(t)
        self._digests: dict[int, bytes] = {}  # base offset -> digest, computed when needed

    def __call__(self, t: InitializerSpan) -> Step:
        data = self._n[t.offset : t.offset + t.length]
        same = self._by_key.get(t.key)
        if same is not None and same.length == t.length:
            if data == self._b[same.offset : same.offset + same.length]:
                return Step(Op.COPY, t.offset, t.length, same.offset)
            return Step(Op.XOR, t.offset, t.length, same.offset, t.element_size)
        # Renamed or moved but identical (e.g. a layer inserted before it shifts names).
        candidates = self._by_length.get(t.length, [])
        if candidates:
            digest = hashlib.blake2b(data, digest_size=16).digest()
            for c in candidates:
                if c.offset not in self._digests:
                    part = self._b[c.offset : c.offset + c.length]
                    self._digests[c.offset] = hashlib.blake2b(part, digest_size=16).digest()
                if self._digests[c.offset] == digest:
                    return Step(Op.COPY, t.offset, t.length, c.offset)
        return Step(Op.PLANES, t.offset, t.length, 0, t.element_size)


def _gap(
    b: memoryview, n: memoryview, start: int, end: int, *, before: int | None, after: int | None
) -> list[Step]:
    """Steps for the framing ``n[start:end]`` between two tensors.

    ``before`` is the base offset aligned with ``start`` (the end of the previous matched
    tensor) and ``after`` the one aligned with ``end``: unchanged framing is a run of equal
    bytes continuing from one of them.  What neither explains becomes a literal.
    """
    if start == end:
        return []
    head = 0 if before is None else _common_length(n[start:end], b[before:], reverse=False)
    tail = 0
    if after is not None and start + head < end:
        tail = _common_length(n[start + head : end], b[:after], reverse=True)
    steps: list[Step] = []
    if head and before is not None:
        steps.append(Step(Op.COPY, start, head, before))
    if end - tail > start + head:
        steps.append(Step(Op.INSERT, start + head, end - tail - start - head))
    if tail and after is not None:
        steps.append(Step(Op.COPY, end - tail, tail, after - tail))
    return steps


def _common_length(x: memoryview, y: memoryview, *, reverse: bool) -> int:
    """Length of the common prefix (or suffix) of ``x`` and ``y``."""
    import numpy as np

    limit = min(len(x), len(y))
    done, block = 0, 256
    while done < limit:
        size = min(block, limit - done)
        if reverse:
            xs, ys = (
                x[len(x) - done - size : len(x) - done],
                y[len(y) - done - size : len(y) - done],
            )
        else:
            xs, ys = x[done : done + size], y[done : done + size]
        diff = np.frombuffer(xs, np.uint8) != np.frombuffer(ys, np.uint8)
        if diff.any():
            first = int(np.argmax(diff[::-1] if reverse else diff))
            return done + first
        done += size
        block = min(block * 4, 4 << 20)
    return limit


def _normalized(steps: list[Step]) -> list[Step]:
    """Merge contiguous COPYs, demote short ones to literals, then merge literals."""
    copies: list[Step] = []
    for s in steps:
        last = copies[-1] if copies else None
        if (
            last is not None
            and s.op is Op.COPY is last.op
            and last.base_offset + last.length == s.base_offset
        ):
            copies[-1] = Step(Op.COPY, last.new_offset, last.length + s.length, last.base_offset)
        else:
            copies.append(s)
    out: list[Step] = []
    for s in copies:
        if s.op is Op.COPY and s.length < MIN_COPY:
            s = Step(Op.INSERT, s.new_offset, s.length)  # noqa: PLW2901 - demoted in place
        last = out[-1] if out else None
        if last is not None and s.op is Op.INSERT is last.op:
            out[-1] = Step(Op.INSERT, last.new_offset, last.length + s.length)
        else:
            out.append(s)
    return out


def _chunked(steps: list[Step]) -> list[Step]:
    """Split every INSERT, XOR and PLANES into pieces of at most ``CHUNK`` bytes."""
    out: list[Step] = []
    for s in steps:
        if s.op is Op.COPY or s.length <= CHUNK:
            out.append(s)
            continue
        for offset in range(0, s.length, CHUNK):
            size = min(CHUNK, s.length - offset)
            base = s.base_offset + offset if s.op is Op.XOR else 0
            out.append(Step(s.op, s.new_offset + offset, size, base, s.planes))
    return out


# --- payloads -------------------------------------------------------------------------


def _compressor(level: int) -> Callable[[npt.NDArray[np.uint8]], bytes]:
    import zstandard

    # The delta's trailer digest covers every frame, so per-frame checksums are redundant.
    cctx = zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=True)
    return lambda data: cctx.compress(data.data)


def split_planes(data: npt.NDArray[np.uint8], planes: int) -> npt.NDArray[np.uint8]:
    """Byte ``i`` of every element, for ``i`` in ``range(planes)``, one plane after another."""
    import numpy as np

    if planes == 1:
        return data
    return np.ascontiguousarray(data.reshape(-1, planes).T).reshape(-1)


def _xor_payload(base: memoryview, new: memoryview, planes: int, level: int) -> tuple[Op, bytes]:
    import numpy as np

    compress = _compressor(level)
    new_bytes = np.frombuffer(new, np.uint8)
    payload = compress(
        split_planes(np.bitwise_xor(new_bytes, np.frombuffer(base, np.uint8)), planes)
    )
    if len(payload) > _XOR_RETRY * len(new):
        plain = compress(split_planes(new_bytes, planes))
        if len(plain) < len(payload):
            return Op.PLANES, plain
    return Op.XOR, payload


def _planes_payload(new: memoryview, planes: int, level: int) -> tuple[Op, bytes]:
    import numpy as np

    return Op.PLANES, _compressor(level)(split_planes(np.frombuffer(new, np.uint8), planes))


def _literal_frame(pieces: list[memoryview], level: int) -> bytes:
    """All literals as one zstd frame, so framing shares one compression context."""
    import zstandard

    total = sum(len(p) for p in pieces)
    if total == 0:
        return b""
    params = zstandard.ZstdCompressionParameters.from_level(
        level, source_size=total, window_log=LITERAL_WINDOW_LOG
    )
    cobj = zstandard.ZstdCompressor(compression_params=params).compressobj(size=total)
    out = [cobj.compress(p) for p in pieces]
    out.append(cobj.flush())
    return b"".join(out)


def _patch_frame(b: memoryview, n: memoryview, level: int) -> bytes:
    """``n`` compressed with ``b`` as a raw-content dictionary, like ``zstd --patch-from``."""
    import zstandard

    # The window must reach back across the whole base for matches in it to count.
    window_log = max(zstandard.WINDOWLOG_MIN, min(31, (len(b) + len(n)).bit_length()))
    params = zstandard.ZstdCompressionParameters.from_level(
        level,
        source_size=len(n),
        window_log=window_log,
        enable_ldm=len(b) > (1 << 20),
    )
    dictionary = (
        zstandard.ZstdCompressionDict(b, dict_type=zstandard.DICT_TYPE_RAWCONTENT) if b else None
    )
    cctx = zstandard.ZstdCompressor(dict_data=dictionary, compression_params=params)
    return cctx.compress(n)
