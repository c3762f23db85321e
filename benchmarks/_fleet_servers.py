"""The fleet simulation's loopback servers, each run in a process of its own so that its
CPU time is its own (read from ``/proc``) and the simulated devices do not share its GIL.

* ``python -m benchmarks._fleet_servers http ROOT``: a threaded static file server over
  ``ROOT`` (the artifact remote), answering ``GET`` and ``HEAD`` with ``ETag`` and
  ``Last-Modified``, ``304`` to ``If-None-Match`` / ``If-Modified-Since``, and ``Range``
  (``bytes=N-`` and ``bytes=N-M``; devices resume downloads with it).  It counts requests,
  bytes in (request line and headers) and out (status line, headers, body), and keeps
  the start and end of every download of a model file (``targets/models/`` or
  ``targets/deltas/``), from which the benchmark reads concurrent downloads.  With
  ``--rate``, model files are sent at that many bytes per second per connection: a
  device's link, so that a download lasts as it would in the field and not the
  microseconds of loopback (metadata, a few hundred bytes to a few KB, goes at once).
* ``python -m benchmarks._fleet_servers proxy PORT``: a TCP proxy in front of ``git
  daemon`` on ``PORT`` that counts connections (one per git request) and bytes both ways
  (git daemon itself counts nothing), a thread per connection.

Each writes ``{"port": ..., "control": ...}`` to ``--ready FILE`` once it listens, and
answers every connection to its control port with its counters as one JSON document
(then closes it).  SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import email.utils
import io
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

_DOWNLOADS: Final = re.compile(r"(^|/)targets/(models|deltas)/")
_RANGE: Final = re.compile(r"^bytes=(\d+)-(\d*)$")
_CHUNK: Final = 16 << 10
_TICK_S: Final = 0.05
"""Granularity of the emulated link: a body goes out in pieces of ``rate * _TICK_S``."""


def cpu_seconds(pid: int) -> float:
    """CPU seconds a process used, with its reaped children (utime + stime + cutime +
    cstime of ``/proc/PID/stat``).

    Raises:
        OSError: no such process, or no ``/proc``.
    """
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = sum(int(f) for f in fields[11:15])  # fields 14-17, counted from the state (3)
    return ticks / os.sysconf("SC_CLK_TCK")


def read_control(port: int, timeout_s: float = 10.0) -> dict[str, Any]:
    """The counters a server of this module reports on its control ``port``.

    Raises:
        OSError: the server does not answer.
        ValueError: the answer is not JSON.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as conn:
        chunks = []
        while data := conn.recv(1 << 20):
            chunks.append(data)
    result: dict[str, Any] = json.loads(b"".join(chunks))
    return result


class _Counters:
    """Thread-safe totals of one server."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, int] = {}
        self.in_flight = 0
        self.downloads: list[tuple[float, float]] = []

    def add(self, **amounts: int) -> None:
        with self.lock:
            for key, n in amounts.items():
                self.values[key] = self.values.get(key, 0) + n

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                **self.values,
                "in_flight": self.in_flight,
                "downloads": list(self.downloads),
                "time": time.time(),
            }


def _serve_control(counters: Callable[[], dict[str, Any]]) -> int:
    """A thread answering each connection with ``counters()`` as JSON; its port."""
    server = socket.create_server(("127.0.0.1", 0), backlog=64)

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                conn.sendall(json.dumps(counters()).encode())

    threading.Thread(target=loop, name="control", daemon=True).start()
    port: int = server.getsockname()[1]
    return port


class _CountingWriter:
    """The response stream of one connection: counts bytes, and paces bodies."""

    def __init__(self, raw: io.BufferedIOBase, counters: _Counters) -> None:
        self.raw = raw
        self.counters = counters

    def write(self, data: bytes) -> int:
        self.raw.write(data)
        self.counters.add(bytes_out=len(data))
        return len(data)

    def flush(self) -> None:
        self.raw.flush()

    @property
    def closed(self) -> bool:
        return self.raw.closed

    def close(self) -> None:
        self.raw.close()


def _handler(root: Path, rate: int | None, counters: _Counters) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "fleet-sim"
        sys_version = ""

        def setup(self) -> None:
            super().setup()
            self.wfile = _CountingWriter(self.wfile, counters)  # type: ignore[assignment]

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, *, body: bool) -> None:
            head = len(self.requestline) + 2 + len(str(self.headers))
            counters.add(requests=1, bytes_in=head)
            path = self.path.split("?", 1)[0]
            local = (root / path.lstrip("/")).resolve()
            if not local.is_relative_to(root) or not local.is_file():
                counters.add(status_404=1)
                self.send_error(404)
                return
            stat = local.stat()
            etag = f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'
            modified = email.utils.formatdate(stat.st_mtime, usegmt=True)
            if self._not_modified(etag, stat.st_mtime):
                counters.add(status_304=1)
                self.send_response(304)
                self.send_header("ETag", etag)
                self.send_header("Last-Modified", modified)
                self.end_headers()
                return
            start, end = 0, stat.st_size - 1
            match = _RANGE.match(self.headers.get("Range", ""))
            if match and int(match.group(1)) < stat.st_size:
                start = int(match.group(1))
                end = min(int(match.group(2)), end) if match.group(2) else end
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{stat.st_size}")
                counters.add(status_206=1)
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", modified)
            self.end_headers()
            if body:
                self._send(local, start, end - start + 1, download=bool(_DOWNLOADS.search(path)))

        def _not_modified(self, etag: str, mtime: float) -> bool:
            match = self.headers.get("If-None-Match")
            if match is not None:
                return etag in {t.strip() for t in match.split(",")} or match.strip() == "*"
            since = self.headers.get("If-Modified-Since")
            if since is None:
                return False
            with contextlib.suppress(TypeError, ValueError, IndexError):
                return int(mtime) <= email.utils.parsedate_to_datetime(since).timestamp()
            return False

        def _send(self, local: Path, offset: int, length: int, *, download: bool) -> None:
            began = time.time()
            if download:
                with counters.lock:
                    counters.in_flight += 1
                    counters.values["downloads_peak"] = max(
                        counters.values.get("downloads_peak", 0), counters.in_flight
                    )
            try:
                with local.open("rb") as fh:
                    fh.seek(offset)
                    paced = rate if download else None
                    piece = _CHUNK if paced is None else max(1, int(paced * _TICK_S))
                    while length > 0 and (data := fh.read(min(piece, length))):
                        tick = time.monotonic()
                        self.wfile.write(data)
                        length -= len(data)
                        if paced is not None and length > 0:
                            time.sleep(max(0.0, len(data) / paced - (time.monotonic() - tick)))
            except OSError:
                pass  # the device hung up
            finally:
                if download:
                    with counters.lock:
                        counters.in_flight -= 1
                        counters.downloads.append((round(began, 4), round(time.time(), 4)))

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per request of a thousand devices is noise

    return Handler


class _FleetHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 4096
    """The listen backlog: a thousand devices may connect in the same instant."""


def serve_http(root: Path, rate: int | None, ready: Path) -> None:
    """Serve ``root`` until SIGTERM (see the module doc)."""
    counters = _Counters()
    server = _FleetHTTPServer(("127.0.0.1", 0), _handler(root.resolve(), rate, counters))
    control = _serve_control(counters.snapshot)
    _announce(ready, server.server_address[1], control)
    _stop_on_term(server.shutdown)
    server.serve_forever(poll_interval=0.1)


def serve_proxy(target: int, ready: Path) -> None:
    """Relay 127.0.0.1:<new port> to 127.0.0.1:``target`` until SIGTERM, counting.

    A thread per connection: connecting to ``git daemon`` may wait seconds in a herd
    (its listen backlog is 5: a dropped SYN is sent again after 1 s, 3 s, ...), and that
    wait must hold up only the device that waits, as it would without the proxy.
    """
    counters = _Counters()
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    control = _serve_control(counters.snapshot)
    _announce(ready, listener.getsockname()[1], control)
    _stop_on_term(lambda: listener.shutdown(socket.SHUT_RDWR))  # wakes accept()

    def pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                counters.add(bytes=len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)  # the other way may still be talking

    def relay(client: socket.socket) -> None:
        with client:
            try:
                upstream = socket.create_connection(("127.0.0.1", target))
            except OSError:
                return
            with upstream:
                back = threading.Thread(target=pipe, args=(upstream, client), daemon=True)
                back.start()
                pipe(client, upstream)
                back.join()

    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return  # closed by SIGTERM
        counters.add(connections=1)
        threading.Thread(target=relay, args=(client,), daemon=True).start()


def _announce(ready: Path, port: int, control: int) -> None:
    tmp = ready.with_suffix(".tmp")
    tmp.write_text(json.dumps({"port": port, "control": control, "pid": os.getpid()}))
    tmp.replace(ready)


def _stop_on_term(stop: Callable[[], None]) -> None:
    def on_term(_sig: int, _frame: object) -> None:
        threading.Thread(target=stop, daemon=True).start()  # shutdown() blocks: not here

    signal.signal(signal.SIGTERM, on_term)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one server (see the module doc)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks._fleet_servers")
    sub = parser.add_subparsers(dest="kind", required=True)
    http = sub.add_parser("http")
    http.add_argument("root", type=Path)
    http.add_argument("--rate", type=int, default=None, help="bytes/s per connection")
    http.add_argument("--ready", type=Path, required=True)
    proxy = sub.add_parser("proxy")
    proxy.add_argument("target", type=int)
    proxy.add_argument("--ready", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.kind == "http":
        serve_http(args.root, args.rate, args.ready)
    else:
        serve_proxy(args.target, args.ready)
    return 0


if __name__ == "__main__":
    sys.exit(main())
