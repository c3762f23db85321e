"""The device-facing description of a released version, signed as a target (stable API).

A device reads nothing from the git checkout but TUF metadata: what it needs to know
about a version besides its bytes (the I/O signature, the device targets with their
selectors and engine settings, the golden cases and their tolerances) travels as the
signed target ``versions/<model>/<version>.json`` (kind ``version``), and each golden
case's arrays as signed ``.npz`` targets (kind ``golden``; inline goldens of a manifest
are written as ``.npz`` too, so a device reads one format).  Paths come from
``signing.target_names``.

Like :mod:`signing.tuf_facts`, fields are only ever added, with defaults, so a device
reads the description of every release signed before it.  The document is canonical
JSON (sorted keys), so the same version always yields the same bytes but for its
``provenance`` (the commit, pull request and run that released it), and a description
once signed is never staged again.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, Field, StringConstraints, model_validator

from registry.schema import (
    Labels,
    Name,
    SemVer,
    Signature,
    Strict,
    Target,
    Tolerance,
    file_name_problem,
)
from registry.tensors import MIN_TENSOR_BYTES, itemsize
from signing.provenance import Provenance
from signing.tuf_facts import Sha256Hex

__all__ = [
    "MAX_TENSORS",
    "MAX_VERSION_DOC_BYTES",
    "GoldenCaseDoc",
    "GraphDoc",
    "TensorDoc",
    "TensorManifest",
    "VersionDoc",
]

MAX_VERSION_DOC_BYTES: Final = 8 << 20
"""Largest description a device reads (a few KiB in practice; a tensor manifest adds
about 250 bytes per tensor)."""
MAX_TENSORS: Final = 1 << 15
"""Most tensors a manifest may list (a large language model has about a thousand)."""
MAX_OBJECT_BYTES: Final = 1 << 40
"""Largest tensor a manifest may name."""
MAX_SKELETON_BYTES: Final = (1 << 31) - 1
"""Largest skeleton: a protobuf message (and ONNX Runtime) takes no more."""

TargetPath = Annotated[str, StringConstraints(min_length=1, max_length=1024)]


def _plain_file(value: str) -> str:
    problem = file_name_problem(value)
    if problem is not None:
        raise ValueError(f"external data file {value!r} {problem}")
    return value


DataFile = Annotated[str, AfterValidator(_plain_file)]
"""An external data file's name: a plain name beside the ``.onnx`` (never a path)."""


class GoldenCaseDoc(Strict):
    """One golden case as a device runs it: arrays by signed target path, and the
    tolerances that apply to it (the case's own, else the version's)."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    inputs: TargetPath
    outputs: TargetPath
    rtol: Tolerance
    atol: Tolerance


class GraphDoc(Strict):
    """The skeleton: the model file with its listed tensors cut out
    (``registry.tensors``), fetched as an object by its digest."""

    sha256: Sha256Hex
    length: Annotated[int, Field(ge=1, le=MAX_SKELETON_BYTES)]


Dtype = Literal[
    "float32", "uint8", "int8", "uint16", "int16", "int32", "int64",
    "bool", "float16", "float64", "uint32", "uint64",
]  # fmt: skip


class TensorDoc(Strict):
    """One weight tensor cut out of the model: its name (a ``Constant`` node's output
    for a tensor of a node), numpy dtype, shape, byte length and the SHA-256 of its
    bytes; for a tensor of a model stored with external data, the data ``file`` its
    bytes lie in and their ``offset`` there (both absent otherwise, and then left out
    of the document)."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    dtype: Dtype
    shape: list[Annotated[int, Field(ge=0, le=1 << 62)]] = Field(max_length=64)
    length: Annotated[int, Field(ge=1, le=MAX_OBJECT_BYTES)]
    sha256: Sha256Hex
    file: DataFile | None = None
    offset: Annotated[int, Field(ge=0, le=MAX_OBJECT_BYTES)] | None = None

    @model_validator(mode="after")
    def _fits(self) -> TensorDoc:
        if math.prod(self.shape) * itemsize(self.dtype) != self.length:
            raise ValueError(
                f"tensor {self.name!r}: {self.length} bytes do not fit {self.shape} {self.dtype}"
            )
        if (self.file is None) != (self.offset is None):
            raise ValueError(f"tensor {self.name!r}: a data file needs an offset, and back")
        if self.file is None and self.length < MIN_TENSOR_BYTES:
            raise ValueError(
                f"tensor {self.name!r}: {self.length} bytes, under the {MIN_TENSOR_BYTES} cut out"
            )
        return self


class TensorManifest(Strict):
    """The version's weights by digest, in the order the skeleton names them: what a
    device needs to hold the version as tensors (``docs/reference/tensors.md``)."""

    graph: GraphDoc
    tensors: list[TensorDoc] = Field(max_length=MAX_TENSORS)

    @model_validator(mode="after")
    def _unique(self) -> TensorManifest:
        seen: set[str] = set()
        for tensor in self.tensors:
            if tensor.name in seen:
                raise ValueError(f"tensor {tensor.name!r} is listed twice")
            seen.add(tensor.name)
        return self

    def placed(self) -> dict[int, tuple[str, int]]:
        """Where each tensor stored as external data lies (file, offset), by index."""
        return {
            i: (t.file, t.offset)
            for i, t in enumerate(self.tensors)
            if t.file is not None and t.offset is not None
        }

    @property
    def weight_bytes(self) -> int:
        """Bytes of the listed tensors (each digest once)."""
        return sum({t.sha256: t.length for t in self.tensors}.values())


class VersionDoc(Strict):
    """``versions/<model>/<version>.json``: what a device needs to install a version.

    Attributes:
        model, version, parent: the version's identity and declared parent.
        artifact: target path of the full ONNX file.
        signature: the declared I/O signature, if the manifest declares one.
        labels: the version's labels.
        targets: the device targets (selector, engine and its settings), as declared.
        engines: prebuilt engine target path by device target name (targets whose
            engine is built on the device are absent).
        goldens: the golden cases, run as the self-test before a swap.
        external_data: for a model stored with ONNX external data, each data file's
            target path by its file name (the name its graph uses, beside the ``.onnx``);
            left out of the document when empty, so a single-file version's description
            is byte for byte what it always was.
        tensors: the tensor manifest (``registry.tensors``): the skeleton's and each
            large weight tensor's digest (and, stored as external data, its data
            file and offset); absent for releases made before it was published, and
            for models whose files do not cut and join back byte for byte.
        provenance: where the version came from: its pull request, the approvals
            counted, the policy that judged it, the CI run (``signing.provenance``);
            absent for releases made before it was recorded.
    """

    model: Name
    version: SemVer
    parent: SemVer | None = None
    artifact: TargetPath
    signature: Signature | None = None
    labels: Labels = Field(default_factory=dict)
    targets: list[Target] = Field(default_factory=list, max_length=64)
    engines: dict[Name, TargetPath] = Field(default_factory=dict, max_length=64)
    goldens: list[GoldenCaseDoc] = Field(default_factory=list, max_length=256)
    external_data: dict[DataFile, TargetPath] = Field(default_factory=dict, max_length=64)
    tensors: TensorManifest | None = None
    provenance: Provenance | None = None

    @model_validator(mode="after")
    def _tensors_in_data_files(self) -> VersionDoc:
        """A tensor stored as external data lies in one of the version's data files,
        clear of every other tensor there."""
        if self.tensors is None:
            return self
        ends: dict[str, list[tuple[int, int, str]]] = {}
        for tensor in self.tensors.tensors:
            if tensor.file is None or tensor.offset is None:
                continue
            if tensor.file not in self.external_data:
                raise ValueError(
                    f"tensor {tensor.name!r} lies in {tensor.file!r}, no data file of the version"
                )
            ends.setdefault(tensor.file, []).append(
                (tensor.offset, tensor.offset + tensor.length, tensor.name)
            )
        for file, spans in ends.items():
            spans.sort()
            for (_, end, name), (start, _, other) in itertools.pairwise(spans):
                if start < end:
                    raise ValueError(f"tensors {name!r} and {other!r} overlap in {file!r}")
        return self

    def to_bytes(self) -> bytes:
        """Canonical bytes: sorted keys, no whitespace variation."""
        data = self.model_dump(mode="json", by_alias=True)
        for key in ("external_data", "tensors", "provenance"):
            if not data[key]:
                del data[key]
        for tensor in data.get("tensors", {}).get("tensors", []):
            for key in ("file", "offset"):
                if tensor[key] is None:
                    del tensor[key]
        return (json.dumps(data, sort_keys=True, indent=1) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> VersionDoc:
        """Parse a description.

        Raises:
            ValueError: over :data:`MAX_VERSION_DOC_BYTES`, not JSON, or not a
                description.
        """
        if len(data) > MAX_VERSION_DOC_BYTES:
            raise ValueError(f"{len(data)} bytes, over the {MAX_VERSION_DOC_BYTES} allowed")
        return cls.model_validate_json(data)

    def target_for(self, labels: dict[str, str]) -> Target | None:
        """The first declared target whose selector the device ``labels`` match (every
        selector label equal); None when none does.  A version that declares no
        targets runs anywhere on ONNX Runtime's CPU provider (see the caller)."""
        for target in self.targets:
            if all(labels.get(k) == v for k, v in target.selector.items()):
                return target
        return None
