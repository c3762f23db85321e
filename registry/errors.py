"""Exception tree of the ``registry`` package (stable API).

::

    RegistryError
    ├── ManifestError        invalid manifest data; carries every Problem found
    │   └── PolicyError      valid manifests, but the change breaks promotion policy
    ├── RepositoryError      not a modelreg repository / layout broken / config invalid
    └── ToolError            git or DVC missing or failing (environment, not data)

    ValueError
    └── UsageError           an argument the caller gave cannot be accepted

Misuse of the API (a bad argument from a caller) raises :class:`UsageError`, a
``ValueError``; the CLI reports it as a usage error (exit code 2).  Any other
``ValueError`` escaping the library is a bug.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_ONE_LINE = str.maketrans(
    {"\n": "\\n", "\r": "\\r", "\x85": "\\x85", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem found in a file, printed as ``file:line:col: field: message``.

    ``line`` and ``col`` are 1-based and absent for problems that concern a path as a
    whole (a directory where a file was expected, an unreadable file).
    """

    file: str
    message: str
    line: int | None = None
    col: int | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}:{self.col if self.col is not None else 1}"
        field = f" {self.field}:" if self.field else ""
        # One problem is one line, whatever the file name or a value contained.
        return f"{where}:{field} {self.message}".translate(_ONE_LINE)

    def sort_key(self) -> tuple[str, int, int, str]:
        """Order problems by file, then position, then text."""
        return (self.file, self.line or 0, self.col or 0, self.message)


class UsageError(ValueError):
    """An argument the caller gave cannot be accepted (the CLI's exit code 2)."""


class RegistryError(Exception):
    """Base of every error raised on purpose by the registry package."""


class ManifestError(RegistryError):
    """One or more manifests are invalid.

    Attributes:
        problems: every problem found, sorted by file and position.
    """

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(sorted(problems, key=Problem.sort_key))
        if not self.problems:
            raise ValueError("ManifestError needs at least one problem")
        super().__init__("\n".join(str(p) for p in self.problems))

    @classmethod
    def single(
        cls,
        file: str,
        message: str,
        *,
        line: int | None = None,
        col: int | None = None,
        field: str | None = None,
    ) -> ManifestError:
        """Build an error holding exactly one problem."""
        return cls([Problem(file, message, line, col, field)])


class PolicyError(ManifestError):
    """The manifests are valid but the requested change breaks the promotion policy."""


class RepositoryError(RegistryError):
    """The directory is not a usable modelreg repository (missing or broken layout)."""


class ToolError(RegistryError):
    """An external tool (git, DVC) is missing or failed.

    Attributes:
        command: the argv that failed, when one ran.
        output: what the tool printed, trimmed.
    """

    def __init__(self, message: str, command: Sequence[str] = (), output: str = "") -> None:
        self.command = tuple(command)
        self.output = output
        super().__init__(message)
