"""How a device downloads: fetchers for python-tuf's ``Updater`` under a time budget.

Private: ``edge_sync.sync.trust`` re-exports :class:`LocalFetcher`.  Every download
(metadata and targets, over HTTP, S3 or from a folder) runs under a
:class:`~edge_sync.sync.transfer.TransferBudget` built from
:class:`~edge_sync.sync.limits.TrustLimits` (``edge_sync.sync.transfer``: the budget, the
guarded HTTP opener, same-origin redirects).  S3 goes through the same HTTP client:
``edge_sync.sync.s3`` presigns, the guarded opener reads.
"""

from __future__ import annotations

import os
import stat
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlparse
from urllib.request import url2pathname

from tuf.api import exceptions as tuf_errors
from tuf.ngclient.fetcher import FetcherInterface

from edge_sync.sync.limits import TrustLimits
from edge_sync.sync.s3 import fetch_s3
from edge_sync.sync.transfer import TransferBudget, guarded_opener, http_chunks


def _fetch_http(
    url: str,
    limits: TrustLimits,
    chunk_size: int,
    offset: int = 0,
    cancelled: Callable[[], bool] | None = None,
) -> tuple[int, Iterator[bytes]]:
    """Open ``url`` (proxies from the environment, redirects followed) under a budget.

    Only HTTP(S) handlers are installed: a redirect to ``ftp:`` or ``file:`` fails.
    With ``offset``, asks for the rest of the file (``Range``); returns where the body
    starts: ``offset`` when the server sent a part (206), 0 when it sent the whole file.

    Raises:
        DownloadHTTPError: the server answered with an error status.
        SlowRetrievalError: a time limit was passed before the body started.
        DownloadError: a redirect to another origin, or ``cancelled`` said stop.
        URLError, HTTPException, OSError: no connection (``fetch()`` wraps them).
    """
    budget = TransferBudget(limits, cancelled=cancelled)
    opener = guarded_opener(budget)
    request = urllib.request.Request(url)  # noqa: S310 - the scheme is checked by the caller
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        response = opener.open(request, timeout=limits.read_timeout_s)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 416 and offset:  # nothing after offset: start again from 0
            return _fetch_http(url, limits, chunk_size, cancelled=cancelled)
        # Without the URL: a remote's URL may hold credentials.
        raise tuf_errors.DownloadHTTPError(f"HTTP error {e.code}", e.code) from None
    start = offset if offset and response.status == 206 else 0
    return start, http_chunks(response, chunk_size)


class LocalFetcher(FetcherInterface):
    """Serves ``file://`` URLs inside given folders, ``http(s)://`` and ``s3://`` URLs.

    Files are streamed in chunks, so the Updater stops reading as soon as a file
    exceeds the length it allows (endless data), and every download runs under the
    time limits of :class:`TrustLimits` (slow retrieval).  A missing file is an HTTP
    404, which the Updater needs to know that the newest root has been reached.
    """

    def __init__(
        self,
        roots: Sequence[Path],
        *,
        limits: TrustLimits | None = None,
        chunk_size: int | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        """Serve files under ``roots`` only (symlinks resolved) under ``limits``.

        Args:
            roots: the folders ``file://`` URLs may name.
            limits: time limits and chunk size (default :class:`TrustLimits`).
            chunk_size: bytes per chunk, instead of ``limits.chunk_size``.
            cancelled: asked while a network download waits for data (at least every
                :data:`~edge_sync.sync.transfer.CANCEL_POLL_S`); True stops it with a
                ``DownloadError``.
        """
        self._roots = tuple(root.resolve() for root in roots)
        self._limits = limits or TrustLimits()
        self._chunk_size = chunk_size or self._limits.chunk_size
        self._cancelled = cancelled

    def _budget(self) -> TransferBudget:
        return TransferBudget(self._limits, cancelled=self._cancelled)

    def _fetch(self, url: str) -> Iterator[bytes]:
        return self.fetch_from(url, 0)[1]

    def fetch_from(self, url: str, offset: int) -> tuple[int, Iterator[bytes]]:
        """The bytes of ``url`` from ``offset`` on where the transport can resume
        (HTTP ``Range``, a seek in a file); returns where they start (0 when it cannot).

        Raises:
            DownloadError, DownloadHTTPError: as ``fetch``.
        """
        parsed = urlparse(url)
        if parsed.scheme == "s3":
            return fetch_s3(url, offset, self._limits, self._chunk_size, self._budget)
        if parsed.scheme in {"http", "https"}:
            try:
                return _fetch_http(url, self._limits, self._chunk_size, offset, self._cancelled)
            except tuf_errors.DownloadError:
                raise
            except Exception as e:
                raise tuf_errors.DownloadError(f"Failed to download {url}") from e
        if parsed.scheme != "file" or parsed.netloc not in {"", "localhost"}:
            raise tuf_errors.DownloadError(f"{url}: unsupported URL")
        budget = self._budget()
        path = Path(url2pathname(parsed.path)).resolve()
        # Checks happen here, not in the generator, so that they raise at fetch time.
        if not any(path.is_relative_to(root) for root in self._roots):
            raise tuf_errors.DownloadHTTPError(f"{url}: outside the served folders", 403)
        # O_NONBLOCK: a FIFO planted on the remote would block the open forever; the
        # type is checked on the opened descriptor, so it cannot change in between.
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags)
        except (FileNotFoundError, NotADirectoryError):
            raise tuf_errors.DownloadHTTPError(f"{url}: not found", 404) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise tuf_errors.DownloadHTTPError(f"{url}: not found (not a regular file)", 404)
        os.set_blocking(fd, True)
        fh = os.fdopen(fd, "rb")
        start = offset if 0 < offset <= os.fstat(fd).st_size else 0
        fh.seek(start)
        return start, self._chunks(fh, budget)

    def _chunks(self, fh: BinaryIO, budget: TransferBudget) -> Iterator[bytes]:
        with fh:
            while chunk := fh.read(self._chunk_size):
                budget.add(len(chunk))
                yield chunk
