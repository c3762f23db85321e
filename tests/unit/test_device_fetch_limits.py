"""Slow retrieval: the time limits of every device download (issue 8, point 7).

The decisions (:class:`edge_sync.sync.transfer.TransferBudget`) are checked with a fake clock;
the fetcher is checked against a real HTTP server on 127.0.0.1 that trickles, stalls
or redirects (:class:`TrickleServer`, shared with ``tests/adversarial``).  The device
end to end (``DeviceTrust.refresh`` / ``fetch``) is in
``tests/adversarial/test_bounded_reads.py``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tuf.api import exceptions as tuf_errors

from edge_sync.sync.transfer import TransferBudget
from edge_sync.sync.trust import LocalFetcher, TrustLimits
from tests.http_sim import Trickle, TrickleServer


@pytest.fixture
def server() -> Iterator[TrickleServer]:
    with TrickleServer() as s:
        yield s


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


LIMITS = TrustLimits(
    read_timeout_s=5.0, min_bytes_per_s=100, rate_grace_s=2.0, download_deadline_s=60.0
)
"""For the decisions: round numbers."""

FAST = TrustLimits(
    read_timeout_s=1.0, min_bytes_per_s=1000, rate_grace_s=0.3, download_deadline_s=1.5
)
"""For the real server: every limit is passed within 1.5 s."""


# --- the decisions --------------------------------------------------------------------


def test_the_rate_is_judged_only_after_the_grace_period() -> None:
    clock = Clock()
    budget = TransferBudget(LIMITS, clock)
    clock.now += 1.9
    budget.add(1)  # 1 byte in 1.9 s: slow, but still within the grace period
    assert budget.violation() is None
    clock.now += 0.2
    assert budget.violation() == "slower than 100 bytes/s (1 bytes in 2.1 s)"
    with pytest.raises(tuf_errors.SlowRetrievalError, match="slower than 100 bytes/s"):
        budget.add(1)


def test_a_fast_enough_average_passes_and_the_deadline_still_ends_it() -> None:
    clock = Clock()
    budget = TransferBudget(LIMITS, clock)
    for _ in range(59):
        clock.now += 1.0
        budget.add(100)  # exactly the minimum rate: never below it
    clock.now += 1.5
    with pytest.raises(tuf_errors.SlowRetrievalError, match=r"not done after 60 s \(6000 bytes\)"):
        budget.add(100)


def test_a_read_may_block_only_until_the_first_limit() -> None:
    clock = Clock()
    budget = TransferBudget(LIMITS, clock)
    # Nothing received yet: the rate breaks when the grace period ends.
    assert budget.wait_s() == pytest.approx(2.0)
    clock.now += 1.0
    budget.add(1000)  # enough for 10 s at 100 bytes/s: the read timeout comes first
    assert budget.wait_s() == pytest.approx(5.0)
    clock.now += 5.0
    assert budget.wait_s() == pytest.approx(4.0)  # at 10 s, 1000 bytes fall below 100/s
    clock.now += 4.0 + 49.0
    budget.add(10_000)  # well above the rate: the deadline (60 s) is next, 1 s away
    assert budget.wait_s() == pytest.approx(1.0)
    clock.now += 1.5
    with pytest.raises(tuf_errors.SlowRetrievalError, match="not done after 60 s"):
        budget.wait_s()


def test_a_read_that_waited_its_whole_time_says_why() -> None:
    clock = Clock()
    budget = TransferBudget(LIMITS, clock)
    budget.add(10_000)
    clock.now += 5.0  # the read timeout, no other limit passed
    assert str(budget.stalled()) == "no data for 5 s"
    clock.now += 100.0
    assert str(budget.stalled()).startswith("not done after 60 s")


def test_no_minimum_rate_leaves_the_read_timeout_and_the_deadline() -> None:
    limits = TrustLimits(min_bytes_per_s=0, read_timeout_s=5.0, download_deadline_s=8.0)
    clock = Clock()
    budget = TransferBudget(limits, clock)
    clock.now += 7.0
    assert budget.violation() is None
    assert budget.wait_s() == pytest.approx(1.0)


@pytest.mark.parametrize(
    "bad",
    [
        {"read_timeout_s": 0},
        {"download_deadline_s": -1},
        {"download_deadline_s": float("nan")},
        {"read_timeout_s": float("inf")},
        {"min_bytes_per_s": -1},
        {"rate_grace_s": -0.5},
        {"chunk_size": 0},
        {"git_store_max_bytes": 0},
    ],
)
def test_limits_that_cannot_work_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="TrustLimits"):
        TrustLimits(**bad)  # type: ignore[arg-type]


# --- the fetcher against a real server --------------------------------------------------


def _download(url: str, limits: TrustLimits = FAST, max_length: int = 1 << 20) -> bytes:
    """What the Updater does for every file: stream ``url`` up to ``max_length``."""
    return LocalFetcher([], limits=limits).download_bytes(url, max_length)


def _timed_refusal(url: str, match: str, limits: TrustLimits = FAST) -> float:
    start = time.monotonic()
    with pytest.raises(tuf_errors.SlowRetrievalError, match=match):
        _download(url, limits)
    return time.monotonic() - start


def test_a_normal_download_over_http(server: TrickleServer) -> None:
    body = os.urandom(300_000)
    server.files["/f"] = body
    assert _download(server.url("f")) == body


def test_a_download_works_in_a_process_with_descriptors_past_1024(server: TrickleServer) -> None:
    """A daemon holding many connections (or a fleet simulation's process) has
    descriptors past 1024, which select() refuses: the wait for data must not use it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    held: list[int] = []
    try:
        while not held or held[-1] < 1030:
            held.append(os.open(os.devnull, os.O_RDONLY))
        body = os.urandom(100_000)
        server.files["/f"] = body
        assert _download(server.url("f")) == body
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_body_trickled_one_byte_every_5_s_ends_after_the_grace_period(
    server: TrickleServer,
) -> None:
    server.files["/f"] = b"x" * 100
    server.slow["/f"] = Trickle(interval_s=5.0)
    # Cut off when the rate is judged (0.3 s), without waiting for the next byte.
    assert _timed_refusal(server.url("f"), r"slower than 1000 bytes/s \(\d+ bytes in 0\.3 s\)") < 1


def test_trickled_status_line_and_headers_are_cut_off_too(server: TrickleServer) -> None:
    server.files["/f"] = b"x" * 100
    server.slow["/f"] = Trickle(interval_s=0.05, headers=True)  # 20 bytes/s, under 1000
    assert _timed_refusal(server.url("f"), "slower than 1000 bytes/s") < 1.5


def test_a_stalled_body_ends_at_the_read_timeout(server: TrickleServer) -> None:
    server.files["/f"] = b"x" * 100
    server.slow["/f"] = Trickle(interval_s=60.0)
    limits = TrustLimits(min_bytes_per_s=0, read_timeout_s=0.5, download_deadline_s=30)
    assert _timed_refusal(server.url("f"), r"no data for 0\.5 s", limits) < 1.5


def test_a_steady_download_that_takes_too_long_ends_at_the_deadline(
    server: TrickleServer,
) -> None:
    server.files["/f"] = b"x" * 200_000
    server.slow["/f"] = Trickle(interval_s=0.02, piece=500)  # ~25 kB/s: rate is fine
    elapsed = _timed_refusal(server.url("f"), r"not done after 1\.5 s")
    assert 1.4 < elapsed < 2.5


def test_errors_keep_their_status_and_other_schemes_are_not_followed(
    server: TrickleServer,
) -> None:
    with pytest.raises(tuf_errors.DownloadHTTPError, match="HTTP error 404") as e:
        _download(server.url("missing"))
    assert e.value.status_code == 404  # the Updater stops its root lookup on 404
    server.redirects["/ftp"] = "ftp://127.0.0.1:1/secret"
    with pytest.raises(tuf_errors.DownloadError, match=r"to another origin, ftp://127\.0\.0\.1:1"):
        _download(server.url("ftp"))


def test_redirects_stay_on_the_remote_s_origin(server: TrickleServer) -> None:
    """A redirect to the same host and port is followed; to another port, host or
    scheme it is refused with the two origins named (issue 23)."""
    server.files["/real"] = b"metadata"
    server.redirects["/moved"] = "/real"
    assert _download(server.url("moved")) == b"metadata"
    with TrickleServer() as other:
        other.files["/real"] = b"metadata"
        for location in (other.url("real"), "https://127.0.0.1/real", "http://localhost/real"):
            server.redirects["/away"] = location
            with pytest.raises(tuf_errors.DownloadError, match="another origin") as e:
                _download(server.url("away"))
            assert "/real" not in str(e.value)  # origins only, never a path or query
        assert other.requests == []


# --- S3 under the same limits (issue 23) ------------------------------------------------


@pytest.fixture
def s3_env(server: TrickleServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trickle server as an S3-compatible endpoint (path-style: ``/bucket/key``)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", server.url("").rstrip("/"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.mark.usefixtures("s3_env")
@pytest.mark.parametrize(
    ("trickle", "match"),
    [
        (Trickle(interval_s=5.0), r"slower than 1000 bytes/s \(\d+ bytes in 0\.3 s\)"),
        (Trickle(interval_s=0.05, headers=True), "slower than 1000 bytes/s"),
        (Trickle(interval_s=0.02, piece=500), r"not done after 1\.5 s"),
    ],
    ids=["body", "headers", "deadline"],
)
def test_an_s3_endpoint_that_trickles_is_cut_at_the_same_bound_as_http(
    server: TrickleServer, trickle: Trickle, match: str
) -> None:
    """botocore times each read, not the transfer: an S3 body trickled one byte every
    5 s held a sync for hours.  Now the same limits cut both transports alike."""
    body = b"x" * (200_000 if trickle.piece > 1 else 100)
    for path in ("/f", "/fleet/modelreg/f"):
        server.files[path] = body
        server.slow[path] = trickle
    over_http = _timed_refusal(server.url("f"), match)
    over_s3 = _timed_refusal("s3://fleet/modelreg/f", match)
    assert abs(over_s3 - over_http) < 0.5, (over_http, over_s3)
    # it did go to the endpoint (the handler may note it after the device gave up)
    deadline = time.monotonic() + 10
    while "/fleet/modelreg/f" not in server.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "/fleet/modelreg/f" in server.requests, server.requests


@pytest.mark.usefixtures("s3_env")
def test_s3_errors_keep_their_status_and_redirects_their_origin(server: TrickleServer) -> None:
    server.files["/fleet/modelreg/f"] = b"metadata"
    assert _download("s3://fleet/modelreg/f") == b"metadata"
    with pytest.raises(tuf_errors.DownloadHTTPError, match="S3 NoSuchKey") as e:
        _download("s3://fleet/modelreg/missing")
    assert e.value.status_code == 404
    server.redirects["/fleet/modelreg/away"] = "http://localhost:1/fleet/modelreg/f"
    with pytest.raises(tuf_errors.DownloadError, match="another origin, http://localhost:1"):
        _download("s3://fleet/modelreg/away")


@pytest.mark.usefixtures("s3_env")
@pytest.mark.parametrize("scheme", ["http", "s3"])
def test_a_cancelled_download_stops_within_a_quarter_second_while_no_byte_comes(
    server: TrickleServer, scheme: str
) -> None:
    """What the daemon's SIGTERM relies on: a read that waits for data looks at
    ``cancelled`` at least every 0.25 s (before: up to the read timeout, 30 s)."""
    for path in ("/f", "/fleet/modelreg/f"):
        server.files[path] = b"x" * 1000
        server.slow[path] = Trickle(interval_s=8.0, piece=500, give_up_s=20.0)
    stop = threading.Event()
    fetcher = LocalFetcher([], limits=TrustLimits(rate_grace_s=30), cancelled=stop.is_set)
    url = server.url("f") if scheme == "http" else "s3://fleet/modelreg/f"
    _, chunks = fetcher.fetch_from(url, 0)
    threading.Timer(1.0, stop.set).start()
    start = time.monotonic()
    with pytest.raises(tuf_errors.DownloadError, match="the daemon is stopping"):
        for _ in chunks:
            pass
    assert time.monotonic() - start < 1.0 + 0.5


# --- local files ------------------------------------------------------------------------


def test_a_fifo_planted_on_the_remote_is_not_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "engine.onnx")
    outcome: list[BaseException] = []
    reader = LocalFetcher([tmp_path])
    thread = threading.Thread(
        target=lambda: outcome.append(_catch(reader, tmp_path / "engine.onnx")), daemon=True
    )
    thread.start()
    thread.join(5)
    if thread.is_alive():  # unblock it: opening a FIFO for reading waits for a writer
        os.close(os.open(tmp_path / "engine.onnx", os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
        pytest.fail("fetching a FIFO blocked")
    (error,) = outcome
    assert isinstance(error, tuf_errors.DownloadHTTPError)
    assert error.status_code == 404
    assert "not a regular file" in str(error)


def _catch(fetcher: LocalFetcher, path: Path) -> BaseException:
    try:
        fetcher.download_bytes(path.as_uri(), 1 << 20)
    except BaseException as e:  # noqa: BLE001 - returned to the test
        return e
    return AssertionError("fetched a FIFO")


def test_local_reads_run_under_the_deadline_too(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 10)
    limits = TrustLimits(download_deadline_s=0.2, chunk_size=1)
    chunks = LocalFetcher([tmp_path], limits=limits).fetch((tmp_path / "f").as_uri())
    assert next(chunks) == b"x"
    time.sleep(0.3)  # the consumer (or the disk) is slow: the file is not done in time
    with pytest.raises(tuf_errors.SlowRetrievalError, match=r"not done after 0\.2 s"):
        next(chunks)
