"""The ONNX Runtime session setups a version may run in on a device (stable API).

One owner for a fact that the device (``edge_sync.engine.ort``, ``edge_sync.engine.host``) and
CI's build (``pipelines.build``) must agree on.  It imports ONNX Runtime only when a
setup configures a session (a device's updater imports this module up front).

A device on CPU runs a version in one of two setups, and may switch between them while
it serves the version:

==========  =====================  ==========  =========================================
setup       graph optimizations    prepacking  why a device runs it
==========  =====================  ==========  =========================================
shared      off                    off         weights shared with the version it
                                               replaces (``edge_sync.engine.weights``)
prepacked   the target's level     on          faster for some models; a private copy
                                               of every weight
==========  =====================  ==========  =========================================

Their kernels differ (Conv and BatchNormalization folded into one, NCHWc layouts,
packed GEMM panels), so their answers differ in the last bits: 2.8e-9 at outputs
near 1e-2 on a small Conv + BatchNormalization model.  Which one a device runs
depends on its own ``serve.prepack`` and, with ``auto``, on a timing measurement made
on the device; a verdict made in the setup a device happens to run differed between
identical devices.

**Rule: one verdict per version.**  A version is accepted only when its golden cases
pass in *every* setup :func:`session_setups` gives for its target, whatever setup the
device itself runs: the device checks each before it serves the version, and CI's
build checks the same ones (each it has the providers for) and fails naming the setup
and the largest error.  The other way to one verdict, choosing the setup from signed
settings, would take the choice from the device that knows its own speed and
memory; checking every setup costs one more session at install (a private copy of the
weights, for the moment it takes), and only for a version that has golden cases.

The number of intra-op threads is not part of a setup: ONNX Runtime's CPU kernels
split work by output, so each value is computed the same way (the model above gives
bit-identical answers on 1, 2 and 4 threads).  Sessions on other execution providers
(CUDA, TensorRT) share no weights: one setup, which CI checks only where it has the
provider.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from registry.schema import Target

__all__ = ["OPTIMIZATION_LEVELS", "PREPACKED", "SHARED", "SessionSetup", "session_setups"]

SHARED: Final = "shared"
PREPACKED: Final = "prepacked"
CPU: Final = ("CPUExecutionProvider",)
OPTIMIZATION_LEVELS: Final = {"disable": 0, "basic": 1, "extended": 2, "all": 99}
"""A target's ``optimization`` as ONNX Runtime's ``GraphOptimizationLevel`` value."""


@dataclass(frozen=True, slots=True)
class SessionSetup:
    """How one ONNX Runtime session is set up (see the module doc).

    Attributes:
        name: ``shared`` or ``prepacked``.
        optimization: the graph optimization level (``disable`` for ``shared``).
        providers: the execution providers, in order.
    """

    name: Literal["shared", "prepacked"]
    optimization: str = "all"
    providers: tuple[str, ...] = CPU

    @property
    def shared(self) -> bool:
        """Whether weights are shared between versions (no optimization, no prepacking)."""
        return self.name == SHARED

    @property
    def label(self) -> str:
        """A short name for messages and records: ``shared``, ``prepacked``, with the
        optimization level and providers when they are not the usual ones."""
        label: str = self.name
        if not self.shared and self.optimization != "all":
            label += f" at {self.optimization}"
        if self.providers != CPU:
            label += f" on {'+'.join(p.removesuffix('ExecutionProvider') for p in self.providers)}"
        return label

    def configure(self, options: Any) -> None:
        """Set ``options`` (an ``onnxruntime.SessionOptions``) up for this setup."""
        import onnxruntime as ort

        options.graph_optimization_level = ort.GraphOptimizationLevel(
            OPTIMIZATION_LEVELS[self.optimization]
        )
        if self.shared:
            options.add_session_config_entry("session.disable_prepacking", "1")


def session_setups(target: Target | None, kind: str = "artifact") -> tuple[SessionSetup, ...]:
    """Every setup a device of ``target`` may run a version in, in a fixed order (a
    device checks them in this order, so identical devices give identical reasons).

    Args:
        target: the version's target the device runs (None: ONNX Runtime on CPU).
        kind: ``artifact`` (the ONNX file, optimized at load) or ``engine`` (a graph
            optimized offline by CI, loaded as it is).
    """
    engine = getattr(target, "engine", "onnxruntime")
    if engine == "tensorrt":
        return (SessionSetup(PREPACKED, "all", ("TensorrtExecutionProvider",)),)
    providers = tuple(getattr(target, "providers", None) or CPU)
    level = "disable" if kind == "engine" else str(getattr(target, "optimization", "all"))
    prepacked = SessionSetup(PREPACKED, level, providers)
    if providers != CPU:
        return (prepacked,)
    return (SessionSetup(SHARED, "disable", providers), prepacked)
