"""One download under a time budget: the budget's decisions, an HTTP opener whose every
read runs under it, same-origin redirects, and the chunked body reader.

What the fetchers (``edge_sync.sync.fetch``), the S3 transport (``edge_sync.sync.s3``) and
the conditional reads (``edge_sync.sync.probe``) share; it imports none of them.  A
:class:`TransferBudget` is built from :class:`~edge_sync.sync.limits.TrustLimits`: an
overall deadline per file, a minimum average rate after a grace period, and a longest
wait for any one read.  Over HTTP the budget sets the socket timeout before each read of
the connection (status line and headers included), so a server that trickles one byte
every few seconds is cut off when a limit is passed, not when it stops.  The HTTP side
is the standard library's client with its connection classes bound to the budget:
urllib3, which python-tuf's own fetcher uses, times single reads but not a whole
transfer.  A read waits for data in steps of at most :data:`CANCEL_POLL_S` when the
download can be cancelled (a stopping daemon), and redirects are followed only to the
request's own scheme, host and port (:class:`SameOriginRedirects`).
"""

from __future__ import annotations

import functools
import http.client
import io
import math
import select
import socket
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, BinaryIO, Final
from urllib.parse import urlparse

from tuf.api import exceptions as tuf_errors

from edge_sync.sync.limits import TrustLimits

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = [
    "CANCEL_POLL_S",
    "SameOriginRedirects",
    "TransferBudget",
    "guarded_opener",
    "http_chunks",
    "no_answer_reason",
    "tls_context",
]


CANCEL_POLL_S: Final = 0.25
"""Longest wait for data between two looks at a download's ``cancelled``."""


class TransferBudget:
    """The time one download may still take: the slow-retrieval decisions, no I/O.

    The clock starts at construction (before connecting).  Readers call :meth:`wait_s`
    before a read that may block, :meth:`add` after it, and :meth:`stalled` when the
    wait ran out; each raises ``SlowRetrievalError`` once a limit is passed, and a
    ``DownloadError`` once ``cancelled`` answers True.
    """

    def __init__(
        self,
        limits: TrustLimits,
        clock: Callable[[], float] = time.monotonic,
        *,
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        """Start the clock of one download under ``limits`` (``clock`` in seconds);
        ``cancelled`` is asked at least every :data:`CANCEL_POLL_S` while it waits."""
        self._limits = limits
        self._clock = clock
        self._start = clock()
        self._cancelled = cancelled
        self.received = 0

    @property
    def poll_s(self) -> float:
        """Longest single wait for data: short when someone may cancel the download."""
        return CANCEL_POLL_S if self._cancelled is not None else math.inf

    def violation(self) -> str | None:
        """Why the download must stop now, or None while it is within its limits."""
        limits, elapsed = self._limits, self._clock() - self._start
        if elapsed > limits.download_deadline_s:
            return f"not done after {limits.download_deadline_s:g} s ({self.received} bytes)"
        if elapsed > limits.rate_grace_s and self.received < limits.min_bytes_per_s * elapsed:
            return (
                f"slower than {limits.min_bytes_per_s} bytes/s "
                f"({self.received} bytes in {elapsed:.1f} s)"
            )
        return None

    def wait_s(self) -> float:
        """How long the next read may block: until the first limit it would reach.

        That is the read timeout, the deadline, or the moment the average rate falls
        below the minimum if no byte arrives, whichever comes first.

        Raises:
            SlowRetrievalError: a limit is already passed.
            DownloadError: the download was cancelled.
        """
        self.check()
        limits, elapsed = self._limits, self._clock() - self._start
        rate_until = math.inf
        if limits.min_bytes_per_s > 0:
            rate_until = max(limits.rate_grace_s, self.received / limits.min_bytes_per_s)
        ends = min(limits.download_deadline_s, rate_until) - elapsed
        # A zero timeout would make the socket non-blocking; the floor only rounds up.
        return max(min(limits.read_timeout_s, ends), 0.001)

    def add(self, n: int) -> None:
        """Count ``n`` bytes received.

        Raises:
            SlowRetrievalError: a limit is passed.
            DownloadError: the download was cancelled.
        """
        self.received += n
        self.check()

    def check(self) -> None:
        """Raise when a limit is passed.

        Raises:
            SlowRetrievalError: a limit is passed.
            DownloadError: the download was cancelled.
        """
        if self._cancelled is not None and self._cancelled():
            raise tuf_errors.DownloadError(
                f"stopped after {self.received} bytes: the daemon is stopping"
            )
        if (why := self.violation()) is not None:
            raise tuf_errors.SlowRetrievalError(why)

    def stalled(self) -> tuf_errors.SlowRetrievalError:
        """The error for a read whose wait (:meth:`wait_s`) ran out."""
        why = self.violation() or f"no data for {self._limits.read_timeout_s:g} s"
        return tuf_errors.SlowRetrievalError(why)


class _GuardedReader(io.RawIOBase):
    """The socket under an HTTP response: no read blocks longer than the budget allows."""

    def __init__(self, sock: socket.socket, budget: TransferBudget) -> None:
        super().__init__()
        self._sock = sock
        # A SocketIO, as http.client's own makefile: it keeps the descriptor open after
        # urllib closes the connection object, until the response is closed.
        self._raw = sock.makefile("rb", buffering=0)
        self._budget = budget

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        budget = self._budget
        # Wait in steps no longer than budget.poll_s, so that a stop is seen between
        # them (a timed-out socket file cannot be read again: the wait is a select).
        while True:
            wait = budget.wait_s()
            step = min(wait, budget.poll_s)
            if self._readable(step):
                break
            if step >= wait:
                raise budget.stalled()
        self._sock.settimeout(budget.wait_s())
        try:
            n = self._raw.readinto(buffer) or 0
        except TimeoutError:
            raise budget.stalled() from None
        budget.add(n)
        return n

    def _readable(self, timeout: float) -> bool:
        if isinstance(self._sock, ssl.SSLSocket) and self._sock.pending():
            return True  # decrypted bytes already wait in the TLS layer
        # poll(), not select(): select() refuses descriptors past 1024, which a daemon
        # serving many connections (or a fleet simulation's process) has
        poller = select.poll()
        poller.register(self._sock, select.POLLIN | select.POLLPRI)
        return bool(poller.poll(max(0.0, timeout) * 1000))

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def _guarded_response(budget: TransferBudget) -> type[http.client.HTTPResponse]:
    class _Response(http.client.HTTPResponse):
        def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
            super().__init__(sock, *args, **kwargs)
            self.fp.close()
            self.fp = io.BufferedReader(_GuardedReader(sock, budget))

    return _Response


class _GuardedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, *, budget: TransferBudget, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self.response_class = _guarded_response(budget)


class _GuardedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, *, budget: TransferBudget, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self.response_class = _guarded_response(budget)


class _GuardedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, budget: TransferBudget) -> None:
        super().__init__()
        self._budget = budget

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_GuardedHTTPConnection, budget=self._budget), req)


def no_answer_reason(error: BaseException) -> str:
    """Why a request got no HTTP answer, in words an operator acts on: a refused
    connection (nothing listens there), a timeout (something does, slowly), a host
    that does not resolve, or the system's words for the rest (never the URL: it may
    carry credentials or a signature)."""
    reason = getattr(error, "reason", error)
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    if isinstance(reason, TimeoutError | socket.timeout):
        return "no answer in time"
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve the host ({reason.strerror or reason})"
    if isinstance(reason, ConnectionResetError):
        return "connection reset by the server"
    if isinstance(reason, ssl.SSLError):
        return f"TLS failed ({reason.reason or type(reason).__name__})"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return f"no answer ({type(reason).__name__})"


@functools.cache
def tls_context() -> ssl.SSLContext:
    # Made once per process: loading the system's CA certificates costs ~20 ms, most of
    # an idle poll's CPU when it was made per request (and for http:// URLs as well).
    return ssl.create_default_context()


class _GuardedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, budget: TransferBudget) -> None:
        super().__init__(context=tls_context())
        self._budget = budget

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = functools.partial(_GuardedHTTPSConnection, budget=self._budget)
        return self.do_open(connection, req, context=tls_context())


def _origin(url: str) -> tuple[str, str, int | None]:
    """Scheme, host and port of ``url`` (the port a scheme implies when none is given)."""
    parsed = urlparse(url)
    try:
        port = parsed.port
    except ValueError:
        port = -1  # not a port: no origin matches it
    scheme = parsed.scheme.lower()
    implied = {"http": 80, "https": 443}.get(scheme)
    return scheme, (parsed.hostname or "").lower(), port if port is not None else implied


def _shown_origin(url: str) -> str:
    """``scheme://host:port`` of ``url`` for a message (never a path, query or password)."""
    scheme, host, port = _origin(url)
    return f"{scheme}://{host}" + (f":{port}" if port is not None else "")


class SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the same scheme, host and port as the request.

    The remote is named by the device's configuration; a redirect elsewhere would send
    the device (and any credentials in the URL or proxy) to a host nobody configured,
    or from ``https`` down to ``http``.  Verification would catch wrong bytes, but not
    the request itself, nor a slow host's hold on the sync.

    Attributes:
        count: redirects followed or refused (each is one more request).
    """

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def redirect_request(  # noqa: PLR0917 - urllib's signature
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        """The request to follow ``newurl`` with, when it has the request's origin.

        Raises:
            DownloadError: ``newurl`` is on another scheme, host or port.
        """
        self.refuse(fp, headers)
        self.count += 1
        target = urllib.parse.urljoin(req.full_url, newurl)
        if _origin(target) != _origin(req.full_url):
            fp.close()  # the redirect's own response, not read any further
            raise tuf_errors.DownloadError(
                f"refused a redirect ({code}) from {_shown_origin(req.full_url)} to "
                f"another origin, {_shown_origin(target)}: a remote's redirects must stay "
                "on its own scheme, host and port"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)

    def refuse(self, fp: Any, headers: Any) -> None:
        """Where a transport looks at a redirect first (its response ``fp`` and its
        ``headers``): raise to refuse it, after closing ``fp``.  Refuses nothing."""


def guarded_opener(
    budget: TransferBudget, redirects: urllib.request.HTTPRedirectHandler | None = None
) -> urllib.request.OpenerDirector:
    """An opener for HTTP(S) only (proxies from the environment, redirects followed by
    ``redirects``, by default only to the same origin: :class:`SameOriginRedirects`)
    whose every read runs under ``budget``; ``budget.received`` then counts every byte
    received, status lines and headers included."""
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(),
        _GuardedHTTPHandler(budget),
        _GuardedHTTPSHandler(budget),
        redirects or SameOriginRedirects(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
        urllib.request.UnknownHandler(),
    ):
        opener.add_handler(handler)
    return opener


def http_chunks(response: BinaryIO, chunk_size: int) -> Iterator[bytes]:
    with response:
        try:
            # read1: what has arrived (up to chunk_size), so that a slow body still
            # yields often (a stopping daemon looks between chunks)
            while chunk := response.read1(chunk_size):  # type: ignore[attr-defined]
                yield chunk
        except (OSError, http.client.HTTPException) as e:
            # Raised inside the Updater's loop, where fetch() no longer wraps errors.
            raise tuf_errors.DownloadError(f"connection failed: {e!r}") from e
