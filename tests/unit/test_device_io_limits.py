"""Device-side costs that grow with a fleet in one process (found by the fleet benchmark):
the daemon's wake-up pipe past descriptor 1024, and one TLS context per process."""

from __future__ import annotations

import os
import resource
import time

import pytest

from edge_sync._fetch import _tls_context, guarded_opener
from edge_sync.daemon import _Wakeup


def test_the_daemon_sleeps_and_wakes_on_a_descriptor_past_1024() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.fail(f"this test needs 1,200 open files; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    wakeup = _Wakeup()
    try:
        assert wakeup.read_fd >= 1024  # select() refuses this one: ValueError
        started = time.monotonic()
        wakeup.sleep(0.05)
        assert time.monotonic() - started >= 0.04
        wakeup.poke()
        started = time.monotonic()
        wakeup.sleep(30)  # poked: returns at once
        assert time.monotonic() - started < 5
    finally:
        wakeup.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_one_tls_context_serves_every_opener() -> None:
    _tls_context.cache_clear()
    for _ in range(5):
        guarded_opener(budget=None)  # type: ignore[arg-type]
    info = _tls_context.cache_info()
    assert (info.misses, info.currsize) == (1, 1)
