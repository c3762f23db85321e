"""One worker process of the fleet simulation: many devices, each the daemon's own loop.

``python -m benchmarks._fleet_worker SPEC`` reads a JSON spec (``configs``: the
``edge.yaml`` of each device; ``events``: where to append what happens; ``final``:
where to write what each device serves at the end) and runs, per device, a thread with
the real :class:`edge_sync.daemon.Daemon` (``serving=False``: no inference server,
no signals): its loop, its poll and jitter waits (``next_delay``), its backoff, and its
:class:`~edge_sync.sync.updater.Updater` with the real watcher, trust, fetch, verification,
state dir and an :class:`~edge_sync.engine.host.InProcessHost` holding a real ONNX Runtime
session per device.

One setting is the simulator's, not the daemon's: the default TLS context is made once
per worker process.  ``edge_sync.sync.transfer.guarded_opener`` makes one for every request
(``ssl.create_default_context`` loads the system's CA certificates: about 22 ms of CPU
here, 80 % of a gitless idle poll on the device), also for ``http://`` URLs that never
use it; a thousand devices sharing two cores would otherwise be paced by that, not by
the servers.  Nothing is sent differently.

Every sync is appended to the events file as one JSON line ``{"t": wall time at its
end, "d": device id, "r": result, "u": {model: [result, version, method,
bytes_fetched]}, "why": reason}``.  SIGTERM stops every daemon (each at its next stage
boundary), then the worker writes ``final`` (``{device id: version served}``) and exits.
"""

from __future__ import annotations

import functools
import json
import resource
import signal
import ssl
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from edge_sync.config import EdgeConfig, load_edge_config
from edge_sync.daemon import Daemon
from edge_sync.engine.host import InProcessHost
from edge_sync.sync.updater import SyncOutcome


class _Events:
    """The events file, one line per sync, written by every device thread."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.lock = threading.Lock()

    def recorder(self, device: str) -> Any:
        def on_sync(report: SyncOutcome) -> None:
            updates = {
                model: [r.result, r.version, r.method, r.bytes_fetched]
                for model, r in report.updates.items()
            }
            line = json.dumps({"t": round(time.time(), 4), "d": device, "r": report.result,
                               "u": updates, "why": report.reason})  # fmt: skip
            with self.lock:
                self.out.write(line + "\n")
                self.out.flush()

        return on_sync


_make_tls_context = ssl.create_default_context


@functools.cache
def _default_tls_context() -> ssl.SSLContext:
    return _make_tls_context()


def _shared_tls_context(*args: Any, **kwargs: Any) -> ssl.SSLContext:
    """``ssl.create_default_context``, the default one made once (see the module doc)."""
    if args or kwargs:
        return _make_tls_context(*args, **kwargs)
    return _default_tls_context()


def _run_device(daemon: Daemon, failed: list[str]) -> None:
    try:
        daemon.run(install_signals=False)
    except Exception as e:  # noqa: BLE001 - one device failing to start is a figure
        failed.append(f"{daemon.config.device.id}: {type(e).__name__}: {e}")


def main(argv: list[str]) -> int:
    """Run the devices of the spec ``argv[0]`` until SIGTERM (see the module doc)."""
    ssl.create_default_context = _shared_tls_context
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    # a lock, a wake-up pipe and a few files per device
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # a flag, never a lock: SIGTERM landing while this thread holds an Event's lock
    # (inside Event.wait) made Event.set() in the handler wait for it forever
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda _sig, _frame: stopping.append(True))
    configs: list[EdgeConfig] = [load_edge_config(Path(p)) for p in spec["configs"]]
    hosts = {c.device.id: InProcessHost(intra_op_threads=1, prepack="off") for c in configs}
    failed: list[str] = []
    with Path(spec["events"]).open("a", encoding="utf-8") as out:
        events = _Events(out)
        daemons = [
            Daemon(c, host=hosts[c.device.id], on_sync=events.recorder(c.device.id),
                   serving=False)
            for c in configs
        ]  # fmt: skip
        threads = [
            threading.Thread(target=_run_device, args=(d, failed), name=d.config.device.id)
            for d in daemons
        ]
        for thread in threads:
            thread.start()
        while not stopping:
            time.sleep(0.1)
        for daemon in daemons:
            daemon.stop()
        deadline = time.monotonic() + 60
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    serving = {}
    for device, host in hosts.items():
        engine = host.current("mlp")
        serving[device] = engine.version if engine is not None else None
    final = {"serving": serving, "failed": failed,
             "stuck": [t.name for t in threads if t.is_alive()]}  # fmt: skip
    Path(spec["final"]).write_text(json.dumps(final), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
