"""Real services on loopback, as a team runs them: PostgreSQL, S3 (moto), ``mlflow server``.

Shared by the team-scale tests (``tests/integration/test_team_scale.py``) and the release
benchmark (``benchmarks/release.py``).  Each service is a context manager that starts a
process of its own on 127.0.0.1 and stops it on exit:

- :func:`postgres`: a throwaway cluster (``initdb`` + ``pg_ctl``) in a temporary folder,
  password authentication on TCP.  PostgreSQL refuses to run as root, so as root (CI) the
  cluster runs as the ``postgres`` user that Debian's package creates.
- :func:`s3_server`: moto's S3 server, with one bucket.
- :func:`mlflow_servers`: ``mlflow server`` with a PostgreSQL backend store and its
  artifacts in S3, either proxied (``--artifacts-destination``: clients need no S3
  credentials) or direct (``--default-artifact-root``: clients write to S3 themselves).
- :class:`FaultProxy`: an HTTP proxy put in front of any of them that cuts connections,
  answers 5xx, stalls, or runs a callback (stop PostgreSQL) when a given request passes.

A service that cannot start here (PostgreSQL not installed) raises
:class:`ServiceUnavailable`; the callers decide whether that is a skip or a failure.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final, Literal

HOST: Final = "127.0.0.1"
S3_CREDENTIALS: Final = {
    "AWS_ACCESS_KEY_ID": "modelreg-test-key-id",
    "AWS_SECRET_ACCESS_KEY": "modelreg-test-secret-not-to-be-printed",
    "AWS_DEFAULT_REGION": "us-east-1",
}
"""What a team's S3 credentials look like in the environment (moto accepts any)."""
_BIN: Final = Path(sys.executable).parent


class ServiceUnavailable(RuntimeError):  # noqa: N818 - reads as the condition it reports
    """A service cannot be started on this machine (a binary missing, no user to run it)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()  # noqa: S310 - loopback only
        except OSError:
            if proc.poll() is not None:
                raise ServiceUnavailable(f"{what} exited with {proc.returncode}") from None
            if time.monotonic() > deadline:
                raise ServiceUnavailable(f"{what} did not answer within {timeout:.0f} s") from None
            time.sleep(0.2)
        else:
            return


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    """Stop each process and its children (``mlflow server`` runs uvicorn as a child):
    each was started in a session of its own, so its group is everything it ran."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 20.0)):
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    for proc in procs:  # leaders gone: their children may not be
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


# --- PostgreSQL ---------------------------------------------------------------------


def postgres_bindir() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``: on PATH, else Debian's newest version."""
    found = shutil.which("pg_ctl")
    if found is not None and (Path(found).parent / "initdb").exists():
        return Path(found).resolve().parent
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    return debian[-1].parent if debian else None


@dataclass
class Postgres:
    """A running PostgreSQL cluster of our own.

    Attributes:
        port: its TCP port on 127.0.0.1.
        user: the superuser, with ``password`` (scram-sha-256 on TCP).
    """

    port: int
    user: str
    password: str
    _bindir: Path
    _data: Path
    _run_as: str | None
    _log: Path

    def url(self, database: str) -> str:
        """A SQLAlchemy URL of ``database`` (with the password: never print it)."""
        return f"postgresql+psycopg://{self.user}:{self.password}@{HOST}:{self.port}/{database}"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [str(self._bindir / "pg_ctl"), "-D", str(self._data), "-l", str(self._log), *args],
            check=True,
            user=self._run_as,
            cwd=self._data.parent,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=120,
        )

    def start(self) -> None:
        """Start the cluster (again) and wait until it accepts connections."""
        options = f"-p {self.port} -k {self._data.parent} -c listen_addresses={HOST} -c fsync=off"
        self._ctl("-w", "-t", "60", "-o", options, "start")

    def stop(self) -> None:
        """Stop the cluster now, as a crash would (``immediate``: no clean shutdown)."""
        self._ctl("-w", "-m", "immediate", "stop")

    def create_database(self, name: str) -> None:
        """Create an empty database ``name``."""
        subprocess.run(
            [str(self._bindir / "createdb"), "-h", HOST, "-p", str(self.port),
             "-U", self.user, name],
            check=True,
            env={**os.environ, "PGPASSWORD": self.password},
            capture_output=True,
            timeout=60,
        )  # fmt: skip


@contextlib.contextmanager
def postgres() -> Iterator[Postgres]:
    """A PostgreSQL cluster in a temporary folder, stopped and removed on exit.

    Raises:
        ServiceUnavailable: PostgreSQL is not installed, or (as root) there is no
            ``postgres`` user to run it as.
    """
    bindir = postgres_bindir()
    if bindir is None:
        raise ServiceUnavailable("PostgreSQL is not installed (apt-get install postgresql)")
    run_as = None
    owner = None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            raise ServiceUnavailable("running as root and no 'postgres' user to run as") from None
        run_as = owner.pw_name
    # Not under pytest's folders: those are private to the user running the tests.
    root = Path(tempfile.mkdtemp(prefix="modelreg-pg-"))
    try:
        if owner is not None:
            os.chown(root, owner.pw_uid, owner.pw_gid)
        password = "pg-" + os.urandom(8).hex()
        pwfile = root / "pw"
        pwfile.write_text(password)
        if owner is not None:
            os.chown(pwfile, owner.pw_uid, owner.pw_gid)
        data = root / "data"
        subprocess.run(
            [str(bindir / "initdb"), "-D", str(data), "-U", "modelreg", f"--pwfile={pwfile}",
             "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync",
             "--locale=C"],
            check=True, user=run_as, cwd=root, capture_output=True, timeout=120,
        )  # fmt: skip
        pwfile.unlink()
        cluster = Postgres(free_port(), "modelreg", password, bindir, data, run_as, root / "log")
        try:
            cluster.start()
        except subprocess.CalledProcessError as e:
            log = cluster._log.read_text(errors="replace") if cluster._log.exists() else ""
            raise ServiceUnavailable(f"PostgreSQL did not start: {log[-500:]}") from e
        try:
            yield cluster
        finally:
            with contextlib.suppress(subprocess.SubprocessError):
                cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- S3 (moto) ----------------------------------------------------------------------


@contextlib.contextmanager
def s3_server(bucket: str) -> Iterator[str]:
    """moto's S3 server on loopback with ``bucket`` created; yields its endpoint URL.

    Raises:
        ServiceUnavailable: moto's server is not installed or does not start.
    """
    exe = _BIN / "moto_server"
    if not exe.exists():
        raise ServiceUnavailable("moto's server is not installed (pip install 'moto[server]')")
    port = free_port()
    proc = subprocess.Popen(
        [str(exe), "-H", HOST, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://{HOST}:{port}"
    try:
        _wait_http(f"{url}/moto-api/", proc, "moto's S3 server", 60)
        import boto3

        client = boto3.client("s3", endpoint_url=url, **_boto_credentials())
        client.create_bucket(Bucket=bucket)
        yield url
    finally:
        _stop(proc)


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "region_name": S3_CREDENTIALS["AWS_DEFAULT_REGION"],
    }


# --- mlflow server --------------------------------------------------------------------

ArtifactMode = Literal["proxied", "direct"]


@dataclass(frozen=True)
class MlflowServer:
    """A running ``mlflow server``.

    Attributes:
        url: its tracking URI.
        mode: ``proxied`` (artifacts through the server) or ``direct`` (clients to S3).
        artifacts: where its artifacts go (``s3://bucket/prefix``).
    """

    url: str
    mode: ArtifactMode
    artifacts: str


@contextlib.contextmanager
def mlflow_servers(
    backend: str, s3_endpoint: str, artifacts: dict[ArtifactMode, str], logs: Path
) -> Iterator[dict[ArtifactMode, MlflowServer]]:
    """One ``mlflow server`` per entry of ``artifacts``, started side by side and stopped
    on exit.  They share ``backend``, which is migrated once before they start (two
    servers migrating one database at once would race).

    Args:
        backend: the backend store URI (``postgresql+psycopg://...``).
        s3_endpoint: the S3 API the servers (proxied) or their clients (direct) use.
        artifacts: ``s3://bucket/prefix`` of each server, by artifact mode.
        logs: folder for the servers' output (it may hold the backend URI: not for
            printing).

    Raises:
        ServiceUnavailable: MLflow is not installed or a server does not start.
    """
    exe = _BIN / "mlflow"
    if not exe.exists():
        raise ServiceUnavailable("MLflow is not installed (pip install 'modelreg[ci]')")
    env = {
        **os.environ,
        **S3_CREDENTIALS,
        "MLFLOW_S3_ENDPOINT_URL": s3_endpoint,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        # The server's S3 client retries a failed write before answering 5xx, and
        # MLflow's client retries that answer: keep the server's own tries short.
        "AWS_RETRY_MODE": "standard",
        "AWS_MAX_ATTEMPTS": "2",
    }
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(var, None)
    logs.mkdir(parents=True, exist_ok=True)
    migrated = subprocess.run(
        [str(exe), "db", "upgrade", backend], env=env, capture_output=True, check=False,
        timeout=300,
    )  # fmt: skip
    if migrated.returncode != 0:
        (logs / "upgrade.log").write_bytes(migrated.stdout + migrated.stderr)
        raise ServiceUnavailable(f"mlflow db upgrade failed (see {logs / 'upgrade.log'})")
    running: dict[ArtifactMode, tuple[subprocess.Popen[bytes], MlflowServer]] = {}
    try:
        for mode, where in artifacts.items():
            port = free_port()
            flags = (
                ["--artifacts-destination", where]
                if mode == "proxied"
                else ["--no-serve-artifacts", "--default-artifact-root", where]
            )
            with (logs / f"mlflow-{mode}.log").open("ab") as out:
                proc = subprocess.Popen(
                    [str(exe), "server", "--backend-store-uri", backend, *flags,
                     "--host", HOST, "--port", str(port), "--workers", "1"],
                    stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                )  # fmt: skip
            running[mode] = proc, MlflowServer(f"http://{HOST}:{port}", mode, where)
        for mode, (proc, server) in running.items():
            _wait_http(f"{server.url}/health", proc, f"mlflow server ({mode})", 240)
        yield {mode: server for mode, (_, server) in running.items()}
    finally:
        _stop(*(proc for proc, _ in running.values()))


# --- faults ---------------------------------------------------------------------------


@dataclass
class Fault:
    """What the proxy does to requests whose method is ``method`` and path holds ``path``.

    Attributes:
        before: called before the request goes on (stop a service mid-release).
        status: answer this status without forwarding.
        status_after: forward, then answer this status instead of the real answer
            (the change is made, the client is told it failed: a gateway timeout).
        delay_s: forward, then wait this long before answering (a slow server).
        times: how many matching requests it applies to.
    """

    method: str
    path: str
    before: Callable[[], None] | None = None
    status: int | None = None
    status_after: int | None = None
    delay_s: float = 0.0
    times: int = 1


_HOP_BY_HOP: Final = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "expect", "te",
     "proxy-connection", "upgrade"}
)  # fmt: skip


@dataclass
class FaultProxy:
    """An HTTP proxy on loopback in front of ``upstream`` (``http://host:port``).

    Attributes:
        down: cut every connection at once (a service gone away) while true.
        faults: applied in order to matching requests.
        auth: the ``Authorization`` header every request must carry (else 401).
        seen: ``METHOD path`` of every request, and the headers of each.
    """

    upstream: str
    down: bool = False
    faults: list[Fault] = field(default_factory=list)
    auth: str | None = None
    seen: list[str] = field(default_factory=list)
    headers_seen: list[dict[str, str]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://{HOST}:{self._server.server_address[1]}"

    def __enter__(self) -> FaultProxy:
        self._server = ThreadingHTTPServer((HOST, 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def _take(self, method: str, path: str) -> Fault | None:
        for fault in self.faults:
            if fault.times > 0 and fault.method == method and fault.path in path:
                fault.times -= 1
                return fault
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self
        host, _, port = proxy.upstream.removeprefix("http://").partition(":")

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    parts = []
                    while size := int(self.rfile.readline().split(b";")[0], 16):
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
                self.send_response(status)
                length = str(len(body))
                for key, value in headers:
                    if key.lower() == "content-length" and self.command == "HEAD":
                        length = value  # the size of what a GET would send
                    elif key.lower() not in _HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _any(self) -> None:
                proxy.seen.append(f"{self.command} {self.path}")
                proxy.headers_seen.append(dict(self.headers.items()))
                if proxy.down:
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                body = self._body()
                if proxy.auth is not None and self.headers.get("Authorization") != proxy.auth:
                    self._answer(401, [], b"unauthorized")
                    return
                fault = proxy._take(self.command, self.path)
                if fault is not None and fault.before is not None:
                    fault.before()
                if fault is not None and fault.status is not None:
                    self._answer(fault.status, [], b"injected failure")
                    return
                upstream = http.client.HTTPConnection(host, int(port), timeout=300)
                try:
                    headers = {
                        k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP
                    }
                    headers["Content-Length"] = str(len(body))
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                except OSError:
                    self._answer(502, [], b"upstream unreachable")
                    return
                finally:
                    upstream.close()
                if fault is not None and fault.delay_s:
                    time.sleep(fault.delay_s)
                if fault is not None and fault.status_after is not None:
                    self._answer(fault.status_after, [], b"injected failure after the change")
                    return
                self._answer(answer.status, answer.getheaders(), data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _any  # noqa: N815

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler
