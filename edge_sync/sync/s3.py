"""``s3://bucket/prefix`` artifact remotes, read with boto3 (``modelreg[edge-s3]``).

Used by ``edge_sync.sync.fetch`` and ``edge_sync.sync.probe``.  The client is
``registry.s3client``'s, under its rule for endpoint, region and credentials (unsigned
without any: a public bucket, as behind a CDN).

botocore only signs: each ``GetObject`` is a presigned URL, read by the same guarded
HTTP client as an ``http(s)://`` remote (``edge_sync.sync.transfer``).  So an S3 transfer
runs under exactly the time limits of :class:`~edge_sync.sync.limits.TrustLimits` (one
deadline and a minimum rate for the whole file, status line and headers included), stops
within a fraction of a second when the daemon stops, and follows no redirect off the
endpoint.  botocore's own reads time only each ``recv``: an endpoint trickling a byte
every few seconds held a sync for hours.  A ``Range`` or ``If-None-Match`` header is
sent beside the signature (S3 signs only the host in a presigned GET).  A bucket in
another region than the client's answers with its region (``x-amz-bucket-region``),
and the request is signed again for it, once, as botocore's own redirector does.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, Final
from urllib.parse import urlparse

from tuf.api import exceptions as tuf_errors

from edge_sync.sync.limits import TrustLimits
from edge_sync.sync.transfer import (
    SameOriginRedirects,
    TransferBudget,
    guarded_opener,
    http_chunks,
    no_answer_reason,
)
from registry.s3client import S3UnavailableError, s3_client

_PRESIGN_S: Final = 3600
"""Lifetime of a presigned request (it is sent at once; a resumed one is signed anew)."""
_REGION_HEADER: Final = "x-amz-bucket-region"
_NO_BOTO3: Final = "s3:// remotes need boto3: install modelreg[edge-s3]"


class _WrongRegion(Exception):  # noqa: N818 - a signal between two functions, not an error
    """The bucket lives in ``region``: sign again for it."""

    def __init__(self, region: str) -> None:
        super().__init__(region)
        self.region = region


def _presigned(url: str, region: str | None) -> str:
    """A presigned ``GetObject`` URL for the object at ``url``.

    Raises:
        DownloadError: ``url`` is not an ``s3://bucket/key`` URL, boto3 is missing, or
            the AWS configuration cannot be read.
    """
    try:
        from botocore.exceptions import BotoCoreError
    except ImportError:
        raise tuf_errors.DownloadError(_NO_BOTO3) from None
    try:
        signer = s3_client(region=region)  # it only signs: no network settings of its own
        params = _object(url)
        return str(signer.generate_presigned_url("get_object", Params=params, ExpiresIn=_PRESIGN_S))
    except S3UnavailableError:
        raise tuf_errors.DownloadError(_NO_BOTO3) from None
    except BotoCoreError as e:
        raise tuf_errors.DownloadError(f"S3: {e}") from None


def _object(url: str) -> dict[str, Any]:
    """The ``GetObject`` arguments naming the object at ``url``.

    Raises:
        DownloadError: ``url`` is not an ``s3://bucket/key`` URL.
    """
    parsed = urlparse(url)
    bucket, key = parsed.netloc, parsed.path.lstrip("/")
    if not bucket or not key:
        raise tuf_errors.DownloadError(f"{url}: not an s3://bucket/key URL")
    return {"Bucket": bucket, "Key": key}


class _S3Redirects(SameOriginRedirects):
    """Same-origin redirects; one that names the bucket's region is signed again."""

    def __init__(self, region: str | None) -> None:
        super().__init__()
        self._region = region

    def refuse(self, fp: Any, headers: Any) -> None:
        """A redirect naming another region than the one signed for: sign again.

        Raises:
            _WrongRegion: the bucket's region.
        """
        region = headers.get(_REGION_HEADER) if headers is not None else None
        if region and region != self._region:
            fp.close()
            raise _WrongRegion(region)


def _refused(status: int) -> tuf_errors.DownloadHTTPError:
    """What a refused S3 request is to the TUF client (never the request's details)."""
    if status == 403:
        return tuf_errors.DownloadHTTPError(
            "S3: access denied (the device's AWS credentials, or none, may not read it)", 403
        )
    if status == 404:
        return tuf_errors.DownloadHTTPError("S3 NoSuchKey", 404)
    return tuf_errors.DownloadHTTPError(f"S3 HTTP error {status}", status or 500)


def _open(
    url: str, signed: str, limits: TrustLimits, budget: TransferBudget, headers: dict[str, str]
) -> tuple[Any, int]:
    """GET the object at ``url`` (presigned as ``signed``) under ``budget``: the
    response, and the redirects followed; an error status comes back as the
    ``HTTPError`` (read and closed).

    Raises:
        DownloadError: no connection, a redirect off the endpoint.
        SlowRetrievalError: a time limit was passed.
    """
    region: str | None = None
    for _ in range(2):
        redirects = _S3Redirects(region)
        opener = guarded_opener(budget, redirects)
        request = urllib.request.Request(signed, headers=headers)  # noqa: S310 - https or the configured endpoint
        try:
            try:
                return opener.open(request, timeout=limits.read_timeout_s), redirects.count
            except urllib.error.HTTPError as e:
                found = e.headers.get(_REGION_HEADER) if e.headers is not None else None
                e.close()
                if found and found != region and e.code in (301, 400):
                    raise _WrongRegion(found) from None
                return e, redirects.count
        except _WrongRegion as w:
            region = w.region
            signed = _presigned(url, region)
        except tuf_errors.DownloadError:
            raise
        except Exception as e:
            # Without the URL: a presigned one carries a signature.
            raise tuf_errors.DownloadError(f"S3: {no_answer_reason(e)}") from e
    raise tuf_errors.DownloadError("S3: the bucket's region kept changing")


def fetch_s3(
    url: str,
    offset: int,
    limits: TrustLimits,
    chunk_size: int,
    budget: Callable[[], TransferBudget],
) -> tuple[int, Iterator[bytes]]:
    """The object at ``url`` from ``offset`` on; where its bytes start.

    Raises:
        DownloadHTTPError: the object is missing (404) or access is refused.
        SlowRetrievalError: a time limit was passed before the body started.
        DownloadError: the service cannot be reached.
    """
    headers = {"Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    # signed before the clock starts: making a client is local work, slow the first time
    signed = _presigned(url, None)
    response, _ = _open(url, signed, limits, budget(), headers)
    if isinstance(response, urllib.error.HTTPError):
        if response.code == 416 and offset:  # nothing after offset: start again from 0
            return fetch_s3(url, 0, limits, chunk_size, budget)
        raise _refused(response.code)
    start = offset if offset and response.status == 206 else 0
    return start, http_chunks(response, chunk_size)


def probe_s3(
    url: str, etag: str | None, limits: TrustLimits, cancelled: Callable[[], bool] | None = None
) -> tuple[bytes | None, str | None, int, int]:
    """The object at ``url`` unless its ETag is still ``etag`` (one ``GetObject`` with
    ``If-None-Match``): (body or None when unchanged, its ETag, requests, bytes received).

    Raises:
        DownloadHTTPError: the object is missing (404) or access is refused.
        DownloadLengthMismatchError: it is over ``limits.timestamp_max_length``.
        SlowRetrievalError: a time limit was passed.
        DownloadError: the service cannot be reached.
    """
    signed = _presigned(url, None)
    budget = TransferBudget(limits, cancelled=cancelled)
    headers = {"Accept-Encoding": "identity"}
    if etag is not None:
        headers["If-None-Match"] = etag
    response, redirects = _open(url, signed, limits, budget, headers)
    if isinstance(response, urllib.error.HTTPError):
        if response.code == 304 and etag is not None:
            return None, etag, 1 + redirects, budget.received
        raise _refused(response.code)
    try:
        with response:
            body = response.read(limits.timestamp_max_length + 1)
            tag = response.headers.get("ETag")
    except tuf_errors.DownloadError:
        raise
    except Exception as e:
        raise tuf_errors.DownloadError(f"S3 connection failed: {type(e).__name__}") from e
    if len(body) > limits.timestamp_max_length:
        raise tuf_errors.DownloadLengthMismatchError(
            f"over the {limits.timestamp_max_length} bytes a timestamp may be"
        )
    return body, tag if isinstance(tag, str) else None, 1 + redirects, budget.received
