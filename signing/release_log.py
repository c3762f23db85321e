"""When each released version first appeared in the trust metadata (for ``history``).

Which versions are released is read from the verified current metadata
(:func:`signing.workspace.release_state`); this module only dates those releases.
Released targets are never removed or replaced (``signing.tuf_history``), and every
``N.targets.json`` stays in the repository, so the first targets version that lists a
version's artifact is found by a binary search over those files: a few reads per
version, not one per release, on a repository with thousands of releases.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from registry.errors import UnsafeFileError
from registry.safe_io import read_regular

_VERSIONED: Final = re.compile(r"^([1-9][0-9]{0,9})\.targets\.json$")
MAX_TARGETS_BYTES: Final = 256 << 20
"""The largest targets file read (10,000 versions with all their files stay far below)."""


def targets_versions(metadata: Path) -> list[int]:
    """The versions ``N`` of the ``N.targets.json`` files in ``metadata``, ascending."""
    try:
        names = [p.name for p in metadata.iterdir()]
    except OSError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := _VERSIONED.match(n)))


class _Targets:
    """The target paths of each ``N.targets.json``, read once each, on demand."""

    def __init__(self, metadata: Path) -> None:
        self.metadata = metadata
        self.loaded: dict[int, frozenset[str]] = {}

    def paths(self, version: int) -> frozenset[str]:
        if version not in self.loaded:
            names: frozenset[str] = frozenset()
            try:
                raw = read_regular(
                    self.metadata / f"{version}.targets.json",
                    root=self.metadata,
                    max_bytes=MAX_TARGETS_BYTES,
                )
                targets = json.loads(raw).get("signed", {}).get("targets", {})
                names = frozenset(targets) if isinstance(targets, dict) else frozenset()
            except (OSError, UnsafeFileError, ValueError, AttributeError):
                pass  # an unreadable file dates nothing; the verified state still stands
            self.loaded[version] = names
        return self.loaded[version]


def first_listed(metadata: Path, wanted: Iterable[str]) -> dict[str, int]:
    """For each target path in ``wanted``, the first targets version that lists it.

    Paths that no targets file lists are absent from the result.
    """
    versions = targets_versions(metadata)
    files = _Targets(metadata)
    found: dict[str, int] = {}
    if not versions:
        return found
    for path in wanted:
        if path not in files.paths(versions[-1]):
            continue
        lo, hi = 0, len(versions) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if path in files.paths(versions[mid]):
                hi = mid
            else:
                lo = mid + 1
        found[path] = versions[lo]
    return found
