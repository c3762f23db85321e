"""A model repository, artifact remote and device that a test controls (TUF attacks).

Modelled on python-tuf's ``tests/repository_simulator.py``, with one difference: the
repository side is the production ``TrustRepo`` writing real files into a temp dir
(``repo/trust/metadata/`` and ``remote/targets/``), and the device is the production
``DeviceTrust`` reading them.  An attacker controls the untrusted transports: it can
rewrite any file in the checkout or on the remote (:meth:`RepoSim.write_metadata`,
plain file edits), and with stolen keys it can sign whatever it likes
(:meth:`RepoSim.forge`).  :class:`FetchTracker` implements the real ``FetcherInterface``
around the production ``LocalFetcher`` and records what the device fetched.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec
from securesystemslib.signer import CryptoSigner, Signer
from tuf.api.metadata import (
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization.json import JSONSerializer
from tuf.ngclient.fetcher import FetcherInterface

from edge_sync.sync.trust import DeviceTrust, LocalFetcher, TrustLimits
from signing.keys import generate, public_key_of
from signing.tuf_facts import ChannelsDoc, TargetFacts, next_channels
from signing.tuf_repo import TrustRepo
from signing.tuf_roles import (
    METADATA_DIR,
    ONLINE_ROLES,
    TARGETS_DIR,
    Expiry,
    build_snapshot,
    build_targets,
    build_timestamp,
    meta_file,
    to_bytes,
)

SEED_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # P-256 n


def new_signer(seed: str | None = None) -> CryptoSigner:
    """A fresh P-256 signer, or a deterministic one derived from ``seed`` (fixtures)."""
    if seed is None:
        key = generate()
    else:
        scalar = int.from_bytes(hashlib.sha256(seed.encode()).digest()) % (SEED_ORDER - 1) + 1
        key = ec.derive_private_key(scalar, ec.SECP256R1())
    return CryptoSigner(key, public_key_of(key))


class FetchTracker(FetcherInterface):
    """Records every URL the device fetches; can stream endless bytes for one of them."""

    def __init__(self, inner: FetcherInterface) -> None:
        self.inner = inner
        self.fetched: list[str] = []
        self.bytes_served = 0
        self.endless: set[str] = set()  # file names served as an endless stream

    def _fetch(self, url: str) -> Iterator[bytes]:
        name = url.rsplit("/", 1)[-1]
        self.fetched.append(name)
        chunks = self._endless() if name in self.endless else self.inner.fetch(url)
        return self._count(chunks)

    def _endless(self) -> Iterator[bytes]:
        while True:
            yield b"\0" * 65536

    def _count(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            self.bytes_served += len(chunk)
            yield chunk

    def reset(self) -> list[str]:
        """Return what was fetched since the last reset, and start a new record."""
        fetched, self.fetched = self.fetched, []
        return fetched


@dataclass
class RepoSim:
    """Repository + remote + device in ``base``, with every key in memory."""

    base: Path
    root_signers: list[CryptoSigner]
    signers: dict[str, CryptoSigner]
    repo: TrustRepo
    tracker: FetchTracker | None = None
    released: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def create(
        cls,
        base: Path,
        *,
        root_keys: int = 1,
        root_threshold: int = 1,
        expiry: Expiry | None = None,
        now: datetime | None = None,
        seed: str | None = None,
    ) -> RepoSim:
        """Initialize a repository (root v1 only; nothing published yet)."""

        def signer(name: str) -> CryptoSigner:
            return new_signer(f"{seed}/{name}" if seed else None)

        root_signers = [signer(f"root{i}") for i in range(root_keys)]
        signers = {role: signer(role) for role in ONLINE_ROLES}
        repo = TrustRepo.initialize(
            base / "repo" / METADATA_DIR,
            root_signers,
            root_threshold,
            {role: s.public_key for role, s in signers.items()},
            expiry=expiry,
            now=now,
        )
        return cls(base, root_signers, signers, repo)

    @property
    def checkout(self) -> Path:
        return self.base / "repo"

    @property
    def metadata_dir(self) -> Path:
        return self.base / "repo" / METADATA_DIR

    @property
    def remote(self) -> Path:
        return self.base / "remote"

    @property
    def state(self) -> Path:
        return self.base / "device"

    def target_file(self, path: str) -> Path:
        """Where the remote stores the published target ``path``."""
        info = self.repo.published(path)
        assert info is not None, path
        parent, sep, name = path.rpartition("/")
        return self.remote / TARGETS_DIR / f"{parent}{sep}{info.hashes['sha256']}.{name}"

    def release(
        self,
        model: str,
        version: str,
        data: bytes | None = None,
        *,
        channels: Mapping[str, tuple[str, float | None]] | None = None,
        facts: Mapping[str, object] | None = None,
        now: datetime | None = None,
    ) -> str:
        """Publish an artifact and its bundle (and channels), like ``ci release``."""
        data = data if data is not None else f"onnx {model} {version}".encode()
        path = f"models/{model}/{version}.onnx"
        common: dict[str, object] = {"model": model, "version": version, "ci_run": "run-1"}
        artifact = TargetFacts.model_validate({"kind": "artifact", **common, **(facts or {})})
        self.repo.add_target(path, data, artifact)
        bundle = TargetFacts.model_validate({"kind": "bundle", **common})
        self.repo.add_target(f"{path}.sig.json", b'{"bundle": "' + data + b'"}', bundle)
        if channels is not None:
            previous = self.repo.load_channels(self.remote)
            desired = {
                name: {channel: (e.version, e.percent) for channel, e in assigned.items()}
                for name, assigned in (previous.models if previous else {}).items()
            }
            desired[model] = dict(channels)
            self.repo.set_channels(next_channels(previous, desired), previous)
        self.repo.write_targets_to(self.remote)
        self.repo.publish(self.signers, now=now)
        self.released[path] = data
        return path

    def fork(self, base: Path) -> RepoSim:
        """A copy of repository and remote in ``base`` (same keys), loaded from disk.

        Two forks of one state released differently are two histories that share a
        past: what a base branch and a pull request (or a rewritten branch) hold.
        """
        for part in ("repo", "remote"):
            if (self.base / part).exists():
                shutil.copytree(self.base / part, base / part)
        repo = TrustRepo.load(base / "repo" / METADATA_DIR, expiry=self.repo.expiry)
        return RepoSim(base, list(self.root_signers), dict(self.signers), repo)

    def channels_doc(self) -> ChannelsDoc | None:
        return self.repo.load_channels(self.remote)

    def device(self, *, limits: TrustLimits | None = None) -> DeviceTrust:
        """The device, provisioned with ``1.root.json`` on first use, fetching via a tracker."""
        DeviceTrust.provision(self.state, (self.metadata_dir / "1.root.json").read_bytes())
        inner = LocalFetcher([self.metadata_dir, self.remote / TARGETS_DIR])
        self.tracker = FetchTracker(inner)
        return DeviceTrust(
            self.state, self.checkout, self.remote, limits=limits, fetcher=self.tracker
        )

    # --- the attacker's tools -----------------------------------------------------------

    def read_metadata(self, name: str) -> bytes:
        return (self.metadata_dir / name).read_bytes()

    def write_metadata(self, name: str, data: bytes) -> None:
        (self.metadata_dir / name).write_bytes(data)

    def forge(
        self,
        role: str,
        version: int,
        signers: Sequence[Signer],
        *,
        listed_version: int | None = None,
        listed: bytes | None = None,
        expires: datetime | None = None,
    ) -> bytes:
        """Sign a snapshot or timestamp listing ``listed`` (or just a version) and store it.

        Nothing checks that the signers are the role's keys: this is what whoever holds
        (or stole) keys can produce.
        """
        expires = expires or datetime.now(UTC) + timedelta(days=1)
        meta = (
            meta_file(listed_version or 1, listed)
            if listed is not None
            else MetaFile(listed_version or 1)
        )
        if listed is not None and listed_version is None:
            meta.version = Metadata.from_bytes(listed).signed.version
        md: Metadata[Snapshot] | Metadata[Timestamp]
        if role == "snapshot":
            md = Metadata(build_snapshot(version, expires, meta))
        elif role == "timestamp":
            md = Metadata(build_timestamp(version, expires, meta))
        else:
            raise ValueError(role)
        for signer in signers:
            md.sign(signer, append=True)
        data = md.to_bytes(JSONSerializer())
        self.write_metadata(
            "timestamp.json" if role == "timestamp" else f"{version}.{role}.json", data
        )
        return data

    def forge_targets(
        self,
        version: int,
        signers: Sequence[Signer],
        files: Mapping[str, TargetFile],
        *,
        expires: datetime | None = None,
    ) -> bytes:
        """Sign targets metadata listing ``files`` with whatever keys are given, and store it."""
        expires = expires or datetime.now(UTC) + timedelta(days=1)
        md = Metadata(build_targets(version, expires, files))
        for signer in signers:
            md.sign(signer, append=True)
        data = to_bytes(md)
        self.write_metadata(f"{version}.targets.json", data)
        return data

    def forge_root(self, root: Root, signers: Sequence[Signer]) -> bytes:
        """Sign and store ``root`` as ``N.root.json`` with whatever keys are given."""
        md = Metadata(root)
        for signer in signers:
            md.sign(signer, append=True)
        data = to_bytes(md)
        self.write_metadata(f"{root.version}.root.json", data)
        return data


def online_signers(keys_dir: Path, pattern: str = "{role}.key") -> dict[str, CryptoSigner]:
    """The online roles' signers from a repository's key folder (``pattern`` names each
    role's file, e.g. ``{role}.*.key.old`` for the keys ``keys rotate`` replaced)."""
    from signing.keys import load_private_key

    signers = {}
    for role in ONLINE_ROLES:
        (path,) = keys_dir.glob(pattern.format(role=role))
        key = load_private_key(path)
        signers[role] = CryptoSigner(key, public_key_of(key))
    return signers


def sign_online(
    folder: Path,
    signers: Mapping[str, Signer],
    files: Mapping[str, TargetFile],
    *,
    snapshot_version: int | None = None,
) -> None:
    """Sign and store a release of ``files`` over the metadata in ``folder``: targets,
    snapshot and timestamp, each one version up, with whatever keys are given (what
    whoever holds, or stole, the online keys can produce)."""
    trust = TrustRepo.load(folder)
    expires = datetime.now(UTC) + timedelta(days=30)
    targets = Metadata(build_targets(trust.version("targets") + 1, expires, dict(files)))
    targets.sign(signers["targets"])
    targets_bytes = to_bytes(targets)
    (folder / f"{targets.signed.version}.targets.json").write_bytes(targets_bytes)
    version = snapshot_version or trust.version("snapshot") + 1
    snapshot: Metadata[Snapshot] = Metadata(
        build_snapshot(version, expires, meta_file(targets.signed.version, targets_bytes))
    )
    snapshot.sign(signers["snapshot"])
    snapshot_bytes = to_bytes(snapshot)
    (folder / f"{version}.snapshot.json").write_bytes(snapshot_bytes)
    timestamp: Metadata[Timestamp] = Metadata(
        build_timestamp(trust.version("timestamp") + 1, expires, meta_file(version, snapshot_bytes))
    )
    timestamp.sign(signers["timestamp"])
    (folder / "timestamp.json").write_bytes(to_bytes(timestamp))


def load_signed(data: bytes) -> Root | Targets | Snapshot | Timestamp:
    """The signed part of serialized metadata (no verification)."""
    signed: Root | Targets | Snapshot | Timestamp = Metadata.from_bytes(data).signed
    return signed


FIXTURE_NOW = datetime(2025, 1, 1, tzinfo=UTC)
FIXTURE_EXPIRY = Expiry(
    **{role: datetime(2099, 1, 1, tzinfo=UTC) - FIXTURE_NOW for role in ("root", *ONLINE_ROLES)}
)


def write_fixtures(out: Path) -> dict[str, object]:
    """The signed fixture set of the current format (deterministic except signatures).

    Deterministic keys and clock; a root rotation (v1 -> v2, new root key) and two
    releases, with every kind of facts.  Returns what a device must read from it.
    """
    sim = RepoSim.create(out, expiry=FIXTURE_EXPIRY, now=FIXTURE_NOW, seed="modelreg-fixtures")
    sim.release(
        "mlp",
        "1.0.0",
        b"mlp 1.0.0 weights",
        channels={"production": ("1.0.0", None)},
        facts={"git_commit": "0" * 40, "targets": ["cpu"]},
        now=FIXTURE_NOW,
    )
    new_root = new_signer("modelreg-fixtures/root-v2")
    sim.repo.rotate_root(sim.root_signers, [new_root.public_key], [new_root], 1, now=FIXTURE_NOW)
    sim.root_signers = [new_root]
    repo = sim.repo
    common = {"model": "mlp", "version": "1.1.0", "parent": "1.0.0", "git_commit": "1" * 40}
    repo.add_target(
        "models/mlp/1.1.0.from-1.0.0.delta",
        b"delta bytes",
        TargetFacts.model_validate(
            {
                "kind": "delta",
                **common,
                "base": "1.0.0",
                "base_sha256": hashlib.sha256(b"mlp 1.0.0 weights").hexdigest(),
            }
        ),
    )
    repo.add_target(
        "models/mlp/1.1.0.cpu.engine",
        b"engine bytes",
        TargetFacts.model_validate({"kind": "engine", **common, "target": "cpu"}),
    )
    sim.release(
        "mlp",
        "1.1.0",
        b"mlp 1.1.0 weights",
        channels={"production": ("1.0.0", None), "canary": ("1.1.0", 10.0)},
        facts={"git_commit": "1" * 40, "parent": "1.0.0"},
        now=FIXTURE_NOW,
    )
    root_file = sim.metadata_dir / "1.root.json"
    (out / "root.json").write_bytes(root_file.read_bytes())
    doc = sim.channels_doc()
    assert doc is not None
    return {
        "channels": doc.model_dump(mode="json"),
        "targets": {
            path: {
                "sha256": info.hashes["sha256"],
                "length": info.length,
                "facts": TargetFacts.from_custom(info.custom).model_dump(
                    mode="json", exclude_defaults=True
                ),
            }
            for path, info in sorted(repo.targets.items())
        },
        "versions": {role: repo.version(role) for role in ("root", *ONLINE_ROLES)},
    }
