"""ONNX external data on the device: fetch, verify and lay out a model's data files.

Private to :mod:`edge_sync.sync.install`.  A version stored with external data (every model
over 2 GB) is its ``.onnx`` plus data files named by its graph; the signed description
(``VersionDoc.external_data``) lists them, each a signed target of kind
``external_data``.  Every file is verified against its signed SHA-256 before anything
uses it and kept as a content-addressed blob like the ``.onnx``; a file whose digest the
device already holds is not fetched again, one whose parent's file it holds comes as a
signed delta (tensor-aware, see ``registry.delta.encode_external``), else in full.  A
delta that fails falls back to the full file, as for the ``.onnx``.

ONNX Runtime resolves a graph's ``location`` beside the ``.onnx``, and blobs are named by
digest; so a *view* folder per version (``views/<sha256 of the .onnx>/``) holds hard
links to the verified blobs under the names the graph uses (``model.onnx`` and each data
file).  Views are derived: rebuilt from the blobs whenever needed, removed when the
state no longer names their model.  Nothing is ever read through a link: they are hard
links, made by the device from blobs it verified.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from registry.errors import RegistryError
from registry.schema import file_name_problem
from registry.tensors import STORE_LOCATION
from signing.errors import FileSetError, VerificationError
from signing.target_names import external_data_delta_path

if TYPE_CHECKING:
    from edge_sync.state.store import BlobStore
    from edge_sync.sync.trust import DeviceTrust, SignedTarget
    from signing.version_doc import VersionDoc

VIEWS_DIR: Final = "views"
VIEW_MODEL: Final = "model.onnx"

Stages = Callable[[str], AbstractContextManager[None]]
Method = Literal["cached", "delta", "full"]


def obtain_data(  # noqa: PLR0917 - one private call site, all needed
    trust: DeviceTrust,
    blobs: BlobStore,
    name: str,
    version: str,
    doc: VersionDoc | None,
    parent: str | None,
    work: Path,
    partials: Path,
    stages: Stages,
) -> tuple[dict[str, str], Method | None]:
    """Every external data file of a version in the blob store, verified.

    Returns:
        Each file's blob digest by its name, and how the last byte came (``full`` when
        any file was fetched whole, else ``delta`` when any came as a delta, else
        ``cached``; None when the version has no external data).

    Raises:
        TargetMismatchError: a file is signed for another model, version or kind.
        VerificationError: a file's bytes do not match their signed digest.
        FetchError: a file cannot be fetched.
        OSError: a file cannot be stored.
    """
    if doc is None or not doc.external_data:
        return {}, None
    found: dict[str, str] = {}
    methods: set[Method] = set()
    for file, (target, info) in signed_data(trust, name, version, doc).items():
        if held_verified(blobs, info.sha256):
            methods.add("cached")
        elif parent is not None and _by_delta(
            trust, blobs, (name, version, parent, file), info.sha256, work=work, stages=stages
        ):
            methods.add("delta")
        else:
            with stages("fetch"):
                fetched = trust.fetch(
                    target, work, model=name, version=version, kind="external_data",
                    partial_dir=partials,
                )  # fmt: skip
            with stages("verify_bytes"):
                blobs.adopt(fetched, info.sha256)
            methods.add("full")
        found[file] = info.sha256
    method: Method = "full" if "full" in methods else "delta" if "delta" in methods else "cached"
    return found, method


def signed_data(
    trust: DeviceTrust, name: str, version: str, doc: VersionDoc | None
) -> dict[str, tuple[str, SignedTarget]]:
    """Each external data file of a version, by the name its graph uses: its target
    path and what is signed for it (checked: this model, version, kind and file).

    Raises:
        TargetMismatchError: a file is signed for another model, version or kind.
        VerificationError: a file's name is no plain name, or is signed as another.
        FileSetError: a file is not signed.
    """
    from edge_sync.sync.trust import expect_facts

    found = {}
    for file, target in sorted((doc.external_data if doc is not None else {}).items()):
        if file_name_problem(file) is not None:  # the description's schema checked it too
            raise VerificationError(f"external data file {file!r} is not a plain name", target)
        info = trust.target_info(target)
        expect_facts(info, model=name, version=version, kind="external_data")
        if info.facts.file != file:
            raise VerificationError(f"signed as file {info.facts.file!r}, not {file!r}", target)
        found[file] = (target, info)
    return found


def held_verified(blobs: BlobStore, sha256: str) -> bool:
    """Whether the blob is held and still hashes to its name (a rotten one is
    discarded, and fetched again)."""
    if not blobs.has(sha256):
        return False
    if blobs.verify(sha256):
        return True
    blobs.discard(sha256)  # rotten: fetched again
    return False


def _by_delta(
    trust: DeviceTrust,
    blobs: BlobStore,
    which: tuple[str, str, str, str],
    want: str,
    *,
    work: Path,
    stages: Stages,
) -> bool:
    """Rebuild one data file from a held base and its signed delta; False (nothing
    kept) when there is no such delta, its base is not held, or it fails."""
    from edge_sync.sync.trust import expect_facts
    from registry.delta import decode

    name, version, parent, file = which
    path = external_data_delta_path(name, version, parent, file)
    try:
        info = trust.target_info(path)
    except FileSetError:
        return False
    base = info.facts.base_sha256
    if info.facts.base != parent or base is None or not blobs.has(base):
        return False
    work.mkdir(parents=True, exist_ok=True)
    try:
        expect_facts(info, model=name, version=version, kind="delta")
        with stages("fetch"):
            delta = trust.fetch(path, work, model=name, version=version, kind="delta")
        out = work / f"{want}.data"
        with stages("apply_delta"):
            decode(blobs.path(base), delta, out, expected_sha256=want)
        with stages("verify_bytes"):
            blobs.adopt(out, want)
    except (VerificationError, RegistryError, OSError):
        return False  # a bad delta (or a remote serving garbage): the full file decides
    return True


def model_view(root: Path, blobs: BlobStore, sha256: str, external: Mapping[str, str]) -> Path:
    """The ``.onnx`` blob ``sha256`` with its data blobs beside it under the names its
    graph uses, as hard links in ``views/<sha256>/``; returns the view's ``.onnx``.

    Raises:
        StateError: a digest is malformed.
        OSError: a blob is missing or the links cannot be made.
    """
    folder = root / VIEWS_DIR / sha256
    wanted = {VIEW_MODEL: blobs.path(sha256)}
    wanted.update({file: blobs.path(digest) for file, digest in external.items()})
    for file in wanted:
        if file != VIEW_MODEL and (
            file == STORE_LOCATION or file_name_problem(file, VIEW_MODEL) is not None
        ):
            raise OSError(f"external data file {file!r} cannot be laid out")
    folder.mkdir(parents=True, exist_ok=True)
    for file, blob in wanted.items():
        link = folder / file
        with contextlib.suppress(FileNotFoundError):
            if link.is_symlink() or not link.samefile(blob):
                link.unlink()
        if not link.exists():
            os.link(blob, link)
    # the file the engine's split names for its cut tensors (nothing is read there)
    (folder / STORE_LOCATION).touch(mode=0o400)
    for extra in {p.name for p in folder.iterdir()} - set(wanted) - {STORE_LOCATION}:
        with contextlib.suppress(FileNotFoundError):
            (folder / extra).unlink()
    return folder / VIEW_MODEL


def collect_views(root: Path, keep: set[str]) -> None:
    """Remove the views of models the state no longer names."""
    views = root / VIEWS_DIR
    if not views.is_dir():
        return
    for folder in views.iterdir():
        if folder.name not in keep:
            shutil.rmtree(folder, ignore_errors=True)
