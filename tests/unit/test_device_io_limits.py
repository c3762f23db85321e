"""Device-side costs that grow with a fleet in one process (found by the fleet benchmark):
the daemon's wake-up pipe past descriptor 1024, and one TLS context per process."""

from __future__ import annotations

import os
import resource
import ssl
import time
import urllib.request
from typing import Any

import pytest

from edge_sync.daemon import _Wakeup
from edge_sync.sync.transfer import guarded_opener, tls_context


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


def test_one_tls_context_serves_every_opener(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[ssl.SSLContext] = []
    real = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(ssl, "create_default_context", counted)
    tls_context.cache_clear()
    openers = [guarded_opener(budget=None) for _ in range(5)]  # type: ignore[arg-type]
    assert len(made) == 1
    # the context each HTTPS handler connects with (urllib keeps both unannotated)
    contexts = {
        id(getattr(h, "_context", None))
        for o in openers
        for h in getattr(o, "handlers", [])
        if isinstance(h, urllib.request.HTTPSHandler)
    }
    assert contexts == {id(made[0])}
