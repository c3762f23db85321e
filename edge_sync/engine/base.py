"""The hand-off between the updater and the serving layer (stable API).

The updater gets verified bytes onto the device and decides what should run; an
:class:`EngineHost` turns a verified file (a :class:`LoadRequest`) into a runnable
:class:`Engine`, which ``edge_sync.engine.selftest`` proves before the host swaps it
in.  The serving layer answers requests from :meth:`EngineHost.lease`, the daemon
reads what is loaded for ``/status`` and ``/metrics``, and nobody reaches past these
two protocols to a concrete class: every member the rest of ``edge_sync`` reads is
declared here (``tests/unit/test_engine_protocols.py`` checks that it stays so).

The ONNX Runtime engine is ``edge_sync.engine.ort``, the in-process host
``edge_sync.engine.host``; TensorRT runs through the ONNX Runtime engine
(``edge_sync.engine.tensorrt``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy.typing as npt

    from edge_sync.engine.weights import TensorRef, Weights
    from registry.schema import Target
    from registry.sessions import SessionSetup

__all__ = [
    "DATATYPES",
    "NUMPY_DTYPES",
    "CacheStats",
    "Engine",
    "EngineHost",
    "LoadRequest",
    "PrepackDecision",
    "SetupHost",
    "TensorDecl",
    "TensorLayout",
]

DATATYPES: Final = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(int8)": "INT8",
    "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
    "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}  # fmt: skip
"""ONNX Runtime's tensor types (what :attr:`Engine.inputs` names) as the Open Inference
Protocol names them."""
NUMPY_DTYPES: Final = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
    "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "FP32": "float32", "FP64": "float64", "BYTES": "object",
}  # fmt: skip
"""The numpy dtype of each protocol datatype."""

TensorDecl = tuple[str, str, list[Any]]
"""One input or output an engine declares: its name, its ONNX Runtime type
(``tensor(float)``: a key of :data:`DATATYPES`) and its shape (sizes, or names and
None for the dimensions the model leaves open)."""

PrepackDecision = dict[str, float | bool | str]
"""Per model: ``prepack`` (whether prepacking won), the milliseconds per run measured
(``shared_ms``, ``prepacked_ms``), and ``error`` when the measurement failed."""


@dataclass(frozen=True)
class LoadRequest:
    """What to build: a verified file and the settings it runs with.

    Attributes:
        model, version: which model version.
        path: the verified file (a blob).
        sha256: its digest.
        kind: ``artifact`` (ONNX, optimized at load) or ``engine`` (a prebuilt engine:
            for ONNX Runtime an ONNX graph optimized offline, loaded as is).
        target: the device target whose settings apply (None: ONNX Runtime on CPU).
        layout: for a version held as tensors, its skeleton and tensors (``path`` and
            ``sha256`` then name the whole file it stands for, which the device may
            not hold).
        model_sha256: the SHA-256 of the version's signed artifact, which every answer
            of the engine names (for a prebuilt engine, not ``sha256``); None when
            unknown (a state kept before it was recorded).
    """

    model: str
    version: str
    path: Path
    sha256: str
    kind: str = "artifact"
    target: Target | None = None
    layout: TensorLayout | None = None
    model_sha256: str | None = None

    @property
    def served_sha256(self) -> str | None:
        """The signed artifact's SHA-256 that answers name (an artifact's own digest when
        ``model_sha256`` was not recorded)."""
        if self.model_sha256 is not None:
            return self.model_sha256
        return self.sha256 if self.kind == "artifact" else None


@dataclass(frozen=True)
class TensorLayout:
    """A version held as tensors (``registry.tensors``): its verified skeleton and
    where each tensor it names lies (``edge_sync.engine.weights.TensorRef``).  An
    engine is built from these, never from a whole file."""

    graph: Path
    tensors: tuple[TensorRef, ...]
    check: Callable[[], None] | None = field(default=None, compare=False)
    """Called before each build from it, a reload after an eviction too: raises
    ``OSError`` when a blob it maps is no longer as verified."""


@dataclass
class CacheStats:
    """Per model: requests that found the engine loaded, that had to load it again,
    and how often it was evicted."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0


@runtime_checkable
class Engine(Protocol):
    """A runnable model version, with what the host, the serving layer and the daemon
    read of it."""

    model: str
    version: str
    sha256: str

    @property
    def request(self) -> LoadRequest:
        """What it was built from."""
        ...  # pragma: no cover - protocol

    @property
    def setup(self) -> SessionSetup | None:
        """The session setup it runs in (``registry.sessions``; None: none of them, and
        the self-test checks this engine alone)."""
        ...  # pragma: no cover - protocol

    @property
    def inputs(self) -> Sequence[TensorDecl]:
        """The inputs it takes."""
        ...  # pragma: no cover - protocol

    @property
    def outputs(self) -> Sequence[TensorDecl]:
        """The outputs it computes."""
        ...  # pragma: no cover - protocol

    @property
    def providers(self) -> Sequence[Any]:
        """ONNX Runtime's execution providers it runs on, in order (names, or a name
        with its options)."""
        ...  # pragma: no cover - protocol

    @property
    def intra_op_threads(self) -> int:
        """Threads one run computes on."""
        ...  # pragma: no cover - protocol

    @property
    def run_s(self) -> float | None:
        """Seconds a run takes, averaged over recent runs (None before the first)."""
        ...  # pragma: no cover - protocol

    @property
    def loaded(self) -> bool:
        """Whether it is in memory (not unloaded for the memory budget, nor released)."""
        ...  # pragma: no cover - protocol

    @property
    def shared(self) -> bool:
        """Whether its weights are shared with other versions (``edge_sync.engine.weights``)."""
        ...  # pragma: no cover - protocol

    @property
    def weights(self) -> Weights | None:
        """The shared weights it runs on (None: it holds private ones)."""
        ...  # pragma: no cover - protocol

    @property
    def size_bytes(self) -> int:
        """Its file's size."""
        ...  # pragma: no cover - protocol

    @property
    def memory_bytes(self) -> int:
        """What it adds to the memory budget: its own weight bytes (shared ones count
        where they were first loaded), else its file's size."""
        ...  # pragma: no cover - protocol

    def sample_inputs(self) -> dict[str, npt.NDArray[Any]]:
        """Zeros shaped like its inputs: warm-up and timing data."""
        ...  # pragma: no cover - protocol

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """Run once; the named outputs (all by default) by name."""
        ...  # pragma: no cover - protocol

    def unload(self) -> None:
        """Free its memory for the budget; its next run loads it again."""
        ...  # pragma: no cover - protocol

    def detach(self) -> object:
        """Release it, and return what it held, for the caller to free where it likes."""
        ...  # pragma: no cover - protocol

    def close(self) -> None:
        """Release what it holds."""
        ...  # pragma: no cover - protocol


@runtime_checkable
class SetupHost(Protocol):
    """A host that can build an engine in a given session setup (the self-test runs the
    goldens in every setup a device may switch to: ``registry.sessions``)."""

    def build_in(self, request: LoadRequest, setup: SessionSetup) -> Engine:
        """An engine for ``request`` in ``setup`` (not serving, not held by the host).

        Raises:
            EngineError: it cannot be built in that setup here.
        """
        ...  # pragma: no cover - protocol


@runtime_checkable
class EngineHost(SetupHost, Protocol):
    """Builds engines and holds the one each model serves, with any others still loaded
    (a candidate, the version a swap replaced while its requests drain)."""

    @property
    def cache(self) -> Mapping[str, CacheStats]:
        """The memory budget's hits, misses and evictions, per model."""
        ...  # pragma: no cover - protocol

    @property
    def prepack_decisions(self) -> Mapping[str, PrepackDecision]:
        """Per model: whether prepacking won when :meth:`tune` measured it."""
        ...  # pragma: no cover - protocol

    def build(self, request: LoadRequest) -> Engine:
        """An engine for ``request`` (not yet serving).

        Raises:
            EngineError: the file cannot run here (unsupported engine or provider,
                an invalid graph).
        """
        ...  # pragma: no cover - protocol

    def swap(self, model: str, engine: Engine) -> Engine | None:
        """Serve ``engine`` for ``model`` from now on; the engine it replaces."""
        ...  # pragma: no cover - protocol

    def current(self, model: str) -> Engine | None:
        """The engine serving ``model``, if any."""
        ...  # pragma: no cover - protocol

    def drop(self, model: str) -> Engine | None:
        """Stop serving ``model``; the engine that served it."""
        ...  # pragma: no cover - protocol

    def retire(self, engine: Engine) -> None:
        """Release ``engine`` once nothing uses it."""
        ...  # pragma: no cover - protocol

    def lease(
        self, model: str, version: str | None = None
    ) -> contextlib.AbstractContextManager[Engine]:
        """Hold the engine a request runs on (the serving one, or a loaded ``version``)
        until the request is done.

        Raises:
            LookupError: nothing serves ``model``, or ``version`` is not loaded.
        """
        ...  # pragma: no cover - protocol

    def versions(self, model: str) -> list[str]:
        """The loaded versions of ``model`` that answer requests, serving one first."""
        ...  # pragma: no cover - protocol

    def loaded(self) -> list[Engine]:
        """Every engine loaded now (serving, candidates, draining)."""
        ...  # pragma: no cover - protocol

    def models(self) -> dict[str, Engine]:
        """What serves each model now."""
        ...  # pragma: no cover - protocol

    def in_flight(self, engine: Engine) -> int:
        """Requests running on ``engine`` now."""
        ...  # pragma: no cover - protocol

    def mapped_blobs(self) -> set[str]:
        """The blobs loaded engines map: the blob store keeps them while they are."""
        ...  # pragma: no cover - protocol

    def tune(self, model: str) -> PrepackDecision | None:
        """Measure once whether prepacking pays for ``model``; the decision made now
        (None: nothing to decide now)."""
        ...  # pragma: no cover - protocol
