"""Bounded work on untrusted input (issue 8, point 7): slow remotes and huge bundles.

* A remote that trickles a file one byte every 5 s held a device forever.  The
  device now refreshes and fetches over real HTTP on 127.0.0.1 under small
  :class:`~edge_sync.sync.trust.TrustLimits`, and a trickled target or metadata file is a
  ``TrustFetchError`` within about a second; nothing is installed or left behind.
* A 64 MiB bundle of ``{}`` made ``modelreg verify`` use 1.8 GB and 20 s.  It is now
  refused from its size before a byte is read, and a bundle under the size cap but
  made of empty objects is refused from its count of JSON values before parsing: one
  line, exit 1, a small peak RSS (measured in a child process).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_sync.sync.trust import DeviceTrust, LocalFetcher, TrustLimits
from signing.errors import TrustFetchError
from signing.tuf_roles import METADATA_DIR
from tests.adversarial.conftest import ARTIFACT, Fleet
from tests.conftest import REPO_ROOT
from tests.http_sim import Trickle, TrickleServer

pytestmark = pytest.mark.integration

LIMITS = TrustLimits(
    read_timeout_s=1.0, min_bytes_per_s=1000, rate_grace_s=0.3, download_deadline_s=3.0
)
"""Small enough that a trickle is cut off in well under a second."""


@pytest.fixture
def served(fleet: Fleet) -> Iterator[TrickleServer]:
    """The fleet's work tree (metadata and artifact remote) over HTTP on 127.0.0.1."""
    with TrickleServer(fleet.root.resolve()) as server:
        yield server


def _remote_url(fleet: Fleet, server: TrickleServer) -> str:
    return server.url(fleet.remote.resolve().relative_to(fleet.root.resolve()).as_posix())


class MetadataOverHttp(LocalFetcher):
    """The production fetcher, with the checkout's metadata served by ``server``.

    ``DeviceTrust`` reads metadata from a git checkout; this maps those ``file://``
    URLs to the same files over HTTP, so the Updater's metadata downloads go through
    the HTTP fetcher and its limits.
    """

    def __init__(self, fleet: Fleet, server: TrickleServer) -> None:
        super().__init__([], limits=LIMITS)
        self._local = (fleet.root / METADATA_DIR).resolve().as_uri() + "/"
        self._http = server.url(METADATA_DIR + "/")

    def _fetch(self, url: str) -> Iterator[bytes]:
        assert url.startswith(("http://", self._local)), url
        return super()._fetch(url.replace(self._local, self._http, 1))


def _device(fleet: Fleet, server: TrickleServer, state: str, *, metadata_over_http: bool) -> Any:
    folder = fleet.tmp / state
    if not folder.exists():
        DeviceTrust.provision(folder, (fleet.root / METADATA_DIR / "1.root.json").read_bytes())
    fetcher = MetadataOverHttp(fleet, server) if metadata_over_http else None
    return DeviceTrust(
        folder, fleet.root, _remote_url(fleet, server), limits=LIMITS, fetcher=fetcher
    )


def test_a_trickled_target_is_cut_off_and_nothing_is_installed(
    fleet: Fleet, served: TrickleServer
) -> None:
    device = _device(fleet, served, "device", metadata_over_http=False)
    device.refresh()
    served.slow[".onnx"] = Trickle(interval_s=5.0)  # the attack: one byte every 5 s
    dest = fleet.tmp / "engines"
    start = time.monotonic()
    with pytest.raises(
        TrustFetchError, match=r"models/mlp/1\.0\.0\.onnx: slower than 1000 bytes/s"
    ):
        device.fetch(ARTIFACT, dest, model="mlp", version="1.0.0")
    assert time.monotonic() - start < 3  # the trickle alone would take hours
    assert any(p.endswith(".onnx") for p in served.requests)  # it did go to the server
    assert not dest.exists() or list(dest.iterdir()) == []  # no file, no .partial

    # The same device, the same limits, a remote at normal speed: the file arrives.
    served.slow.clear()
    got = device.fetch(ARTIFACT, dest, model="mlp", version="1.0.0")
    assert got.read_bytes() == (fleet.root / ARTIFACT).read_bytes()
    assert [p.name for p in dest.iterdir()] == [got.name]


def test_trickled_metadata_is_cut_off_and_the_trusted_state_kept(
    fleet: Fleet, served: TrickleServer
) -> None:
    device = _device(fleet, served, "device", metadata_over_http=True)
    device.refresh()  # metadata over HTTP at normal speed: fine
    assert any(p.endswith("/timestamp.json") for p in served.requests)
    trusted = device.trusted()
    state = {p: p.read_bytes() for p in (fleet.tmp / "device").rglob("*") if p.is_file()}

    served.slow["/timestamp.json"] = Trickle(interval_s=5.0)
    start = time.monotonic()
    with pytest.raises(TrustFetchError, match="trust metadata: slower than 1000 bytes/s"):
        device.refresh()
    assert time.monotonic() - start < 3
    assert device.trusted() == trusted
    assert {p: p.read_bytes() for p in (fleet.tmp / "device").rglob("*") if p.is_file()} == state

    # A device that never refreshed trusts nothing new either, and fetches nothing.
    fresh = _device(fleet, served, "fresh", metadata_over_http=True)
    served.slow["/timestamp.json"] = Trickle(interval_s=0.05, headers=True)
    with pytest.raises(TrustFetchError, match="slower than 1000 bytes/s"):
        fresh.fetch(ARTIFACT, fleet.tmp / "fresh-engines")
    assert "timestamp" not in fresh.trusted()
    assert not (fleet.tmp / "fresh-engines").exists()


# --- modelreg verify --bundle on a huge or hostile bundle -----------------------------

_MEASURED = """
import os, sys
from modelreg.cli.main import main
try:
    main(sys.argv[1:])
finally:
    # VmHWM, not ru_maxrss: the latter keeps the parent's RSS across fork and exec.
    with open("/proc/self/status") as status, open(os.environ["PEAK_RSS_OUT"], "w") as out:
        out.write(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
"""


def _measured_verify(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """``modelreg verify ARGS`` in a child process; its result and peak RSS in MB."""
    out = tmp_path / "peak-rss"
    env = {**os.environ, "PEAK_RSS_OUT": str(out), "PYTHONPATH": str(REPO_ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", _MEASURED, "verify", *args],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60, check=False,
    )  # fmt: skip
    return run, int(out.read_text()) // 1024  # VmHWM is in kB


@pytest.fixture
def signed(tmp_path: Path, cli: Any, example_models: Path) -> tuple[Path, Path, Path]:
    """A model file, its bundle and the public key, made by ``modelreg keys`` and ``sign``."""
    model = tmp_path / "mlp.onnx"
    model.write_bytes((example_models / "mlp/1.0.0.onnx").read_bytes())
    keys = tmp_path / "keys"
    assert cli("keys", "generate", "--role", "targets", "--out", str(keys), cwd=tmp_path).code == 0
    bundle = tmp_path / "mlp.sigstore.json"
    r = cli("sign", str(model), "--bundle", str(bundle), "--private-key",
            str(keys / "targets.key"), cwd=tmp_path)  # fmt: skip
    assert r.code == 0, r.err
    return model, bundle, keys / "targets.pub"


def _empty_objects(path: Path, size: int) -> None:
    with path.open("wb") as fh:
        fh.write(b"[")
        fh.write(b"{}," * ((size - 4) // 3))
        fh.write(b"{}]")


def test_a_64_mib_bundle_of_empty_objects_is_one_line_fast_and_small(
    tmp_path: Path, signed: tuple[Path, Path, Path]
) -> None:
    model, bundle, public = signed
    run, rss = _measured_verify(tmp_path, str(model), "--bundle", str(bundle),
                                "--public-key", str(public))  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "verified" in run.stdout

    huge = tmp_path / "huge.sigstore.json"
    _empty_objects(huge, 64 << 20)
    start = time.monotonic()
    run, rss = _measured_verify(tmp_path, str(model), "--bundle", str(huge),
                                "--public-key", str(public))  # fmt: skip
    elapsed = time.monotonic() - start
    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr.splitlines() == [
        f"modelreg: {huge}: bundle is {huge.stat().st_size} bytes, over the 33554432 allowed"
    ]
    assert rss < 150, f"peak RSS {rss} MB"  # was 1.8 GB: nothing of the file is read
    assert elapsed < 10, f"{elapsed:.1f} s"  # was 20 s; most of this is starting Python


def test_a_bundle_under_the_size_cap_made_of_empty_objects_is_refused_before_parsing(
    tmp_path: Path, signed: tuple[Path, Path, Path]
) -> None:
    model, _, public = signed
    hostile = tmp_path / "many.sigstore.json"
    _empty_objects(hostile, 30 << 20)
    run, rss = _measured_verify(tmp_path, str(model), "--bundle", str(hostile),
                                "--public-key", str(public))  # fmt: skip
    assert run.returncode == 1
    (line,) = run.stderr.splitlines()
    assert line.startswith(f"modelreg: {hostile}: bundle has about ")
    assert line.endswith("JSON values, over the 1024 allowed "
                         "(a bundle is a few small fields and one base64 payload)")  # fmt: skip
    # The 30 MiB file is read (once), never parsed: parsing it took over 800 MB.
    assert rss < 200, f"peak RSS {rss} MB"


def test_a_bundle_that_is_a_link_or_a_fifo_is_refused_without_reading(
    tmp_path: Path, cli: Any, signed: tuple[Path, Path, Path]
) -> None:
    model, bundle, public = signed
    link = tmp_path / "link.sigstore.json"
    link.symlink_to(bundle)
    r = cli("verify", str(model), "--bundle", str(link), "--public-key", str(public),
            cwd=tmp_path)  # fmt: skip
    assert (r.code, r.out) == (1, "")
    assert r.err.splitlines() == [
        f"modelreg: {link}: bundle is a symbolic link; links in a repository are never followed"
    ]
    fifo = tmp_path / "fifo.sigstore.json"
    os.mkfifo(fifo)
    # In a child with a timeout: before the fix, opening the FIFO waited for a writer.
    run, _ = _measured_verify(tmp_path, str(model), "--bundle", str(fifo),
                              "--public-key", str(public))  # fmt: skip
    assert run.returncode == 1
    assert run.stderr.splitlines() == [f"modelreg: {fifo}: bundle is not a regular file"]
