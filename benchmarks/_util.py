"""Helpers shared by the benchmarks: timing subprocesses, isolation, machine facts."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
"""Root of the modelreg checkout holding this suite."""

BENCH_DIR: Final = REPO_ROOT / ".bench"
"""Git-ignored scratch space for generated repositories and tool installs."""


class BenchmarkError(RuntimeError):
    """A benchmark could not produce a trustworthy figure (bad fixture, failing tool)."""


@dataclass(frozen=True, slots=True)
class Timing:
    """Wall-clock times of repeated runs of one command.

    Attributes:
        runs: how many timed runs were made.
        min_s: fastest run in seconds.
        median_s: median run in seconds (the figure reported).
        max_s: slowest run in seconds.
        samples_s: every run in seconds, in the order they ran.
    """

    runs: int
    min_s: float
    median_s: float
    max_s: float
    samples_s: tuple[float, ...]

    @classmethod
    def of(cls, samples: Sequence[float]) -> Timing:
        """Summarise ``samples`` (seconds).

        Raises:
            ValueError: ``samples`` is empty.
        """
        if not samples:
            raise ValueError("no samples to summarise")
        return cls(
            runs=len(samples),
            min_s=min(samples),
            median_s=statistics.median(samples),
            max_s=max(samples),
            samples_s=tuple(samples),
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping (seconds rounded to the microsecond)."""
        out = asdict(self)
        for key in ("min_s", "median_s", "max_s"):
            out[key] = round(out[key], 6)
        out["samples_s"] = [round(s, 6) for s in self.samples_s]
        return out


def isolated_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The current environment with a private HOME and git configuration.

    Nothing the benchmark runs reads or writes the user's git or tool settings, and
    commits get a fixed identity.

    Args:
        home: folder to use as HOME (created if missing); its ``.gitconfig`` is the
            global git configuration.
        extra: variables to add or override.

    Returns:
        A new environment mapping.
    """
    home.mkdir(parents=True, exist_ok=True)
    gitconfig = home / ".gitconfig"
    if not gitconfig.exists():
        gitconfig.write_text(
            "[user]\n\tname = bench\n\temail = bench@example.invalid\n"
            "[init]\n\tdefaultBranch = main\n[commit]\n\tgpgsign = false\n"
            "[tag]\n\tgpgsign = false\n",
            encoding="utf-8",
        )
    env = dict(os.environ)
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "MODELREG_TRACEBACK"):
        env.pop(var, None)
    env.update(
        {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "GIT_CONFIG_GLOBAL": str(gitconfig),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "bench",
            "GIT_AUTHOR_EMAIL": "bench@example.invalid",
            "GIT_COMMITTER_NAME": "bench",
            "GIT_COMMITTER_EMAIL": "bench@example.invalid",
            "GIT_TERMINAL_PROMPT": "0",
            "DVC_NO_ANALYTICS": "1",
            "NO_COLOR": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    env.update(extra or {})
    return env


def run_checked(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    input_bytes: bytes | None = None,
    timeout: float = 3600,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` and raise with its output when it fails.

    Raises:
        BenchmarkError: the command is missing or exits non-zero.
    """
    try:
        proc = subprocess.run(
            list(argv),
            cwd=cwd,
            env=dict(env),
            input=input_bytes,
            capture_output=True,
            check=False,
            timeout=timeout,
        )
    except FileNotFoundError as e:
        raise BenchmarkError(f"{argv[0]}: not found ({e})") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).decode(errors="replace").strip()[-2000:]
        raise BenchmarkError(f"`{' '.join(argv)}` (in {cwd}) exited {proc.returncode}:\n{tail}")
    return proc


def _timed_run(
    argv: Sequence[str], cwd: Path, env: Mapping[str, str], ok_exit: tuple[int, ...] = (0,)
) -> tuple[float, subprocess.CompletedProcess[bytes]]:
    start = time.perf_counter()
    proc = subprocess.run(list(argv), cwd=cwd, env=dict(env), capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode not in ok_exit:
        tail = (proc.stderr or proc.stdout).decode(errors="replace").strip()[-2000:]
        raise BenchmarkError(f"`{' '.join(argv)}` (in {cwd}) exited {proc.returncode}:\n{tail}")
    return elapsed, proc


def time_command(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    runs: int,
    stop_after_s: float | None = None,
    check_output: Callable[[bytes], None] | None = None,
) -> Timing:
    """Run a command ``runs`` times and time each run with ``time.perf_counter``.

    Output goes to a pipe that is read to the end (as when piped into another tool);
    every run must exit 0.

    Args:
        argv: the command.
        cwd: its working directory.
        env: its environment.
        runs: timed runs wanted.
        stop_after_s: stop after the first run if it took longer than this (slow
            tools are then reported from one run).
        check_output: called with the stdout of the first run; raises if wrong.

    Returns:
        The timing summary.

    Raises:
        BenchmarkError: a run exits non-zero.
    """
    spec = Command(argv, cwd, check_output=check_output, stop_after_s=stop_after_s)
    return time_interleaved({"command": spec}, env=env, runs=runs)["command"]


@dataclass(frozen=True)
class Command:
    """One command to time.

    Attributes:
        argv: the command line.
        cwd: its working directory.
        check_output: called with the stdout of its first run; raises if wrong.
        stop_after_s: run it only once if that first run took longer than this.
        ok_exit: exit codes taken as success (a command whose expected outcome is a
            reported failure; ``check_output`` should then check it is that one).
    """

    argv: Sequence[str]
    cwd: Path
    check_output: Callable[[bytes], None] | None = None
    stop_after_s: float | None = None
    ok_exit: tuple[int, ...] = (0,)


def time_interleaved(
    commands: Mapping[str, Command], *, env: Mapping[str, str], runs: int
) -> dict[str, Timing]:
    """Time several commands round-robin: run 1 of each, then run 2 of each, ...

    Interleaving spreads a burst of other work on the machine over all commands
    instead of loading it onto one, which keeps their ratios fair.  Output goes to a
    pipe that is read to the end; every run must exit 0.

    Args:
        commands: what to time, by name (the order of the rounds).
        env: environment of every run.
        runs: timed runs wanted per command.

    Returns:
        The timing summary per command name.

    Raises:
        BenchmarkError: a run exits non-zero or its output check fails.
    """
    samples: dict[str, list[float]] = {name: [] for name in commands}
    done: set[str] = set()
    for i in range(runs):
        for name, cmd in commands.items():
            if name in done:
                continue
            elapsed, proc = _timed_run(cmd.argv, cmd.cwd, env, cmd.ok_exit)
            if i == 0 and cmd.check_output is not None:
                cmd.check_output(proc.stdout)
            samples[name].append(elapsed)
            if i == 0 and cmd.stop_after_s is not None and elapsed > cmd.stop_after_s:
                done.add(name)
    return {name: Timing.of(s) for name, s in samples.items()}


def tool_version(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """First non-empty output line of a ``--version`` style command, or ``unavailable``."""
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
            env=dict(env) if env is not None else None,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    return lines[0] if lines and proc.returncode == 0 else "unavailable"


def machine_info() -> dict[str, Any]:
    """Facts about the machine and interpreter that figures depend on."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        usable = os.cpu_count() or 1
    git = shutil.which("git")
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "processor": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "git": tool_version([git, "--version"]) if git else "unavailable",
        "load_average": load_average(),
    }


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (other work on the machine skews timings)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not available on this platform
        return None


def busy_warning() -> str | None:
    """A warning line when the machine is busy with other work, else None."""
    load = load_average()
    cpus = os.cpu_count() or 1
    if load is not None and load[0] > 0.5 * cpus:
        return (
            f"warning: 1-minute load average {load[0]} on {cpus} CPUs: other work is "
            "running, timings will be noisy"
        )
    return None


def fmt_seconds(value: float) -> str:
    """Seconds for tables: ``0.842 s``, ``28.1 s``."""
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


_DECODE_RSS: Final = """
import sys
from pathlib import Path

def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)

import numpy, zstandard  # noqa: F401 - loaded before the baseline, as on a device
from registry import delta
from registry.delta import _decode as _delta_decode  # noqa: F401
baseline = status("VmRSS:")
delta.decode(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
print(status("VmHWM:") - baseline)
"""


def decode_peak_rss(base: Path, delta: Path, out: Path) -> int:
    """Bytes of RSS that decoding ``delta`` over ``base`` into ``out`` adds at its peak.

    Runs in a fresh interpreter with the decoder's imports loaded before the baseline
    is read, as a device would have them (Linux: reads ``/proc/self/status``).

    Raises:
        BenchmarkError: ``/proc`` is missing or the decode fails.
    """
    if not Path("/proc/self/status").exists():
        raise BenchmarkError("measuring peak RSS needs /proc (Linux)")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _DECODE_RSS, str(base), str(delta), str(out)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BenchmarkError(f"decode failed: {last}")
    return int(proc.stdout.strip())


@contextlib.contextmanager
def git_daemon(base: Path) -> Iterator[str]:
    """Serve the repositories under ``base`` with ``git daemon`` on 127.0.0.1 (pushes
    allowed); yields the ``git://`` URL of ``base`` (the tests use it too).

    Raises:
        BenchmarkError: the daemon did not start within 30 s.
    """
    with git_daemon_process(base) as (url, _proc):
        yield url


@contextlib.contextmanager
def git_daemon_process(
    base: Path, *, max_connections: int = 32
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """:func:`git_daemon`, also yielding the daemon's process (to read its CPU time);
    ``max_connections`` is git's own limit on concurrent clients (0: none).  The daemon
    runs in a session of its own, and its whole process group is ended on exit.

    Raises:
        BenchmarkError: the daemon did not start within 30 s.
    """
    import signal
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # git-daemon itself where it is installed: `git daemon` runs it as a child of the
    # `git` wrapper, which would hide its CPU time until the wrapper exits
    exec_path = subprocess.run(["git", "--exec-path"], capture_output=True, text=True,
                               check=False).stdout.strip()  # fmt: skip
    dashed = Path(exec_path) / "git-daemon"
    command = [str(dashed)] if exec_path and dashed.is_file() else ["git", "daemon"]
    proc = subprocess.Popen(
        [*command, "--reuseaddr", "--export-all", "--enable=receive-pack",
         f"--max-connections={max_connections}",
         f"--base-path={base}", "--listen=127.0.0.1", f"--port={port}", str(base)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise BenchmarkError("git daemon did not start") from None
                time.sleep(0.1)
        yield f"git://127.0.0.1:{port}", proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # the daemon and the upload-packs it forked
        proc.wait(timeout=30)
