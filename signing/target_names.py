"""Where each release file lives among the signed targets (stable API).

One module names every TUF target path, for CI (``pipelines.publish``, ``pipelines.ci``,
``signing.workspace``) and for devices (``edge_sync``), so that the two sides cannot
drift apart.  Paths are POSIX, relative to the targets root, and made only of names the
manifests already validated (DNS-label model and target names, SemVer versions, golden
case names); every function here refuses anything else rather than build a path that
could climb out of its folder.

=====================  ============================================  =================
kind                   path                                          written
=====================  ============================================  =================
``artifact``           ``models/<model>/<version>.onnx``             once per version
``external_data``      ``models/<model>/<version>.data/<file>``      once per data file
``bundle``             ``bundles/<model>/<version>.sigstore.json``   once per version
``delta``              ``deltas/<model>/<version>.from-<base>.delta``  once per pair
``delta`` (data file)  ``deltas/<model>/<version>.from-<base>.data/<file>.delta``  per pair
``engine``             ``engines/<model>/<version>/<target>.<ext>``  once per target
``version``            ``versions/<model>/<version>.json``           once per version
``provenance``         ``provenance/<model>/<version>.intoto.json``  once per version
``golden``             ``goldens/<model>/<version>/<case>.<side>.npz``  once per case
``deprecation``        ``deprecated/<model>/<version>.txt``          once per version
``channels``           ``channels.json``                             every change
=====================  ============================================  =================

Beside the targets, under the same folder of the remote, each released version's
skeleton and weight tensors (``registry.tensors``) lie as **objects** by their SHA-256:
``objects/sha256/<first two hex digits>/<sha256>`` (:func:`object_path`).  They are not
TUF targets (a model has hundreds of tensors, and every device would download their
entries with each targets metadata): the signed description lists their digests and
lengths (``signing.version_doc.TensorManifest``), and a device checks each object
against those.  An object is written once, whatever version or model names it.
"""

from __future__ import annotations

import re
from typing import Final, Literal

from registry.errors import UsageError
from registry.schema import DNS_LABEL_RE, SYMBOL_RE, file_name_problem, is_semver
from signing.tuf_facts import CHANNELS_PATH

__all__ = [
    "CHANNELS_PATH",
    "ENGINE_SUFFIXES",
    "GoldenSide",
    "artifact_path",
    "bundle_path",
    "delta_path",
    "deprecation_path",
    "engine_file_name",
    "engine_path",
    "external_data_delta_path",
    "external_data_path",
    "golden_path",
    "object_path",
    "provenance_path",
    "version_path",
]

_HEX64: Final = re.compile(r"[0-9a-f]{64}")

ENGINE_SUFFIXES: Final = {"onnxruntime": "ort.onnx", "tensorrt": "plan"}
"""File suffix of a prebuilt engine, by engine kind."""

GoldenSide = Literal["inputs", "outputs"]

_NAME: Final = re.compile(DNS_LABEL_RE)
_CASE: Final = re.compile(SYMBOL_RE.replace("_]", "_.-]"))


def _name(value: str, what: str) -> str:
    if not _NAME.fullmatch(value):
        raise UsageError(f"{what} {value!r} is not a DNS label")
    return value


def _version(value: str) -> str:
    if not is_semver(value):
        raise UsageError(f"version {value!r} is not SemVer")
    return value


def artifact_path(model: str, version: str) -> str:
    """The full ONNX file of a version."""
    return f"models/{_name(model, 'model')}/{_version(version)}.onnx"


def _file(value: str) -> str:
    problem = file_name_problem(value)
    if problem is not None:
        raise UsageError(f"external data file {value!r} {problem}")
    return value


def external_data_path(model: str, version: str, file: str) -> str:
    """One external data file of a version (ONNX external data), by its name beside the
    ``.onnx`` (which its graph uses)."""
    return f"models/{_name(model, 'model')}/{_version(version)}.data/{_file(file)}"


def external_data_delta_path(model: str, version: str, base: str, file: str) -> str:
    """The delta that turns ``base``'s external data file into ``version``'s ``file``."""
    return (
        f"deltas/{_name(model, 'model')}/{_version(version)}.from-{_version(base)}.data/"
        f"{_file(file)}.delta"
    )


def bundle_path(model: str, version: str) -> str:
    """The OpenSSF Model Signing bundle of a version."""
    return f"bundles/{_name(model, 'model')}/{_version(version)}.sigstore.json"


def deprecation_path(model: str, version: str) -> str:
    """A version's deprecation: its reason, signed; devices never install the version.

    A file of its own (not a field of ``channels.json``) so that a daemon older than
    deprecation, which reads the channels document strictly, keeps working; once
    released it is immutable, like every per-version file.
    """
    return f"deprecated/{_name(model, 'model')}/{_version(version)}.txt"


def delta_path(model: str, version: str, base: str) -> str:
    """The delta that turns ``base``'s artifact into ``version``'s."""
    return f"deltas/{_name(model, 'model')}/{_version(version)}.from-{_version(base)}.delta"


def engine_file_name(target: str, engine: str | None) -> str:
    """The file name of a prebuilt engine for device target ``target``.

    Raises:
        ValueError: ``target`` is not a target name, or ``engine`` makes no file.
    """
    suffix = ENGINE_SUFFIXES.get(engine or "")
    if suffix is None:
        raise UsageError(f"engine {engine!r} makes no prebuilt file")
    return f"{_name(target, 'target')}.{suffix}"


def engine_path(model: str, version: str, target: str, engine: str | None) -> str:
    """The prebuilt engine of a version for one device target."""
    name = engine_file_name(target, engine)
    return f"engines/{_name(model, 'model')}/{_version(version)}/{name}"


def version_path(model: str, version: str) -> str:
    """The device-facing description of a version (``signing.version_doc.VersionDoc``)."""
    return f"versions/{_name(model, 'model')}/{_version(version)}.json"


def provenance_path(model: str, version: str) -> str:
    """A version's SLSA provenance: a DSSE envelope of an in-toto statement
    (``signing.provenance``)."""
    return f"provenance/{_name(model, 'model')}/{_version(version)}.intoto.json"


def golden_path(model: str, version: str, case: str, side: GoldenSide) -> str:
    """One side of one golden case of a version, as an ``.npz`` file."""
    if not _CASE.fullmatch(case) or case.startswith("."):
        raise UsageError(f"golden case {case!r} is not a case name")
    if side not in ("inputs", "outputs"):
        raise UsageError(f"golden side {side!r} is neither inputs nor outputs")
    return f"goldens/{_name(model, 'model')}/{_version(version)}/{case}.{side}.npz"


def object_path(sha256: str) -> str:
    """Where the object (a skeleton or a tensor) of digest ``sha256`` lives, relative
    to the targets folder of the remote (see the module doc)."""
    if not _HEX64.fullmatch(sha256):
        raise UsageError(f"{sha256!r} is not a SHA-256 hex digest")
    return f"objects/sha256/{sha256[:2]}/{sha256}"
