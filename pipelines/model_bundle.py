"""The OMS bundle of a model with every file it is made of.

A model stored with ONNX external data is its ``.onnx`` graph and the data files the
graph names beside it; a bundle over the graph alone would let any byte of the weights
change unnoticed.  So a bundle of such a model is the ``files`` serialization over the
``.onnx`` and each data file by name, what ``model_signing`` signs for a folder that
holds exactly them (``signing.oms.sign_files``; ``signing.oms.verify_model`` finds the
other files beside the ``.onnx``).  ``ci release`` (``pipelines.publish``) and
``modelreg sign`` / ``verify`` all go through here.

A file is read as ONNX when its name ends in ``.onnx``; the graph's references are
checked as ``build`` checks them (``pipelines.onnx``: plain names beside the model,
regular files, no links), so a model whose data cannot be signed safely is refused with
the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from signing.errors import VerificationError
from signing.hashing import SINGLE_FILE
from signing.oms import ModelFacts, VerifiedModel, sign_files, sign_model

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["check_covered", "data_files", "sign_onnx", "sign_path"]


def data_files(path: Path, display: str | None = None) -> tuple[str, ...]:
    """The external data files of the model at ``path``, sorted (empty for a file
    that is not an ``.onnx``, or a self-contained one).

    Raises:
        ArtifactError: not an ONNX model, or a reference ``build`` would refuse (a
            missing data file, a link, a path outside the model's folder).
    """
    if not path.is_file() or path.suffix.lower() != ".onnx":
        return ()
    from pipelines.onnx import load_onnx_external

    return load_onnx_external(path, display or str(path))[1].files


def sign_onnx(
    artifact: Path,
    external: Sequence[str],
    key: ec.EllipticCurvePrivateKey,
    *,
    model_name: str,
    facts: ModelFacts | None = None,
) -> dict[str, Any]:
    """The bundle of an ``.onnx`` and its external data files ``external`` (names
    beside it): over its one file when there are none.

    Raises:
        SigningError: the artifact is a link or not a regular file.
        OSError: a file cannot be read.
    """
    if not external:
        return sign_model(artifact, key, model_name=model_name, facts=facts)
    files = {artifact.name: artifact, **{f: artifact.parent / f for f in external}}
    return sign_files(files, key, model_name=model_name, facts=facts)


def sign_path(
    path: Path,
    key: ec.EllipticCurvePrivateKey,
    *,
    facts: ModelFacts | None = None,
    bundle_path: Path | None = None,
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The bundle of a model file or folder (``modelreg sign``), and the external data
    files it covers beside an ``.onnx`` (a folder's files are all covered anyway).

    Raises:
        ArtifactError: an ``.onnx`` that does not load, or whose external data is
            refused (see :func:`data_files`).
        SigningError: the model holds a link or a special file, or no file at all.
        OSError: a file cannot be read.
    """
    from signing.oms import model_name_of

    external = data_files(path)
    if external:
        return sign_onnx(path, external, key, model_name=model_name_of(path), facts=facts), external
    return sign_model(path, key, facts=facts, bundle_path=bundle_path), ()


def check_covered(verified: VerifiedModel) -> None:
    """Refuse a verified ``.onnx`` whose bundle signs its graph only while the graph
    names external data: the weights were never signed (a bundle ``modelreg sign``
    wrote before it signed data files).

    Raises:
        VerificationError: data files the bundle does not cover.
        ArtifactError: the graph's external data is refused (see :func:`data_files`).
    """
    if SINGLE_FILE not in verified.files:
        return  # the bundle lists every file, and the verifier checked the set
    unsigned = data_files(verified.path)
    if unsigned:
        raise VerificationError(
            f"the bundle signs the graph only, not its external data ({', '.join(unsigned)}): "
            "sign the model again (modelreg sign covers every file)",
            str(verified.path),
        )
