"""HTTP servers on 127.0.0.1 for the device's tests.

:class:`TrickleServer` is one a test makes slow: it trickles, stalls or redirects.
Shared by the device fetch tests (``tests/unit/test_device_fetch_limits.py``) and the
adversarial ones; it hangs up by itself, so a fetcher without limits fails its test
instead of hanging it.

:class:`StaticServer` serves a folder as a plain web server or CDN does, with ``ETag``
and ``Last-Modified`` and ``304 Not Modified`` answers to conditional requests, and
counts every request and the bytes it sent (what an idle device poll costs).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import socketserver
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO, TypeVar


@dataclass(frozen=True)
class Trickle:
    """How the server sends one response slowly.

    Attributes:
        interval_s: wait before each piece.
        piece: bytes per piece.
        headers: trickle the status line and headers too (else they go at once).
        give_up_s: close the connection after this long, so that a device without
            time limits fails its test instead of hanging it.
    """

    interval_s: float = 5.0
    piece: int = 1
    headers: bool = False
    give_up_s: float = 10.0


class TrickleServer:
    """A real HTTP server on 127.0.0.1 serving ``root``; some paths slowly.

    ``slow`` maps a suffix of the request path to a :class:`Trickle`; ``redirects``
    maps a path to a ``Location``; ``files`` maps a path to a body served at once.
    Use as a context manager: on exit every trickling handler stops at its next wait.
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = root
        self.slow: dict[str, Trickle] = {}
        self.redirects: dict[str, str] = {}
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def url(self, path: str = "") -> str:
        """The URL of ``path`` on this server."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/{path}"

    def __enter__(self) -> TrickleServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _body(self, path: str) -> bytes | None:
        if path in self.files:
            return self.files[path]
        if self.root is None:
            return None
        target = (self.root / path.lstrip("/")).resolve()
        return (
            target.read_bytes() if target.is_relative_to(self.root) and target.is_file() else None
        )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                server.requests.append(path)
                if path in server.redirects:
                    self.send_response(302)
                    self.send_header("Location", server.redirects[path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = server._body(path)
                if body is None:
                    self.send_error(404)
                    return
                slow = next((t for s, t in server.slow.items() if path.endswith(s)), None)
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                try:
                    if slow is None:
                        self.wfile.write(head + body)
                    elif slow.headers:
                        self._trickle(head + body, slow)
                    else:
                        self.wfile.write(head)
                        self._trickle(body, slow)
                except (BrokenPipeError, ConnectionResetError):
                    return  # the device gave up: what the tests want

            def _trickle(self, data: bytes, slow: Trickle) -> None:
                give_up = time.monotonic() + slow.give_up_s
                for start in range(0, len(data), slow.piece):
                    wait = min(slow.interval_s, give_up - time.monotonic())
                    if server._stop.wait(max(wait, 0)) or time.monotonic() >= give_up:
                        return
                    self.wfile.write(data[start : start + slow.piece])

            def log_message(self, format: str, *args: object) -> None:
                return

        return Handler


@dataclass(frozen=True)
class Served:
    """One request a :class:`StaticServer` answered."""

    method: str
    path: str
    status: int
    sent: int
    """Bytes sent for it: status line, headers and body."""
    conditional: bool
    asked: int = 0
    """Bytes of the request: request line and headers."""


class _Counted(io.RawIOBase):
    def __init__(self, inner: BinaryIO) -> None:
        super().__init__()
        self._inner = inner
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = self._inner.write(data)
        self.count += len(data)
        return n if n is not None else len(data)

    def flush(self) -> None:
        self._inner.flush()


class StaticServer:
    """A real HTTP server on 127.0.0.1 serving the files under ``root``.

    Answers GET and HEAD with a strong ``ETag`` (the SHA-256 of the bytes) and
    ``Last-Modified`` (the file's mtime), and ``304`` when ``If-None-Match`` matches
    (else when ``If-Modified-Since`` is not older than the file).  With ``etags`` or
    ``last_modified`` off it leaves those out, as some servers do.  :attr:`served`
    lists every answer, with the bytes sent.  Use as a context manager.
    """

    def __init__(self, root: Path, *, etags: bool = True, last_modified: bool = True) -> None:
        self.root = root.resolve()
        self.etags = etags
        self.last_modified = last_modified
        self._served: list[Served] = []
        self._busy = 0
        self._idle = threading.Condition()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def url(self, path: str = "") -> str:
        """The URL of ``path`` on this server."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/{path}"

    def __enter__(self) -> StaticServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def served(self) -> list[Served]:
        """Every answer so far (once the handlers at work are done: a client may have
        read its answer before the handler has counted it)."""
        with self._idle:
            self._idle.wait_for(lambda: self._busy == 0, timeout=10)
            return list(self._served)

    def clear(self) -> None:
        """Forget the requests counted so far."""
        with self._idle:
            self._idle.wait_for(lambda: self._busy == 0, timeout=10)
            self._served.clear()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def setup(self) -> None:
                with server._idle:
                    server._busy += 1
                super().setup()
                self.counted = _Counted(self.wfile)  # type: ignore[arg-type]
                self.wfile = self.counted  # type: ignore[assignment]

            def finish(self) -> None:
                try:
                    super().finish()
                finally:
                    with server._idle:
                        server._busy -= 1
                        server._idle.notify_all()

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, *, body: bool) -> None:
                path = self.path.split("?", 1)[0]
                target = (server.root / path.lstrip("/")).resolve()
                conditional = "If-None-Match" in self.headers or (
                    "If-Modified-Since" in self.headers
                )
                start = self.counted.count
                if not target.is_relative_to(server.root) or not target.is_file():
                    self.send_error(404)
                    status = 404
                else:
                    status = self._file(target, body=body)
                self.wfile.flush()
                with server._idle:
                    line = getattr(self, "raw_requestline", b"")  # set by the base class
                    asked = len(line) + len(self.headers.as_bytes())
                    sent = self.counted.count - start
                    server._served.append(
                        Served(self.command, path, status, sent, conditional, asked)
                    )

            def _file(self, target: Path, *, body: bool) -> int:
                data = target.read_bytes()
                etag = f'"{hashlib.sha256(data).hexdigest()[:32]}"'
                mtime = int(target.stat().st_mtime)
                headers = []
                if server.etags:
                    headers.append(("ETag", etag))
                if server.last_modified:
                    headers.append(("Last-Modified", formatdate(mtime, usegmt=True)))
                if self._not_modified(etag, mtime):
                    self.send_response(304)
                    for name, value in headers:
                        self.send_header(name, value)
                    self.end_headers()
                    return 304
                self.send_response(200)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)
                return 200

            def _not_modified(self, etag: str, mtime: int) -> bool:
                match = self.headers.get("If-None-Match")
                if match is not None:
                    return server.etags and etag in [t.strip() for t in match.split(",")]
                since = self.headers.get("If-Modified-Since")
                if since is None or not server.last_modified:
                    return False
                try:
                    return mtime <= parsedate_to_datetime(since).timestamp()
                except (TypeError, ValueError):
                    return False

            def log_message(self, format: str, *args: object) -> None:
                return

        return Handler


S = TypeVar("S", bound=socketserver.BaseServer)


@contextlib.contextmanager
def running(server: S) -> Iterator[S]:
    """``server`` answering in a thread of its own; shut down and closed on exit."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
