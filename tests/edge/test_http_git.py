"""A device following its repository over git's smart HTTP protocol (``git
http-backend`` behind an HTTP server on 127.0.0.1), as from a Git host's https URL."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import git
from tests.edge.conftest import EdgeRig

pytestmark = pytest.mark.integration


@contextmanager
def _smart_http(projects: Path) -> Iterator[tuple[str, list[str]]]:
    """``git http-backend`` as CGI; yields the base URL and the request log."""
    log: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _cgi(self) -> None:
            path, _, query = self.path.partition("?")
            log.append(f"{self.command} {path}")
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            env = {
                "GIT_PROJECT_ROOT": str(projects),
                "GIT_HTTP_EXPORT_ALL": "1",
                "PATH_INFO": path,
                "QUERY_STRING": query,
                "REQUEST_METHOD": self.command,
                "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                "CONTENT_LENGTH": str(length),
                "HTTP_GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                "REMOTE_ADDR": "127.0.0.1",
                "PATH": "/usr/bin:/bin:/usr/local/bin",
            }
            out = subprocess.run(
                ["git", "http-backend"], input=body, env=env, capture_output=True, check=False
            ).stdout
            head, _, payload = out.partition(b"\r\n\r\n")
            status, headers = 200, []
            for line in head.decode("latin-1").split("\r\n"):
                name, _, value = line.partition(":")
                if name.lower() == "status":
                    status = int(value.split()[0])
                elif name:
                    headers.append((name, value.strip()))
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:
            self._cgi()

        def do_POST(self) -> None:
            self._cgi()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", log
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_device_follows_its_repository_over_smart_http(rig: EdgeRig) -> None:
    projects = rig.tmp / "projects"
    projects.mkdir()
    git(projects, "clone", "-q", "--bare", str(rig.root), "fleet.git")
    with _smart_http(projects) as (base, log):
        over_http = {"repository": {"url": f"{base}/fleet.git", "branch": "main"}}
        update = rig.sync(**over_http).updates["mlp"]
        assert (update.result, update.version) == ("installed", "1.0.0")
        log.clear()
        assert rig.sync(**over_http).result == "current"
        # an idle poll fetches nothing: protocol v2 asks for the capabilities, then for
        # the one ref (over git:// both go on one connection)
        assert log == ["GET /fleet.git/info/refs", "POST /fleet.git/git-upload-pack"], log
