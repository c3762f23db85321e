"""Read DVC pointer files (``<artifact>.dvc``) without importing DVC.

Devices and the validator need only the digest and size a pointer records; importing
DVC for that would cost a second of start-up and pull DVC onto edge installs.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from registry.errors import ManifestError, Problem, UnsafeFileError, quote
from registry.loader import validate_document
from registry.safe_io import read_regular
from registry.yamlsrc import read_yaml


class _Out(BaseModel):
    # DVC owns this format and adds keys over time: accept what we don't read.
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    md5: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
    path: Annotated[str, StringConstraints(min_length=1)]
    size: Annotated[int, Field(ge=0)] | None = None


class _DvcFile(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    outs: Annotated[list[_Out], Field(min_length=1, max_length=1)]


@dataclass(frozen=True, slots=True)
class DvcPointer:
    """What a ``.dvc`` file says about the one output it tracks."""

    md5: str
    size: int | None
    path: str


# A pointer is a few lines; anything near this size is not one (and gets read_yaml's
# precise message from its own, larger, cap).
_FAST_PATH_BYTES: Final = 4096

# What `dvc add` writes.  Matching it directly skips a YAML parse per version, which
# is most of the cost of validating a large repository; anything else takes the
# general path below, with the same result.
_CANONICAL: Final = re.compile(
    rb"outs:\n- md5: ([0-9a-f]{32})\n  size: ([0-9]{1,19})\n  hash: md5\n"
    rb"  path: ([A-Za-z0-9._@+-]{1,255})\n"
)


def read_pointer(
    pointer: Path | str, display: str, artifact_name: str, *, root: Path | None = None
) -> DvcPointer:
    """Parse ``pointer`` and check it tracks ``artifact_name`` (its sibling file).

    Args:
        pointer: the ``.dvc`` file.
        display: its name in error messages.
        artifact_name: file name the pointer must track.
        root: the repository root: no folder between it and the pointer may be a
            link (the pointer itself never may).

    Returns:
        The digest, size and path it records.

    Raises:
        ManifestError: missing, a link, unreadable, malformed, or tracking another file.
    """
    try:
        raw = read_regular(pointer, root=root, max_bytes=_FAST_PATH_BYTES)
    except (OSError, UnsafeFileError):
        raw = b""  # let read_yaml report it precisely
    match = _CANONICAL.fullmatch(raw)
    if match is not None and match.group(3).decode() == artifact_name:
        md5, size, path = match.groups()
        return DvcPointer(md5.decode(), int(size), path.decode())
    doc = read_yaml(Path(pointer), display, root=root)
    parsed = validate_document(doc, _DvcFile)
    out = parsed.outs[0]
    if out.path != artifact_name:
        line, col = doc.position(("outs", 0, "path"))
        raise ManifestError.single(
            display,
            f"tracks {quote(out.path)}, expected {quote(artifact_name)}",
            line=line,
            col=col,
            field="outs[0].path",
        )
    return DvcPointer(out.md5, out.size, out.path)


@dataclass(frozen=True, slots=True)
class PointerCheck:
    """Whether ``<artifact>.dvc`` exists and what is wrong with it (nothing when valid)."""

    artifact: str
    exists: bool
    problems: tuple[Problem, ...] = ()
    md5: str | None = None


_root_path = functools.lru_cache(maxsize=4)(Path)
"""``Path(root)``, made once per repository rather than once per version."""


def check_pointer(root: str, display_prefix: str, artifact: str) -> PointerCheck:
    """Check the pointer of ``artifact`` (a clean repository-relative path).

    Args:
        root: repository root, as a string.
        display_prefix: what to put before repository-relative paths in messages.
        artifact: the artifact path from the manifest.
    """
    pointer = os.path.join(root, f"{artifact}.dvc")  # noqa: PTH118 - hot path, see repository
    try:
        found = read_pointer(
            pointer,
            f"{display_prefix}{artifact}.dvc",
            artifact.rpartition("/")[2],
            root=_root_path(root),
        )
    except ManifestError as e:
        # Asked only now: most pointers exist.  A link exists (read_pointer refused it).
        if not os.path.lexists(pointer):
            return PointerCheck(artifact, exists=False)
        return PointerCheck(artifact, exists=True, problems=e.problems)
    return PointerCheck(artifact, exists=True, md5=found.md5)
