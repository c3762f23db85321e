"""The watcher of the metadata mirrored to the artifact remote (issue 14, point 1): an
idle poll is one conditional read, a changed ``timestamp.json`` comes back whole, and
whatever the remote says is bounded, typed and shown without credentials.

Real transports: files, and a real HTTP server on loopback that answers conditional
requests (``tests/http_sim.StaticServer``)."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import pytest

from edge_sync.errors import RemoteMetadataError, SourceError
from edge_sync.sync.limits import TrustLimits
from edge_sync.sync.probe import _etag
from edge_sync.sync.watcher import WATCH_FILE, Probe, RemoteMetadataWatcher, Validators
from tests.http_sim import StaticServer

TIMESTAMP = b'{"signed": {"_type": "timestamp", "version": 1}}'


def _remote(tmp_path: Path, data: bytes = TIMESTAMP) -> Path:
    folder = tmp_path / "remote/modelreg"
    (folder / "metadata").mkdir(parents=True)
    (folder / "metadata/timestamp.json").write_bytes(data)
    return folder


def _stamp(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


@pytest.mark.parametrize("as_url", [False, True], ids=["path", "file-url"])
def test_a_folder_is_asked_with_stat_and_read_only_when_it_changed(
    tmp_path: Path, as_url: bool
) -> None:
    remote = _remote(tmp_path)
    state = tmp_path / "state"
    watcher = RemoteMetadataWatcher(remote.as_uri() if as_url else str(remote), state)
    first = watcher.sync()
    assert (first.commit, first.changed) == (_stamp(TIMESTAMP), True)
    assert dict(first.prefetched) == {"timestamp.json": TIMESTAMP}
    idle = watcher.sync()
    assert (idle.commit, idle.changed, dict(idle.prefetched)) == (first.commit, False, {})
    assert watcher.last is not None
    assert watcher.last.received == 0
    # rewritten with the same bytes (a re-upload): read again, but nothing changed
    ts = remote / "metadata/timestamp.json"
    os.utime(ts, ns=(1, 1))
    again = watcher.sync()
    assert (again.commit, again.changed) == (first.commit, False)
    ts.write_bytes(TIMESTAMP.replace(b"1}", b"2}"))
    moved = watcher.sync()
    assert moved.changed
    assert moved.commit == _stamp(ts.read_bytes())
    assert watcher.requests == 4
    # a restart keeps what was read: still one stat
    restarted = RemoteMetadataWatcher(remote.as_uri() if as_url else str(remote), state)
    assert restarted.sync().changed is False


def test_the_kept_validators_are_a_hint_only(tmp_path: Path) -> None:
    remote = _remote(tmp_path)
    state = tmp_path / "state"
    RemoteMetadataWatcher(str(remote), state).sync()
    kept = (state / WATCH_FILE).read_text()
    assert str(remote) not in kept  # the URL (and any credentials in it) stays out
    for damage in (b"{", b"x" * 10_000, b'{"source": 1}'):
        (state / WATCH_FILE).write_bytes(damage)
        head = RemoteMetadataWatcher(str(remote), state).sync()
        assert head.commit == _stamp(TIMESTAMP)
        assert head.prefetched
    # validators kept for another remote are not sent to this one
    other = _remote(tmp_path / "other", TIMESTAMP)
    assert RemoteMetadataWatcher(str(other), state).sync().prefetched


def test_an_idle_poll_over_http_is_one_request_under_a_kilobyte(tmp_path: Path) -> None:
    remote = _remote(tmp_path)
    with StaticServer(remote) as server:
        watcher = RemoteMetadataWatcher(server.url(), tmp_path / "state")
        assert watcher.sync().changed
        server.clear()
        head = watcher.sync()
        assert not head.changed
        assert not head.prefetched
        (served,) = server.served
        assert (served.status, served.conditional) == (304, True)
        assert served.sent <= 1024
        last = watcher.last
        assert last is not None
        assert last == Probe(None, last.validators, 1, served.sent)


@pytest.mark.parametrize(
    ("etags", "last_modified", "idle_status"),
    [(False, True, 304), (False, False, 200)],
    ids=["last-modified-only", "no-validators"],
)
def test_servers_with_fewer_validators(
    tmp_path: Path, etags: bool, last_modified: bool, idle_status: int
) -> None:
    """``If-Modified-Since`` alone works; a server with no validators answers 200
    every time: dearer, but the stamp (the bytes' digest) says nothing changed."""
    remote = _remote(tmp_path)
    os.utime(remote / "metadata/timestamp.json", (1_600_000_000, 1_600_000_000))
    with StaticServer(remote, etags=etags, last_modified=last_modified) as server:
        watcher = RemoteMetadataWatcher(server.url(), tmp_path / "state")
        watcher.sync()
        server.clear()
        assert watcher.sync().changed is False
        assert [s.status for s in server.served] == [idle_status]


def test_what_a_remote_sends_is_bounded_and_its_failures_typed(tmp_path: Path) -> None:
    remote = _remote(tmp_path, b"{" + b" " * 100_000 + b"}")
    with StaticServer(remote) as server:
        watcher = RemoteMetadataWatcher(server.url(), tmp_path / "state")
        with pytest.raises(RemoteMetadataError, match="over the 16384 bytes") as caught:
            watcher.sync()
        assert isinstance(caught.value, SourceError)
        (remote / "metadata/timestamp.json").unlink()
        with pytest.raises(RemoteMetadataError, match=r"not found \(has `modelreg publish`"):
            watcher.sync()
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = RemoteMetadataWatcher(f"http://u:s3cret@127.0.0.1:{port}/x?token=t0k", tmp_path / "s")
    with pytest.raises(RemoteMetadataError) as caught:
        down.sync()
    assert "s3cret" not in str(caught.value)
    assert "t0k" not in str(caught.value)
    assert "127.0.0.1" in str(caught.value)
    missing = RemoteMetadataWatcher(str(tmp_path / "nowhere"), tmp_path / "s")
    with pytest.raises(RemoteMetadataError, match="not found"):
        missing.sync()


def test_a_server_etag_is_sent_back_only_when_it_is_one() -> None:
    assert _etag('"abc"') == '"abc"'
    assert _etag('W/"abc"') == 'W/"abc"'
    for bad in ('"a"\r\nX-Evil: 1', "abc", '"' + "a" * 300 + '"', None):
        assert _etag(bad) is None


def test_an_injected_prober_sees_every_poll(tmp_path: Path) -> None:
    """What a fleet simulation uses: the watcher's logic over its own transport."""
    asked: list[Validators] = []

    def prober(url: str, known: Validators, limits: TrustLimits) -> Probe:
        asked.append(known)
        assert url.endswith("/modelreg/metadata/timestamp.json")
        if known.etag == '"1"':
            return Probe(None, known, 1, 150)
        return Probe(TIMESTAMP, Validators(etag='"1"'), 1, 700)

    watcher = RemoteMetadataWatcher("https://cdn.example/fleet/modelreg", tmp_path, prober=prober)
    assert watcher.metadata == "https://cdn.example/fleet/modelreg/metadata"
    assert [watcher.sync().changed for _ in range(3)] == [True, False, False]
    assert asked == [Validators(), Validators(etag='"1"'), Validators(etag='"1"')]
    assert (watcher.requests, watcher.bytes_received) == (3, 1000)


def test_a_refused_connection_is_said_as_such_not_as_no_answer() -> None:
    """Issue 27, point 15: a closed port on loopback was reported as "no answer
    (URLError: ...)", as if a server were slow; now it says nothing listens there."""
    from tuf.api import exceptions as tuf_errors

    from edge_sync.sync.probe import probe

    with socket.socket() as sock:  # a port nothing listens on (bound, never listening)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        with pytest.raises(tuf_errors.DownloadError) as caught:
            probe(f"http://127.0.0.1:{port}/timestamp.json", Validators(), TrustLimits())
    assert str(caught.value) == "connection refused (nothing listens there)"
