"""Exception tree of the ``registry`` package (stable API).

::

    RegistryError
    ├── ManifestError        invalid manifest data; carries every Problem found
    │   └── PolicyError      valid manifests, but the change breaks promotion policy
    ├── RepositoryError      not a modelreg repository / layout broken / config invalid
    ├── UnsafeFileError      a work-tree file that must not be read: a link, not a
    │   │                    regular file, outside the repository
    │   └── FileTooLargeError  over the size cap, refused before reading
    ├── GoldenError          a golden file or inline tensor that cannot be read or
    │                        converted (``registry.goldens``)
    └── ToolError            git or DVC missing or failing (environment, not data)

    ValueError
    └── UsageError           an argument the caller gave cannot be accepted

Misuse of the API (a bad argument from a caller) raises :class:`UsageError`, a
``ValueError``; the CLI reports it as a usage error (exit code 2).  Any other
``ValueError`` escaping the library is a bug.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "MESSAGE_LIMIT",
    "QUOTE_LIMIT",
    "FileTooLargeError",
    "GoldenError",
    "ManifestError",
    "PolicyError",
    "Problem",
    "RegistryError",
    "RepositoryError",
    "ToolError",
    "UnsafeFileError",
    "UsageError",
    "one_line",
    "printable",
    "quote",
]

_ONE_LINE = str.maketrans(
    {"\n": "\\n", "\r": "\\r", "\x85": "\\x85", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


_ANSI: Final = re.compile(r"\x1b\[[0-9;]*m")
MESSAGE_LIMIT: Final = 400
"""The most characters of a third-party message (ONNX, zipfile, numpy) a problem shows."""


def one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` with its whitespace collapsed and colours removed, cut to ``limit`` characters.

    ONNX's checker writes multi-line messages with context blocks; a problem is one line.
    """
    flat = " ".join(_ANSI.sub("", text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


_HIDDEN: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})


def printable(text: str, keep: str = "\n\t") -> str:
    """``text`` without control and format characters (terminal escape sequences, a
    carriage return that overwrites a line, bidi overrides that reorder it), but for
    those in ``keep``.  Text from git history, a remote or a pull request reaches
    terminals and CI logs through this."""
    return "".join(ch for ch in text if ch in keep or unicodedata.category(ch) not in _HIDDEN)


QUOTE_LIMIT: Final = 32
"""The most characters of a value a message quotes (a manifest value may be a secret
that a pull request tricked us into reading: a message shows a prefix, never all)."""


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr`` of at most ``limit`` characters of ``value``, marked when cut.

    Args:
        value: the bad value (a string, or anything ``str()`` can render).
        limit: the most characters shown.

    Returns:
        ``'abc'``, or ``'abcdef...' (1234 characters)`` for a longer value.
    """
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


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


class UnsafeFileError(RegistryError):
    """A file of the work tree that must not be read (``registry.safe_io`` refuses it).

    The message never holds any of the file's content: it was not read.

    Attributes:
        path: the file, as given.
        reason: why, one short line (``is a symbolic link``).
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class FileTooLargeError(UnsafeFileError):
    """A file over its size cap, refused from its size before reading it.

    Attributes:
        size: its size in bytes.
        limit: the cap.
    """

    def __init__(self, path: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(path, f"is {size} bytes; the limit is {limit}")


class GoldenError(RegistryError):
    """A golden ``.npz`` file or inline tensor that cannot be read or converted.

    The message is one line and never holds the file's content.

    Attributes:
        path: the file (or ``inline tensor 'x'``), as shown to the user.
        reason: why, one short line.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


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
