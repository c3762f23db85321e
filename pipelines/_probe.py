"""One short HTTP request that tells whether a server is there at all.

Private: used before long work against a tracking server or an artifact remote
(:mod:`pipelines.register`, :mod:`pipelines.dvc`), whose own clients retry for
minutes before they give up.  A refused connection, a name that does not resolve or
silence past the timeout is reported in a few words; any HTTP answer, an error
status included, means the server is there (what it says is for the real request).
"""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Final

_HTTP_SCHEMES: Final = frozenset({"http", "https"})


def http_url(url: str) -> str | None:
    """``url`` without credentials, query or fragment if it is http(s), else None.

    urllib would take credentials in the netloc for part of the host; the probe
    needs none (a 401 shows the server is there as well as a 200 does).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in _HTTP_SCHEMES or not parts.hostname:
        return None
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def _reason(error: BaseException, timeout: float) -> str:
    reason = getattr(error, "reason", error)
    if isinstance(reason, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve the host ({reason.strerror or reason})"
    if isinstance(reason, OSError):
        return reason.strerror or str(reason) or type(reason).__name__
    return str(reason) or type(reason).__name__


def first_answer(url: str, *, timeout: float, attempts: int = 1, pause: float = 1.0) -> str | None:
    """Why ``url`` (http or https, no credentials) gets no HTTP answer; None if it does.

    Args:
        url: what to ``GET``.
        timeout: seconds to connect, and again to wait for the answer.
        attempts: tries when the connection is refused (a server restarting); a try
            that timed out is not repeated: it already waited.
        pause: seconds between tries.
    """
    request = urllib.request.Request(url, headers={"User-Agent": "modelreg"})  # noqa: S310 - callers pass http(s)
    why = ""
    for attempt in range(max(attempts, 1)):
        if attempt:
            time.sleep(pause)
        try:
            with urllib.request.urlopen(request, timeout=timeout):  # noqa: S310
                return None
        except urllib.error.HTTPError as e:
            e.close()
            return None
        except (urllib.error.URLError, OSError) as e:
            why = _reason(e, timeout)
            if not isinstance(getattr(e, "reason", e), ConnectionRefusedError):
                break
    return why
