"""An HTTP server on 127.0.0.1 that a test makes slow: it trickles, stalls or redirects.

Shared by the device fetch tests (``tests/unit/test_device_fetch_limits.py``) and the
adversarial ones; it hangs up by itself, so a fetcher without limits fails its test
instead of hanging it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


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
