"""Where each manifest lives in a model repository (stable API).

One module names the manifest files, for the loader (``registry.repository``), the
history and policy readers, the pipelines and the CLI, so that none of them spells the
layout again.  ``signing.target_names`` does the same for the signed release files.

===================  ==========================================  ====================
what                 path                                        read as
===================  ==========================================  ====================
model folder         ``<manifests>/<model>``                     one per model
model file           ``<manifests>/<model>/model.yaml``          ``RegisteredModel``
versions folder      ``<manifests>/<model>/versions``            one per model
version file         ``<manifests>/<model>/versions/<v>.yaml``   ``ModelVersion``
===================  ==========================================  ====================

``<manifests>`` is the folder ``modelreg.yaml`` names (``manifests`` unless set).  Every
function takes it either as a POSIX string (a path relative to the repository root, or
to a git work tree, as git names files) and answers with a string, or as a ``Path`` and
answers with a ``Path``.  Names are joined as given: a model or version name comes from
a validated manifest or from a folder listing, and checking it is the schema's job.
"""

from __future__ import annotations

from pathlib import Path, PurePath
from typing import Final, NamedTuple, TypeVar

__all__ = [
    "MODEL_FILE",
    "VERSIONS_DIR",
    "VERSION_SUFFIX",
    "ManifestPath",
    "model_dir",
    "model_file",
    "parse_manifest_path",
    "version_file",
    "version_file_name",
    "versions_dir",
]

MODEL_FILE: Final = "model.yaml"
"""The file of a model's ``RegisteredModel``, in its folder."""
VERSIONS_DIR: Final = "versions"
"""The folder of a model's ``ModelVersion`` files, in its folder."""
VERSION_SUFFIX: Final = ".yaml"
"""How a version file's name ends: ``<version>.yaml``."""

_P = TypeVar("_P", str, Path)
"""A path as the caller holds it: a POSIX string, or a ``Path``."""


def _join(base: _P, *parts: str) -> _P:
    if isinstance(base, str):
        return "/".join((base, *parts) if base else parts)  # "": the folder itself
    return base.joinpath(*parts)


def model_dir(manifests: _P, model: str) -> _P:
    """The folder of model ``model``."""
    return _join(manifests, model)


def model_file(manifests: _P, model: str) -> _P:
    """The ``model.yaml`` of model ``model``."""
    return _join(manifests, model, MODEL_FILE)


def versions_dir(manifests: _P, model: str) -> _P:
    """The folder of model ``model``'s version files."""
    return _join(manifests, model, VERSIONS_DIR)


def version_file_name(version: str) -> str:
    """The file name of version ``version`` in its model's versions folder."""
    return f"{version}{VERSION_SUFFIX}"


def version_file(manifests: _P, model: str, version: str) -> _P:
    """The manifest of version ``version`` of model ``model``."""
    return _join(manifests, model, VERSIONS_DIR, version_file_name(version))


class ManifestPath(NamedTuple):
    """What a manifest's path says about it.

    Attributes:
        model: the model whose folder holds it.
        version: the version a version file names (its file name without ``.yaml``,
            SemVer or not: the loader reports a name that is not); None for the model's
            ``model.yaml``.
    """

    model: str
    version: str | None


def parse_manifest_path(path: str | PurePath, manifests: str | PurePath) -> ManifestPath | None:
    """The model (and version) of the manifest at ``path``, or None when ``path`` is no
    model file or version file of ``manifests``.

    Both paths are read as written, relative to the same folder (or both absolute), in
    POSIX form: nothing is resolved, and a path with an empty, ``.`` or ``..`` part
    names no model.  String work only: the history reader asks this of every path of
    every commit.
    """
    folder = str(manifests)
    prefix = "" if folder in ("", ".") else folder.rstrip("/") + "/"
    text = str(path)
    if not text.startswith(prefix):
        return None
    parts = text[len(prefix) :].split("/")
    if any(part in ("", ".", "..") for part in parts):
        return None
    match parts:
        case [model, file] if file == MODEL_FILE:
            return ManifestPath(model, None)
        case [model, sub, name] if sub == VERSIONS_DIR and name.endswith(VERSION_SUFFIX):
            version = name.removesuffix(VERSION_SUFFIX)
            return ManifestPath(model, version) if version not in ("", ".", "..") else None
    return None
