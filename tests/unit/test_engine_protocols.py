"""The ``Engine`` and ``EngineHost`` protocols are complete (issue 24): every member the
rest of ``edge_sync`` reads of an engine or a host is declared in
``edge_sync.engine.base``, the ONNX Runtime engine and the in-process host have every
declared member, and the engine and serving code read none with a default
(``getattr(engine, "x", default)``, ``hasattr``), which would hide a missing member.

The reads are found by walking the code's syntax: an engine is a name ``engine``, an
attribute ``<anything>.engine`` (a held engine), or what ``with <host>.lease(...) as x``
binds; a host is a name ``host`` or ``self.host``.  mypy checks the same statically
wherever a value is typed ``Engine``; this also covers reads through ``Any``.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
from pathlib import Path
from typing import Generic, Protocol

import pytest

from edge_sync.engine.base import Engine, EngineHost, LoadRequest, SetupHost
from edge_sync.engine.host import InProcessHost
from edge_sync.engine.ort import OrtEngine
from tests.conftest import REPO_ROOT
from tests.edge import models

NO_DEFAULTS_IN = ("edge_sync",)
"""Where no engine or host member may be read with a default: the whole device side."""


def members(protocol: type) -> set[str]:
    """The public members a protocol declares (its own and its bases')."""
    found: set[str] = set()
    for klass in protocol.__mro__:
        if klass in (object, Generic, Protocol):
            continue
        found |= set(inspect.get_annotations(klass))
        found |= set(vars(klass))
    return {name for name in found if not name.startswith("_")}


ENGINE = members(Engine)
HOST = members(EngineHost)


class Read:
    """One read of a member of an engine or a host found in source code."""

    def __init__(self, of: str, member: str, *, defaulted: bool, line: int) -> None:
        self.of, self.member, self.defaulted, self.line = of, member, defaulted, line

    def __repr__(self) -> str:
        return f"{self.of}.{self.member}{' (with a default)' if self.defaulted else ''}"


def _leased(tree: ast.AST) -> set[str]:
    """The names ``with <x>.lease(...) as name`` binds (engines)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                call, bound = item.context_expr, item.optional_vars
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "lease"
                    and isinstance(bound, ast.Name)
                ):
                    names.add(bound.id)
    return names


def _what(node: ast.expr, engines: set[str]) -> str | None:
    """``engine``, ``host`` or None: what the expression is, by the rules above."""
    if isinstance(node, ast.Name):
        return "engine" if node.id in engines else "host" if node.id == "host" else None
    if isinstance(node, ast.Attribute):
        if node.attr == "engine":
            return "engine"
        if node.attr == "host" and isinstance(node.value, ast.Name) and node.value.id == "self":
            return "host"
    return None


def reads(source: str) -> list[Read]:
    """Every read of an engine's or a host's member in ``source``: ``x.member``, and
    ``getattr`` / ``hasattr`` with a literal name (defaulted: a three-argument
    ``getattr``, or any ``hasattr``)."""
    tree = ast.parse(source)
    engines = {"engine"} | _leased(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            of = _what(node.value, engines)
            if of is not None:
                found.append(Read(of, node.attr, defaulted=False, line=node.lineno))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            of = _what(node.args[0], engines)
            if of is not None:
                defaulted = node.func.id == "hasattr" or len(node.args) == 3
                found.append(Read(of, node.args[1].value, defaulted=defaulted, line=node.lineno))
    return found


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("engine.run(x)", ["engine.run"]),
        ("held.engine.loaded", ["engine.loaded"]),
        ("with self.host.lease(m) as other:\n    other.run(x)", ["host.lease", "engine.run"]),
        ("with open(p) as other:\n    other.read()", []),
        ("self.host.tune(m)", ["host.tune"]),
        ("host.in_flight(e)", ["host.in_flight"]),
        ('getattr(engine, "weights", None)', ["engine.weights (with a default)"]),
        ('getattr(engine, "weights")', ["engine.weights"]),
        ('hasattr(self.host, "cache")', ["host.cache (with a default)"]),
        ('getattr(self.host, "mapped_blobs", None)', ["host.mapped_blobs (with a default)"]),
        ("request.client.host", []),  # a client's address, not the engine host
        ("target.engine", []),  # a read of .engine itself says nothing of an engine
        ("engine.model = 'm'", []),  # a write
        ("other.weights", []),  # an unknown name: not an engine
    ],
)
def test_the_reads_the_walk_finds(source: str, expected: list[str]) -> None:
    assert sorted(map(repr, reads(source))) == sorted(expected)


def _sources(*folders: str) -> list[Path]:
    paths = [p for folder in folders for p in sorted((REPO_ROOT / folder).rglob("*.py"))]
    assert paths, folders
    return paths


def test_every_member_edge_sync_reads_of_an_engine_or_a_host_is_in_its_protocol() -> None:
    missing = []
    for path in _sources("edge_sync"):
        for read in reads(path.read_text()):
            declared = ENGINE if read.of == "engine" else HOST
            if read.member not in declared:
                missing.append(f"{path.relative_to(REPO_ROOT)}:{read.line}: {read!r}")
    assert not missing, "read but not in the protocol:\n" + "\n".join(missing)


def test_no_engine_or_host_member_is_read_with_a_default() -> None:
    defaulted = [
        f"{path.relative_to(REPO_ROOT)}:{read.line}: {read!r}"
        for path in _sources(*NO_DEFAULTS_IN)
        for read in reads(path.read_text())
        if read.defaulted
    ]
    assert not defaulted, "\n".join(defaulted)


def test_the_walk_sees_the_serving_and_daemon_reads() -> None:
    """The walk is not blind: it finds the reads each protocol exists for."""
    paths = [*_sources("edge_sync/serve", "edge_sync/engine"), REPO_ROOT / "edge_sync/daemon.py"]
    seen = {(read.of, read.member) for path in paths for read in reads(path.read_text())}
    assert {("engine", "inputs"), ("engine", "run_s"), ("engine", "weights"),
            ("engine", "setup"), ("engine", "memory_bytes")} <= seen  # fmt: skip
    assert {("host", "lease"), ("host", "cache"), ("host", "tune"), ("host", "in_flight")} <= seen


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[OrtEngine, InProcessHost]:
    path = models.save(models.mlp(width=64), tmp_path_factory.mktemp("m") / "m.onnx")
    request = LoadRequest("mlp", "1.0.0", path, hashlib.sha256(path.read_bytes()).hexdigest())
    host = InProcessHost(prepack="off")
    engine = host.build(request)
    host.swap("mlp", engine)
    assert isinstance(engine, OrtEngine)
    return engine, host


@pytest.mark.parametrize(("protocol", "which"), [(Engine, 0), (EngineHost, 1), (SetupHost, 1)])
def test_the_real_engine_and_host_have_every_declared_member(
    built: tuple[OrtEngine, InProcessHost], protocol: type, which: int
) -> None:
    real = built[which]
    assert isinstance(real, protocol)
    for name in members(protocol):
        declared = inspect.getattr_static(protocol, name, None)  # None: an annotation
        assert hasattr(real, name), name
        if inspect.isfunction(declared):  # a method: callable, not a property
            assert callable(getattr(real, name)), name


def test_the_protocols_declare_what_the_issue_names() -> None:
    assert {"inputs", "outputs", "providers", "loaded", "shared", "weights", "setup",
            "request", "sample_inputs", "size_bytes", "memory_bytes"} <= ENGINE  # fmt: skip
    assert {"loaded", "in_flight", "prepack_decisions", "tune", "build_in",
            "mapped_blobs", "cache", "models"} <= HOST  # fmt: skip
