"""``modelreg freshness refresh``: re-sign the timestamp, and mirror it to the remote.

The scheduled job keeps the signed metadata from expiring for every device: those that
follow git get the commit the workflow pushes, those that follow the artifact remote's
mirror (``<DVC remote>/modelreg/metadata/``) get the upload made here.  Signing comes
first and does not wait on the remote: when the remote cannot be read or written, the
timestamp is still re-signed in the repository (and committed by the workflow), and
the failure is raised afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pipelines import dvc
from pipelines.publish._stage import TargetStore
from registry.config import load_config
from registry.errors import ToolError
from signing.tuf_repo import PublishResult, TrustRepo
from signing.workspace import refresh, signer, trust_paths


@dataclass(frozen=True)
class RefreshReport:
    """What a refresh signed and mirrored.

    Attributes:
        result: the roles re-signed and the files written in the repository.
        remote: the artifact remote mirrored to (None: not mirrored).
        mirrored: the metadata files uploaded there, in order.
    """

    result: PublishResult
    remote: str | None = None
    mirrored: list[str] = field(default_factory=list)


def refresh_metadata(
    root: Path, *, mirror: bool = True, env: Mapping[str, str] | None = None
) -> RefreshReport:
    """Re-sign the timestamp of the repository at ``root`` (and snapshot/targets if
    they would expire first) and, with ``mirror``, mirror the metadata to its DVC
    remote when one is configured.

    A timestamp the mirror holds that git does not (a lost push) is signed above
    (:meth:`TargetStore.mirror_floor`).

    Raises:
        KeyMaterialError: the timestamp key is missing, or a role that must be
            re-signed has no key available.
        VerificationError: the metadata in the repository does not verify (see
            :func:`signing.workspace.refresh`); a ``RollbackError`` when the mirror
            holds a newer timestamp than the one signed.
        ToolError: the remote cannot be read or written (the timestamp is re-signed
            in the repository all the same), or DVC is missing.
    """
    config = load_config(root)
    paths = trust_paths(root, config)
    trust = TrustRepo.load(paths.metadata, expiry=paths.expiry)
    signer(paths, "timestamp", env)  # a missing key fails before the remote is asked
    store = None
    floor: dict[str, int] = {}
    failed: ToolError | None = None
    if mirror and dvc.has_remote(root, config.remote):
        try:
            store = TargetStore(root, config.remote)
            floor = store.mirror_floor(trust)
        except ToolError as e:
            failed = e
    result = refresh(paths, env, floor=floor)
    if failed is not None or store is None:
        if failed is not None:
            raise ToolError(f"timestamp re-signed, not mirrored: {failed}") from failed
        return RefreshReport(result)
    # loaded again: only metadata that verifies is mirrored
    signed = TrustRepo.load(paths.metadata, expiry=paths.expiry)
    try:
        mirrored = store.write_metadata(signed)
    except ToolError as e:
        raise ToolError(f"timestamp re-signed, not mirrored: {e}") from e
    return RefreshReport(result, store.url, mirrored)
