"""The daemon under systemd: the ``NOTIFY_SOCKET`` protocol (readiness, status, the
watchdog) and the unit ``modelreg edge unit`` writes for one ``edge.yaml``.

The unit is sandboxed with ``ProtectSystem=strict``: every path the daemon writes must
be named in it, or writing there fails (an ``EROFS`` deep in a sync).  So the paths come
from the config itself: the state dir (``StateDirectory=`` when it lies under
``/var/lib``, else ``ReadWritePaths=``) and a report folder; ``ProtectHome=`` is relaxed
to ``read-only`` only when something the daemon reads or writes lies under a home.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Final

from edge_sync.config import EdgeConfig
from registry.errors import UsageError

__all__ = ["Watchdog", "notify", "systemd_unit", "unit_paths"]

_HOMES: Final = (PurePosixPath("/home"), PurePosixPath("/root"), PurePosixPath("/run/user"))
"""What ``ProtectHome=yes`` hides."""
_STATE_BASE: Final = PurePosixPath("/var/lib")
"""Where ``StateDirectory=`` creates a folder (owned by the service's user)."""
_CONFIG_BASE: Final = PurePosixPath("/etc")


def notify(message: str) -> None:
    """Tell systemd (``NOTIFY_SOCKET``) something; a no-op without it."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(message.encode())


class Watchdog:
    """systemd's watchdog (``WatchdogSec=``): ``WATCHDOG=1`` at least every half period.

    The daemon's loop pings it itself (at each wait, stage and download chunk), never a
    thread of its own: a thread would keep a stuck loop alive in systemd's eyes.
    Enabled when systemd asks for it (``WATCHDOG_USEC``, and ``WATCHDOG_PID`` naming
    this process when set), as ``sd_watchdog_enabled`` decides.
    """

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        send: Callable[[str], None] = notify,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Read the period from ``environ`` (default: the process environment)."""
        env = os.environ if environ is None else environ
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        enabled = usec.isdigit() and int(usec) > 0 and pid in ("", str(os.getpid()))
        self.period_s: float | None = int(usec) / 1e6 if enabled else None
        """systemd's watchdog period, or None when it watches nothing."""
        self._send, self._clock = send, clock
        self._last = -math.inf

    @property
    def wait_s(self) -> float:
        """The longest the loop may sleep between pings (infinite when not watched)."""
        return math.inf if self.period_s is None else self.period_s / 2

    def ping(self) -> None:
        """Tell systemd the loop is alive (at most four times per period)."""
        if self.period_s is None:
            return
        now = self._clock()
        if now - self._last >= self.period_s / 4:
            self._last = now
            self._send("WATCHDOG=1")


def _local_folder(url: str) -> PurePosixPath | None:
    """The folder a path or ``file://`` URL names (None for another scheme)."""
    if url.startswith("file:"):
        return PurePosixPath(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
    if "://" in url:
        return None
    return PurePosixPath(url)


def unit_paths(config: EdgeConfig) -> tuple[list[PurePosixPath], list[PurePosixPath]]:
    """What the daemon of ``config`` writes, and what it only reads (absolute paths).

    Writes: the state dir (the blobs, engines, checkout, lock and state file all live in
    it) and a report folder.  Reads: the trust root, a local artifact remote or
    repository, report credentials.
    """
    writes = [PurePosixPath(config.state_path)]
    reads = [PurePosixPath(config.root_path)]
    report = config.report
    if report is not None:
        folder = _local_folder(report.url) if report.scheme == "file" else None
        if folder is not None:
            writes.append(folder)
        if report.credentials:
            reads.append(PurePosixPath(report.credentials))
    for url in (config.artifacts.url, config.repository.url):
        local = _local_folder(url) if url else None
        if local is not None:
            reads.append(local)
    return writes, reads


def _check(value: str, *, spaces: bool = False) -> str:
    """``value`` as a unit file takes it: no quoting, escaping or ``%`` specifiers.

    Raises:
        UsageError: it holds a character systemd would split or expand.
    """
    if any((c.isspace() and not spaces) or c in "%$\\\"'\n" for c in value):
        raise UsageError(f"{value!r}: a unit file takes it only without quoting or expansion")
    return value


def _under(path: PurePosixPath, base: PurePosixPath) -> bool:
    return path != base and path.is_relative_to(base)


def _sandbox(config_file: PurePosixPath, config: EdgeConfig) -> list[str]:
    """The lines that open the sandbox where ``config``'s daemon writes."""
    writes, reads = unit_paths(config)
    state, *others = writes
    lines = []
    if _under(state, _STATE_BASE):
        # systemd creates it, owned by the service's user, and makes it writable
        lines += [f"StateDirectory={_check(str(state.relative_to(_STATE_BASE)))}",
                  "StateDirectoryMode=0700"]  # fmt: skip
    else:
        others.insert(0, state)
    if _under(config_file, _CONFIG_BASE) and len(config_file.parts) > 3:
        lines.append(f"ConfigurationDirectory={_check(config_file.parts[2])}")
    # Not prefixed with "-": a folder missing at start fails the start, with its name,
    # instead of every write failing later.
    lines += [f"ReadWritePaths={_check(str(p))}" for p in dict.fromkeys(others)]
    homes = any(_under(p, h) or p == h for p in [config_file, *writes, *reads] for h in _HOMES)
    lines.append(f"ProtectHome={'read-only' if homes else 'yes'}")
    return lines


def systemd_unit(config_file: PurePosixPath, executable: str, config: EdgeConfig) -> str:
    """The systemd unit that runs ``executable edge run --config config_file``
    (``Type=notify``, watchdog, restart on failure, sandboxed, the paths ``config``
    writes opened; see ``edge_sync/systemd/modelreg-edge.service``).

    Args:
        config_file: the ``edge.yaml`` (absolute).
        executable: the ``modelreg`` command (may hold spaces: ``python -m modelreg``).
        config: that file, loaded (:func:`~edge_sync.config.load_edge_config`).

    Raises:
        UsageError: a path holds a character systemd would split or expand.
    """
    from importlib.resources import files

    _check(str(config_file))
    _check(executable, spaces=True)
    text = files("edge_sync").joinpath("systemd", "modelreg-edge.service").read_text("utf-8")
    paths = "\n".join(_sandbox(config_file, config))
    return (
        text.replace("@EXEC@", executable)
        .replace("@CONFIG@", str(config_file))
        .replace("@PATHS@", paths)
    )
