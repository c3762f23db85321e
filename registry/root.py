"""Where a repository is: the folder holding ``modelreg.yaml`` (``registry.config``
re-exports both names, and is where callers take them from).

Kept apart from the configuration's schema so that finding the root costs no
pydantic import (``modelreg validate`` of an unchanged tree needs nothing more).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from registry.errors import RepositoryError

__all__ = ["CONFIG_FILE", "TOOL_FOLDERS", "find_root", "tool_folder_of"]

CONFIG_FILE: Final = "modelreg.yaml"
TOOL_FOLDERS: Final = (".git", ".modelreg/cache", ".modelreg/remote", ".dvc/cache", ".dvc/tmp")
"""Folders of the repository that git, DVC and modelreg write to as they run: no
manifest may name a file in them (``registry.schema.repo_path``), and the stored
results of an unchanged tree do not look into them (``registry.result_cache``)."""


def tool_folder_of(path: str) -> str | None:
    """The tool folder a repository-relative POSIX ``path`` is in (or is), if any;
    compared without case, as a case-insensitive file system would."""
    folded = path.casefold()
    for folder in TOOL_FOLDERS:
        if folded == folder or folded.startswith(f"{folder}/"):
            return folder
    return None


def find_root(start: Path) -> Path:
    """Walk up from ``start`` to the folder holding ``modelreg.yaml``.

    Raises:
        RepositoryError: no ancestor holds a ``modelreg.yaml``.
    """
    here = start.resolve()
    for candidate in (here, *here.parents):
        if (candidate / CONFIG_FILE).is_file():
            return candidate
    raise RepositoryError(
        f"{start}: not inside a modelreg repository (no {CONFIG_FILE} here or above); "
        "run `modelreg init` first"
    )
