"""An inference request's body, undone to its JSON header and binary data, with every
byte it costs charged before it is allocated (``edge_sync.serve.codec`` reads the
tensors; ``edge_sync.serve.admission`` keeps the accounts).

* A content coding (gzip, deflate) is inflated by a streaming decompressor whose output
  is bounded chunk by chunk: a bomb costs at most the cap, never its inflated size.
* The JSON header is charged at the most ``json.loads`` can allocate for it
  (:func:`json_cost`), and its nesting is measured on the bytes (:func:`depth`), before
  it is parsed.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable
from typing import Final

import orjson

from edge_sync.errors import RefusedError

__all__ = [
    "HEADER_LENGTH", "TEXT_COST", "Charge", "Inflating", "RefusedError", "depth", "inflate",
    "json_cost", "loads", "split",
]  # fmt: skip

HEADER_LENGTH: Final = "inference-header-content-length"
"""Where the JSON header of a binary-data request or response ends."""
INFLATE_CHUNK: Final = 1 << 20
"""Inflated bytes made (and charged) at a time."""
TEXT_COST: Final = 9
"""What ``json.loads`` may allocate per byte of text at least counted (strings)."""
MOST_PER_BYTE: Final = 72 + 48 + TEXT_COST
"""The most :func:`json_cost` counts for one byte (an opening bracket)."""
SMALL_HEADER: Final = 16 << 10
"""A JSON header up to this size is charged ``MOST_PER_BYTE`` a byte (at most 2 MiB),
cheaper than counting."""
_SLICE: Final = 1 << 20

Charge = Callable[[int], None]
"""Accounts for bytes about to be allocated for a request (raises RefusedError over
its cap or the server's budget)."""


def _no_charge(_: int) -> None:
    return None


def inflate(
    body: bytes | bytearray, coding: str, cap: int, charge: Charge = _no_charge
) -> bytes | bytearray:
    """The body with its content coding undone (:class:`Inflating`, at once).

    Raises:
        RefusedError: see :class:`Inflating`.
    """
    return Inflating(body, coding, cap, charge).finish()


class Inflating:
    """A body with its content coding undone (gzip, deflate: what ``tritonclient``
    sends) as far as asked, within ``cap`` bytes, each chunk charged before it is made.

    Raises:
        RefusedError: from the constructor, an unknown coding (415); from
            :meth:`until` and :meth:`finish`, too large inflated (413), or not a whole
            stream of its coding (400); and what ``charge`` raises.
    """

    def __init__(
        self, body: bytes | bytearray, coding: str, cap: int, charge: Charge = _no_charge
    ) -> None:
        coding = coding.strip().lower()
        self.coding, self.cap, self.charge = coding, cap, charge
        self.done = coding in ("", "identity")
        """Nothing (more) to inflate."""
        if not self.done and coding not in ("gzip", "x-gzip", "deflate"):
            raise RefusedError(415, f"content encoding {coding[:40]!r} is not supported")
        self.out: bytes | bytearray = body if self.done else bytearray()
        self._pending = body
        self._step = 64 << 10  # small bodies are charged little
        if not self.done:  # (a decompressor costs microseconds to make: not for plain bodies)
            self._inflater = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib, by header

    def until(self, size: int) -> bytes | bytearray:
        """At least ``size`` bytes inflated (fewer at the stream's end): all so far."""
        out = self.out
        try:
            while not self.done and len(out) < size:
                assert isinstance(out, bytearray)  # noqa: S101 - set so when coded
                room = min(self._step, self.cap + 1 - len(out))
                self._step = min(self._step * 2, INFLATE_CHUNK)
                self.charge(room)
                out += self._inflater.decompress(self._pending, room)
                self._pending = self._inflater.unconsumed_tail
                if len(out) > self.cap:
                    raise RefusedError(413, f"request body over {self.cap} bytes inflated")
                if self._inflater.eof or not self._pending:
                    self._finished()
        except zlib.error:
            raise RefusedError(400, f"the body is not {self.coding} data") from None
        return out

    def _finished(self) -> None:
        self.done = True
        if not self._inflater.eof or self._inflater.unused_data:
            raise RefusedError(400, f"the body is not one whole {self.coding} stream")

    def finish(self) -> bytes | bytearray:
        """The whole body inflated (not copied to bytes: that would hold it twice)."""
        return self.until(self.cap + 1)


def json_cost(text: bytes | bytearray) -> int:
    """An upper bound of what ``json.loads(text)`` allocates, from counts of bytes (no
    parse): every value at most one list or dict (72 bytes with its slot) or number
    (48: more digits are more text), every member a dict entry, every string its object
    and up to 9 bytes a byte of text (4 a character as a wide string, built from parts).

    Checked against ``tracemalloc`` on adversarial texts (tests/edge/test_bounds.py):
    over-counting is safe (a request refused with 413 it could have had); a text that
    costs more than this would let a small body outgrow the budget.
    """
    containers = values = quoted = 0
    for start in range(0, len(text), _SLICE):  # slices: other threads get the GIL between
        piece = text[start : start + _SLICE] if len(text) > _SLICE else text
        containers += piece.count(b"[") + piece.count(b"{")
        values += piece.count(b",")
        quoted += piece.count(b":") + piece.count(b'"')
    values += containers + 1
    return 72 * containers + 48 * values + 40 * quoted + TEXT_COST * len(text)


_STRING: Final = re.compile(rb'"[^"\\]*(?:\\[\s\S][^"\\]*)*(?:"|\\?\Z)')
"""A JSON string, or an unterminated one up to the end (so that every match attempt
succeeds and a scan is linear)."""
_NOT_BRACKETS: Final = bytes(set(range(256)) - set(b"[]{}"))


def depth(header: bytes | bytearray, limit: int) -> int:
    """How deep the JSON text ``header`` nests (exact for any prefix the JSON parser
    accepts), without parsing it; 0 when it cannot exceed ``limit``."""
    import numpy as np

    if header.count(b"[") + header.count(b"{") <= limit:
        return 0  # depth never exceeds the number of opened brackets
    brackets = _STRING.sub(b"", header).translate(None, _NOT_BRACKETS)
    # '[' and '{' have bit 1 set, ']' and '}' do not: +1 for an opening, -1 for a close
    steps = (np.frombuffer(brackets, dtype=np.uint8) & 2).astype(np.int32) - 1
    return int(np.cumsum(steps, dtype=np.int32).max()) if steps.size else 0


def split(
    body: bytes | bytearray, header_length: str | None, max_depth: int, charge: Charge = _no_charge
) -> tuple[object, memoryview]:
    """The JSON header (parsed, once its cost is charged) and the binary tensor data
    after it.

    Raises:
        RefusedError: a bad ``Inference-Header-Content-Length``, a header that nests
            too deep or is not JSON (400); and what ``charge`` raises.
    """
    cut = len(body)
    if header_length is not None:
        value = header_length.strip()
        if not (value.isascii() and value.isdigit()) or int(value) > len(body):
            raise RefusedError(
                400, f"{HEADER_LENGTH}: {header_length[:20]!r} is not a length in the body"
            )
        cut = int(value)
    header = bytes(body[:cut]) if cut < len(body) else body
    if len(header) <= SMALL_HEADER:  # charged the most a byte can cost, not counted
        charge(MOST_PER_BYTE * len(header))
    else:
        least = TEXT_COST * len(header)
        charge(least)  # a header too large for the request is refused before it is scanned
        charge(json_cost(header) - least)
    if depth(header, max_depth) > max_depth:
        raise RefusedError(400, f"the request's JSON nests deeper than {max_depth} levels")
    return loads(header), memoryview(body)[cut:]


_DIGITS: Final = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_NUMBER: Final = b"0" * 19
"""Digits enough for an integer past 64 bits (or a float written longer than needed),
once every digit reads ``0`` (a translation and a substring search: a regular
expression took 12 us of a request's ~200 on a body of 32 floats)."""


def loads(text: bytes | bytearray) -> object:
    """JSON text as Python values: by orjson (ten times faster), or by ``json`` where
    orjson refuses or reads otherwise what the standard library reads (``NaN``, a lone
    surrogate escape, an integer past 64 bits), so the answer never depends on which
    one read it.

    Raises:
        RefusedError: it is not JSON (400).
    """
    # orjson reads an integer past 64 bits as a float
    if _LONG_NUMBER not in text.translate(_DIGITS):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise RefusedError(400, "the request's JSON header is not JSON") from None
