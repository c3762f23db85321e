"""The update plan (docs/reference/daemon.md, "The loop"): how a device gets a version's bytes, as a
pure decision over facts the updater gathered (no I/O, no trust objects, no clock).

The facts are digests and lengths: the version's signed artifact, the blobs the device
holds (verified), the installed versions whose artifacts could be a delta's base, the
chain of signed deltas that leads back from the version, the engine of the device
target chosen, and the signed digests already rejected for this version.

======================================  ===============================================
facts                                   plan
======================================  ===============================================
this signed digest rejected before      nothing (``None``): not tried again until its
                                        description or artifact changes
targets named, none for this device     :class:`Refusal` ``no target``
an engine the device does not build     ``engine`` (its prebuilt file), ``cached`` when
itself (:data:`DEVICE_BUILT`)           held; :class:`Refusal` ``no prebuilt engine``
                                        when none is signed
the artifact is held                    ``cached``
a signed tensor manifest, an ONNX       ``tensors``: the skeleton and tensors the
Runtime target, some of its tensors     device lacks (each digest once), when they
held, the rest shorter than the         are fewer bytes than the artifact
artifact
deltas lead back to a held version in   ``delta``: the chain, base first
at most :data:`MAX_DELTA_CHAIN` steps,
their total shorter than the artifact
otherwise                               ``full``
======================================  ===============================================

``tensors`` is said as ``delta`` in the status (SPEC: the bytes came as a difference
from what the device held).  A first install holds no tensor, so it takes the artifact
whole: one request, and its tensors are then held as spans of that file.

ONNX Runtime and TensorRT targets both take the artifact (TensorRT builds its engine on
the device from it: ``edge_sync.engine.tensorrt``), which later deltas apply to.  So no
engine the manifest schema allows today takes the ``engine`` row: it is there for a
target whose engine only CI can build (the signed ``engines/`` targets ``publish`` makes),
and only the table tests reach it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

__all__ = [
    "DEVICE_BUILT",
    "MAX_DELTA_CHAIN",
    "DeltaLink",
    "Method",
    "Plan",
    "PlanFacts",
    "Refusal",
    "Signed",
    "TensorFacts",
    "plan_update",
    "said",
    "worst",
]

MAX_DELTA_CHAIN: Final = 16
"""Most deltas applied in a row (each is a full decode of the model)."""
DEVICE_BUILT: Final = frozenset({"onnxruntime", "tensorrt"})
"""Engines the device makes from the ONNX artifact itself (no prebuilt file needed)."""

Method = Literal["cached", "tensors", "delta", "full", "engine"]
DataMethod = Literal["cached", "delta", "full"]


@dataclass(frozen=True)
class Signed:
    """A signed file: where it is, its digest and its length."""

    path: str
    sha256: str
    length: int


@dataclass(frozen=True)
class DeltaLink:
    """One signed delta of a chain: it turns ``parent``'s artifact into ``version``'s.

    Attributes:
        version: the version it produces.
        sha256: that version's signed artifact digest (what applying it must give).
        parent: the version it applies to.
        path: the delta's target path.
        length: the delta's signed length.
        base: the base its signed facts name (checked against ``parent`` once fetched).
    """

    version: str
    sha256: str
    parent: str
    path: str
    length: int
    base: str | None = None


@dataclass(frozen=True)
class TensorFacts:
    """A version's signed tensor manifest, as objects, and which the device holds.

    Attributes:
        graph: the skeleton.
        tensors: each tensor, in manifest order (a digest may repeat).
        held: the digests the device holds (skeletons and tensors, verified).
        whole: the bytes a whole install fetches, for a model stored with external
            data: the artifact and its data files (0: the artifact's length).
    """

    graph: Signed
    tensors: tuple[Signed, ...]
    held: frozenset[str] = frozenset()
    whole: int = 0

    def missing(self) -> tuple[Signed, ...]:
        """The objects to fetch: the skeleton and each tensor not held, each digest once."""
        found: dict[str, Signed] = {}
        for obj in (self.graph, *self.tensors):
            if obj.sha256 not in self.held:
                found.setdefault(obj.sha256, obj)
        return tuple(found.values())

    def held_bytes(self) -> int:
        """Bytes of the version's tensors the device holds."""
        return sum({t.sha256: t.length for t in self.tensors if t.sha256 in self.held}.values())


@dataclass(frozen=True)
class PlanFacts:
    """What the plan decides from (the updater gathers it).

    Attributes:
        version: the version assigned.
        artifact: its signed artifact.
        signed: the digest of its signed description and artifact.
        rejected: signed digests of this version rejected before.
        matched: False when the version names device targets and none is for this
            device.
        engine: the chosen target's engine (None: no targets named).
        held: blob digests the device holds (verified).
        installed: artifact digest by version, for the versions the device installed
            (possible delta bases).
        links: the signed deltas leading back from ``version``, newest first.
        prebuilt: the signed prebuilt engine for the chosen target (engines the device
            does not build only).
        tensors: the version's tensor manifest (None: it has none).
    """

    version: str
    artifact: Signed
    signed: str = ""
    rejected: frozenset[str] = frozenset()
    matched: bool = True
    engine: str | None = None
    held: frozenset[str] = frozenset()
    installed: Mapping[str, str] = field(default_factory=dict)
    links: tuple[DeltaLink, ...] = ()
    prebuilt: Signed | None = None
    tensors: TensorFacts | None = None

    @property
    def settled(self) -> bool:
        """Whether the plan is decided before any blob or delta is looked at."""
        return self.signed in self.rejected or not self.matched

    @property
    def needs_prebuilt(self) -> bool:
        """Whether the chosen target runs a prebuilt engine file, not the artifact."""
        return self.engine is not None and self.engine not in DEVICE_BUILT

    def bases(self) -> dict[str, str]:
        """Artifact digest by installed version, for those whose blob is held."""
        return {v: d for v, d in self.installed.items() if d in self.held}


@dataclass(frozen=True)
class Plan:
    """The cheapest verified way to the version's bytes.

    Attributes:
        method: ``cached``, ``delta``, ``full`` or ``engine``.
        kind: the file the engine loads: the ``artifact`` or a prebuilt ``engine``.
        sha256: that file's signed digest.
        path: its target path.
        chain: the deltas to apply, base first (``delta`` only).
        base_sha256: the held artifact the chain starts from (``delta`` only).
        objects: the skeleton and tensors to fetch (``tensors`` only).
    """

    method: Method
    kind: Literal["artifact", "engine"]
    sha256: str
    path: str
    chain: tuple[DeltaLink, ...] = ()
    base_sha256: str | None = None
    objects: tuple[Signed, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """The version cannot be installed on this device (it is rejected)."""

    why: Literal["no target", "no prebuilt engine"]


def plan_update(facts: PlanFacts) -> Plan | Refusal | None:
    """Decide how to get the version (see the module doc's table); None: nothing to
    do, it was rejected before and nothing signed changed since."""
    if facts.signed in facts.rejected:
        return None
    if not facts.matched:
        return Refusal("no target")
    if facts.needs_prebuilt:
        prebuilt = facts.prebuilt
        if prebuilt is None:
            return Refusal("no prebuilt engine")
        method: Method = "cached" if prebuilt.sha256 in facts.held else "engine"
        return Plan(method, "engine", prebuilt.sha256, prebuilt.path)
    art = facts.artifact
    if art.sha256 in facts.held:
        return Plan("cached", "artifact", art.sha256, art.path)
    tensors = facts.tensors
    if tensors is not None and facts.engine in (None, "onnxruntime") and tensors.held_bytes():
        objects = tensors.missing()
        if sum(o.length for o in objects) < (tensors.whole or art.length):
            return Plan("tensors", "artifact", art.sha256, art.path, objects=objects)
    chain = delta_chain(facts.version, facts.links, facts.bases(), art.length)
    if chain is not None:
        links, base = chain
        return Plan("delta", "artifact", art.sha256, art.path, links, base)
    return Plan("full", "artifact", art.sha256, art.path)


def delta_chain(
    version: str, links: tuple[DeltaLink, ...], bases: Mapping[str, str], full_length: int
) -> tuple[tuple[DeltaLink, ...], str] | None:
    """The deltas from a held base to ``version`` (base first) and the base's digest,
    when at most :data:`MAX_DELTA_CHAIN` of them lead there and together they are
    shorter than the full file; else None."""
    chain: list[DeltaLink] = []
    current, total = version, 0
    for link in links:
        if current in bases or len(chain) >= MAX_DELTA_CHAIN or link.version != current:
            break
        chain.append(link)
        total += link.length
        current = link.parent
    base = bases.get(current)
    if not chain or base is None or total >= full_length:
        return None
    return tuple(reversed(chain)), base


def worst(method: Method, data: DataMethod | None) -> Method:
    """How a version with external data came: the costliest way any of its files did
    (``data``: how its data files came; None: it has none)."""
    order = ("cached", "delta", "full")
    if data is None or method in ("engine", "tensors"):
        return method
    return method if order.index(method) >= order.index(data) else data


def said(method: Method) -> DataMethod:
    """The method as status reports it (SPEC: a prebuilt engine is a full file too, and
    tensors are a difference from what the device held)."""
    if method == "tensors":
        return "delta"
    return "full" if method == "engine" else method
