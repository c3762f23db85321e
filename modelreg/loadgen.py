"""A closed-loop HTTP load generator: the demo's traffic during a swap, the serving
benchmark and the hot-swap tests.

``concurrency`` connections to one server on loopback each keep one request in flight
(HTTP/1.1 keep-alive, no pipelining): a response is answered by the next request at once,
for ``duration_s`` seconds or until ``count`` requests were answered.  Per response it
records the latency, the HTTP status, the ``model_version`` field of the JSON answer
(the Open Inference Protocol names the version that computed it) and, when a ``check``
is given, whether the answer passed it.

The public API (stable for the tests that import it)::

    result = run_load("http://127.0.0.1:8000/v2/models/mlp/infer", body,
                      concurrency=16, duration_s=10)
    result.throughput_rps, result.percentile(99), result.failures, result.version_counts()

    # the same in a separate interpreter (no GIL shared with a server in this process),
    # optionally pinned to some CPUs; the check is then named "module:function"
    result = run_load_subprocess(url, body, concurrency=200, count=5000, cpus={1})

Why raw asyncio streams rather than httpx or aiohttp: on the 2-core machines this runs
on, the generator shares the CPUs with the server it measures.  Measured against the
device server pinned to one core, the generator to the other (``python -m
modelreg.loadgen URL --body FILE --duration 5 --compare-clients``, 2 x 16 floats per
request): httpx 0.29 used 1.7 ms of CPU per request at 16 in flight and 11 ms at 200,
and was the bottleneck (560 and 88 requests/s, against the server's 1,000 to 2,200);
aiohttp 3.14 kept up when it had a core to itself, at 135 to 150 us per request; these
streams need 65 to 75 us.  Half aiohttp's CPU matters where nothing is pinned (the
hot-swap tests run server and generator on the same two cores), and the request bytes
are exactly the same for every server (aiohttp and httpx add ``Accept-Encoding: gzip``,
which switches MLServer's gzip middleware on for larger answers).  The HTTP subset is
small and fixed: one prepared request; responses read by ``Content-Length`` or chunked
transfer coding; any other response is a failed request.

It ships in the ``modelreg`` package, not beside the benchmarks, because ``python -m
modelreg.demo`` drives its traffic step with it from an installed wheel, where no
``benchmarks`` folder exists.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

__all__ = ["Check", "LoadError", "LoadResult", "run_load", "run_load_subprocess"]

Check = Callable[[Mapping[str, Any]], str | None]
"""Called with each 200 answer's JSON document: None when it is right, else why not."""

MAX_HEADER_BYTES: Final = 64 << 10
MAX_BODY_BYTES: Final = 64 << 20
"""Largest response read (a larger one is a failure, and the connection is dropped)."""
_IMPORT_ROOT: Final = Path(__file__).resolve().parents[1]
"""The folder this ``modelreg`` was imported from, put first on a generator process's
path so that it runs this same copy: the checkout's root when run from one (where a
``check`` in ``tests/`` or ``benchmarks/`` imports too), site-packages when installed."""


class LoadError(RuntimeError):
    """The load could not be generated at all (a bad URL, no server to connect to, or a
    generator process that failed): not a failed request, which is recorded instead."""


@dataclass(frozen=True)
class LoadResult:
    """What one load run saw, one entry per answered request in the order they finished.

    Attributes:
        concurrency: requests kept in flight.
        elapsed_s: from the first request sent to the last answer.
        latencies_s: each request's latency (seconds).
        statuses: each HTTP status; 0 when no response came (connection error, timeout).
        versions: each answer's ``model_version`` (None when it had none).
        errors: None for a good answer, else one line saying what was wrong (a status
            other than 200, no response, a body that is not JSON, a failed check).
        finished_s: when each answer came, in seconds from the start.
        client_cpu_s: CPU time the generator used (user + system) while it ran.
        started_unix_s: when the clock started (``time.time()``): to line the answers up
            with events in other processes (``finished_s`` counts from here).
    """

    concurrency: int
    elapsed_s: float
    latencies_s: tuple[float, ...]
    statuses: tuple[int, ...]
    versions: tuple[str | None, ...]
    errors: tuple[str | None, ...]
    finished_s: tuple[float, ...]
    client_cpu_s: float = 0.0
    started_unix_s: float = 0.0
    _sorted: list[float] = field(default_factory=list, repr=False, compare=False)

    @property
    def requests(self) -> int:
        """Requests answered (or that failed) during the run."""
        return len(self.latencies_s)

    @property
    def failures(self) -> dict[str, int]:
        """Failed requests by reason (empty when every answer was good)."""
        return dict(Counter(e for e in self.errors if e is not None))

    @property
    def failed(self) -> int:
        """How many requests failed."""
        return sum(e is not None for e in self.errors)

    @property
    def throughput_rps(self) -> float:
        """Good answers per second."""
        good = self.requests - self.failed
        return good / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile latency in seconds (nearest rank; 0 without requests)."""
        if not self.latencies_s:
            return 0.0
        if not self._sorted:
            self._sorted.extend(sorted(self.latencies_s))
        rank = max(1, math.ceil(q / 100 * len(self._sorted)))
        return self._sorted[min(rank, len(self._sorted)) - 1]

    def version_counts(self) -> dict[str | None, int]:
        """Good answers by the version that computed them."""
        return dict(
            Counter(v for v, e in zip(self.versions, self.errors, strict=True) if e is None)
        )

    def summary(self) -> dict[str, Any]:
        """Figures for a report: throughput, p50/p99 in ms, failures, CPU per request."""
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "elapsed_s": round(self.elapsed_s, 3),
            "throughput_rps": round(self.throughput_rps, 1),
            "p50_ms": round(self.percentile(50) * 1000, 3),
            "p99_ms": round(self.percentile(99) * 1000, 3),
            "max_ms": round(max(self.latencies_s, default=0.0) * 1000, 3),
            "failed": self.failed,
            "failures": self.failures,
            "versions": {str(k): v for k, v in self.version_counts().items()},
            "client_cpu_us_per_request": round(self.client_cpu_s / max(self.requests, 1) * 1e6, 1),
        }

    def to_json(self) -> dict[str, Any]:
        """Every field, JSON-ready (the subprocess hands its result over this way)."""
        return {
            "concurrency": self.concurrency,
            "elapsed_s": self.elapsed_s,
            "latencies_s": list(self.latencies_s),
            "statuses": list(self.statuses),
            "versions": list(self.versions),
            "errors": list(self.errors),
            "finished_s": list(self.finished_s),
            "client_cpu_s": self.client_cpu_s,
            "started_unix_s": self.started_unix_s,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> LoadResult:
        """The result :meth:`to_json` wrote.

        Raises:
            KeyError: a field is missing.
        """
        return cls(
            concurrency=int(doc["concurrency"]),
            elapsed_s=float(doc["elapsed_s"]),
            latencies_s=tuple(doc["latencies_s"]),
            statuses=tuple(doc["statuses"]),
            versions=tuple(doc["versions"]),
            errors=tuple(doc["errors"]),
            finished_s=tuple(doc["finished_s"]),
            client_cpu_s=float(doc["client_cpu_s"]),
            started_unix_s=float(doc.get("started_unix_s", 0.0)),
        )


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    request: bytes


def _target(url: str, body: bytes, headers: Mapping[str, str] | None) -> _Target:
    """The prepared request.

    Raises:
        LoadError: not an ``http://host:port/path`` URL.
    """
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise LoadError(f"{url!r}: only http://host[:port]/path URLs are supported")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return _Target(parts.hostname, parts.port or 80, head + body)


class _Connection:
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self, target: _Target) -> None:
        self.target = target
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self.streams = await asyncio.open_connection(
            self.target.host, self.target.port, limit=MAX_HEADER_BYTES
        )
        return self.streams

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
        self.streams = None

    async def exchange(self) -> tuple[int, dict[str, str], bytes]:
        """Send the request, read the response: status, headers (lower-case), body.

        Raises:
            OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError:
                the connection broke or the response is not HTTP/1.1 as expected.
        """
        reader, writer = self.streams or await self.open()
        writer.write(self.target.request)
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            length = int(headers["content-length"])
            if length > MAX_BODY_BYTES:
                raise ValueError(f"a {length}-byte response")
            body = await reader.readexactly(length)
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self._chunked(reader)
        else:
            raise ValueError("a response with neither Content-Length nor chunked coding")
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers, body

    @staticmethod
    async def _chunked(reader: asyncio.StreamReader) -> bytes:
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers
                return bytes(body)
            if len(body) + size > MAX_BODY_BYTES:
                raise ValueError("a response over the size limit")
            body += await reader.readexactly(size)
            await reader.readexactly(2)


def _judge(
    status: int, headers: Mapping[str, str], body: bytes, check: Check | None
) -> tuple[str | None, str | None]:
    """The answer's version and what was wrong with it (None: nothing)."""
    cut = headers.get("inference-header-content-length")
    try:
        doc = json.loads(body[: int(cut)] if cut is not None else body)
    except ValueError:
        return None, f"HTTP {status}: the body is not JSON"
    if not isinstance(doc, dict):
        return None, f"HTTP {status}: the body is not a JSON object"
    version = doc.get("model_version")
    version = str(version) if version is not None else None
    if status != 200:
        return version, f"HTTP {status}: {str(doc.get('error', ''))[:80]}"
    return version, checked(doc, check)


@dataclass(frozen=True)
class _Plan:
    target: _Target | None
    concurrency: int
    duration_s: float | None
    count: int | None
    check: Check | None
    timeout_s: float
    warmup_s: float


@dataclass
class _Recorder:
    latencies: list[float] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    versions: list[str | None] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)
    finished: list[float] = field(default_factory=list)

    def add(
        self, latency: float, status: int, version: str | None, error: str | None, at: float
    ) -> None:
        """One answered (or failed) request, ``at`` seconds from the start."""
        self.latencies.append(latency)
        self.statuses.append(status)
        self.versions.append(version)
        self.errors.append(error)
        self.finished.append(at)


Exchange = Callable[[], Awaitable[tuple[int, str | None, str | None]]]
"""One request and its answer: (status, the answer's version, what was wrong or None);
a status of 0 when no answer came."""


async def _run(plan: _Plan) -> LoadResult:
    target = plan.target
    assert target is not None  # noqa: S101 - an HTTP plan has one
    connections = [_Connection(target) for _ in range(plan.concurrency)]
    try:
        await asyncio.gather(*(c.open() for c in connections))
    except OSError as e:
        for c in connections:
            c.close()
        where = f"{target.host}:{target.port}"
        raise LoadError(f"cannot connect to {where}: {e}") from None

    def exchange(conn: _Connection) -> Exchange:
        async def one() -> tuple[int, str | None, str | None]:
            try:
                async with asyncio.timeout(plan.timeout_s):
                    status, headers, body = await conn.exchange()
            except (OSError, EOFError, ValueError, asyncio.IncompleteReadError,
                    asyncio.LimitOverrunError, TimeoutError) as e:  # fmt: skip
                conn.close()
                return 0, None, f"no response: {type(e).__name__}"
            version, error = _judge(status, headers, body, plan.check)
            return status, version, error

        return one

    try:
        return await closed_loop([exchange(c) for c in connections], plan)
    finally:
        for c in connections:
            c.close()


async def closed_loop(exchanges: Sequence[Exchange], plan: _Plan) -> LoadResult:
    """Each exchange repeated back to back (one request in flight each) for the plan's
    duration or count, after its warm-up; what was recorded."""
    rec = _Recorder()
    clock = time.perf_counter
    # shared by the workers (one event loop: no lock needed)
    budget = plan.count if plan.count is not None else -1
    stop_at = math.inf
    recording = plan.warmup_s <= 0
    origin, cpu, unix = clock(), time.process_time(), time.time()

    async def worker(exchange: Exchange) -> None:
        nonlocal budget
        while clock() < stop_at:
            if recording and budget >= 0:
                if budget == 0:
                    return
                budget -= 1
            record, sent = recording, clock()  # a request sent during warm-up is not kept
            status, version, error = await exchange()
            done = clock()
            if record:
                rec.add(done - sent, status, version, error, done - origin)

    async def start_recording() -> None:
        nonlocal origin, cpu, unix, recording, stop_at
        if plan.warmup_s > 0:
            await asyncio.sleep(plan.warmup_s)
        origin, cpu, unix = clock(), time.process_time(), time.time()
        recording = True
        if plan.duration_s is not None:
            stop_at = origin + plan.duration_s

    await asyncio.gather(start_recording(), *(worker(e) for e in exchanges))
    return LoadResult(
        concurrency=len(exchanges),
        elapsed_s=max(rec.finished, default=0.0),
        latencies_s=tuple(rec.latencies),
        statuses=tuple(rec.statuses),
        versions=tuple(rec.versions),
        errors=tuple(rec.errors),
        finished_s=tuple(rec.finished),
        client_cpu_s=time.process_time() - cpu,
        started_unix_s=unix,
    )


def checked(doc: Mapping[str, Any], check: Check | None) -> str | None:
    """What ``check`` finds wrong with an answer (None: nothing, or no check)."""
    if check is None:
        return None
    try:
        problem = check(doc)
    except Exception as e:  # noqa: BLE001 - a check that breaks fails the answer, not the run
        problem = f"the check raised {type(e).__name__}: {e}"
    return None if problem is None else f"check: {problem}"


def _validate(concurrency: int, duration_s: float | None, count: int | None) -> None:
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    if (duration_s is None) == (count is None):
        raise ValueError("give exactly one of duration_s and count")
    if duration_s is not None and duration_s <= 0:
        raise ValueError(f"duration_s must be positive, not {duration_s}")
    if count is not None and count < 1:
        raise ValueError(f"count must be at least 1, not {count}")


def run_load(
    url: str,
    body: bytes,
    *,
    concurrency: int,
    duration_s: float | None = None,
    count: int | None = None,
    check: Check | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
    warmup_s: float = 0.0,
) -> LoadResult:
    """POST ``body`` to ``url`` with ``concurrency`` requests in flight, in this process
    (its own event loop: call it from a thread that runs none).

    Args:
        url: ``http://host:port/path``; or ``grpc://host:port/MODEL``: the protocol's
            ``ModelInfer`` over gRPC, the body's tensors sent as raw contents
            (``modelreg.loadgen_grpc``).
        body: the JSON request body, sent as is every time.
        concurrency: requests kept in flight (one connection each, opened before the
            clock starts).
        duration_s: stop sending after this long (the requests in flight finish).
        count: or: stop after this many requests.
        check: judges each 200 answer (see :data:`Check`).
        headers: extra request headers.
        timeout_s: a request with no answer after this long fails (status 0).
        warmup_s: run this long first without recording (connections and server warm).

    Returns:
        What was recorded; failed requests are in it, never raised.

    Raises:
        ValueError: a bad argument (not exactly one of ``duration_s`` and ``count``).
        LoadError: a bad URL, or the server refuses connections.
    """
    _validate(concurrency, duration_s, count)
    if url.startswith("grpc://"):  # the protocol over gRPC (modelreg.loadgen_grpc)
        from modelreg.loadgen_grpc import grpc_target, run_grpc

        address, request = grpc_target(url, body)
        plan = _Plan(None, concurrency, duration_s, count, check, timeout_s, warmup_s)
        return asyncio.run(run_grpc(address, request, plan))
    plan = _Plan(_target(url, body, headers), concurrency, duration_s, count, check,
                 timeout_s, warmup_s)  # fmt: skip
    return asyncio.run(_run(plan))


def run_load_subprocess(
    url: str,
    body: bytes,
    *,
    concurrency: int,
    duration_s: float | None = None,
    count: int | None = None,
    check: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
    warmup_s: float = 0.0,
    cpus: Collection[int] | None = None,
    python: str = sys.executable,
) -> LoadResult:
    """:func:`run_load` in a fresh interpreter, so the generator shares no GIL (and, with
    ``cpus``, no CPU) with a server in this process.

    Args:
        check: ``"module:function"``, a :data:`Check` the child imports (the folder
            this ``modelreg`` came from is on its path: the checkout's root in one).
        cpus: pin the generator to these CPUs (Linux; None: wherever the OS runs it).
        python: the interpreter to run it with.
        url, body, concurrency, duration_s, count, headers, timeout_s, warmup_s: as for
            :func:`run_load`.

    Returns:
        The child's result.

    Raises:
        ValueError: a bad argument.
        LoadError: the child failed (its last error line is in the message).
    """
    _validate(concurrency, duration_s, count)
    with tempfile.TemporaryDirectory(prefix="loadgen-") as tmp:
        body_file, out_file = Path(tmp) / "body", Path(tmp) / "result.json"
        body_file.write_bytes(body)
        argv = [python, "-m", "modelreg.loadgen", url, "--body", str(body_file),
                "--concurrency", str(concurrency), "--timeout", str(timeout_s),
                "--warmup", str(warmup_s), "--json-out", str(out_file)]  # fmt: skip
        argv += ["--duration", str(duration_s)] if duration_s is not None else []
        argv += ["--count", str(count)] if count is not None else []
        argv += ["--check", check] if check else []
        argv += ["--cpus", ",".join(map(str, sorted(cpus)))] if cpus else []
        for name, value in (headers or {}).items():
            argv += ["--header", f"{name}: {value}"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(_IMPORT_ROOT), os.environ.get("PYTHONPATH", "")) if p)}  # fmt: skip
        limit = (duration_s or 0) + warmup_s + timeout_s + 120 + (count or 0) * 0.01
        try:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True,
                                  timeout=limit, check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            raise LoadError(f"the load generator ran past {limit:.0f} s") from None
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise LoadError(f"the load generator exited {proc.returncode}: {last}")
        return LoadResult.from_json(json.loads(out_file.read_text()))


async def _other_client(
    name: str, url: str, body: bytes, concurrency: int, duration_s: float
) -> tuple[int, float, float]:
    """Requests answered, seconds and CPU seconds of httpx's or aiohttp's async client
    in the same closed loop (each answer's JSON read for its ``model_version``)."""
    headers = {"Content-Type": "application/json"}
    answered = [0]

    async def loop(post: Callable[[], Awaitable[None]]) -> tuple[int, float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        end = start + duration_s

        async def slot() -> None:
            while time.perf_counter() < end:
                await post()
                answered[0] += 1

        await asyncio.gather(*(slot() for _ in range(concurrency)))
        return answered[0], time.perf_counter() - start, time.process_time() - cpu

    if name == "httpx":
        import httpx

        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(limits=limits, timeout=30) as client:

            async def httpx_post() -> None:
                response = await client.post(url, content=body, headers=headers)
                response.json().get("model_version")

            return await loop(httpx_post)
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def aiohttp_post() -> None:
            async with session.post(url, data=body, headers=headers) as response:
                (await response.json()).get("model_version")

        return await loop(aiohttp_post)


def compare_clients(
    url: str, body: bytes, *, concurrency: int, duration_s: float
) -> dict[str, dict[str, float]]:
    """Why this generator speaks HTTP itself: requests per second and client CPU
    microseconds per request of these streams, aiohttp and httpx, against one server
    (clients that are not installed are left out).
    """
    out: dict[str, dict[str, float]] = {}
    ours = run_load(url, body, concurrency=concurrency, duration_s=duration_s)
    out["asyncio streams"] = {
        "rps": round(ours.throughput_rps, 1),
        "cpu_us_per_request": round(ours.client_cpu_s / max(ours.requests, 1) * 1e6, 1),
    }
    for name in ("aiohttp", "httpx"):
        if importlib.util.find_spec(name) is None:
            continue
        n, seconds, cpu = asyncio.run(_other_client(name, url, body, concurrency, duration_s))
        out[name] = {"rps": round(n / seconds, 1), "cpu_us_per_request": round(cpu / n * 1e6, 1)}
    return out


def _import_check(ref: str) -> Check:
    """The callable ``module:function`` names.

    Raises:
        ValueError: not ``module:function``.
        TypeError: what it names is not callable.
    """
    module, _, name = ref.partition(":")
    if not module or not name:
        raise ValueError(f"--check {ref!r}: expected module:function")
    found = getattr(importlib.import_module(module), name)
    if not callable(found):
        raise TypeError(f"--check {ref!r} is not callable")
    return found  # type: ignore[no-any-return]


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m modelreg.loadgen",
        description="keep N requests in flight against one URL; print or write the result",
    )
    parser.add_argument("url")
    parser.add_argument("--body", type=Path, required=True, help="file with the request body")
    parser.add_argument("--concurrency", type=int, default=16)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--duration", type=float, help="seconds to send for")
    what.add_argument("--count", type=int, help="requests to send")
    parser.add_argument("--check", help="module:function judging each 200 answer")
    parser.add_argument("--header", action="append", default=[], help="'Name: value'")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=0.0)
    parser.add_argument("--cpus", help="pin to these CPUs, e.g. 1 or 0,1")
    parser.add_argument("--json-out", type=Path, help="write the full result here")
    parser.add_argument(
        "--compare-clients",
        action="store_true",
        help="measure these streams against aiohttp and httpx instead (needs --duration)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Generate load from the command line; prints the summary as JSON.

    Returns:
        0, or 1 when the load could not be generated at all.
    """
    args = _parse(argv)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    headers = dict(h.split(":", 1) for h in args.header)
    if args.compare_clients:
        if args.duration is None:
            print("loadgen: --compare-clients needs --duration", file=sys.stderr)
            return 2
        found = compare_clients(args.url, args.body.read_bytes(),
                                concurrency=args.concurrency, duration_s=args.duration)  # fmt: skip
        print(json.dumps(found, indent=1))
        return 0
    try:
        result = run_load(
            args.url, args.body.read_bytes(), concurrency=args.concurrency,
            duration_s=args.duration, count=args.count,
            check=_import_check(args.check) if args.check else None,
            headers={k.strip(): v.strip() for k, v in headers.items()},
            timeout_s=args.timeout, warmup_s=args.warmup,
        )  # fmt: skip
    except (LoadError, ValueError, TypeError) as e:
        print(f"loadgen: {e}", file=sys.stderr)
        return 1
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(result.to_json()))
    print(json.dumps(result.summary()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
