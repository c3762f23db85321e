"""DVC operations through DVC's Python API (authoring and CI only, never on devices).

Transfers to an HTTP(S) or S3 remote run under :class:`RemoteLimits`: DVC's HTTP
client otherwise waits 60 s to connect and 60 s for each read, five times over, and a
push to a remote that accepts connections but never answers sat silent for minutes.
Before a transfer the remote is asked once (:func:`pipelines._probe.first_answer`),
so that one that is down fails in seconds with one line naming it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from pipelines._probe import first_answer, http_url
from registry import progress
from registry.errors import ToolError
from registry.redact import redact

_LOGGERS = ("dvc", "dvc_data", "dvc_objects")
_NETWORK_SCHEMES: Final = frozenset({"http", "https", "s3"})

DEFAULT_REMOTE_DIR: Final = ".modelreg/remote"
"""The artifact remote ``modelreg init`` sets up when given none (inside the clone)."""
REMOTE_NAME: Final = "storage"
"""The DVC remote modelreg pushes to and pulls from."""


@dataclass(frozen=True, slots=True)
class RemoteLimits:
    """How long a transfer waits on a network remote, unless its DVC config says.

    Attributes:
        connect_timeout: seconds to connect (DVC's ``connect_timeout`` of the remote).
        read_timeout: seconds to wait for each part of an answer (``read_timeout``);
            not for a whole upload, so large artifacts still go through.
        probe_timeout: seconds the probe before a transfer waits to connect, and
            again for an answer.
        probe_attempts: tries of the probe when the connection is refused.
    """

    connect_timeout: int = 10
    read_timeout: int = 60
    probe_timeout: float = 10.0
    probe_attempts: int = 2


DEFAULT_REMOTE_LIMITS: Final = RemoteLimits()
_DEAD_FOR: Final = 60.0
# Remotes the probe found dead in this process, by URL: (when, why).  A build pulls
# each version's artifact on its own; a remote that gave no answer a moment ago is not
# waited on again for every one of them.
_dead: dict[str, tuple[float, str]] = {}


def _shown(url: str) -> str:
    """``url`` for a message: no query (tokens live there), credentials redacted."""
    parts = urlsplit(url)
    return redact(parts._replace(query="", fragment="").geturl())


def _probe(target: str, limits: RemoteLimits) -> str | None:
    now = time.monotonic()
    seen = _dead.get(target)
    if seen is not None and now - seen[0] < _DEAD_FOR:
        return seen[1]
    why = first_answer(target, timeout=limits.probe_timeout, attempts=limits.probe_attempts)
    if why is not None:
        _dead[target] = (now, why)
    return why


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Run DVC without its console output: we report results and failures ourselves.

    DVC, dvc_data and dvc_objects log on their own loggers ("Initialized DVC
    repository.", multi-line warnings that repeat a failure we report in one line),
    and DVC reports usage analytics unless told not to: never phone home from CI.
    """
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        # DVC's own deprecation noise (e.g. pygtrie's _NoneStep.value) is not the user's.
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def open_repo(root: Path) -> Any:
    """A ``dvc.repo.Repo`` for ``root``.

    Raises:
        ToolError: DVC is not installed.
    """
    try:
        from dvc.repo import Repo
    except ImportError:
        raise ToolError("DVC is not installed; install modelreg[ci]") from None
    return Repo(str(root))


def init(root: Path, *, subdir: bool = False) -> None:
    """``dvc init`` in ``root`` with analytics off and git auto-staging on.

    Raises:
        ToolError: DVC is missing or fails.
    """
    try:
        from dvc.exceptions import DvcException
        from dvc.repo import Repo
    except ImportError:
        raise ToolError("DVC is not installed; install modelreg[ci]") from None
    with quiet():
        try:
            if not (root / ".dvc").is_dir():
                Repo.init(str(root), subdir=subdir)
            with Repo(str(root)) as repo, repo.config.edit() as conf:
                conf["core"]["analytics"] = False
                conf["core"]["autostage"] = True
        except DvcException as e:
            raise ToolError(f"dvc init failed: {e}") from None


def set_remote(root: Path, name: str, url: str) -> None:
    """Add (or update) remote ``name`` at ``url`` and make it the default.

    Raises:
        ToolError: DVC fails.
    """
    from dvc.exceptions import DvcException

    with quiet():
        try:
            with open_repo(root) as repo, repo.config.edit() as conf:
                conf["remote"][name] = {"url": url}
                conf["core"]["remote"] = name
        except DvcException as e:
            raise ToolError(f"cannot configure DVC remote {name!r}: {e}") from None


def add(root: Path, path: Path, *more: Path) -> None:
    """``dvc add path [more...]``: cache each file and write ``<file>.dvc`` beside it
    (one DVC call for a model and its external data files).

    Raises:
        ToolError: DVC fails.
    """
    from dvc.exceptions import DvcException

    with quiet():
        try:
            with open_repo(root) as repo:  # closed: its state databases hold files open
                repo.add([str(p) for p in (path, *more)] if more else str(path))
        except DvcException as e:
            raise ToolError(f"dvc add {path} failed: {e}") from None


def has_remote(root: Path, name: str | None = None) -> bool:
    """Whether DVC remote ``name`` (the default remote when None) is configured.

    Raises:
        ToolError: DVC is missing.
    """
    with quiet(), open_repo(root) as repo:
        config = repo.config
        remote = name or config["core"].get("remote")
        return bool(remote) and remote in config["remote"]


def remote_url(root: Path, name: str | None = None) -> str:
    """URL of DVC remote ``name`` (the default remote when None), paths made absolute.

    Raises:
        ToolError: DVC is missing, or no such remote is configured.
    """
    with quiet(), open_repo(root) as repo:
        config = repo.config
        remote = name or config["core"].get("remote")
        remotes = config["remote"]
        if not remote or remote not in remotes:
            known = ", ".join(remotes) or "none"
            raise ToolError(
                f"DVC remote {remote or '(default)'} is not configured (known: {known})"
            )
        return str(remotes[remote]["url"])


def bounded_repo(
    root: Path,
    remote: str | None = None,
    *,
    probe: bool = True,
    limits: RemoteLimits = DEFAULT_REMOTE_LIMITS,
) -> Any:
    """A ``dvc.repo.Repo`` whose remote ``remote`` (the default when None) has time limits.

    A network remote (http, https, s3) gets ``limits``' timeouts where its config sets
    none, in memory only (the user's config is not rewritten); with ``probe``, its
    URL (an S3 remote's ``endpointurl``) is asked once first.  Close the repo after use.

    Raises:
        ToolError: DVC is not installed, or the probe gets no answer from the remote.
    """
    repo = open_repo(root)
    name = remote or repo.config["core"].get("remote")
    conf = repo.config["remote"].get(name) if name else None
    if conf is None:
        return repo  # no such remote: DVC says so in its own words
    url = str(conf.get("url", ""))
    scheme = urlsplit(url).scheme
    if scheme not in _NETWORK_SCHEMES:
        return repo
    target = http_url(str(conf.get("endpointurl", "")) if scheme == "s3" else url)
    if probe and target is not None:
        why = _probe(target, limits)
        if why is not None:
            repo.close()
            raise ToolError(f"DVC remote {name!r} at {_shown(url)}: unreachable ({why})")
    missing = {
        key: value
        for key, value in (
            ("connect_timeout", limits.connect_timeout),
            ("read_timeout", limits.read_timeout),
        )
        if key not in conf
    }
    if not missing:
        return repo
    from dvc.repo import Repo

    repo.close()
    return Repo(str(root), remote=name, remote_config=missing)


def push(root: Path, remote: str | None = None) -> int:
    """``dvc push``: upload every tracked file the remote lacks; returns how many.

    Raises:
        ToolError: DVC fails (remote unreachable, cache missing a file).
    """
    from dvc.exceptions import DvcException

    with quiet(), progress.stage("dvc push", remote or "(default remote)"):
        repo = bounded_repo(root, remote)
        try:
            return int(repo.push(remote=remote) or 0)
        except DvcException as e:
            raise ToolError(f"dvc push failed: {e}") from None
        finally:
            repo.close()


def remote_fs(root: Path, name: str | None = None) -> Any:
    """DVC's remote object for ``name`` (default remote): ``.fs`` (fsspec-style) and ``.path``.

    A network remote is probed and gets the timeouts of :func:`bounded_repo`, as a push
    does: the same settings give the same (cached) file system, not a second one.

    Raises:
        ToolError: DVC is missing, the remote is not configured or is unreachable.
    """
    from dvc.exceptions import DvcException

    with quiet():
        try:
            return bounded_repo(root, name).cloud.get_remote(name)
        except DvcException as e:
            raise ToolError(f"DVC remote {name or '(default)'}: {e}") from None
