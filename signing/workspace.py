"""Trust operations on a model repository: set up, rotate, revoke, refresh.

The commands ``modelreg init``, ``keys rotate|revoke`` and ``freshness refresh`` call
these; they read paths and expiries from ``modelreg.yaml`` and keys from the
environment (CI secrets) or the repository's local key folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from securesystemslib.signer import CryptoSigner, Signer

from registry.atomic import write_atomic
from registry.config import RepoConfig, has_trust_metadata
from registry.errors import UsageError
from signing.errors import KeyMaterialError
from signing.keys import (
    ROLES,
    KeyFiles,
    generate,
    load_public_key,
    private_pem,
    public_key_of,
    public_pem,
    signer_from_env,
    write_keypair,
)
from signing.tuf_facts import TargetFacts
from signing.tuf_repo import PublishResult, TrustRepo
from signing.tuf_roles import Expiry

ONLINE = ("targets", "snapshot", "timestamp")


@dataclass(frozen=True)
class TrustPaths:
    """Resolved trust locations of a repository."""

    metadata: Path
    keys: Path
    expiry: Expiry


def trust_paths(root: Path, config: RepoConfig) -> TrustPaths:
    """Where ``config`` puts the metadata and keys of the repository at ``root``."""
    days = config.trust.expiry
    expiry = Expiry(
        root=timedelta(days=days.root),
        targets=timedelta(days=days.targets),
        snapshot=timedelta(days=days.snapshot),
        timestamp=timedelta(days=days.timestamp),
    )
    return TrustPaths(root / config.trust.metadata, root / config.trust.keys, expiry)


def signer(paths: TrustPaths, role: str, env: Mapping[str, str] | None = None) -> Signer:
    """``role``'s signer from ``MODELREG_<ROLE>_KEY`` or the local key folder.

    Raises:
        KeyMaterialError: no key for the role, or it cannot be loaded.
    """
    return signer_from_env(role, env, paths.keys)


def init_trust(paths: TrustPaths) -> list[KeyFiles]:
    """Create keys (those missing) and ``1.root.json`` for a new repository.

    The root key is written to the local key folder like the others; a real fleet
    moves it offline afterwards (``modelreg init`` says so).

    Raises:
        ValueError: the metadata folder is already initialized.
        KeyMaterialError: an existing key cannot be loaded.
    """
    created = [
        write_keypair(paths.keys, role)
        for role in ROLES
        if not (paths.keys / f"{role}.key").exists()
    ]
    signers = {role: signer_from_env(role, {}, paths.keys) for role in ROLES}
    TrustRepo.initialize(
        paths.metadata,
        [signers["root"]],
        1,
        {role: signers[role].public_key for role in ROLES if role != "root"},
        expiry=paths.expiry,
    )
    return created


def refresh(
    paths: TrustPaths,
    env: Mapping[str, str] | None = None,
    *,
    floor: Mapping[str, int] | None = None,
) -> PublishResult:
    """Re-sign the timestamp (and snapshot/targets only if they would expire first).

    Only metadata that verifies under the newest root is re-signed (see
    :meth:`TrustRepo.load`): a timestamp, snapshot or targets file written with a
    replaced key is refused, never renewed under the current one.  ``floor``: versions
    signed elsewhere to sign above (see :meth:`TrustRepo.publish`).

    Raises:
        KeyMaterialError: the timestamp key is missing, or a role that must be
            re-signed has no key available.
        VerificationError: the metadata in the repository does not verify under the
            newest root, or its release history was cut (deleted or rewound
            timestamp); a :class:`~signing.errors.StaleKeyError` when it was signed
            with replaced keys.
    """
    repo = TrustRepo.load(paths.metadata, expiry=paths.expiry)

    def optional(role: str) -> Signer | None:
        try:
            return signer(paths, role, env)
        except KeyMaterialError:
            return None  # only needed if that role is due; refresh_timestamp says so

    return repo.refresh_timestamp(
        signer(paths, "timestamp", env),
        snapshot_signer=optional("snapshot"),
        targets_signer=optional("targets"),
        floor=floor,
    )


def _stash(paths: TrustPaths, role: str, keyid: str) -> None:
    # Keep the replaced key pair beside the new one, named by its id, never deleted.
    for suffix in ("key", "pub"):
        current = paths.keys / f"{role}.{suffix}"
        if current.exists():
            current.replace(paths.keys / f"{role}.{keyid[:16]}.{suffix}.old")


def rotate(
    paths: TrustPaths,
    role: str,
    *,
    new_public: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[int, str]:
    """Replace ``role``'s key: a new root version signed by the old and new root keys.

    Without ``new_public`` a new key pair is generated in the key folder (the old
    pair is kept as ``<role>.<keyid>.{key,pub}.old``).  For an online role the role is
    re-signed with the new key at once, so devices move to it on their next refresh.

    If it stops half-way (the metadata is written versioned role files first, then the
    new root, then ``timestamp.json``; the key folder last), the metadata folder holds
    new untracked files that every later command refuses to load, rather than
    trusting the replaced key: restore the metadata folder from the last commit
    (``git checkout -- trust/metadata && git clean -f trust/metadata``) and run the
    rotation again; the key folder still holds the old key until the very end.

    Returns:
        (new root version, new key id).

    Raises:
        ValueError: unknown role.
        KeyMaterialError: a needed key is missing or below threshold.
        VerificationError: the metadata in the repository does not verify.
    """
    if role not in ROLES:
        raise UsageError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    repo = TrustRepo.load(paths.metadata, expiry=paths.expiry)
    old_root = signer(paths, "root", env)
    old_keyids = list(repo.root.roles[role].keyids)
    new_private = None
    if new_public is None:
        # The new pair is written only once the new root is signed, so a failure
        # leaves the key folder as it was.
        new_private = generate()
        new_signer: Signer | None = CryptoSigner(new_private, public_key_of(new_private))
        new_key = public_key_of(new_private)
    else:
        new_key = load_public_key(new_public)
        new_signer = None
    if role == "root":
        if new_signer is None:
            raise KeyMaterialError("rotating root needs the new private key to co-sign root")
        version = repo.rotate_root([old_root], [new_key], [new_signer], 1)
    else:
        signers = {r: signer(paths, r, env) for r in ONLINE if r != role}
        if new_signer is not None:
            signers[role] = new_signer
        repo.revoke_key(role, old_keyids[0], [old_root], replacement=new_key, signers=signers)
        version = repo.version("root")
    if new_private is not None:
        for keyid in old_keyids:
            _stash(paths, role, keyid)
        write_atomic(paths.keys / f"{role}.key", private_pem(new_private), mode=0o600)
        write_atomic(paths.keys / f"{role}.pub", public_pem(new_private), mode=0o644)
    return version, new_key.keyid


def revoke(
    paths: TrustPaths,
    role: str,
    keyid: str,
    *,
    replacement: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> PublishResult:
    """Remove ``keyid`` from ``role`` in a new root version (optionally adding a replacement).

    Written in the order :func:`rotate` describes; if it stops half-way, restore the
    metadata folder from the last commit and run it again.

    Raises:
        ValueError: the key is not one of the role's, or the role would fall below
            its threshold.
        KeyMaterialError: root or re-signing keys are missing.
        VerificationError: the metadata in the repository does not verify.
    """
    repo = TrustRepo.load(paths.metadata, expiry=paths.expiry)
    new_key = load_public_key(replacement) if replacement is not None else None
    signers: dict[str, Signer] = {}
    for r in ONLINE:
        try:
            signers[r] = signer(paths, r, env)
        except KeyMaterialError:
            continue  # revoke_key names the one it needs, if any
    return repo.revoke_key(
        role, keyid, [signer(paths, "root", env)], replacement=new_key, signers=signers
    )


@dataclass(frozen=True)
class ReleaseState:
    """What the signed targets say about one version.

    Attributes:
        signed: its OMS bundle is released.
        published: its artifact is released.
        ci_run: the CI run that released it.
        sha256: the released artifact's SHA-256.
        dvc_md5: the md5 its DVC pointer recorded at release.
    """

    signed: bool = False
    published: bool = False
    ci_run: str | None = None
    sha256: str | None = None
    dvc_md5: str | None = None


def release_state(root: Path, config: RepoConfig) -> dict[tuple[str, str], ReleaseState] | None:
    """Per (model, version): what :func:`release_states` says, read from the repository's
    signed targets metadata (verified on load).  None when the repository has no trust
    metadata at all.

    Raises:
        VerificationError: the trust metadata in the repository does not verify.
    """
    if not has_trust_metadata(root, config):
        return None
    paths = trust_paths(root, config)
    return release_states(TrustRepo.load(paths.metadata, expiry=paths.expiry))


def released_deprecation(root: Path, config: RepoConfig, model: str, version: str) -> str | None:
    """The SHA-256 of the deprecation reason released for ``model`` ``version`` (None:
    no deprecation of it is released, or the repository has no trust metadata).

    Raises:
        VerificationError: the trust metadata in the repository does not verify.
    """
    from signing.target_names import deprecation_path

    if not has_trust_metadata(root, config):
        return None
    paths = trust_paths(root, config)
    info = TrustRepo.load(paths.metadata, expiry=paths.expiry).published(
        deprecation_path(model, version)
    )
    return info.hashes.get("sha256") if info is not None else None


def release_states(trust: TrustRepo) -> dict[tuple[str, str], ReleaseState]:
    """Per (model, version): whether its OMS bundle and its artifact are released, by
    which CI run, and the released artifact's digests."""
    state: dict[tuple[str, str], ReleaseState] = {}
    for info in trust.targets.values():
        try:
            facts = TargetFacts.from_custom(info.custom)
        except ValueError:
            continue  # not one of ours
        if facts.kind not in ("artifact", "bundle") or facts.model is None or facts.version is None:
            continue
        key = (facts.model, facts.version)
        current = state.get(key, ReleaseState())
        artifact = facts.kind == "artifact"
        state[key] = ReleaseState(
            signed=current.signed or facts.kind == "bundle",
            published=current.published or artifact,
            ci_run=current.ci_run or facts.ci_run,
            sha256=info.hashes.get("sha256") if artifact else current.sha256,
            dvc_md5=facts.dvc_md5 if artifact else current.dvc_md5,
        )
    return state
