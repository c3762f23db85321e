"""Conditional reads of one small file: "has it changed since these validators?".

Private: ``edge_sync.sync.watcher`` re-exports what the remote metadata watcher needs.  A
device that follows the metadata mirrored to its artifact remote asks for
``timestamp.json`` once per poll, with what identified the copy it last read:

=============  ============================================  ==========================
transport      asked with                                    "not modified" is
=============  ============================================  ==========================
http(s)://     ``If-None-Match`` (ETag), ``If-Modified-      ``304``, headers only
               Since`` (Last-Modified); one GET
s3://          ``GetObject`` with ``IfNoneMatch`` (ETag)     ``304``, headers only
path, file://  ``stat``: inode, size, mtime, ctime           the same four numbers
=============  ============================================  ==========================

A changed file comes back whole (bounded by ``TrustLimits.timestamp_max_length``), so
the TUF client does not download it a second time.  A server that ignores the
validators answers ``200`` every time: still correct, only dearer.  Nothing here is
trusted: validators are hints for the transport, and what a changed file says is
verified by ``edge_sync.sync.trust`` like everything else.

Every read runs under the time limits of :class:`~edge_sync.sync.limits.TrustLimits`, and
each :class:`Probe` counts its requests and the bytes received (over HTTP: status
lines and headers included, as read from the socket).  Errors are python-tuf's
transport errors, as the fetchers raise them.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlparse
from urllib.request import url2pathname

from tuf.api import exceptions as tuf_errors

from edge_sync.sync.limits import TrustLimits
from edge_sync.sync.s3 import probe_s3
from edge_sync.sync.transfer import (
    SameOriginRedirects,
    TransferBudget,
    guarded_opener,
    no_answer_reason,
)

_ETAG: Final = re.compile(r'^(W/)?"[\x21\x23-\x7e]{0,200}"$')
"""An entity tag as RFC 9110 writes it (ASCII, no quote inside); anything else is not
sent back (a header built from a server's bytes must not carry a line break)."""
_HTTP_DATE: Final = re.compile(r"^[\x20-\x7e]{1,64}$")


@dataclass(frozen=True)
class Validators:
    """What identifies the copy of a file last read, to ask whether it changed.

    Attributes:
        etag: the ETag an HTTP server or S3 sent with it.
        last_modified: the ``Last-Modified`` an HTTP server sent with it.
        stat: a local file's (inode, size, mtime ns, ctime ns).
    """

    etag: str | None = None
    last_modified: str | None = None
    stat: tuple[int, int, int, int] | None = None

    @property
    def empty(self) -> bool:
        """Whether there is nothing to ask with (the next read is unconditional)."""
        return self.etag is None and self.last_modified is None and self.stat is None


@dataclass(frozen=True)
class Probe:
    """The answer to one conditional read.

    Attributes:
        body: the file's bytes when it changed (or the server cannot tell), None when
            it is unchanged since the validators asked with.
        validators: what identifies the copy now held (to ask with next time).
        requests: requests sent (redirects included; a ``stat`` counts as one).
        received: bytes received for them (headers included where the transport
            tells; over S3 the headers are counted as botocore parsed them).
    """

    body: bytes | None
    validators: Validators
    requests: int = 1
    received: int = 0


Prober = Callable[[str, Validators, TrustLimits], Probe]
"""Reads ``url`` unless unchanged since the validators (:func:`probe` is the real one;
a fleet simulation or a test passes its own)."""


def probe(
    url: str,
    known: Validators,
    limits: TrustLimits,
    *,
    cancelled: Callable[[], bool] | None = None,
) -> Probe:
    """Read ``url`` (a path, ``file://``, ``http(s)://`` or ``s3://`` URL) unless it is
    unchanged since ``known``; over the network, ``cancelled`` is asked while a read
    waits (True ends it with a ``DownloadError``).

    Raises:
        DownloadHTTPError: the server answered with an error status (404: missing).
        DownloadLengthMismatchError: the file is over ``limits.timestamp_max_length``.
        SlowRetrievalError: a time limit of ``limits`` was passed.
        DownloadError: no connection, or an unsupported URL.
    """
    scheme = urlparse(url).scheme
    if scheme in {"http", "https"}:
        return _probe_http(url, known, limits, cancelled)
    if scheme == "s3":
        body, etag, requests, received = probe_s3(url, known.etag, limits, cancelled)
        validators = known if body is None else Validators(etag=_etag(etag))
        return Probe(body, validators, requests, received)
    if scheme == "file":
        return _probe_file(Path(url2pathname(urlparse(url).path)), known, limits)
    if scheme:
        raise tuf_errors.DownloadError(f"{scheme}:// is not a supported URL scheme")
    return _probe_file(Path(url), known, limits)


def _etag(value: str | None) -> str | None:
    return value if value is not None and _ETAG.match(value) else None


def _too_long(limits: TrustLimits) -> tuf_errors.DownloadLengthMismatchError:
    return tuf_errors.DownloadLengthMismatchError(
        f"over the {limits.timestamp_max_length} bytes a timestamp may be"
    )


def _probe_http(
    url: str, known: Validators, limits: TrustLimits, cancelled: Callable[[], bool] | None = None
) -> Probe:
    budget = TransferBudget(limits, cancelled=cancelled)
    redirects = SameOriginRedirects()  # counts them: each is a request
    opener = guarded_opener(budget, redirects)
    # identity: a compressed body would be the hash of other bytes than were signed
    request = urllib.request.Request(url, headers={"Accept-Encoding": "identity"})  # noqa: S310 - the scheme is checked above
    if known.etag is not None:
        request.add_header("If-None-Match", known.etag)
    if known.last_modified is not None:
        request.add_header("If-Modified-Since", known.last_modified)
    try:
        try:
            response = opener.open(request, timeout=limits.read_timeout_s)
        except urllib.error.HTTPError as e:
            e.close()
            if e.code == 304 and not known.empty:
                return Probe(None, known, 1 + redirects.count, budget.received)
            # Without the URL: a remote's URL may hold credentials.
            raise tuf_errors.DownloadHTTPError(f"HTTP error {e.code}", e.code) from None
        with response:
            body = response.read(limits.timestamp_max_length + 1)
            headers = response.headers
    except tuf_errors.DownloadError:
        raise
    except Exception as e:
        raise tuf_errors.DownloadError(no_answer_reason(e)) from e
    if len(body) > limits.timestamp_max_length:
        raise _too_long(limits)
    modified = headers.get("Last-Modified")
    validators = Validators(
        etag=_etag(headers.get("ETag")),
        last_modified=modified if modified and _HTTP_DATE.match(modified) else None,
    )
    return Probe(body, validators, 1 + redirects.count, budget.received)


def _open_nofollow(path: Path) -> int:
    """Open ``path`` for reading with no symbolic link followed, in any component: each
    folder is opened from the one before it (``openat``) with ``O_NOFOLLOW``.

    A remote's folder is untrusted: a link planted there could make the device read,
    and publish the digest of, any file it may read (``/etc/shadow`` as ``sync.commit``).
    The operator's own path to the remote is resolved by the caller before it comes
    here.  ``O_NONBLOCK``: a FIFO planted on the remote would block the open forever.

    Raises:
        DownloadHTTPError: ``path`` or a folder on the way is missing (404).
        DownloadError: a component is a symbolic link, or cannot be opened.
    """
    # lexical, not resolved: resolving would follow the very links refused here
    absolute = Path(os.path.abspath(path))  # noqa: PTH100
    folder_flags = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
    nofollow = os.O_NOFOLLOW
    fd = os.open("/", folder_flags)
    try:
        *folders, name = absolute.parts[1:] or ("",)
        for part in folders:
            step = os.open(part, folder_flags | nofollow, dir_fd=fd)
            os.close(fd)
            fd = step
        file_flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | nofollow
        return os.open(name, file_flags, dir_fd=fd)
    except (FileNotFoundError, NotADirectoryError):
        # a link to a folder, opened as itself (O_PATH | O_NOFOLLOW), is not a folder
        if _is_link(absolute):
            raise _link(path) from None
        raise tuf_errors.DownloadHTTPError(f"{path}: not found", 404) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _link(path) from None
        raise tuf_errors.DownloadError(f"{path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _is_link(path: Path) -> bool:
    """Whether ``path`` or a folder on its way is a symbolic link (for the message)."""
    return any(p.is_symlink() for p in (path, *path.parents))


def _link(path: Path) -> tuf_errors.DownloadError:
    return tuf_errors.DownloadError(
        f"{path}: a symbolic link on the remote (in the file's path): not followed"
    )


def _probe_file(path: Path, known: Validators, limits: TrustLimits) -> Probe:
    # The type is checked on the opened descriptor, so it cannot change in between.
    fd = _open_nofollow(path)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise tuf_errors.DownloadHTTPError(f"{path}: not found (not a regular file)", 404)
        stamp = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        if known.stat == stamp:
            return Probe(None, known, 1, 0)
        os.set_blocking(fd, True)
        body = fh.read(limits.timestamp_max_length + 1)
    if len(body) > limits.timestamp_max_length:
        raise _too_long(limits)
    return Probe(body, Validators(stat=stamp), 1, len(body))
