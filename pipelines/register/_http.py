"""Time limits for MLflow's HTTP client, and one reachability probe before any work.

Private: used by :mod:`pipelines.register._store`.  MLflow's REST client, left to its
defaults, retries a failed request for minutes (7 retries, backoff factor 2, 120 s a
request): against an unreachable tracking server ``modelreg register`` sat silent for
4 min 15 s before it failed.  Two things bound that here:

- :func:`bounded_client` sets MLflow's own ``MLFLOW_HTTP_REQUEST_*`` variables to the
  limits of :class:`MlflowLimits` for the duration of a session, unless the user set
  them (a value the user chose is theirs to keep, e.g. a patient retry policy against
  a rate-limited hosted MLflow).
- :func:`unreachable` asks the server once, with a short timeout, before anything is
  read or written: a server that refuses the connection or never answers is one line
  within seconds, not a stack of retries in the middle of a release.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from pipelines._probe import first_answer, http_url


@dataclass(frozen=True, slots=True)
class MlflowLimits:
    """How long and how often a session waits on an MLflow tracking server.

    Attributes:
        probe_timeout: seconds to connect, and again to get an answer, when probing.
        probe_attempts: tries of the probe when the connection is refused (a server
            restarting); a probe that timed out is not repeated, it already waited.
        probe_pause: seconds between those tries.
        max_retries: MLflow's retries of one failed request (5xx, connection errors).
        backoff_factor: MLflow's exponential backoff factor between those retries.
        request_timeout: seconds MLflow waits to connect, and between bytes of an answer
            (not for a whole upload: a large model still goes through).
    """

    probe_timeout: float = 10.0
    probe_attempts: int = 2
    probe_pause: float = 1.0
    max_retries: int = 2
    backoff_factor: int = 1
    request_timeout: int = 30


DEFAULT_LIMITS: Final = MlflowLimits()


def _client_env(limits: MlflowLimits) -> dict[str, str]:
    return {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(limits.max_retries),
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": str(limits.backoff_factor),
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(limits.request_timeout),
    }


@contextlib.contextmanager
def bounded_client(limits: MlflowLimits = DEFAULT_LIMITS) -> Iterator[None]:
    """Give MLflow's HTTP client ``limits`` inside the block, where the user set none.

    MLflow reads these variables at each request, so setting them for the block is
    enough; they are removed afterwards so that the caller's process is as it was.
    """
    added = [key for key in _client_env(limits) if key not in os.environ]
    for key in added:
        os.environ[key] = _client_env(limits)[key]
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def unreachable(uri: str, limits: MlflowLimits = DEFAULT_LIMITS) -> str | None:
    """Why the MLflow server at ``uri`` cannot be reached, or None if it answers.

    Any HTTP answer counts as reachable (a 401 or 404 is MLflow's, or its proxy's,
    to explain on the real request); only a refused connection, a host that cannot
    be resolved or silence past ``limits.probe_timeout`` is reported.  URIs that are
    not HTTP (a local store, ``databricks``) are not probed.
    """
    base = http_url(uri)
    if base is None:
        return None
    why = first_answer(
        base.rstrip("/") + "/health",  # MLflow's own liveness endpoint
        timeout=limits.probe_timeout,
        attempts=limits.probe_attempts,
        pause=limits.probe_pause,
    )
    return None if why is None else f"unreachable ({why})"
