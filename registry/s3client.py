"""The one place a boto3 S3 client is made, for the device (artifact remotes, the report
sink) and the fleet (reading the reports), under one rule:

- **endpoint**: ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL`` (an S3-compatible
  store: MinIO, Ceph, moto), else what the AWS configuration says (AWS's own endpoint
  for the region).  Read here, not left to boto3, so that the rule holds with a boto3
  too old to know these variables.
- **region**: the caller's (a bucket's region learned from its answer), else the AWS
  configuration's (``AWS_DEFAULT_REGION``, the profile), else botocore's default.
- **credentials**: the keys the caller gives (a device's report credentials file), else
  the standard chain (environment, ``AWS_PROFILE`` and ``~/.aws``, an instance role);
  when none are found, requests go **unsigned**: a public bucket (as behind a CDN)
  answers, a private one refuses with ``AccessDenied``.

Clients are thread-safe and slow to make: one is kept per set of inputs (the caller's
region, keys and network settings, and the environment variables that change what the
AWS configuration says), and made again when any of them changes.  boto3 is imported
when the first client is made: a device reading only HTTP remotes installs none
(``modelreg[edge-s3]`` adds it).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from registry.errors import RegistryError

__all__ = [
    "ENDPOINT_ENV",
    "S3Network",
    "S3UnavailableError",
    "endpoint_url",
    "s3_client",
]

ENDPOINT_ENV: Final = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
"""Where an S3-compatible endpoint is named, the first set one winning."""
_SETTINGS: Final = (
    *ENDPOINT_ENV, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
    "AWS_RETRY_MODE", "AWS_MAX_ATTEMPTS",
)  # fmt: skip
"""The environment that changes which client is right (a new one is made when it does)."""
_CLIENTS: dict[tuple[object, ...], tuple[tuple[object, ...], Any]] = {}
"""One client per use (region and network settings), with what it was made from: a
client made from other keys or settings replaces it, so rotated credentials (a report
sink re-reads its file before each send) neither pile up clients nor keep old secrets."""
_LOCK = threading.Lock()


class S3UnavailableError(RegistryError):
    """boto3 is not installed (each caller says which extra brings it)."""


@dataclass(frozen=True)
class S3Network:
    """How a client's own requests go (None: botocore's default).

    A client that only presigns (the device's artifact remote: the transfer itself runs
    under the device's time budget) makes no request and needs none of these.

    Attributes:
        timeout_s: connect and read timeout of each request.
        retries: tries after a failed first one (botocore's ``max_attempts``).
        pool: connections kept open at once (one per thread that reads in parallel).
    """

    timeout_s: float | None = None
    retries: int | None = None
    pool: int | None = None

    def options(self) -> dict[str, Any]:
        """These settings as ``botocore.config.Config`` arguments."""
        found: dict[str, Any] = {}
        if self.timeout_s is not None:
            found.update(connect_timeout=self.timeout_s, read_timeout=self.timeout_s)
        if self.retries is not None:
            found["retries"] = {"max_attempts": self.retries, "mode": "standard"}
        if self.pool is not None:
            found["max_pool_connections"] = self.pool
        return found


def endpoint_url(environ: Mapping[str, str] | None = None) -> str | None:
    """The endpoint the rule names (module docstring); None: the AWS configuration's."""
    env = os.environ if environ is None else environ
    return next((env[name] for name in ENDPOINT_ENV if env.get(name)), None)


def s3_client(
    *,
    region: str | None = None,
    keys: Mapping[str, str] | None = None,
    network: S3Network | None = None,
) -> Any:
    """An S3 client under the module's rule (a kept one when nothing changed).

    Args:
        region: the bucket's region, when known.
        keys: ``aws_access_key_id``, ``aws_secret_access_key`` and optionally
            ``aws_session_token``, instead of the standard chain.
        network: the client's own requests' settings (default: botocore's).

    Raises:
        S3UnavailableError: boto3 is not installed.
    """
    try:
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config
    except ImportError:
        raise S3UnavailableError("boto3 is not installed") from None
    held = tuple(sorted((keys or {}).items()))
    network = network or S3Network()
    use = (region, network)
    made_from = (held, *(os.environ.get(name) for name in _SETTINGS))
    with _LOCK:
        kept = _CLIENTS.get(use)
        if kept is not None and kept[0] == made_from:
            return kept[1]
        session = boto3.session.Session(**dict(held))
        signed = session.get_credentials() is not None
        config = Config(signature_version="s3v4" if signed else UNSIGNED, **network.options())
        client = session.client(
            "s3", config=config, region_name=region, endpoint_url=endpoint_url()
        )
        _CLIENTS[use] = (made_from, client)
        return client
