"""The hash locks the workflows install modelreg's dependencies from.

``modelreg init`` copies ``templates/modelreg-*requirements.txt`` to ``.github/``; the
workflows run ``pip install --require-hashes --no-deps`` on them, so every
distribution CI installs is one file named by its SHA-256, as the actions are named
by commit. A lock is pip's requirements format in hash-checking mode::

    # comment lines
    name==version \\
        --hash=sha256:<64 hex> [\\
        --hash=sha256:<64 hex> ...]

Two files, because one dependency (antlr4-python3-runtime, through dvc, hydra-core
and omegaconf) is published as an sdist only. pip would build it in an isolated
environment with a setuptools fetched from the index unchecked (pip does not apply
the hashes to build requirements); the workflows instead install setuptools from
:data:`BUILD_LOCK_FILE` first and build with ``--no-build-isolation``.

``scripts/lock_workflow_requirements.py`` writes both (pip's resolver, the index's
hashes); this module renders and checks the format, as pure functions.

modelreg itself is in neither and cannot be: the locks ship inside modelreg's wheel,
and a file cannot hold the hash of the archive that contains it.  ``modelreg init``
writes a third file, :data:`SELF_LOCK_FILE`, with ``modelreg==<its version>`` and the
SHA-256 of that release's files as the package index lists them (asked once, at
init); pip then checks modelreg's own archive by hash too.  Where the index cannot be
asked (offline, or a version not published there) the pin is by version only, and
``init`` says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "BUILD_LOCK_FILE",
    "LOCK_FILE",
    "LOCK_FILES",
    "SELF_LOCK_FILE",
    "SELF_LOCK_HEADER",
    "Pin",
    "lock_problems",
    "normalized",
    "parse_lock",
    "render_lock",
    "render_self_lock",
]

LOCK_FILE: Final = ".github/modelreg-requirements.txt"
"""Where ``modelreg init`` writes the lock in a repository (and the workflows read it)."""

BUILD_LOCK_FILE: Final = ".github/modelreg-build-requirements.txt"
"""The build backend for the lock's sdists, installed before it."""

SELF_LOCK_FILE: Final = ".github/modelreg-self-requirements.txt"
"""modelreg itself, by exact version and (when the index was reachable at init) hash."""

SELF_LOCK_HEADER: Final = (
    "# modelreg itself, installed by the workflows after its locked dependencies;"
)
"""The first line of :data:`SELF_LOCK_FILE` as ``modelreg init`` writes it."""

LOCK_FILES: Final = (BUILD_LOCK_FILE, LOCK_FILE)
"""Both locks, in install order; each ships as ``pipelines/templates/<file name>``."""

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_PIN = re.compile(rf"^({_NAME})==([A-Za-z0-9.+!_-]+)$")
_HASH = re.compile(r"^--hash=sha256:([0-9a-f]{64})$")


@dataclass(frozen=True)
class Pin:
    """One locked distribution: an exact version and the SHA-256 of its file(s)."""

    name: str
    version: str
    sha256: tuple[str, ...]


def normalized(name: str) -> str:
    """The PEP 503 form of a project name (``ruamel.yaml`` -> ``ruamel-yaml``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def render_lock(pins: Iterable[Pin], header: str) -> str:
    """The lock file: ``header`` as comment lines, then one entry per pin by name."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    for pin in sorted(pins, key=lambda p: normalized(p.name)):
        hashes = [f"    --hash=sha256:{h}" for h in sorted(pin.sha256)]
        entry = [f"{normalized(pin.name)}=={pin.version}", *hashes]
        lines.append(" \\\n".join(entry))
    return "\n".join(lines) + "\n"


def render_self_lock(version: str, sha256: Iterable[str], index: str) -> str:
    """:data:`SELF_LOCK_FILE`: modelreg at ``version``, with the hashes ``index`` lists
    for its files (none: pinned by version only, and the file says so)."""
    hashes = sorted(set(sha256))
    if hashes:
        how = f"by the SHA-256 of its files as {index} listed them when `modelreg init` ran"
    else:
        how = (
            f"by version only: {index} listed no hash of it when `modelreg init` ran\n"
            "# (offline, or not published there); add --hash=sha256:<digest> lines, from\n"
            "# `pip hash <file>` of the release's wheel"
        )
    header = f"{SELF_LOCK_HEADER}\n# pinned {how}.\n"
    entry = [f"modelreg=={version}", *(f"    --hash=sha256:{h}" for h in hashes)]
    return header + " \\\n".join(entry) + "\n"


def _entries(text: str) -> Iterable[tuple[int, str]]:
    """Logical lines (continuations joined) with the number of their first line."""
    start, parts = 0, list[str]()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not parts:
            start = number
            if not line or line.startswith("#"):
                continue
        continued = line.endswith("\\")
        parts.append(line.removesuffix("\\").strip())
        if not continued:
            yield start, " ".join(p for p in parts if p)
            parts = []
    if parts:
        yield start, " ".join(p for p in parts if p)


def lock_problems(text: str) -> list[str]:
    """Everything that keeps ``text`` from being a strict hash lock, one line each.

    Every entry must be ``name==version`` and at least one ``--hash=sha256:`` of 64 hex
    digits, and nothing else (no ranges, options, URLs, markers or extras); a name may
    appear once.
    """
    problems, seen = [], set[str]()
    for number, entry in _entries(text):
        first, *rest = entry.split()
        pin = _PIN.match(first)
        if pin is None:
            problems.append(f"line {number}: {first!r} is not name==version")
            continue
        name = normalized(pin.group(1))
        if name in seen:
            problems.append(f"line {number}: {name} is pinned twice")
        seen.add(name)
        if not rest:
            problems.append(f"line {number}: {name} has no --hash=sha256:")
        problems += [f"line {number}: {name}: {r!r} is not --hash=sha256:<64 hex>"
                     for r in rest if not _HASH.match(r)]  # fmt: skip
    if not seen:
        problems.append("no requirement is pinned")
    return problems


def parse_lock(text: str) -> list[Pin]:
    """The pins of a lock that :func:`lock_problems` accepts.

    Raises:
        ValueError: ``text`` is not a strict hash lock (the first problem).
    """
    problems = lock_problems(text)
    if problems:
        raise ValueError(problems[0])
    pins = []
    for _, entry in _entries(text):
        first, *rest = entry.split()
        name, _, version = first.partition("==")
        pins.append(Pin(normalized(name), version, tuple(r.rsplit(":", 1)[1] for r in rest)))
    return pins
