"""``s3://bucket/prefix`` artifact remotes, read with boto3 (``modelreg[edge-s3]``).

Private to ``edge_sync._fetch``.  Credentials, region and endpoint come from the
standard AWS configuration (environment, ``~/.aws``, instance roles;
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` for an S3-compatible server); with no
credentials at all, requests go unsigned (a public bucket, as behind a CDN).  Like the
other transports, a download resumes with a ``Range`` and runs under the time limits of
:class:`~edge_sync.limits.TrustLimits`; what it returns is verified by the caller.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlparse

from tuf.api import exceptions as tuf_errors

from edge_sync.limits import TrustLimits

_CLIENTS: dict[tuple[object, ...], Any] = {}
_SETTINGS = (
    "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
    "AWS_DEFAULT_REGION", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
)  # fmt: skip
"""Environment that changes which client is right (a new one is made when it does)."""
_LOCK = threading.Lock()


def _client(limits: TrustLimits) -> Any:
    """One boto3 client per limits (clients are thread-safe and slow to make)."""
    try:
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config
    except ImportError:
        raise tuf_errors.DownloadError(
            "s3:// remotes need boto3: install modelreg[edge-s3]"
        ) from None
    key = (limits.read_timeout_s, *(os.environ.get(name) for name in _SETTINGS))
    with _LOCK:
        if key not in _CLIENTS:
            session = boto3.session.Session()
            config = Config(
                connect_timeout=limits.read_timeout_s,
                read_timeout=limits.read_timeout_s,
                retries={"max_attempts": 2, "mode": "standard"},
            )
            if session.get_credentials() is None:
                config = config.merge(Config(signature_version=UNSIGNED))
            _CLIENTS[key] = session.client("s3", config=config)
        return _CLIENTS[key]


def fetch_s3(
    url: str,
    offset: int,
    limits: TrustLimits,
    chunk_size: int,
    budget: Callable[[], Any],
) -> tuple[int, Iterator[bytes]]:
    """The object at ``url`` from ``offset`` on; where its bytes start.

    Raises:
        DownloadHTTPError: the object is missing (404) or access is refused.
        DownloadError: the service cannot be reached.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    parsed = urlparse(url)
    bucket, key = parsed.netloc, parsed.path.lstrip("/")
    if not bucket or not key:
        raise tuf_errors.DownloadError(f"{url}: not an s3://bucket/key URL")
    request: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if offset:
        request["Range"] = f"bytes={offset}-"
    try:
        response = _client(limits).get_object(**request)
    except ClientError as e:
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        code = str(e.response.get("Error", {}).get("Code", "error"))
        if status == 416 and offset:
            return fetch_s3(url, 0, limits, chunk_size, budget)
        if code in ("NoSuchKey", "404", "NotFound"):
            status = 404
        if status == 403 or code == "AccessDenied":
            raise tuf_errors.DownloadHTTPError(
                "S3: access denied (the device's AWS credentials, or none, may not read it)",
                403,
            ) from None
        raise tuf_errors.DownloadHTTPError(f"S3 {code}", status or 500) from None
    except BotoCoreError as e:
        raise tuf_errors.DownloadError(f"S3: {e}") from None
    start = offset if offset and response.get("ContentRange") else 0
    return start, _chunks(response["Body"], chunk_size, budget())


def _chunks(body: Any, chunk_size: int, budget: Any) -> Iterator[bytes]:
    from botocore.exceptions import BotoCoreError

    try:
        for chunk in body.iter_chunks(chunk_size):
            budget.add(len(chunk))
            yield chunk
    except (BotoCoreError, OSError) as e:
        raise tuf_errors.DownloadError(f"S3 connection failed: {e!r}") from e
    finally:
        body.close()


def _header_bytes(metadata: Any) -> int:
    """About the bytes of a response's status line and headers, as botocore parsed them."""
    headers = metadata.get("HTTPHeaders", {}) if isinstance(metadata, dict) else {}
    return len("HTTP/1.1 200 OK\r\n\r\n") + sum(len(k) + len(v) + 4 for k, v in headers.items())


def probe_s3(
    url: str, etag: str | None, limits: TrustLimits
) -> tuple[bytes | None, str | None, int, int]:
    """The object at ``url`` unless its ETag is still ``etag`` (one ``GetObject`` with
    ``IfNoneMatch``): (body or None when unchanged, its ETag, requests, bytes received).

    Raises:
        DownloadHTTPError: the object is missing (404) or access is refused.
        DownloadLengthMismatchError: it is over ``limits.timestamp_max_length``.
        DownloadError: the service cannot be reached.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    parsed = urlparse(url)
    bucket, key = parsed.netloc, parsed.path.lstrip("/")
    if not bucket or not key:
        raise tuf_errors.DownloadError(f"{url}: not an s3://bucket/key URL")
    request: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if etag is not None:
        request["IfNoneMatch"] = etag
    try:
        response = _client(limits).get_object(**request)
    except ClientError as e:
        meta = e.response.get("ResponseMetadata", {})
        status = int(meta.get("HTTPStatusCode", 0) or 0)
        code = str(e.response.get("Error", {}).get("Code", "error"))
        if etag is not None and (status == 304 or code in ("304", "NotModified")):
            return None, etag, 1, _header_bytes(meta)
        if code in ("NoSuchKey", "404", "NotFound"):
            status = 404
        if status == 403 or code == "AccessDenied":
            raise tuf_errors.DownloadHTTPError(
                "S3: access denied (the device's AWS credentials, or none, may not read it)",
                403,
            ) from None
        raise tuf_errors.DownloadHTTPError(f"S3 {code}", status or 500) from None
    except BotoCoreError as e:
        raise tuf_errors.DownloadError(f"S3: {e}") from None
    from edge_sync._fetch import _TransferBudget

    body = b""
    for chunk in _chunks(response["Body"], limits.chunk_size, _TransferBudget(limits)):
        body += chunk
        if len(body) > limits.timestamp_max_length:
            response["Body"].close()
            raise tuf_errors.DownloadLengthMismatchError(
                f"over the {limits.timestamp_max_length} bytes a timestamp may be"
            )
    received = len(body) + _header_bytes(response.get("ResponseMetadata"))
    tag = response.get("ETag")
    return body, tag if isinstance(tag, str) else None, 1, received
