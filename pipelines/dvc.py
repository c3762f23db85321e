"""DVC operations through DVC's Python API (authoring and CI only, never on devices)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from registry import progress
from registry.errors import ToolError

_LOGGERS = ("dvc", "dvc_data", "dvc_objects")


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
            repo = Repo(str(root))
            with repo.config.edit() as conf:
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
            repo = open_repo(root)
            with repo.config.edit() as conf:
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
            repo = open_repo(root)
            repo.add([str(p) for p in (path, *more)] if more else str(path))
        except DvcException as e:
            raise ToolError(f"dvc add {path} failed: {e}") from None


def remote_url(root: Path, name: str | None = None) -> str:
    """URL of DVC remote ``name`` (the default remote when None), paths made absolute.

    Raises:
        ToolError: DVC is missing, or no such remote is configured.
    """
    with quiet():
        config = open_repo(root).config
        remote = name or config["core"].get("remote")
        remotes = config["remote"]
        if not remote or remote not in remotes:
            known = ", ".join(remotes) or "none"
            raise ToolError(
                f"DVC remote {remote or '(default)'} is not configured (known: {known})"
            )
        return str(remotes[remote]["url"])


def push(root: Path, remote: str | None = None) -> int:
    """``dvc push``: upload every tracked file the remote lacks; returns how many.

    Raises:
        ToolError: DVC fails (remote unreachable, cache missing a file).
    """
    from dvc.exceptions import DvcException

    with quiet(), progress.stage("dvc push", remote or "(default remote)"):
        try:
            return int(open_repo(root).push(remote=remote) or 0)
        except DvcException as e:
            raise ToolError(f"dvc push failed: {e}") from None


def remote_fs(root: Path, name: str | None = None) -> Any:
    """DVC's remote object for ``name`` (default remote): ``.fs`` (fsspec-style) and ``.path``.

    Raises:
        ToolError: DVC is missing or the remote is not configured.
    """
    from dvc.exceptions import DvcException

    with quiet():
        try:
            return open_repo(root).cloud.get_remote(name)
        except DvcException as e:
            raise ToolError(f"DVC remote {name or '(default)'}: {e}") from None
