"""An interrupted download is resumed (HTTP ``Range``), never used as it is."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.edge.conftest import EdgeRig

pytestmark = pytest.mark.integration


class _Remote:
    """The artifact remote over HTTP on 127.0.0.1, with ranges, that cuts chosen files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cut: dict[str, int] = {}  # path suffix -> bytes sent before the connection drops
        self.ranges: list[tuple[str, str]] = []
        remote = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = (remote.root / self.path.lstrip("/")).resolve()
                if not path.is_relative_to(remote.root) or not path.is_file():
                    self.send_error(404)
                    return
                body = path.read_bytes()
                start = 0
                asked = self.headers.get("Range")
                if asked:
                    remote.ranges.append((self.path, asked))
                    start = int(asked.removeprefix("bytes=").rstrip("-"))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                cut = next((n for s, n in remote.cut.items() if self.path.endswith(s)), None)
                if cut is not None and not asked:
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.connection.shutdown(2)  # the link drops mid-file
                    return
                self.wfile.write(body[start:])

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@contextmanager
def _serving(root: Path) -> Iterator[_Remote]:
    remote = _Remote(root)
    thread = threading.Thread(target=remote.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield remote
    finally:
        remote.server.shutdown()
        remote.server.server_close()
        thread.join()


def test_a_download_cut_midway_resumes_where_it_stopped(rig: EdgeRig) -> None:
    with _serving(rig.remote.resolve()) as remote:
        over_http: dict[str, Any] = {"artifacts": {"url": remote.url}}
        assert rig.sync(**over_http).updates["mlp"].version == "1.0.0"
        rig.release_version("1.1.0", "1.0.0")
        for delta in (rig.remote / "targets/deltas").rglob("*.delta"):
            delta.unlink()  # only the full file leads there
        size = (rig.root / "models/mlp/1.1.0.onnx").stat().st_size
        remote.cut[".1.1.0.onnx"] = size // 2
        first = rig.sync(**over_http)
        update = first.updates["mlp"]
        assert (first.result, update.result) == ("failed", "failed")
        partials = list((rig.tmp / "device/state/tmp/partial").iterdir())
        assert len(partials) == 1  # kept for the next try, never adopted as a blob
        assert rig.state().models["mlp"].serving.version == "1.0.0"
        second = rig.sync(**over_http)
        update = second.updates["mlp"]
        assert (update.result, update.version, update.method) == ("installed", "1.1.0", "full")
        assert remote.ranges[-1][1] == f"bytes={size // 2}-"
        rest = size - size // 2
        assert rest <= update.bytes_fetched < rest + 2048  # and the signed description
        assert not (rig.tmp / "device/state/tmp/partial").exists()


def test_a_partial_file_with_wrong_bytes_is_never_used(rig: EdgeRig) -> None:
    with _serving(rig.remote.resolve()) as remote:
        over_http: dict[str, Any] = {"artifacts": {"url": remote.url}}
        rig.sync(**over_http)
        rig.release_version("1.1.0", "1.0.0")
        for delta in (rig.remote / "targets/deltas").rglob("*.delta"):
            delta.unlink()
        size = (rig.root / "models/mlp/1.1.0.onnx").stat().st_size
        remote.cut[".1.1.0.onnx"] = size // 2
        rig.sync(**over_http)
        (partial,) = (rig.tmp / "device/state/tmp/partial").iterdir()
        partial.write_bytes(b"\0" * (size // 2))  # the disk (or someone) spoiled it
        report = rig.sync(**over_http)
        update = report.updates["mlp"]
        assert update.result == "failed"
        assert "differs from the signed" in (update.reason or "")
        assert not partial.exists()  # wrong bytes are not resumed from
        remote.cut.clear()
        update = rig.sync(**over_http).updates["mlp"]
        assert (update.result, update.version) == ("installed", "1.1.0")
        assert size <= update.bytes_fetched < size + 2048
