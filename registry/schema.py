"""Manifest schema, ``apiVersion: modelreg/v1`` (stable API).

Two kinds live in a modelreg repository:

* ``RegisteredModel`` at ``manifests/<name>/model.yaml``: what the model is, its I/O
  contract, which version each channel serves, which targets it may be built for and
  the promotion policy.
* ``ModelVersion`` at ``manifests/<name>/versions/<semver>.yaml``: one immutable
  release: its DVC-tracked ONNX artifact, lineage, metrics, golden tests and targets.

Every model is frozen and rejects unknown keys, and scalars are validated strictly
(no ``"10"`` for 10).  All paths are POSIX paths relative to the repository root.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

import semver
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)

from registry.errors import quote
from registry.root import tool_folder_of
from registry.units import parse_duration

__all__ = [
    "API_VERSION",
    "DNS_LABEL_RE",
    "INLINE_LIMITS",
    "KINDS",
    "LABEL_KEY_RE",
    "MAX_DIM",
    "MAX_RANK",
    "SYMBOL_RE",
    "Artifact",
    "Channel",
    "DType",
    "Deprecation",
    "Dim",
    "Duration",
    "GoldenCase",
    "Goldens",
    "InlineTensorLimits",
    "LabelKey",
    "LabelValue",
    "Labels",
    "Manifest",
    "ModelMetadata",
    "ModelVersion",
    "ModelVersionSpec",
    "Name",
    "OnnxRuntimeTarget",
    "Percent",
    "Promotion",
    "Reason",
    "RegisteredModel",
    "RegisteredModelSpec",
    "RepoPath",
    "Rollout",
    "RolloutStop",
    "SemVer",
    "Shadow",
    "ShortText",
    "Signature",
    "Source",
    "Strict",
    "Symbol",
    "Target",
    "Tensor",
    "TensorRTTarget",
    "TensorSet",
    "TensorSpec",
    "Tolerance",
    "VersionMetadata",
    "Wave",
    "file_name_problem",
    "inline_shape_problem",
    "is_semver",
    "repo_path",
]

API_VERSION: Final = "modelreg/v1"

DNS_LABEL_RE: Final = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
SYMBOL_RE: Final = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
LABEL_KEY_RE: Final = (
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_SAFE_PATH_RE: Final = re.compile(r"^[A-Za-z0-9._@+-][A-Za-z0-9._@+/-]*$")


@functools.lru_cache(maxsize=1 << 16)
def is_semver(value: str) -> bool:
    """Whether ``value`` is a SemVer version (``1.0.0``, ``2.1.0-rc.1``)."""
    # Memoized: a large repository validates the same version strings many times
    # (metadata.version, parents, channels).
    try:
        semver.Version.parse(value)
    except ValueError:
        return False
    return True


def _semver(value: str) -> str:
    if not is_semver(value):
        raise ValueError(
            f"{quote(value)} is not a SemVer version (expected MAJOR.MINOR.PATCH, e.g. 1.0.0)"
        )
    return value


def repo_path(value: str) -> str:
    """``value`` if it is a clean repository-relative POSIX path.

    Raises:
        ValueError: absolute, empty parts, ``..``, or unusual characters.
    """
    parts = value.split("/")
    if (
        not _SAFE_PATH_RE.match(value)
        or value.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise ValueError(
            f"{quote(value)} is not a clean repository-relative path "
            "(use forward slashes, no '..', no leading '/')"
        )
    if (folder := tool_folder_of(value)) is not None:
        raise ValueError(f"{quote(value)} is inside {folder}, which git, DVC and modelreg write to")
    return value


_FILE_NAME_RE: Final = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,254}")


def file_name_problem(value: str, model_name: str | None = None) -> str | None:
    """Why ``value`` is not a plain file name beside a model (an ONNX external data
    ``location``), or None (pure).  Shared by the manifests, CI and the device.

    Args:
        value: the name.
        model_name: the ``.onnx`` file's own name, which the name may not repeat.
    """
    if not value:
        return "is empty"
    if "/" in value or "\\" in value:
        return "is a path; it must be a file name in the model's folder"
    if value.startswith("."):
        return "starts with '.'; it must be a plain file name in the model's folder"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return "holds a control character"
    if not _FILE_NAME_RE.fullmatch(value):
        return "is not a plain file name (letters, digits and . _ + -, at most 255)"
    if value == model_name:
        return "names the model file itself"
    if value.endswith(".dvc"):
        return "names a DVC pointer"
    return None


Name = Annotated[str, StringConstraints(pattern=DNS_LABEL_RE)]
"""A DNS label: lowercase letters, digits and '-', at most 63 characters."""
SemVer = Annotated[str, AfterValidator(_semver)]
RepoPath = Annotated[str, StringConstraints(max_length=1024), AfterValidator(repo_path)]
Symbol = Annotated[str, StringConstraints(pattern=SYMBOL_RE)]
LabelKey = Annotated[str, StringConstraints(pattern=LABEL_KEY_RE)]
LabelValue = Annotated[str, StringConstraints(max_length=63)]
Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=64)]
ShortText = Annotated[str, StringConstraints(max_length=256)]

DType = Literal[
    "float32", "float16", "bfloat16", "float64",
    "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
    "bool", "string",
]  # fmt: skip

MAX_DIM: Final = (1 << 63) - 1
MAX_RANK: Final = 16
"""The most dimensions a declared tensor may have."""
"""The largest dimension ONNX can state (an int64)."""

Dim = Annotated[int, Field(ge=0, le=MAX_DIM)] | Symbol | None
"""A tensor dimension: a size, a symbolic name shared across tensors, or null (unknown)."""


class Strict(BaseModel):
    """Base of every manifest model: strict scalars, unknown keys rejected, frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class TensorSpec(Strict):
    """One named input or output of the model graph."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    dtype: DType
    shape: Annotated[list[Dim], Field(max_length=MAX_RANK)]


def _unique_names(tensors: list[TensorSpec], what: str) -> list[TensorSpec]:
    seen: set[str] = set()
    for tensor in tensors:
        if tensor.name in seen:
            raise ValueError(f"duplicate {what} name {quote(tensor.name)}")
        seen.add(tensor.name)
    return tensors


class Signature(Strict):
    """The I/O contract of a model graph."""

    inputs: Annotated[
        list[TensorSpec],
        Field(min_length=1, max_length=256),
        AfterValidator(lambda v: _unique_names(v, "input")),
    ]
    outputs: Annotated[
        list[TensorSpec],
        Field(min_length=1, max_length=256),
        AfterValidator(lambda v: _unique_names(v, "output")),
    ]


Reason = Annotated[
    str,
    StringConstraints(
        min_length=1, max_length=500, pattern=r"^[^\x00-\x1f\x7f]*\S[^\x00-\x1f\x7f]*$"
    ),
]
"""Why something was decided: one line of text (no control characters)."""


def _three_decimals(value: float) -> float:
    if round(value, 3) != value:
        raise ValueError(f"{value!r} has more than 3 decimals (1 device in 100,000 is the finest)")
    return value


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*(ms|s|m|h)?\s*$"},
                {"type": "number", "minimum": 0},
            ],
            "description": "a duration: 500ms, 30s, 5m, 1h, or a number of seconds",
        }
    ),
]
"""A duration written ``500ms``, ``30s``, ``5m``, ``1h`` (a bare number is seconds),
held as seconds."""

Percent = Annotated[float, Field(ge=0, le=100), AfterValidator(_three_decimals)]
"""A share of devices, 0..100 with at most 3 decimals."""


class Wave(Strict):
    """One step of a staged rollout.

    Attributes:
        percent: the share of the channel's devices in this wave (above 0).
        soak: how long the wave runs, at least, from its release before ``modelreg
            fleet advance`` may start the next one.
    """

    percent: Annotated[float, Field(gt=0, le=100), AfterValidator(_three_decimals)]
    soak: Duration = 0.0


def _increasing(waves: list[Wave]) -> list[Wave]:
    for i in range(1, len(waves)):
        if waves[i].percent <= waves[i - 1].percent:
            raise ValueError(
                f"wave percents must increase: waves[{i}] is {waves[i].percent:g}% after "
                f"{waves[i - 1].percent:g}%"
            )
    if waves and waves[-1].soak:
        raise ValueError(
            f"the last wave ({waves[-1].percent:g}%) has no next wave to soak for; remove its soak"
        )
    return waves


Share = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
"""A share, 0..1."""


class RolloutStop(Strict):
    """When ``modelreg fleet advance`` stops a rollout, or waits for evidence.

    Attributes:
        failure_share: stop (and put the rollout on hold) when more than this share
            (0..1) of the wave's cohort reported that its last update to the version
            failed, was rejected or was rolled back by the health gate; None: never.
        min_reports: devices of the cohort that must report running the version
            before the next wave starts (the default 1 keeps a rollout that no device
            reports on from advancing on time alone).
        min_agreement: stop when the wave's devices, together, report that fewer of
            the version's answers than this share keep the previous version's top
            class (their shadow comparisons: the channel's ``shadow``); None: never.
        max_output_drift: stop when the answers differ from the previous version's
            by more than this relative L1 difference (0.05: 5 %); None: never.
        max_p99_ratio: stop when the version's p99 run time over the previous
            version's, on the same requests, is more than this; None: never.
        min_compared: requests the wave's devices must have compared, together,
            before those three are judged; the next wave waits for them.
    """

    failure_share: Share | None = None
    min_reports: Annotated[int, Field(ge=0, le=10_000_000)] = 1
    min_agreement: Share | None = None
    max_output_drift: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)] | None = None
    max_p99_ratio: Annotated[float, Field(ge=1, le=1000, allow_inf_nan=False)] | None = None
    min_compared: Annotated[int, Field(ge=1, le=10_000_000)] = 100

    @property
    def behaviour(self) -> bool:
        """Whether a condition reads the devices' shadow comparisons."""
        return any(
            v is not None for v in (self.min_agreement, self.max_output_drift, self.max_p99_ratio)
        )


class Shadow(Strict):
    """A shadow comparison (docs/guide/behaviour.md): while a new version's health gate
    is open, a device runs a sampled share of its live requests on the version it
    replaced too, off the request path, and keeps how their answers agree (sums only).

    Declared per channel in ``model.yaml`` (devices that follow the channel compare),
    or per model in a device's ``edge.yaml`` (which wins; ``false`` there: never).

    Attributes:
        sample: the share of answered requests also run on the previous version.
        max_cpu_share: the share of the device's CPU time (all cores) the comparison
            may take; past it, sampled requests are dropped (never delayed).
        after: keep comparing this long after the gate passed (the previous version
            stays loaded as long).
        min_agreement: the gate fails a version whose answers keep the previous
            version's top class less often than this (None: the gate does not judge
            agreement).
        max_output_drift: the gate fails a version whose answers differ from the
            previous version's by more than this relative L1 difference (None: never).
        min_compared: requests compared before the gate judges the answers (a gate
            with fewer by the end of its extended window passes, "not judged").
    """

    sample: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.05
    max_cpu_share: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.1
    after: Annotated[Duration, Field(ge=0, le=7 * 86400)] = 0.0
    min_agreement: Share | None = None
    max_output_drift: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)] | None = None
    min_compared: Annotated[int, Field(ge=1, le=1_000_000)] = 50


class Rollout(Strict):
    """Share of a channel's devices that take its version (stable per device).

    With ``waves``, the rollout is staged: ``percent`` is the wave the channel is in
    (one of the waves' percents), and ``modelreg fleet advance`` commits the next
    wave's percent when the current one has soaked and the fleet's reports allow it
    (``stop``).  ``hold`` (a reason) pauses the waves: ``fleet advance`` writes it
    when a stop condition trips, and a person may write it too; removing it resumes.
    Devices read only ``percent``.
    """

    percent: Percent
    waves: Annotated[list[Wave], Field(max_length=32), AfterValidator(_increasing)] = []
    stop: RolloutStop | None = None
    hold: Reason | None = None

    @model_validator(mode="after")
    def _in_a_wave(self) -> Rollout:
        if not self.waves:
            if self.stop is not None or self.hold is not None:
                key = "stop" if self.stop is not None else "hold"
                raise ValueError(
                    f"rollout.{key} applies to waves; add rollout.waves or remove rollout.{key}"
                )
            return self
        percents = [w.percent for w in self.waves]
        if self.percent not in percents:
            listed = ", ".join(f"{p:g}" for p in percents)
            raise ValueError(
                f"rollout.percent {self.percent:g} is not one of the waves' percents "
                f"({listed}); set it to the wave the channel is in"
            )
        return self

    def wave_index(self) -> int | None:
        """The position of ``percent`` in ``waves`` (None without waves)."""
        percents = [w.percent for w in self.waves]
        return percents.index(self.percent) if self.percent in percents else None


def _channel_shorthand(value: Any) -> Any:
    # `production: 1.0.0` is the common case; the mapping form adds a rollout.
    return {"version": value} if isinstance(value, str) else value


class Channel(Strict):
    """The version a channel serves, with an optional partial rollout."""

    version: SemVer
    rollout: Rollout | None = None
    shadow: Shadow | None = None
    """Devices following the channel compare each new version's answers with the
    previous version's while its health gate is open (:class:`Shadow`)."""

    @model_validator(mode="after")
    def _shadow_for_behaviour(self) -> Channel:
        stop = self.rollout.stop if self.rollout is not None else None
        if stop is not None and stop.behaviour and self.shadow is None:
            raise ValueError(
                "rollout.stop judges the devices' shadow comparisons (min_agreement, "
                "max_output_drift, max_p99_ratio); declare shadow: {sample: 0.05} on the "
                "channel so that its devices compare"
            )
        return self


class Promotion(Strict):
    """Who may promote what, and where from.

    Attributes:
        order: channels in promotion order (e.g. ``[canary, production]``): a version
            reaches a channel only after it served the one before.
        branch: the only branch whose commits may change channels.
        approvals: reviews a promotion pull request needs.
        max_latency_ratio: how much slower than its parent (median run time on the
            CI runner, ``build``'s comparison) a new version may be; ``ci pr`` refuses
            one slower than that.  None: shown, never refused.
    """

    order: Annotated[list[Name], Field(max_length=32)] = []
    branch: Annotated[str, StringConstraints(min_length=1, max_length=255)] = "main"
    approvals: Annotated[int, Field(ge=0, le=100)] = 1
    max_latency_ratio: Annotated[float, Field(ge=1, le=1000, allow_inf_nan=False)] | None = None

    @model_validator(mode="after")
    def _order_unique(self) -> Promotion:
        if len(set(self.order)) != len(self.order):
            raise ValueError("promotion.order lists a channel twice")
        return self


class ModelMetadata(Strict):
    """Identity of a RegisteredModel."""

    name: Name
    labels: Labels = {}


class RegisteredModelSpec(Strict):
    """What a RegisteredModel declares."""

    description: Annotated[str, StringConstraints(max_length=10_000)] = ""
    owner: ShortText = ""
    task: ShortText = ""
    signature: Signature | None = None
    channels: Annotated[
        dict[Name, Annotated[Channel, BeforeValidator(_channel_shorthand)]],
        Field(max_length=64),
    ] = {}
    targets: Annotated[list[Name], Field(max_length=64)] = []
    promotion: Promotion = Promotion()


class RegisteredModel(Strict):
    """``manifests/<name>/model.yaml``."""

    api_version: Literal["modelreg/v1"] = Field(alias="apiVersion")
    kind: Literal["RegisteredModel"]
    metadata: ModelMetadata
    spec: RegisteredModelSpec


class VersionMetadata(Strict):
    """Identity of a ModelVersion."""

    name: Name
    version: SemVer
    labels: Labels = {}


def _artifact_shorthand(value: Any) -> Any:
    return {"path": value} if isinstance(value, str) else value


class Artifact(Strict):
    """The DVC-tracked model file (``<path>.dvc`` sits beside it) and, for a model stored
    with ONNX external data (every model over 2 GB), the data files its graph names: plain
    file names in the same folder, each DVC-tracked too.  Build checks that the list is
    exactly the set of ``location``s in the graph."""

    path: RepoPath
    format: Literal["onnx"] = "onnx"
    external_data: Annotated[list[str], Field(max_length=64)] = []

    @model_validator(mode="after")
    def _plain_names(self) -> Artifact:
        model_name = self.path.rsplit("/", 1)[-1]
        for name in self.external_data:
            problem = file_name_problem(name, model_name)
            if problem is not None:
                raise ValueError(f"external data file {quote(name)} {problem}")
        if len(set(self.external_data)) != len(self.external_data):
            raise ValueError("external data file names must be unique")
        return self

    def files(self) -> list[str]:
        """Repository-relative paths of the ``.onnx`` and its external data files."""
        folder = self.path.rsplit("/", 1)[0] + "/" if "/" in self.path else ""
        return [self.path, *(folder + name for name in self.external_data)]


class Source(Strict):
    """Where the version came from."""

    run: ShortText | None = None
    code: ShortText | None = None
    datasets: Annotated[list[ShortText], Field(max_length=256)] = []


@dataclass(frozen=True, slots=True)
class InlineTensorLimits:
    """Bounds on a golden tensor written inline in a manifest.

    Attributes:
        max_elements: most values in one tensor (``data``), and the largest size any
            dimension may have: an empty tensor (a 0 in its shape) with a dimension of
            10**23 states nothing useful, and numpy cannot even shape it.
        max_rank: most dimensions.
    """

    max_elements: int = 65_536
    max_rank: int = 16


INLINE_LIMITS: Final = InlineTensorLimits()


def inline_shape_problem(
    shape: list[int], limits: InlineTensorLimits = INLINE_LIMITS
) -> str | None:
    """Why an inline tensor of ``shape`` is refused, or None (pure).

    Args:
        shape: the declared shape (non-negative sizes).
        limits: the caps.
    """
    for i, dim in enumerate(shape):
        if dim > limits.max_elements:
            return (
                f"dimension {i} is {dim}; inline tensors hold at most {limits.max_elements} "
                "values (use an .npz file)"
            )
    count = math.prod(shape)
    if count > limits.max_elements:
        return (
            f"shape holds {count} values; inline tensors hold at most {limits.max_elements} "
            "(use an .npz file)"
        )
    return None


class Tensor(Strict):
    """An inline tensor: flat row-major ``data`` of ``shape``."""

    dtype: DType
    shape: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=INLINE_LIMITS.max_rank)]
    data: Annotated[list[float | int | bool | str], Field(max_length=INLINE_LIMITS.max_elements)]

    @model_validator(mode="after")
    def _size_matches(self) -> Tensor:
        refused = inline_shape_problem(self.shape)
        if refused is not None:
            raise ValueError(refused)
        expected = math.prod(self.shape)
        if expected != len(self.data):
            raise ValueError(
                f"shape {self.shape} holds {expected} values but data has {len(self.data)}"
            )
        return self


TensorSet = RepoPath | dict[Annotated[str, StringConstraints(min_length=1)], Tensor]
"""An ``.npz`` file (arrays keyed by tensor name) or inline tensors by name."""

Tolerance = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class GoldenCase(Strict):
    """Inputs and the outputs the model must reproduce within tolerance."""

    name: Annotated[str, StringConstraints(pattern=SYMBOL_RE.replace("_]", "_.-]"))]
    inputs: TensorSet
    outputs: TensorSet
    rtol: Tolerance | None = None
    atol: Tolerance | None = None


class Goldens(Strict):
    """Golden tests: every case must pass within rtol/atol (numpy ``allclose``)."""

    rtol: Tolerance = 1e-4
    atol: Tolerance = 1e-5
    cases: Annotated[list[GoldenCase], Field(min_length=1, max_length=256)]

    @model_validator(mode="after")
    def _unique_cases(self) -> Goldens:
        names = [c.name for c in self.cases]
        if len(set(names)) != len(names):
            raise ValueError("golden case names must be unique")
        return self


class _TargetBase(Strict):
    name: Name
    selector: Labels = {}


class OnnxRuntimeTarget(_TargetBase):
    """Run the ONNX model with ONNX Runtime and these execution providers."""

    engine: Literal["onnxruntime"]
    providers: Annotated[list[Symbol], Field(min_length=1, max_length=8)] = ["CPUExecutionProvider"]
    optimization: Literal["disable", "basic", "extended", "all"] = "all"


class TensorRTTarget(_TargetBase):
    """Build a TensorRT engine on (or for) the device."""

    engine: Literal["tensorrt"]
    precision: Literal["fp32", "fp16", "int8"] = "fp16"
    workspace: Annotated[int, Field(ge=16, le=1 << 20)] = 1024
    """Builder workspace in MiB."""


Target = Annotated[OnnxRuntimeTarget | TensorRTTarget, Field(discriminator="engine")]


class Deprecation(Strict):
    """A version that must not be served again (``modelreg version deprecate``).

    No channel may point at it, ``promote`` and ``ci pr`` refuse it, the signed
    channels document lists it so that devices refuse to install it, and its MLflow
    version carries the reason as the ``modelreg.deprecated`` tag.
    """

    reason: Reason


class ModelVersionSpec(Strict):
    """What a ModelVersion declares.

    ``signature_change`` says why this version's inputs or outputs differ from the
    model's ``spec.signature`` (the contract the model's clients were written for):
    such a version serves its own signature, and a reviewer sees the reason.  Without
    it a version must fit the model's signature.
    """

    artifact: Annotated[Artifact, BeforeValidator(_artifact_shorthand)]
    parent: SemVer | None = None
    description: Annotated[str, StringConstraints(max_length=10_000)] = ""
    signature: Signature | None = None
    source: Source | None = None
    metrics: Annotated[
        dict[
            Annotated[str, StringConstraints(min_length=1, max_length=128)],
            Annotated[float, Field(allow_inf_nan=False)],
        ],
        Field(max_length=256),
    ] = {}
    goldens: Goldens | None = None
    targets: Annotated[list[Target], Field(max_length=64)] = []
    signature_change: Reason | None = None
    deprecated: Deprecation | None = None

    @model_validator(mode="after")
    def _unique_targets(self) -> ModelVersionSpec:
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names):
            raise ValueError("target names must be unique")
        return self


class ModelVersion(Strict):
    """``manifests/<name>/versions/<semver>.yaml``."""

    api_version: Literal["modelreg/v1"] = Field(alias="apiVersion")
    kind: Literal["ModelVersion"]
    metadata: VersionMetadata
    spec: ModelVersionSpec


Manifest = Annotated[RegisteredModel | ModelVersion, Field(discriminator="kind")]

KINDS: Final[dict[str, type[RegisteredModel] | type[ModelVersion]]] = {
    "RegisteredModel": RegisteredModel,
    "ModelVersion": ModelVersion,
}
