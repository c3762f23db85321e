"""modelreg's facts signed with each release file, and the signed channels document.

Stable API.  These schemas are the contract between CI (which signs them, see
``signing.tuf_repo``) and devices (which read them after verification, see
``edge_sync.sync.trust``): every target carries :class:`TargetFacts` as TUF custom data,
``{"modelreg": {...}}``, and channel assignments travel as the signed target
``channels.json`` (:class:`ChannelsDoc`), whose sequence numbers only grow.

Fields are only ever added, with defaults, so that a device reads the facts of every
release signed before it (``tests/data/trust_fixtures``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    model_serializer,
    model_validator,
)

from registry.schema import Name, SemVer, Shadow, Strict, file_name_problem
from signing.errors import RollbackError

CUSTOM_KEY: Final = "modelreg"
"""The key of modelreg's facts in a target's TUF custom data."""
CHANNELS_PATH: Final = "channels.json"
"""Target path of the channels document."""

TargetKind = Literal[
    "artifact",
    "external_data",
    "delta",
    "engine",
    "bundle",
    "channels",
    "version",
    "golden",
    "deprecation",
    "provenance",
]
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
GitCommit = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{7,64}$")]
ShortText = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Percent = Annotated[float, Field(ge=0, le=100)]


class TargetFacts(Strict):
    """modelreg's facts about one target file, signed with it as TUF custom data.

    Attributes:
        kind: what the file is: a full ONNX ``artifact``, one of its ``external_data``
            files (``file``, its name beside the ``.onnx``), a ``delta`` from ``base``,
            a prebuilt ``engine`` for ``target``, an OMS signature ``bundle``, the
            ``channels`` document, a version's device-facing description
            (``version``, see ``signing.version_doc``), a ``golden`` case's arrays, a
            version's ``deprecation`` (its reason, UTF-8: devices never install it), or
            its SLSA ``provenance`` (``signing.provenance``).
        model, version: the model version the file belongs to (all kinds but channels).
        git_commit, ci_run: where the release was built.
        parent: the version's declared parent.
        targets: the device targets the version may be built for.
        target: the device target an engine was built for.
        base, base_sha256: the version (and exact file) a delta applies to.
        sequence: the channels document's sequence number.
        dvc_md5: for an artifact, the md5 its DVC pointer records (lets CI prove a
            released version's file was not swapped without hashing it again).
        file: for an external data file and its delta, the file's name beside the
            ``.onnx``.
    """

    kind: TargetKind
    model: Name | None = None
    version: SemVer | None = None
    git_commit: GitCommit | None = None
    ci_run: ShortText | None = None
    parent: SemVer | None = None
    targets: list[Name] = Field(default_factory=list, max_length=64)
    target: Name | None = None
    base: SemVer | None = None
    base_sha256: Sha256Hex | None = None
    sequence: Annotated[int, Field(ge=0)] | None = None
    dvc_md5: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")] | None = None
    file: Annotated[str, StringConstraints(max_length=255)] | None = None

    @model_validator(mode="after")
    def _complete(self) -> TargetFacts:
        if self.kind == "channels":
            if self.sequence is None or self.model is not None or self.version is not None:
                raise ValueError("channels facts carry a sequence and no model/version")
        elif self.model is None or self.version is None:
            raise ValueError(f"{self.kind} facts need a model and a version")
        if self.kind == "delta" and (self.base is None or self.base_sha256 is None):
            raise ValueError("delta facts need base and base_sha256")
        if self.kind == "external_data" and self.file is None:
            raise ValueError("external_data facts need the file's name")
        if self.file is not None and file_name_problem(self.file) is not None:
            raise ValueError(f"file {self.file!r} {file_name_problem(self.file)}")
        if self.kind == "engine" and self.target is None:
            raise ValueError("engine facts need the target it was built for")
        return self

    def to_custom(self) -> dict[str, object]:
        """The TUF ``custom`` value: ``{"modelreg": {...}}`` without unset fields."""
        return {CUSTOM_KEY: self.model_dump(mode="json", exclude_defaults=True)}

    @classmethod
    def from_custom(cls, custom: object) -> TargetFacts:
        """Parse the TUF ``custom`` value of a target.

        Raises:
            ValueError: no modelreg facts, or they do not match the schema.
        """
        if not isinstance(custom, dict) or CUSTOM_KEY not in custom:
            raise ValueError("no modelreg facts in the target's custom data")
        return cls.model_validate(custom[CUSTOM_KEY])


class ChannelEntry(Strict):
    """What one channel of one model serves, and since which channels sequence."""

    version: SemVer
    percent: Percent | None = None
    sequence: Annotated[int, Field(ge=1)]
    shadow: Shadow | None = None
    """The channel's shadow comparison (``registry.schema.Shadow``), which its devices
    run unless their ``edge.yaml`` says otherwise; left out of the document when None,
    as documents were before it existed (their bytes, and what an older device reads)."""

    @model_serializer(mode="wrap")
    def _without_no_shadow(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        found: dict[str, Any] = handler(self)
        if found.get("shadow") is None:
            found.pop("shadow", None)
        return found


class ChannelsDoc(Strict):
    """The signed ``channels.json``: model -> channel -> assignment.

    ``sequence`` grows with every change; an entry's ``sequence`` is the document
    sequence at which that assignment last changed.  Devices keep both as high-water
    marks: a rollback is a new document with a higher sequence that points back.
    """

    sequence: Annotated[int, Field(ge=0)]
    models: dict[Name, dict[Name, ChannelEntry]] = Field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """Canonical bytes (sorted keys): the same document always hashes the same."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=1)
        return (text + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ChannelsDoc:
        """Parse ``channels.json``.

        Raises:
            ValueError: not JSON or not a channels document.
        """
        return cls.model_validate_json(data)


def next_channels(
    previous: ChannelsDoc | None,
    desired: Mapping[str, Mapping[str, tuple[str, float | None]]],
    shadows: Mapping[str, Mapping[str, Shadow]] | None = None,
) -> ChannelsDoc:
    """The channels document that serves ``desired`` (model -> channel -> (version, %)),
    with the ``shadows`` declared (model -> channel -> shadow comparison).

    Unchanged assignments keep their sequence; changed or new ones get the new
    document sequence.  Returns ``previous`` itself when nothing changed, so that
    publishing twice signs nothing new.

    Raises:
        ValueError: a model, channel or version name is invalid.
    """
    base = previous.sequence if previous is not None else 0
    old = previous.models if previous is not None else {}
    models: dict[str, dict[str, ChannelEntry]] = {}
    changed = set(old) != set(desired)
    for model, channels in desired.items():
        models[model] = {}
        if set(old.get(model, {})) != set(channels):
            changed = True
        for channel, (version, percent) in channels.items():
            entry = old.get(model, {}).get(channel)
            shadow = (shadows or {}).get(model, {}).get(channel)
            if entry is not None and (entry.version, entry.percent, entry.shadow) == (
                version,
                percent,
                shadow,
            ):
                models[model][channel] = entry
            else:
                changed = True
                models[model][channel] = ChannelEntry(
                    version=version, percent=percent, sequence=base + 1, shadow=shadow
                )
    if previous is not None and not changed:
        return previous
    return ChannelsDoc.model_validate({"sequence": base + 1, "models": models})


def check_channels_successor(previous: ChannelsDoc, new: ChannelsDoc) -> None:
    """Check that ``new`` may follow ``previous``: sequences only grow.

    Raises:
        RollbackError: the document or an assignment goes back in sequence, or an
            assignment changed without a new sequence.
    """
    if new == previous:
        return
    if new.sequence <= previous.sequence:
        raise RollbackError(
            f"sequence {new.sequence} does not follow {previous.sequence}", CHANNELS_PATH
        )
    for model, channels in new.models.items():
        for channel, entry in channels.items():
            where = f"{CHANNELS_PATH}: {model}/{channel}"
            if entry.sequence > new.sequence:
                raise RollbackError(f"entry sequence {entry.sequence} > {new.sequence}", where)
            old = previous.models.get(model, {}).get(channel)
            if old is None:
                continue
            if entry.sequence < old.sequence or (entry != old and entry.sequence == old.sequence):
                raise RollbackError(
                    f"sequence {entry.sequence} after {old.sequence} (changes need a new one)",
                    where,
                )
