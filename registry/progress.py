"""Progress of long steps: live on a terminal, one line per stage in CI logs (stable API).

Long work (DVC pulls and pushes, hashing, deltas, builds, MLflow uploads) runs inside
:func:`stage`; what the user sees depends on the :class:`ProgressReporter` the command runs
under, chosen once by the CLI (:func:`for_environment`, installed with
:func:`reporting`):

- on a terminal, a ``rich`` display: a spinner (a bar when the size is known) per
  running stage, and a line for each stage that took long enough to notice;
- in CI (``CI`` set, as GitHub Actions does), one plain line per finished stage with
  its time, e.g. ``build mlp 1.1.0: fetch (0.41 s)``, which a log keeps readable;
- anywhere else (output piped, library use, tests), nothing.

Everything goes to stderr: stdout carries results (``--json`` stays parseable).  The
reporter lives in a context variable rather than a parameter of every pipeline
function: progress is presentation, and a library caller who installs none gets
none.  ``MODELREG_PROGRESS`` (``rich``, ``lines``, ``off``) overrides the choice.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Final

from registry.errors import UsageError, printable
from registry.redact import redact

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

__all__ = [
    "LineReporter",
    "ProgressReporter",
    "RichReporter",
    "Stage",
    "for_environment",
    "reporting",
    "stage",
]

ENV_MODE: Final = "MODELREG_PROGRESS"
"""Overrides the choice of reporter: ``rich``, ``lines`` or ``off``."""
_FALSE: Final = frozenset({"", "0", "false", "no", "off"})


def _clean(text: str) -> str:
    # Stage subjects quote paths and URLs: as every CLI line, no secret, no control codes.
    return printable(redact(text))


@dataclass
class Stage:
    """One running (or finished) step.

    Attributes:
        subject: what the step works on (``build mlp 1.1.0``, ``release``).
        name: the step (``fetch``, ``publish``).
        total: its size in units of ``advance`` (bytes), when known.
        done: units done so far.
        started: ``time.perf_counter()`` at its start.
        elapsed: seconds it took, once finished.
        failed: whether it ended with an exception.
        logged: whether it gets a line in CI logs; a detail inside a logged stage
            (hashing one file) shows only on a terminal, as a bar.
    """

    subject: str
    name: str
    total: int | None = None
    logged: bool = True
    done: int = 0
    started: float = field(default_factory=time.perf_counter)
    elapsed: float = 0.0
    failed: bool = False
    _reporter: ProgressReporter | None = field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        """``subject: name``, as shown."""
        return f"{self.subject}: {self.name}"

    def advance(self, units: int) -> None:
        """Count ``units`` more done (bytes read, files pushed)."""
        self.done += units
        if self._reporter is not None:
            self._reporter.advanced(self)


class ProgressReporter:
    """Shows nothing: the reporter of library calls and piped output.

    Subclasses override the hooks; each is called in the thread that runs the stage.
    """

    def started(self, stage: Stage) -> None:
        """``stage`` began."""

    def advanced(self, stage: Stage) -> None:
        """``stage`` made progress (``stage.done`` of ``stage.total``)."""

    def finished(self, stage: Stage) -> None:
        """``stage`` ended (``stage.elapsed`` and ``stage.failed`` are set)."""

    def close(self) -> None:
        """The command is over: release the terminal."""


class LineReporter(ProgressReporter):
    """One line per finished stage with its time: for CI logs.

    Args:
        stream: where lines go (stderr by default).
    """

    def __init__(self, stream: IO[str] | None = None) -> None:
        # Bound now: steps that silence a tool's chatter (MLflow, DVC) swap sys.stderr
        # for a buffer while they run, and their stages must still be seen.
        self._stream = stream or sys.stderr

    def finished(self, stage: Stage) -> None:
        """Write ``subject: name (0.41 s)``, ``failed`` added when it failed."""
        if not stage.logged:
            return
        stream = self._stream
        outcome = " failed" if stage.failed else ""
        stream.write(_clean(f"{stage.label}{outcome} ({stage.elapsed:.2f} s)") + "\n")
        stream.flush()


class RichReporter(ProgressReporter):
    """A live ``rich`` display on a terminal.

    The display runs only while a stage does, so that whatever a command prints
    between stages (results, errors) is never drawn over.  Finished stages that took
    ``min_seconds`` or more leave a line; shorter ones only flash by.

    Args:
        console: the terminal; by default one over ``stream``, made at the first stage
            (importing rich costs more than many commands take, and most run none).
        stream: the terminal's stream when no console is given (stderr by default).
        min_seconds: the shortest stage that leaves a line.
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        stream: IO[str] | None = None,
        min_seconds: float = 0.5,
    ) -> None:
        self._console = console
        # The stream is bound now, as LineReporter's is: rich would otherwise look
        # sys.stderr up at each write and draw into a tool's silenced buffer.
        self._stream = stream or sys.stderr
        self.min_seconds = min_seconds
        self._progress: Progress | None = None
        self._tasks: dict[int, TaskID] = {}

    def _display(self) -> Progress:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            ProgressColumn,
            SpinnerColumn,
            Task,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.text import Text

        class _Sized(ProgressColumn):
            # A stage of unknown size shows a spinner and its time: a pulsing bar
            # and "0/? bytes" would only say that nothing is known.
            def __init__(self, inner: ProgressColumn) -> None:
                super().__init__()
                self.inner = inner

            def render(self, task: Task) -> Any:
                return Text("") if task.total is None else self.inner.render(task)

        if self._progress is None:
            if self._console is None:
                from rich.console import Console

                self._console = Console(file=self._stream)
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                _Sized(BarColumn()),
                _Sized(DownloadColumn()),
                TimeElapsedColumn(),
                console=self._console,
                transient=True,
                # stdout carries --json: never route it through the stderr console.
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._progress.start()
        return self._progress

    def started(self, stage: Stage) -> None:
        """Add a spinner (a bar once the size is known) for ``stage``."""
        self._tasks[id(stage)] = self._display().add_task(_clean(stage.label), total=stage.total)

    def advanced(self, stage: Stage) -> None:
        """Move ``stage``'s bar."""
        task = self._tasks.get(id(stage))
        if task is not None and self._progress is not None:
            self._progress.update(task, completed=stage.done, total=stage.total)

    def finished(self, stage: Stage) -> None:
        """Remove ``stage``'s spinner; leave a line if it took long or failed."""
        task = self._tasks.pop(id(stage), None)
        progress = self._progress
        if task is None or progress is None:
            return
        progress.remove_task(task)
        if stage.failed or stage.elapsed >= self.min_seconds:
            mark = "[red]✗[/red]" if stage.failed else "[green]✓[/green]"
            progress.console.print(
                f"{mark} {_clean(stage.label)} [dim]{stage.elapsed:.2f} s[/dim]",
                markup=True,
                highlight=False,
            )
        if not self._tasks:
            self.close()

    def close(self) -> None:
        """Stop the live display (it is transient: the spinners disappear)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


_SILENT: Final = ProgressReporter()
_CURRENT: contextvars.ContextVar[ProgressReporter | None] = contextvars.ContextVar(
    "modelreg_progress", default=None
)


def for_environment(
    env: Mapping[str, str] | None = None, stream: IO[str] | None = None
) -> ProgressReporter:
    """The reporter for a command run with ``env`` and showing progress on ``stream``.

    ``MODELREG_PROGRESS`` decides when set; else ``CI`` set means plain lines, a
    terminal means ``rich``, and anything else nothing.

    Raises:
        UsageError: ``MODELREG_PROGRESS`` is not ``rich``, ``lines`` or ``off``.
    """
    env = os.environ if env is None else env
    stream = stream or sys.stderr
    mode = env.get(ENV_MODE, "").strip().lower()
    if mode not in {"", "rich", "lines", "off"}:
        raise UsageError(f"{ENV_MODE}={mode!r}: expected rich, lines or off")
    if not mode:
        if env.get("CI", "").strip().lower() not in _FALSE:
            mode = "lines"
        elif getattr(stream, "isatty", lambda: False)():
            mode = "rich"
        else:
            mode = "off"
    if mode == "lines":
        return LineReporter(stream)
    if mode == "rich":
        return RichReporter(stream=stream)
    return ProgressReporter()


@contextlib.contextmanager
def reporting(reporter: ProgressReporter) -> Iterator[ProgressReporter]:
    """Show the stages run inside the block with ``reporter``; close it afterwards."""
    token = _CURRENT.set(reporter)
    try:
        yield reporter
    finally:
        _CURRENT.reset(token)
        reporter.close()


@contextlib.contextmanager
def stage(
    subject: str, name: str, *, total: int | None = None, logged: bool = True
) -> Iterator[Stage]:
    """Run the block as step ``name`` of ``subject``, shown by the current reporter.

    Args:
        subject: what the step works on (``build mlp 1.1.0``).
        name: the step (``fetch``).
        total: its size, when known (then ``Stage.advance`` moves a bar).
        logged: False for a detail of a logged stage: a bar on a terminal, no line
            in CI logs.

    Yields:
        The stage: ``advance`` it as work is done; ``elapsed`` is set at the end.
    """
    reporter = _CURRENT.get() or _SILENT
    current = Stage(subject, name, total, logged=logged, _reporter=reporter)
    reporter.started(current)
    try:
        yield current
    except BaseException:
        current.failed = True
        raise
    finally:
        current.elapsed = time.perf_counter() - current.started
        reporter.finished(current)
