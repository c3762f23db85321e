"""The one place the CI side opens an ONNX Runtime session (build, goldens, diff drift).

ONNX Runtime ships no type information; :class:`Session` and :class:`NodeArg` describe
the part of its API the pipelines use, so the rest of the code is typed against them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from pipelines.errors import ArtifactError
from registry.errors import one_line
from registry.sessions import SessionSetup


class NodeArg(Protocol):
    """An input or output of a session: ``onnxruntime.NodeArg``."""

    @property
    def name(self) -> str: ...

    @property
    def type(self) -> str: ...

    @property
    def shape(self) -> list[int | str | None]: ...


class Session(Protocol):
    """What the pipelines use of ``onnxruntime.InferenceSession``."""

    def get_inputs(self) -> list[NodeArg]: ...

    def get_outputs(self) -> list[NodeArg]: ...

    def run(
        self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any]
    ) -> list[Any]: ...


@functools.cache
def ort_errors() -> tuple[type[Exception], ...]:
    """The exception types ONNX Runtime raises for bad models, inputs and providers.

    Its pybind11 exceptions (``Fail``, ``InvalidGraph``, ...) derive from ``Exception``
    directly, not from ``RuntimeError``, so they are collected from the module.
    """
    import onnxruntime.capi.onnxruntime_pybind11_state as state

    found = [v for v in vars(state).values() if isinstance(v, type) and issubclass(v, Exception)]
    return (RuntimeError, ValueError, *found)


def load_session(
    model: Path | str | bytes,
    display: str,
    providers: list[str] | None = None,
    *,
    setup: SessionSetup | None = None,
    threads: int | None = None,
) -> Session:
    """An ONNX Runtime ``InferenceSession`` over ``model`` (CPU unless told otherwise):
    the one place the CI side opens a session (build, goldens, diff drift).

    ``model`` is a path (external data is resolved beside it) or the model's bytes.
    ``setup`` sets the session up as a device does (``registry.sessions``: graph
    optimization, prepacking, providers); without it, ONNX Runtime's defaults.
    ``threads`` sets the intra-op threads (timing: one is the steadiest figure).

    Raises:
        ArtifactError: ONNX Runtime cannot load the model.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: warnings would go to the CI log unasked
    if setup is not None:
        setup.configure(options)
        providers = list(setup.providers)
    if threads is not None:
        options.intra_op_num_threads = threads
    source = model if isinstance(model, bytes) else str(model)
    try:
        session: Session = ort.InferenceSession(
            source, sess_options=options, providers=providers or ["CPUExecutionProvider"]
        )
    except ort_errors() as e:
        raise ArtifactError(display, f"ONNX Runtime cannot load it: {one_line(str(e))}") from None
    return session
