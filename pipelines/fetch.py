"""Build stage "fetch": make the workspace hold the exact bytes a version's DVC pointer names.

The artifact is pulled through DVC (``dvc pull <path>``: DVC's cache first, then its
default remote) only when the workspace copy is missing; a copy that is present is
never overwritten, so a locally modified file is reported rather than silently
replaced.  Either way the file's MD5 and size must match the ``.dvc`` pointer.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pipelines.dvc import bounded_repo, open_repo, quiet
from pipelines.errors import ArtifactError
from registry import progress
from registry.dvcfile import DvcPointer, read_pointer
from registry.errors import ManifestError, ToolError, UnsafeFileError
from registry.safe_io import open_regular

_CHUNK: Final = 1 << 20
_ANSI: Final = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True, slots=True)
class FetchedArtifact:
    """A workspace artifact whose bytes match its DVC pointer.

    Attributes:
        path: the file in the workspace.
        pointer: what ``<path>.dvc`` records.
        fetched: whether ``dvc pull`` had to restore it.
        sha256: SHA-256 of the bytes that were checked (read once, with the MD5).
        size: their size in bytes.
    """

    path: Path
    pointer: DvcPointer
    fetched: bool
    sha256: str = ""
    size: int = 0


@dataclass(frozen=True, slots=True)
class Digests:
    """MD5 (DVC's content address), SHA-256 (what is signed) and size of one read."""

    md5: str
    sha256: str
    size: int


def digest_file(path: Path, *, root: Path | None = None) -> Digests:
    """MD5, SHA-256 and size of a file, read once, never through a link.

    Args:
        path: the file.
        root: the repository root: no folder between it and ``path`` may be a link.

    Raises:
        UnsafeFileError: ``path`` (or a folder below ``root``) is a link, or it is not
            a regular file.
        OSError: the file cannot be read.
    """
    md5 = hashlib.md5(usedforsecurity=False)  # DVC's content address, not a security check
    sha256 = hashlib.sha256()
    size = 0
    with (
        open_regular(path, root=root) as fh,
        progress.stage(
            "hash", path.name, total=os.fstat(fh.fileno()).st_size, logged=False
        ) as shown,
    ):
        while chunk := fh.read(_CHUNK):
            md5.update(chunk)
            sha256.update(chunk)
            size += len(chunk)
            shown.advance(len(chunk))
    return Digests(md5.hexdigest(), sha256.hexdigest(), size)


def md5_file(path: Path) -> str:
    """MD5 of a file's content, as DVC 3 records it for ``hash: md5`` outputs.

    Raises:
        UnsafeFileError: ``path`` is a link or not a regular file.
        OSError: the file cannot be read.
    """
    return digest_file(path).md5


def fetch_artifact(root: Path, artifact: str, display: str) -> FetchedArtifact:
    """Ensure ``root/artifact`` exists and matches its ``.dvc`` pointer.

    The pointer and the artifact are opened through ``registry.safe_io``: a link (to a
    key, a token, ``/etc/passwd``) is refused before anything is read, so a build can't
    be made to print the digest of a file outside the repository.

    Args:
        root: the repository root (where DVC's ``.dvc/`` is found from).
        artifact: the artifact's repository-relative POSIX path (``spec.artifact.path``).
        display: the artifact's name in messages.

    Returns:
        The verified artifact, with its SHA-256 and size.

    Raises:
        ArtifactError: the pointer is missing or invalid, the artifact or a folder on
            its way is a link or not a regular file, ``dvc pull`` cannot restore it,
            or its MD5 or size differ from the pointer's.
        ToolError: DVC is not installed (only raised when a pull is needed).
    """
    path = root / artifact
    pointer_path = path.with_name(path.name + ".dvc")
    try:
        pointer = read_pointer(pointer_path, f"{display}.dvc", path.name, root=root)
    except ManifestError as e:
        raise ArtifactError(display, f"no usable DVC pointer: {e.problems[0]}") from None
    fetched = False
    if not os.path.lexists(path):  # a dangling link is there, and refused below
        _pull(root, path, display, pointer)
        fetched = True
        if not os.path.lexists(path):
            raise ArtifactError(
                display, "missing from the workspace and `dvc pull` did not restore it"
            )
    try:
        found = digest_file(path, root=root)
    except UnsafeFileError as e:
        raise ArtifactError(display, e.reason) from None
    except IsADirectoryError:
        raise ArtifactError(display, "is not a regular file") from None
    except OSError as e:
        raise ArtifactError(display, f"cannot be read ({e.strerror or 'I/O error'})") from None
    if found.md5 != pointer.md5:
        raise ArtifactError(
            display,
            f"md5 {found.md5} does not match {display}.dvc ({pointer.md5}): the workspace copy "
            f"is not the committed artifact; restore it with `dvc checkout {display}` "
            f"or record the change with `dvc add {display}`",
        )
    if pointer.size is not None and found.size != pointer.size:  # same md5, other size: forged
        raise ArtifactError(
            display, f"size {found.size} does not match {display}.dvc ({pointer.size} bytes)"
        )
    return FetchedArtifact(path, pointer, fetched, found.sha256, found.size)


def _pull(root: Path, path: Path, display: str, pointer: DvcPointer) -> None:
    try:
        from dvc.exceptions import CheckoutError, DvcException
    except ImportError:
        raise ToolError("DVC is not installed; install modelreg[ci]") from None
    with quiet(), progress.stage("dvc pull", display):
        try:
            repo = open_repo(root)
            try:
                # From DVC's cache no remote is needed, and none is asked (``pull``
                # would query it anyway): a remote that is down or silent must not
                # hold up a build that has the bytes at hand.
                if repo.cache.local.exists(pointer.md5):
                    repo.checkout(targets=[str(path)])
                    return
            finally:
                repo.close()
            try:
                repo = bounded_repo(root)
            except ToolError as e:
                # A problem of this artifact's build, reported beside the others.
                raise ArtifactError(
                    display, f"missing from the workspace and the DVC cache; {e}"
                ) from None
            try:
                repo.pull(targets=[str(path)])
            finally:
                repo.close()
        except CheckoutError:
            raise ArtifactError(
                display,
                f"missing from the workspace, the DVC cache and the DVC remote "
                f"(md5 {pointer.md5}); {_push_advice(root, display)}",
            ) from None
        except DvcException as e:
            raise ArtifactError(display, f"dvc pull failed: {_one_line(str(e))}") from None


def _push_advice(root: Path, display: str) -> str:
    """How to get the file onto the remote: from here, or, when the remote is the folder
    ``modelreg init`` makes inside each clone, from the clone that added it (nobody
    else holds it) after pointing DVC at a shared remote."""
    from pipelines.dvc import DEFAULT_REMOTE_DIR, REMOTE_NAME, remote_url

    try:
        url = Path(remote_url(root))
    except (ToolError, ValueError):
        return f"upload it with `dvc push {display}`"
    local = (root / DEFAULT_REMOTE_DIR).resolve()
    here = url if url.is_absolute() else (root / ".dvc" / url)
    if here.resolve() != local:
        return f"upload it with `dvc push {display}` from a clone that has it"
    return (
        f"upload it with `dvc push {display}` from the clone that added it; the DVC "
        f"remote is {DEFAULT_REMOTE_DIR}, a folder inside each clone (the default of "
        "`modelreg init`) that no teammate or CI job reaches: point DVC at a shared "
        f"remote first (`dvc remote modify {REMOTE_NAME} url s3://bucket/path`, commit "
        ".dvc/config)"
    )


def _one_line(text: str) -> str:
    return " ".join(_ANSI.sub("", text).split())
