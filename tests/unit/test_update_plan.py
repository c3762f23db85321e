"""The update plan without I/O (issue 24, point 3): how a device gets a version's bytes
(``edge_sync.decide.plan.plan_update``).  Each row builds the facts the updater would
gather (digests, lengths, what the blob store holds, the signed deltas, the target's
engine, the rejected digests) and names the exact plan: its method, the file, and the
chain base first; or a refusal, or nothing to do."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import replace

import pytest

from edge_sync.decide import plan as planning
from edge_sync.decide.plan import (
    DeltaLink,
    Plan,
    PlanFacts,
    Refusal,
    Signed,
    TensorFacts,
    plan_update,
    said,
    worst,
)

FULL = 1000
"""The artifact's signed length."""


def _art(version: str) -> str:
    return f"sha-{version}"


def _link(version: str, parent: str, length: int = 100) -> DeltaLink:
    return DeltaLink(
        version, _art(version), parent, f"deltas/mlp/{version}.from-{parent}.delta", length,
        parent,
    )  # fmt: skip


def _chain(*versions: str, length: int = 100) -> tuple[DeltaLink, ...]:
    """Links newest first: ``_chain("1.2", "1.1", "1.0")`` is 1.2 <- 1.1 <- 1.0."""
    return tuple(_link(v, p, length) for v, p in itertools.pairwise(versions))


def _facts(version: str = "1.1", **over: object) -> PlanFacts:
    art = Signed(f"models/mlp/{version}.onnx", _art(version), FULL)
    facts = PlanFacts(version=version, artifact=art, signed="signed-now")
    return replace(facts, **over)  # type: ignore[arg-type]


def _installed(*versions: str) -> Mapping[str, str]:
    return {v: _art(v) for v in versions}


def _held(*versions: str) -> frozenset[str]:
    return frozenset(_art(v) for v in versions)


ENGINE = Signed("engines/mlp/1.1/gpu.plan", "sha-engine", 5000)
ART = ("models/mlp/1.1.onnx", "sha-1.1")


def _delta(*chain: str) -> tuple[str, ...]:
    """The expected chain as "from->to", base first."""
    return tuple(f"{p}->{v}" for p, v in itertools.pairwise(chain))


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        # cached / full
        pytest.param(_facts(held=_held("1.1")), ("cached", "artifact", *ART, (), None), id="artifact held: cached"),
        pytest.param(_facts(), ("full", "artifact", *ART, (), None), id="nothing held, no deltas: full"),
        pytest.param(_facts(held=_held("1.1", "1.0"), installed=_installed("1.0"), links=_chain("1.1", "1.0")), ("cached", "artifact", *ART, (), None), id="held beats a delta"),
        # delta chains
        pytest.param(_facts(held=_held("1.0"), installed=_installed("1.0"), links=_chain("1.1", "1.0")), ("delta", "artifact", *ART, _delta("1.0", "1.1"), "sha-1.0"), id="one delta from the version served"),
        pytest.param(_facts("1.3", held=_held("1.0"), installed=_installed("1.0"), links=_chain("1.3", "1.2", "1.1", "1.0")), ("delta", "artifact", "models/mlp/1.3.onnx", "sha-1.3", _delta("1.0", "1.1", "1.2", "1.3"), "sha-1.0"), id="a chain of three, applied base first"),
        pytest.param(_facts("1.3", held=_held("1.0", "1.2"), installed=_installed("1.0", "1.2"), links=_chain("1.3", "1.2", "1.1", "1.0")), ("delta", "artifact", "models/mlp/1.3.onnx", "sha-1.3", _delta("1.2", "1.3"), "sha-1.2"), id="the nearest held version is the base"),
        pytest.param(_facts("1.3", held=_held("1.0"), installed=_installed("1.0"), links=_chain("1.3", "1.2", "1.1", "1.0", length=334)), ("full", "artifact", "models/mlp/1.3.onnx", "sha-1.3", (), None), id="chain total (1002) longer than the full file: full"),
        pytest.param(_facts("1.3", held=_held("1.0"), installed=_installed("1.0"), links=_chain("1.3", "1.2", "1.1", "1.0", length=333)), ("delta", "artifact", "models/mlp/1.3.onnx", "sha-1.3", _delta("1.0", "1.1", "1.2", "1.3"), "sha-1.0"), id="chain total (999) just shorter: delta"),
        pytest.param(_facts(held=_held("1.0"), installed=_installed("1.0"), links=_chain("1.1", "1.0", length=FULL)), ("full", "artifact", *ART, (), None), id="a delta as long as the full file: full"),
        pytest.param(_facts(installed=_installed("1.0"), links=_chain("1.1", "1.0")), ("full", "artifact", *ART, (), None), id="base installed but its blob missing: full"),
        pytest.param(_facts(held=_held("0.9"), installed=_installed("0.9"), links=_chain("1.1", "1.0")), ("full", "artifact", *ART, (), None), id="deltas lead to a version not held: full"),
        pytest.param(_facts(held=_held("1.0"), links=_chain("1.1", "1.0")), ("full", "artifact", *ART, (), None), id="a held blob no installed version names is no base: full"),
        pytest.param(_facts(held=_held("1.0"), installed=_installed("1.0"), links=(_link("1.1", "1.05"), _link("1.04", "1.0"))), ("full", "artifact", *ART, (), None), id="a gap in the links ends the chain: full"),
        pytest.param(_facts(held=_held("1.0"), installed=_installed("1.0")), ("full", "artifact", *ART, (), None), id="no delta signed: full"),
        # engines
        pytest.param(_facts(engine="onnxruntime", held=_held("1.1")), ("cached", "artifact", *ART, (), None), id="onnxruntime runs the artifact"),
        pytest.param(_facts(engine="tensorrt", held=_held("1.0"), installed=_installed("1.0"), links=_chain("1.1", "1.0")), ("delta", "artifact", *ART, _delta("1.0", "1.1"), "sha-1.0"), id="tensorrt builds from the artifact: deltas apply"),
        pytest.param(_facts(engine="vendor", prebuilt=ENGINE), ("engine", "engine", ENGINE.path, ENGINE.sha256, (), None), id="an engine the device does not build: its prebuilt file"),
        pytest.param(_facts(engine="vendor", prebuilt=ENGINE, held=frozenset({ENGINE.sha256})), ("cached", "engine", ENGINE.path, ENGINE.sha256, (), None), id="a prebuilt engine held: cached"),
        pytest.param(_facts(engine="vendor", prebuilt=ENGINE, held=_held("1.1")), ("engine", "engine", ENGINE.path, ENGINE.sha256, (), None), id="the artifact held is no prebuilt engine"),
    ],
)  # fmt: skip
def test_plan(facts: PlanFacts, expected: tuple[object, ...]) -> None:
    plan = plan_update(facts)
    assert isinstance(plan, Plan)
    chain = tuple(f"{link.parent}->{link.version}" for link in plan.chain)
    assert (plan.method, plan.kind, plan.path, plan.sha256, chain, plan.base_sha256) == expected
    for link in plan.chain:  # each step is checked against its version's signed digest
        assert link.sha256 == _art(link.version)


def _obj(name: str, length: int) -> Signed:
    return Signed(f"objects/sha256/{name}", name, length)


GRAPH = _obj("graph", 10)
"""The skeleton; tensors t1..t4 of 200 bytes each make the rest of the 1000-byte file
(``FULL``, with a few bytes of framing left to the skeleton)."""
TENSORS = tuple(_obj(f"t{n}", 200) for n in range(1, 5))


def _tensors(*held: str, tensors: tuple[Signed, ...] = TENSORS) -> TensorFacts:
    return TensorFacts(GRAPH, tensors, frozenset(held))


def _names(plan: Plan) -> tuple[str, ...]:
    return tuple(o.sha256 for o in plan.objects)


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        pytest.param(_facts(tensors=_tensors("t1", "t2", "t3")), ("tensors", ("graph", "t4")), id="three of four tensors held: the skeleton and the fourth"),
        pytest.param(_facts(tensors=_tensors("graph", "t1", "t2", "t3", "t4")), ("tensors", ()), id="every object held (a rollback to a version held as tensors): nothing fetched"),
        pytest.param(_facts(tensors=_tensors()), ("full", ()), id="first install, nothing held: the whole file in one request"),
        pytest.param(_facts(tensors=_tensors("graph")), ("full", ()), id="only the skeleton held: no weights to reuse, full"),
        pytest.param(_facts(tensors=_tensors("t1")), ("tensors", ("graph", "t2", "t3", "t4")), id="one tensor held, 810 of 1000 bytes missing: tensors"),
        pytest.param(_facts(tensors=_tensors("t1", tensors=(*TENSORS, _obj("t5", 200), _obj("t6", 200)))), ("full", ()), id="missing objects (1010) longer than the file: full"),
        pytest.param(_facts(tensors=replace(_tensors("t1"), whole=5000)), ("tensors", ("graph", "t2", "t3", "t4")), id="external data: 810 bytes missing of 5000 with its data files (the .onnx alone: 1000)"),
        pytest.param(_facts(tensors=replace(_tensors("t1"), whole=600)), ("full", ()), id="external data: missing objects (610) longer than the .onnx and its data files (600): full"),
        pytest.param(_facts(tensors=_tensors("t1", tensors=(_obj("t1", 200), _obj("t2", 400), _obj("t2", 400)))), ("tensors", ("graph", "t2")), id="a digest listed twice is fetched once"),
        pytest.param(_facts(tensors=_tensors("t1", "t2", "t3"), held=_held("1.1")), ("cached", ()), id="the artifact held beats tensors"),
        pytest.param(_facts(engine="onnxruntime", tensors=_tensors("t1", "t2", "t3")), ("tensors", ("graph", "t4")), id="an onnxruntime target builds from tensors"),
        pytest.param(_facts(engine="tensorrt", tensors=_tensors("t1", "t2", "t3"), held=_held("1.0"), installed=_installed("1.0"), links=_chain("1.1", "1.0")), ("delta", ()), id="tensorrt needs the file: the delta, never tensors"),
        pytest.param(_facts(tensors=_tensors("t1", "t2", "t3"), held=_held("1.0"), installed=_installed("1.0"), links=_chain("1.1", "1.0", length=50)), ("tensors", ("graph", "t4")), id="tensors beat a shorter delta chain (no whole file rebuilt)"),
    ],
)  # fmt: skip
def test_tensor_plan(facts: PlanFacts, expected: tuple[str, tuple[str, ...]]) -> None:
    """A version with a signed tensor manifest (issue 25)."""
    plan = plan_update(facts)
    assert isinstance(plan, Plan)
    assert (plan.method, _names(plan)) == expected
    assert (plan.kind, plan.sha256) == ("artifact", "sha-1.1")


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        pytest.param(_facts(rejected=frozenset({"signed-now"})), None, id="this signed digest rejected before: nothing"),
        pytest.param(_facts(rejected=frozenset({"signed-now"}), held=_held("1.1")), None, id="rejected before, even when held"),
        pytest.param(_facts(rejected=frozenset({"signed-now"}), matched=False), None, id="rejected before wins over no target (not rejected again)"),
        pytest.param(_facts(rejected=frozenset({"signed-before"}), held=_held("1.1")), "cached", id="another digest rejected (the release changed): planned"),
        pytest.param(_facts(matched=False, held=_held("1.1")), Refusal("no target"), id="targets named, none for this device: refused"),
        pytest.param(_facts(engine="vendor"), Refusal("no prebuilt engine"), id="an engine to prebuild, none signed: refused"),
    ],
)  # fmt: skip
def test_nothing_or_refused(facts: PlanFacts, expected: object) -> None:
    plan = plan_update(facts)
    if isinstance(plan, Plan):
        assert plan.method == expected
    else:
        assert plan == expected


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        pytest.param(_facts(rejected=frozenset({"signed-now"})), True, id="rejected before"),
        pytest.param(_facts(matched=False), True, id="no target"),
        pytest.param(_facts(rejected=frozenset({"other"})), False, id="another digest rejected"),
        pytest.param(_facts(engine="tensorrt"), False, id="a target"),
    ],
)  # fmt: skip
def test_settled_before_any_blob_is_looked_at(facts: PlanFacts, expected: bool) -> None:
    assert facts.settled is expected


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param(planning.MAX_DELTA_CHAIN, "delta", id="a chain of MAX_DELTA_CHAIN deltas: applied"),
        pytest.param(planning.MAX_DELTA_CHAIN + 1, "full", id="one delta more than MAX_DELTA_CHAIN: full"),
    ],
)  # fmt: skip
def test_the_chain_length_is_bounded(steps: int, expected: str) -> None:
    versions = [f"1.{n}" for n in range(steps, -1, -1)]  # newest first, 1.0 held
    facts = _facts(versions[0], held=_held("1.0"), installed=_installed("1.0"),
                   links=_chain(*versions, length=1))  # fmt: skip
    plan = plan_update(facts)
    assert isinstance(plan, Plan)
    assert (plan.method, len(plan.chain)) == (expected, steps if expected == "delta" else 0)


@pytest.mark.parametrize(
    ("method", "data", "expected"),
    [
        ("cached", None, "cached"),
        ("full", None, "full"),
        ("cached", "cached", "cached"),
        ("cached", "delta", "delta"),
        ("cached", "full", "full"),
        ("delta", "cached", "delta"),
        ("delta", "full", "full"),
        ("full", "cached", "full"),
        ("full", "delta", "full"),
        ("engine", "full", "engine"),
        ("engine", None, "engine"),
        ("tensors", None, "tensors"),
    ],
)
def test_external_data_is_worst_of(method: str, data: str | None, expected: str) -> None:
    """A version with external data came the costliest way any of its files did."""
    assert worst(method, data) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("method", "expected"),
    [("cached", "cached"), ("delta", "delta"), ("full", "full"), ("engine", "full"),
     ("tensors", "delta")],
)  # fmt: skip
def test_status_says_a_prebuilt_engine_is_a_full_file(method: str, expected: str) -> None:
    assert said(method) == expected  # type: ignore[arg-type]
