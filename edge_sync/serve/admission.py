"""What the inference server lets in: a concurrency limit and a budget of decoded bytes
in flight, across requests (``serve.limits``; ``edge_sync.serve.app`` uses them).

A request is charged as it is read, inflated and decoded, *before* each step allocates:
the body as it arrives (its declared length at once), each inflated chunk, the JSON
header at its worst-case expansion (``oip_body.json_cost``) before it is parsed, each tensor
at its array's size, and the answer at its encoded size.  A charge over the request's own
cap is the request's fault (413); over what is left of the budget shared with every
other request, the server's state (503 with ``Retry-After``): either way nothing is
allocated for it, so no mix of clients makes the device run out of memory.

Decoding and running take one of ``max_concurrent`` slots (waiting, at most
``max_queued`` requests for ``queue_timeout`` each, else 503): a worker thread per slot,
never the event loop, which keeps answering health and metadata.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Final

from edge_sync.errors import RefusedError

__all__ = ["RETRY_AFTER_S", "Budget", "Slots", "Ticket"]

RETRY_AFTER_S: Final = 1
"""What a 503 for a full server tells the client to wait (``Retry-After``)."""
RESERVE_BYTES: Final = 64 << 10
"""What a request's account takes from the shared budget at least, at a time."""
TRIM_AFTER_BYTES: Final = 16 << 20
"""Once requests held this much together since the last time, the server gives freed
heap back to the system (``malloc_trim``) when nothing is in flight: a burst of large
requests is not kept (glibc keeps freed heap for reuse otherwise)."""


class Budget:
    """Decoded bytes held by every request in flight (thread-safe: requests are charged
    on the event loop and in worker threads)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.since_trim = 0
        """Bytes requests held since the heap was last trimmed."""
        self._lock = threading.Lock()

    def take(self, size: int) -> bool:
        """Reserve ``size`` bytes; False (nothing reserved) when over the limit."""
        with self._lock:
            if self.used + size > self.limit:
                return False
            self.used += size
            return True

    def give(self, size: int) -> bool:
        """Return ``size`` bytes; whether it is time to trim the heap (nothing in flight
        any more after a burst)."""
        with self._lock:
            self.used -= size
            self.since_trim += size
            if self.used == 0 and self.since_trim >= TRIM_AFTER_BYTES:
                self.since_trim = 0
                return True
            return False

    def ticket(self, cap: int) -> Ticket:
        """A new request's account, within ``cap`` bytes of its own."""
        return Ticket(self, cap)


class Ticket:
    """One request's account against its cap and the shared :class:`Budget` (reserved
    from it :data:`RESERVE_BYTES` at a time: a small request takes the lock twice)."""

    def __init__(self, budget: Budget, cap: int) -> None:
        self.budget, self.cap = budget, cap
        self.held = 0
        """Bytes charged."""
        self.reserved = 0
        """Bytes taken from the budget (at least ``held``)."""

    def charge(self, size: int, what: str = "decoded") -> None:
        """Account for ``size`` more bytes, before they are allocated.

        Raises:
            RefusedError: over the request's cap (413), or over what the server has
                left in flight (503, with ``Retry-After``).
        """
        held = self.held + size
        if held <= self.reserved:
            self.held = held
            return
        if held > self.cap:
            raise RefusedError(
                413, f"the request needs over {self.cap} bytes {what} (serve.limits.max_request)"
            )
        more = min(max(held - self.reserved, RESERVE_BYTES), self.cap - self.reserved)
        if not self.budget.take(more):
            raise RefusedError(
                503,
                "the server holds as many requests as its memory allows; retry later",
                retry_after=RETRY_AFTER_S,
            )
        self.reserved += more
        self.held = held

    def release(self) -> bool:
        """Give everything back; whether the heap should be trimmed now."""
        reserved, self.reserved, self.held = self.reserved, 0, 0
        return self.budget.give(reserved) if reserved else False


class Slots:
    """At most ``limit`` requests decoding or running at once; up to ``max_waiting``
    more wait for a slot, each at most ``timeout_s`` (used on the event loop only)."""

    def __init__(self, limit: int, max_waiting: int, timeout_s: float) -> None:
        self.limit, self.max_waiting, self.timeout_s = limit, max_waiting, timeout_s
        self.waiting = 0
        self._free: asyncio.Semaphore | None = None

    async def acquire(self) -> None:
        """Take a slot.

        Raises:
            RefusedError: too many requests wait already, or none came free in time
                (503, with ``Retry-After``).
        """
        if self._free is None:
            self._free = asyncio.Semaphore(self.limit)
        if not self._free.locked():
            await self._free.acquire()  # does not wait
            return
        if self.waiting >= self.max_waiting:
            raise RefusedError(503, "the server is busy; retry later", retry_after=RETRY_AFTER_S)
        self.waiting += 1
        try:
            await asyncio.wait_for(self._free.acquire(), self.timeout_s)
        except TimeoutError:
            raise RefusedError(
                503, "the server is busy; retry later", retry_after=RETRY_AFTER_S
            ) from None
        finally:
            self.waiting -= 1

    def release(self) -> None:
        """Give a slot back."""
        assert self._free is not None  # noqa: S101 - only after acquire
        self._free.release()
