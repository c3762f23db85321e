"""Repository configuration, ``modelreg.yaml`` at the repository root (stable API)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from registry.loader import validate_document
from registry.root import CONFIG_FILE, find_root
from registry.schema import RepoPath, Strict
from registry.yamlsrc import read_yaml

__all__ = [
    "CONFIG_FILE",
    "ExpiryDays",
    "MlflowConfig",
    "RepoConfig",
    "TrustConfig",
    "find_root",
    "has_trust_metadata",
    "load_config",
]


class MlflowConfig(Strict):
    """Where ``modelreg register`` mirrors releases (MLFLOW_TRACKING_URI overrides it)."""

    uri: Annotated[str, StringConstraints(min_length=1, max_length=2048)] | None = None


class ExpiryDays(Strict):
    """How many days each role's signed metadata stays valid."""

    root: Annotated[float, Field(gt=0, le=3650)] = 365
    targets: Annotated[float, Field(gt=0, le=3650)] = 90
    snapshot: Annotated[float, Field(gt=0, le=3650)] = 7
    timestamp: Annotated[float, Field(gt=0, le=3650)] = 1


class TrustConfig(Strict):
    """Where the signed release metadata and the local keys live.

    Attributes:
        metadata: folder (in git) of the TUF metadata devices verify.
        keys: folder of private keys for local use; CI passes keys in
            ``MODELREG_<ROLE>_KEY`` instead, and the root key belongs offline.
        expiry: validity of each role's metadata, in days.
    """

    metadata: RepoPath = "trust/metadata"
    keys: RepoPath = ".modelreg/keys"
    expiry: ExpiryDays = ExpiryDays()


class RepoConfig(Strict):
    """Settings of one GitOps model repository.

    Attributes:
        manifests: folder holding ``<model>/model.yaml`` and ``<model>/versions/``.
        artifacts: folder where ``modelreg version add`` places ONNX files.
        remote: DVC remote to push to and pull from (DVC's default when unset).
        mlflow: MLflow mirror settings.
        trust: signed release metadata and keys.
        devices: folder of enrolled devices' public keys (``<device-id>.pub``); the
            fleet counts only reports signed by them once it exists.
    """

    api_version: Literal["modelreg/v1"] = Field(alias="apiVersion")
    kind: Literal["RegistryConfig"]
    manifests: RepoPath = "manifests"
    artifacts: RepoPath = "models"
    remote: Annotated[str, StringConstraints(min_length=1, max_length=255)] | None = None
    mlflow: MlflowConfig = MlflowConfig()
    trust: TrustConfig = TrustConfig()
    devices: RepoPath = "devices"


def has_trust_metadata(root: Path, config: RepoConfig) -> bool:
    """Whether the repository at ``root`` holds signed release metadata (its first root):
    a repository never released has none, and nothing of TUF needs loading for it."""
    return (root / config.trust.metadata / "1.root.json").is_file()


def load_config(root: Path, display: str = CONFIG_FILE) -> RepoConfig:
    """Read and validate ``<root>/modelreg.yaml``.

    Raises:
        ManifestError: the file is invalid, or a link (never followed: it could point
            at a key or token file on the machine).
    """
    return validate_document(read_yaml(root / CONFIG_FILE, display, root=root), RepoConfig)
