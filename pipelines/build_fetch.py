"""Build stage "fetch": make the workspace hold the exact bytes a version's DVC pointer names.

The artifact is pulled through DVC (``dvc pull <path>``: DVC's cache first, then its
default remote) only when the workspace copy is missing; a copy that is present is
never overwritten, so a locally modified file is reported rather than silently
replaced.  Either way the file's MD5 and size must match the ``.dvc`` pointer.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pipelines.dvc import open_repo, quiet
from pipelines.errors import ArtifactError
from registry.dvcfile import DvcPointer, read_pointer
from registry.errors import ManifestError, ToolError

_CHUNK: Final = 1 << 20
_ANSI: Final = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True, slots=True)
class FetchedArtifact:
    """A workspace artifact whose bytes match its DVC pointer.

    Attributes:
        path: the file in the workspace.
        pointer: what ``<path>.dvc`` records.
        fetched: whether ``dvc pull`` had to restore it.
    """

    path: Path
    pointer: DvcPointer
    fetched: bool


def md5_file(path: Path) -> str:
    """MD5 of a file's content, as DVC 3 records it for ``hash: md5`` outputs.

    Raises:
        OSError: the file cannot be read.
    """
    digest = hashlib.md5(usedforsecurity=False)  # DVC's content address, not a security check
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_artifact(root: Path, artifact: str, display: str) -> FetchedArtifact:
    """Ensure ``root/artifact`` exists and matches its ``.dvc`` pointer.

    Args:
        root: the repository root (where DVC's ``.dvc/`` is found from).
        artifact: the artifact's repository-relative POSIX path (``spec.artifact.path``).
        display: the artifact's name in messages.

    Returns:
        The verified artifact.

    Raises:
        ArtifactError: the pointer is missing or invalid, ``dvc pull`` cannot restore the
            file, or its MD5 or size differ from the pointer's.
        ToolError: DVC is not installed (only raised when a pull is needed).
    """
    path = root / artifact
    pointer_path = path.with_name(path.name + ".dvc")
    try:
        pointer = read_pointer(pointer_path, f"{display}.dvc", path.name)
    except ManifestError as e:
        raise ArtifactError(display, f"no usable DVC pointer: {e.problems[0]}") from None
    fetched = False
    if not path.exists():
        _pull(root, path, display, pointer)
        fetched = True
        if not path.exists():
            raise ArtifactError(
                display, "missing from the workspace and `dvc pull` did not restore it"
            )
    if not path.is_file():
        raise ArtifactError(display, "is not a regular file")
    md5 = md5_file(path)
    if md5 != pointer.md5:
        raise ArtifactError(
            display,
            f"md5 {md5} does not match {display}.dvc ({pointer.md5}): the workspace copy "
            f"is not the committed artifact; restore it with `dvc checkout {display}` "
            f"or record the change with `dvc add {display}`",
        )
    size = path.stat().st_size
    if pointer.size is not None and size != pointer.size:  # same md5, other size: a forged pointer
        raise ArtifactError(
            display, f"size {size} does not match {display}.dvc ({pointer.size} bytes)"
        )
    return FetchedArtifact(path, pointer, fetched)


def _pull(root: Path, path: Path, display: str, pointer: DvcPointer) -> None:
    try:
        from dvc.exceptions import CheckoutError, DvcException
    except ImportError:
        raise ToolError("DVC is not installed; install modelreg[ci]") from None
    with quiet():
        try:
            repo = open_repo(root)
            try:
                repo.pull(targets=[str(path)])
            finally:
                repo.close()
        except CheckoutError:
            raise ArtifactError(
                display,
                f"missing from the workspace, the DVC cache and the DVC remote "
                f"(md5 {pointer.md5}); upload it with `dvc push {display}`",
            ) from None
        except DvcException as e:
            raise ArtifactError(display, f"dvc pull failed: {_one_line(str(e))}") from None


def _one_line(text: str) -> str:
    return " ".join(_ANSI.sub("", text).split())
