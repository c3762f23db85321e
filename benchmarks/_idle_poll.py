"""The edge daemon's idle poll, counted through a TCP proxy (``benchmarks.edge_update``):
one poll of a current checkout against a ``git daemon`` on 127.0.0.1, its round trips
(connections) and bytes both ways."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from contextlib import suppress
from pathlib import Path

from benchmarks._util import BenchmarkError, git_daemon, run_checked

__all__ = ["idle_poll"]


class _CountingProxy:
    """A TCP proxy on 127.0.0.1 that counts connections and bytes to one port."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self.bytes = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    self.bytes += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            src.close()  # each socket is read by one pipe, which closes it

    def reset(self) -> None:
        with self._lock:
            self.connections = self.bytes = 0

    def close(self) -> None:
        """Stop accepting (the pipes close their sockets as their peers hang up)."""
        self.server.close()


def idle_poll(work: Path, repo: Path) -> dict[str, int]:
    """Connections and bytes of one idle poll (the checkout already current)."""
    from edge_sync.sync.watcher import GitWatcher

    served = work / "served"
    shutil.rmtree(served, ignore_errors=True)
    served.mkdir()
    run_checked(["git", "clone", "-q", "--bare", str(repo), str(served / "fleet.git")],
                cwd=work, env={})  # fmt: skip
    with git_daemon(served) as url:
        proxy = _CountingProxy(int(url.rsplit(":", 1)[1]))
        try:
            watcher = GitWatcher(
                f"git://127.0.0.1:{proxy.port}/fleet.git", "main", work / "idle-co"
            )
            watcher.sync()  # the first poll fetches
            time.sleep(0.2)
            proxy.reset()
            head = watcher.sync()
            time.sleep(0.2)  # let the pipes count the last bytes
            if head.changed:
                raise BenchmarkError("the idle poll fetched")
            return {"connections": proxy.connections, "bytes": proxy.bytes}
        finally:
            proxy.close()
