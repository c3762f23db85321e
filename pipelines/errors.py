"""Exception tree of the ``pipelines`` package (stable API).

::

    registry.RegistryError
    └── PipelineError          a CI or authoring step failed
        └── ArtifactError      the model file itself is invalid (not ONNX, bad graph)

Tool failures (git, DVC) are ``registry.ToolError``; misuse is ``ValueError``.
"""

from __future__ import annotations

from registry.errors import RegistryError


class PipelineError(RegistryError):
    """A CI or authoring step failed."""


class ArtifactError(PipelineError):
    """A model artifact is invalid.

    Attributes:
        path: the offending file, as shown to the user.
    """

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")
