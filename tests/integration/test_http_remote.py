"""Publishing to a non-local DVC remote: an HTTP remote on loopback, read by a device over HTTP.

The server is a small real HTTP server (GET/HEAD/PUT/POST on a folder); DVC pushes the
artifacts to it, ``publish`` uploads the TUF targets through DVC's filesystem for it,
and the device fetches them with python-tuf's HTTP fetcher.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from edge_sync.sync.trust import DeviceTrust
from tests.conftest import git

pytestmark = pytest.mark.integration


def _handler(root: Path) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _path(self) -> Path | None:
            rel = self.path.split("?", 1)[0].lstrip("/")
            target = (root / rel).resolve()
            return target if target.is_relative_to(root) else None

        def do_GET(self) -> None:
            self._send(body=True)

        def do_HEAD(self) -> None:
            self._send(body=False)

        def _send(self, *, body: bool) -> None:
            target = self._path()
            if target is None or not target.is_file():
                self.send_error(404)
                return
            data = target.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def do_PUT(self) -> None:
            target = self._path()
            if target is None:
                self.send_error(403)
                return
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                data = self._chunked()  # what fsspec's HTTP filesystem sends
            else:
                data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _chunked(self) -> bytes:
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()

        do_POST = do_PUT  # noqa: N815 - the stdlib dispatches on this name

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler


@pytest.fixture
def http_remote(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = (tmp_path / "http-store").resolve()
    root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(root))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/storage", root
    finally:
        server.shutdown()
        server.server_close()


def test_publish_to_an_http_remote_and_fetch_over_http(
    tmp_path: Path, cli, example_models: Path, http_remote: tuple[str, Path]
) -> None:
    url, served = http_remote
    root = tmp_path / "fleet"
    assert cli("init", str(root), "--remote", url, cwd=tmp_path).code == 0
    with (root / ".dvc/config").open("a") as fh:
        fh.write("    method = PUT\n")  # plain HTTP servers take uploads as PUT
    assert cli("model", "add", "mlp", cwd=root).code == 0
    for version in ("1.0.0", "1.1.0"):
        assert cli("version", "add", "mlp", version, "--artifact",
                   str(example_models / f"mlp/{version}.onnx"), cwd=root).code == 0  # fmt: skip
    assert cli("promote", "mlp", "1.1.0", "-c", "production", cwd=root).code == 0
    git(root, "add", "-A")
    git(root, "commit", "-qm", "mlp")
    r = cli("publish", "--json", cwd=root)
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert report["remote"] == f"{url}/modelreg"
    assert report["pushed"] == 2
    assert any(served.joinpath("storage/modelreg/targets/models/mlp").glob("*.1.1.0.onnx"))
    # publishing again reads the previous channels back over HTTP and changes nothing
    again = cli("publish", "--json", cwd=root)
    assert again.code == 0, again.err
    assert json.loads(again.out)["added"] == []

    DeviceTrust.provision(tmp_path / "device", (root / "trust/metadata/1.root.json").read_bytes())
    device = DeviceTrust(tmp_path / "device", root, f"{url}/modelreg")
    device.refresh()
    production = device.channels().models["mlp"]["production"]
    assert production.version == "1.1.0"
    got = device.fetch("models/mlp/1.1.0.onnx", tmp_path / "got", model="mlp", version="1.1.0")
    assert got.read_bytes() == (example_models / "mlp/1.1.0.onnx").read_bytes()
