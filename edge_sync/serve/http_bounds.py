"""uvicorn's httptools protocol with the bounds ``edge_sync.serve.listeners`` describes: a
header size cap (431), a header timeout and a body's idle timeout (408), and a
connection cap that evicts the longest idle connection first, else the request stalled
longest (503 when none is idle or stalled).

One timer per request watches it from its first byte to its last: until the headers
end, against ``header_timeout`` from that byte; then against ``body_timeout`` from the
last read (re-armed when it fires early, not at every read).  An answer the client
stops taking (the connection's write buffer full) may wait ``body_timeout`` for it,
then the connection is cut (not closed: a close waits for the buffer to drain).

An inference request declaring a small body (:data:`DIRECT_BODY_BYTES`) whose body
came in the read of its head is answered here, from the app's ``answer_now``, with no
ASGI call (a task, a scope, receive and send: 13 % of the throughput of a small model,
``benchmarks/serving.py``); a body still coming after that read is left to the ASGI
call, which charges it to the request's budget as it arrives."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar, Final

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from edge_sync.serve.app import ANSWER_KEY, INLINE_BODY_BYTES

if TYPE_CHECKING:
    from collections.abc import Callable

    from edge_sync.serve.listeners import ConnectionLimits

__all__ = ["BoundedHttpTools"]


class _HeadTooLargeError(Exception):
    """Raised from a parser callback: the request's head is over the cap."""


class _PipelineTooDeepError(Exception):
    """Raised from a parser callback: too many requests wait behind the one answered."""


def _reply(status: bytes, reason: str) -> bytes:
    body = ('{"error":"' + reason + '"}').encode()
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n"
        + (b"retry-after: 1\r\n" if status.startswith(b"503") else b"")
        + b"\r\n" + body
    )  # fmt: skip


_TOO_LARGE: Final = _reply(b"431 Request Header Fields Too Large", "request headers too large")
_TOO_SLOW: Final = _reply(b"408 Request Timeout", "request headers not sent in time")
MAX_PIPELINED: Final = 8
"""Requests a connection may pipeline behind the one being answered: every request of
a read is parsed and queued at once (256 KiB of 31-byte requests held 14 MiB), so a
connection that sends more is cut (answers cannot go out of order)."""
STALLED_S: Final = 1.0
"""A request whose head or body has sent nothing for this long gives way to a new
connection at the cap (when none is idle)."""
DIRECT_BODY_BYTES: Final = INLINE_BODY_BYTES
"""An inference request declaring at most this much is read whole before its ASGI call
(under uvicorn's own pause threshold), so that the app may answer it at once."""
DIRECT_ANSWER_BYTES: Final = 256 << 10
"""An answer up to this size is written at once; a larger one goes out in pieces."""
_FULL: Final = _reply(b"503 Service Unavailable", "too many connections; retry later")


class BoundedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds of the module docstring (a
    subclass per listener sets :attr:`limits`)."""

    limits: ClassVar[ConnectionLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head = 0
        """Bytes of the current request's line and headers read so far (-1: in its
        body or answering it)."""
        self._head_timer: Any = None
        self._refusing: bool | None = False
        """Why the parser was stopped: True, a head too large; None, too many requests
        pipelined."""
        self._idle_since = time.monotonic()
        self._last_read = 0.0
        self._write_timer: Any = None
        self._answering: Any = None
        """The request being answered (pipelined ones wait behind it)."""
        self._now: Callable[..., Any] | None = getattr(self.app, "answer_now", None)
        self._deferred: Any = None
        """An inference request whose answer waits for the rest of its body."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections and not self._evict_idle():
            self.connections.discard(self)
            transport.write(_FULL)
            transport.close()
            return
        self._arm()

    def _evict_idle(self) -> bool:
        """Close the longest idle other connection, else the one whose request's head or
        body stalled longest (over :data:`STALLED_S`); whether there was one.

        Without the second, connections that each trickle a byte of their body within
        ``body_timeout`` held the cap for good: every new client was refused."""
        others = [c for c in self.connections if isinstance(c, BoundedHttpTools) and c is not self]
        idle = [c for c in others if c._idle()]
        if idle:
            victim = min(idle, key=lambda c: c._idle_since)
            self.connections.discard(victim)
            victim.transport.close()
            return True
        reading = [c for c in others if c._head != 0 and not c.transport.is_closing()]
        stalled = min(reading, key=lambda c: c._last_read, default=None)
        if stalled is None or self.loop.time() - stalled._last_read < STALLED_S:
            return False
        self.connections.discard(stalled)
        stalled._disarm()
        if stalled.cycle is None or not stalled.cycle.response_started:
            stalled.transport.write(_TOO_SLOW)
        stalled.transport.close()
        return True

    def _idle(self) -> bool:
        return self._head == 0 and (self.cycle is None or self.cycle.response_complete)

    def _arm(self) -> None:
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _too_slow(self) -> None:
        self._head_timer = None
        if self._head < 0:  # in the body: only a pause between reads counts
            if self.flow.read_paused:  # the server's pause (pipelining, a full buffer)
                self._last_read = self.loop.time()
            idle = self.loop.time() - self._last_read
            if idle < self.limits.body_timeout_s:
                self._head_timer = self.loop.call_later(
                    self.limits.body_timeout_s - idle, self._too_slow
                )
                return
        if not self.transport.is_closing():
            if self.cycle is None or not self.cycle.response_started:
                self.transport.write(_TOO_SLOW)
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        if self._head >= 0:
            self._head += len(data)
            if self._head_timer is None:
                self._arm()  # a new request's first bytes
        super().data_received(data)
        if self._deferred is not None:
            # its body did not come in the read of its head: the ASGI call reads the
            # rest, charging it to the request's budget as it comes (a body held here
            # until complete would be outside it)
            cycle, self._deferred = self._deferred, None
            super()._start_asgi_task(cycle, self.app)
        if self._head > self.limits.max_header_bytes and not self.transport.is_closing():
            self._refuse_head()  # the head is still coming: not parsed any further

    def on_headers_complete(self) -> None:
        if len(self.pipeline) >= MAX_PIPELINED:
            self._refusing = None
            raise _PipelineTooDeepError
        if self._head > self.limits.max_header_bytes:  # a head in one large read
            size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
            if size > self.limits.max_header_bytes:
                self._refusing = True
                raise _HeadTooLargeError
        self._head = -1  # the timer goes on, for the body (until the message is complete)
        timer, body_s = self._head_timer, self.limits.body_timeout_s
        if timer is None or timer.when() > self.loop.time() + body_s:
            # none: a request pipelined in the read that ended the one before (whose
            # end disarmed the timer); else it would fire later than a body may stall
            if timer is not None:
                timer.cancel()
            self._last_read = self.loop.time()
            self._head_timer = self.loop.call_later(body_s, self._too_slow)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head = 0  # the next request's head, pipelined or after keep-alive
        self._disarm()
        cycle, self._deferred = self._deferred, None
        if cycle is not None and not self._answer_now(cycle):
            super()._start_asgi_task(cycle, self.app)

    def on_response_complete(self) -> None:
        self._idle_since = time.monotonic()
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        if self._refusing is None:  # the parser stopped on _PipelineTooDeepError
            self._cut()
        elif self._refusing:  # the parser stopped on _HeadTooLargeError
            self._refuse_head()
        else:
            super().send_400_response(msg)

    def _refuse_head(self) -> None:
        self._disarm()
        self.transport.write(_TOO_LARGE)
        self.transport.close()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.limits.body_timeout_s, self._cut)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stop_write_timer()

    def _stop_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._answering = cycle  # uvicorn's own self.cycle is the last request parsed
        if self._now is not None and app is self.app and self._answerable(cycle):
            if cycle.more_body:
                self._deferred = cycle  # answered here if its body is in this read
                return
            if self._answer_now(cycle):
                return
        super()._start_asgi_task(cycle, app)

    def _answerable(self, cycle: Any) -> bool:
        """Whether ``cycle`` is a request the app may answer at once
        (``answer_now``): an inference POST declaring a body small enough to be read
        whole without pausing the connection (no 100-continue awaited)."""
        scope = cycle.scope
        if scope["method"] != "POST" or not scope["path"].endswith("/infer"):
            return False
        if cycle.waiting_for_100_continue or self.flow.write_paused:
            return False
        for name, value in scope["headers"]:
            if name == b"content-length":
                return value.isdigit() and int(value) <= DIRECT_BODY_BYTES
        return False

    def _answer_now(self, cycle: Any) -> bool:
        """Answer ``cycle`` (its body read) from the app's ``answer_now``, written here
        when small; whether it was answered (else its ASGI call runs: with the answer
        in its scope when one was computed but is large, to be sent in pieces)."""
        scope, now = cycle.scope, self._now
        if now is None:
            return False
        try:
            response = now(scope["path"], scope["headers"], cycle.body)
        except Exception:  # noqa: BLE001 - the ASGI call meets it again, answers 500, logs it
            return False
        if response is None:
            return False
        body = getattr(response, "body", None)
        paced = getattr(response, "background", None) is not None  # gives back after sending
        if body is None or paced or len(body) > DIRECT_ANSWER_BYTES or self.flow.write_paused:
            scope[ANSWER_KEY] = response
            return False
        content = [STATUS_LINE[response.status_code]]
        for name, value in (*self.server_state.default_headers, *response.raw_headers):
            content += (name, b": ", value, b"\r\n")
        if not cycle.keep_alive:
            content.append(b"connection: close\r\n")
        content += (b"\r\n", body)
        cycle.response_started = cycle.response_complete = True
        self.transport.write(b"".join(content))
        if not cycle.keep_alive:
            self.transport.close()
        cycle.on_response()
        return True

    def _cut(self) -> None:
        """Drop the connection and whatever it holds at once, its requests told the
        client left (uvicorn tells only the last one parsed: the one being answered
        would write to the dropped transport)."""
        self._disarm()
        self._stop_write_timer()
        for cycle in (self._answering, self.cycle, *(c for c, _ in self.pipeline)):
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        self.pipeline.clear()
        self._deferred = None
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._deferred = None
        self._disarm()
        self._stop_write_timer()
        answering = self._answering
        if answering is not None and not answering.response_complete:
            answering.disconnected = True  # not only self.cycle, a pipelined one
            answering.message_event.set()
        super().connection_lost(exc)
