"""The daemon's HTTP listeners, bounded: what a client may hold with connections and
headers alone, before any request reaches the application (``serve.limits``).

uvicorn has a keep-alive timeout and a cap on h11's incomplete events, but with
httptools (the fast parser) no limit on a request's line and headers, and no time limit
to send them: a 64 MiB header line was read whole, and 300 idle connections took every
descriptor of a daemon limited to 256, so that its next sync failed with ``EMFILE``.
``edge_sync.serve.http_bounds.BoundedHttpTools`` (imported with uvicorn, when a server is
made) adds, for each connection:

* a header size cap: over ``max_header`` bytes before the headers end, 431 and the
  connection is closed (the bytes are counted as they arrive, never parsed past it);
* a header timeout: a request's line and headers must arrive within
  ``header_timeout`` of its first byte (of the connection, for a new one), else 408
  and the connection is closed; then its body may pause ``body_timeout`` at most;
* a connection cap below the descriptor limit (:func:`connection_cap`): a connection
  over it takes the place of the longest idle one (no request in progress, no byte of
  a new one), or is answered 503 and closed when none is idle.

The common path pays two comparisons per read and one per request.
"""

from __future__ import annotations

import dataclasses
import resource
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from edge_sync.config import ServeConfig, Subscription
    from edge_sync.engine.base import EngineHost
    from edge_sync.serve.recorder import Recorder
    from edge_sync.serve.shadow import ShadowRunner

__all__ = [
    "FD_RESERVE", "MANAGEMENT_CONNECTIONS", "ConnectionLimits", "Listeners", "connection_cap",
    "server",
]  # fmt: skip

FD_RESERVE: Final = 128
"""Descriptors kept for the rest of the daemon (the update loop's files, git, the state
dir, sessions, the report sink): the listeners never take them."""
MANAGEMENT_CONNECTIONS: Final = 16
"""Connections the management listener may hold (``serve.management_listen``), taken
from the inference listener's share of the descriptors."""
MIN_CONNECTIONS: Final = 8
MAX_CONNECTIONS: Final = 4096
"""The cap when the descriptor limit allows more (and none is configured)."""


def connection_cap(configured: int | None, reserve: int = FD_RESERVE) -> int:
    """The most connections the listeners may hold: ``configured`` (or
    :data:`MAX_CONNECTIONS`), never more than the process's descriptor limit
    (``RLIMIT_NOFILE``, as systemd's ``LimitNOFILE`` sets it) less ``reserve``."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = MAX_CONNECTIONS * 16 if soft == resource.RLIM_INFINITY else soft - reserve
    return max(MIN_CONNECTIONS, min(configured or MAX_CONNECTIONS, room))


@dataclass(frozen=True)
class ConnectionLimits:
    """What one listener allows each connection, and how many.

    Attributes:
        max_connections: open connections.
        max_header_bytes: a request's line and headers (431 over it).
        header_timeout_s: to send them (408 after it).
        keepalive_timeout_s: idle between requests.
        body_timeout_s: idle between two reads of a request's body (408 after it: a
            trickled body holds its bytes of the budget in flight no longer).
    """

    max_connections: int
    max_header_bytes: int = 64 << 10
    header_timeout_s: float = 10.0
    keepalive_timeout_s: float = 5.0
    body_timeout_s: float = 30.0


def server(app: Any, host: str, port: int, limits: ConnectionLimits) -> Any:
    """A uvicorn server for ``app`` on ``host``:``port`` within ``limits``
    (``uvicorn.Server``; started by its ``run``)."""
    import uvicorn

    from edge_sync.serve.http_bounds import BoundedHttpTools

    protocol = type("Bounded", (BoundedHttpTools,), {"limits": limits})
    return uvicorn.Server(
        uvicorn.Config(
            app, host=host, port=port, http=protocol, log_level="warning", lifespan="off",
            access_log=False, timeout_keep_alive=max(1, round(limits.keepalive_timeout_s)),
            # no forwarded-for rewriting (a device trusts no proxy's word for a client's
            # address: POST /v2/repository/sync is for loopback) and no server header
            proxy_headers=False, server_header=False,
            h11_max_incomplete_event_size=limits.max_header_bytes,
        )
    )  # fmt: skip


def _connection_limits(serve: ServeConfig, management: int) -> ConnectionLimits:
    """The inference listener's bounds from ``serve.limits``, leaving ``management``
    connections to the management listener."""
    bounds = serve.limits
    return ConnectionLimits(
        max_connections=connection_cap(bounds.max_connections) - management,
        max_header_bytes=bounds.max_header,
        header_timeout_s=bounds.header_timeout,
        keepalive_timeout_s=bounds.keepalive_timeout,
        body_timeout_s=bounds.body_timeout,
    )


class Listeners:
    """uvicorn serving the OIP v2 app in a thread beside the update loop (and, with
    ``serve.management_listen``, ``/status`` and ``/metrics`` in another; with
    ``serve.grpc_listen``, the protocol over gRPC on the same serving core), each
    within ``serve.limits``."""

    def __init__(
        self,
        serve: ServeConfig,
        models: Sequence[Subscription],
        host: EngineHost,
        status: Callable[[], Mapping[str, Any]],
        version: str,
        *,
        request_sync: Callable[[], None] | None = None,
        recorder: Recorder | None = None,
        shadow: ShadowRunner | None = None,
    ) -> None:
        """Build the servers (:meth:`start` starts them).

        Args:
            serve: the configuration they follow.
            models: the subscribed models.
            host: where each model's engine is.
            status: the status document, made on demand.
            version: the daemon's version.
            request_sync: asks the daemon to sync now.
            recorder: where answers go for the health gate.
            shadow: where answers are offered for a shadow comparison.
        """
        from edge_sync.config import batching_of
        from edge_sync.serve.app import create_management_app, create_rest_app
        from edge_sync.serve.batching import BatchPolicy
        from edge_sync.serve.codec import ServeLimits
        from edge_sync.serve.core import Inference
        from edge_sync.serve.metrics import Metrics

        self.metrics = Metrics(host)
        if shadow is not None:
            self.metrics.watch_shadow(shadow, [m.name for m in models])
        batching = {
            name: BatchPolicy(c.max_batch_size, c.max_queue_delay)
            for name, c in batching_of(serve, models).items()
        }
        self.core = core = Inference(
            host, [m.name for m in models], self.metrics, recorder,
            ServeLimits.from_config(serve.limits), batching, shadow,
        )  # fmt: skip
        app = create_rest_app(
            core,
            status,
            version,
            request_sync=request_sync,
            remote_sync=serve.remote_sync,
            management=serve.management_listen is None,
        )
        self.grpc = None
        if serve.grpc_listen is not None:
            from edge_sync.serve.grpc_server import GrpcServer

            bounds = _connection_limits(serve, 0)
            self.grpc = GrpcServer(core, version, serve.grpc_listen,
                                   max_connections=bounds.max_connections,
                                   handshake_timeout_s=bounds.header_timeout_s)  # fmt: skip
        self.grpc_address: str | None = None
        management = MANAGEMENT_CONNECTIONS if serve.management_listen else 0
        limits = _connection_limits(serve, management)
        address, _, port = serve.listen.rpartition(":")
        self.address = address.strip("[]")
        self._servers = [server(app, self.address, int(port), limits)]
        if serve.management_listen:
            where, _, at = serve.management_listen.rpartition(":")
            small = dataclasses.replace(limits, max_connections=management)
            self._servers.append(
                server(
                    create_management_app(status, self.metrics), where.strip("[]"), int(at), small
                )
            )
        self._threads = [
            threading.Thread(target=s.run, name=f"oip-server-{i}", daemon=True)
            for i, s in enumerate(self._servers)
        ]

    def start(self, timeout_s: float = 30.0) -> str:
        """Start serving; the address the inference listener listens on (a port 0
        resolved).

        Raises:
            OSError: it could not listen (the port is taken).
        """
        deadline = time.monotonic() + timeout_s
        for each, thread in zip(self._servers, self._threads, strict=True):
            thread.start()
            while not each.started:
                if not thread.is_alive() or time.monotonic() > deadline:
                    self.stop()
                    raise OSError(f"cannot serve on {self.address}: the server did not start")
                time.sleep(0.02)
        if self.grpc is not None:
            try:
                self.grpc_address = self.grpc.start()
            except OSError:
                self.stop()
                raise
        port = self._servers[0].servers[0].sockets[0].getsockname()[1]
        return f"{self.address}:{port}"

    @property
    def management_address(self) -> str | None:
        """Where ``/status`` and ``/metrics`` are served apart (None: on the inference
        listener)."""
        if len(self._servers) < 2 or not self._servers[1].started:
            return None
        host, port = self._servers[1].servers[0].sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    def stop(self) -> None:
        """Finish the requests in flight, then stop."""
        if self.grpc is not None and self.grpc_address is not None:
            self.grpc.stop()
        for each in self._servers:
            each.should_exit = True
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=30)
        self.core.close()
