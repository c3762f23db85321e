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
JSON (sorted keys), so the same version always yields the same bytes and publishing
again signs nothing new.
"""

from __future__ import annotations

import json
from typing import Annotated, Final

from pydantic import AfterValidator, Field, StringConstraints

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

__all__ = ["MAX_VERSION_DOC_BYTES", "GoldenCaseDoc", "VersionDoc"]

MAX_VERSION_DOC_BYTES: Final = 1 << 20
"""Largest description a device reads (a few KiB in practice)."""

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

    def to_bytes(self) -> bytes:
        """Canonical bytes: sorted keys, no whitespace variation."""
        data = self.model_dump(mode="json", by_alias=True)
        if not data["external_data"]:
            del data["external_data"]
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
