"""Where a repository is: the folder holding ``modelreg.yaml`` (``registry.config``
re-exports both names, and is where callers take them from).

Kept apart from the configuration's schema so that finding the root costs no
pydantic import (``modelreg validate`` of an unchanged tree needs nothing more).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from registry.errors import RepositoryError

__all__ = ["CONFIG_FILE", "find_root"]

CONFIG_FILE: Final = "modelreg.yaml"


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
