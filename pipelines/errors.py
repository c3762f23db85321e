"""Exception tree of the ``pipelines`` package (stable API).

::

    registry.RegistryError
    └── PipelineError              a CI or authoring step failed
        ├── ArtifactError          the model file itself is invalid (not ONNX, bad graph)
        ├── BuildError             one or more versions failed to build (``build``)
        ├── RegistryMirrorError    MLflow is unreachable or refused a change (``register``)
        └── GitHubError            the GitHub API could not be asked or read (``ci pr``)

Other failures the pipelines raise are ``registry`` errors: ``ManifestError`` (invalid
manifests, with every problem), ``PolicyError`` (a promotion breaks policy),
``ToolError`` (git, DVC), ``UsageError`` (misuse: a bad argument or ref), and the trust
layer's ``signing.errors`` (keys, verification).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry.errors import RegistryError, UsageError

if TYPE_CHECKING:
    from pipelines.build import BuildReport

__all__ = ["ArtifactError", "BuildError", "GitHubError", "PipelineError", "RegistryMirrorError"]


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


class BuildError(PipelineError):
    """One or more versions failed to build.

    Attributes:
        report: the full report, passing versions included.
        problems: every problem, in report order; the message has one line per problem.
    """

    def __init__(self, report: BuildReport) -> None:
        if not report.problems:
            raise UsageError("BuildError needs at least one problem")
        self.report = report
        self.problems = list(report.problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class RegistryMirrorError(PipelineError):
    """MLflow is unreachable or refused an operation of ``register``.

    Attributes:
        tracking_uri: the MLflow it talked to (credentials removed).
    """

    def __init__(self, tracking_uri: str, message: str) -> None:
        self.tracking_uri = tracking_uri
        super().__init__(f"MLflow at {tracking_uri}: {message}")


class GitHubError(PipelineError):
    """The GitHub API could not be asked, or its answer (or the run's event) could not
    be read.

    Attributes:
        subject: what could not be read: the API's URL, or the event file.
    """

    def __init__(self, message: str, *, subject: str = "GitHub API") -> None:
        self.subject = subject
        super().__init__(message)
