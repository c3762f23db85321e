"""What ``show`` and ``list`` report about models and versions (pure, over a loaded repo).

A reference names a model (``mlp``), one of its versions (``mlp:1.1.0``) or the version
a channel serves (``mlp@production``), as ``gto show`` and MLflow's ``models:/`` URIs
do.  An unknown name is one :class:`UnknownNameError` line with the closest known names.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Final

from registry.dvcfile import check_pointer
from registry.errors import RegistryError
from registry.repository import ModelEntry, Repository, VersionEntry

_SHOWN: Final = 8  # known names quoted when nothing is close


class UnknownNameError(RegistryError):
    """A model, version or channel that the repository does not declare."""


def suggest(word: str, known: list[str], what: str, where: str = "") -> UnknownNameError:
    """The one-line error for an unknown ``what``, with a did-you-mean when one is close."""
    close = difflib.get_close_matches(word, known, n=1)
    if not close:  # an abbreviation: `prod` for `production`
        close = [k for k in known if k.startswith(word)][:1] if word else []
    if close:
        hint = f"; did you mean {close[0]!r}?"
    else:
        listed = ", ".join(known[:_SHOWN]) + (", ..." if len(known) > _SHOWN else "")
        hint = f" (declared: {listed or 'none'})"
    return UnknownNameError(f"{what} {word!r} is not declared{where}{hint}")


@dataclass(frozen=True)
class Ref:
    """A resolved reference: the model, and the version when one was named."""

    model: ModelEntry
    version: VersionEntry | None = None
    channel: str | None = None


def model_entry(repo: Repository, name: str) -> ModelEntry:
    """The model ``name``.

    Raises:
        UnknownNameError: no such model (or its ``model.yaml`` does not load).
    """
    entry = repo.models.get(name)
    if entry is None:
        if (name, None) in repo.broken:
            raise UnknownNameError(f"model {name!r} does not load; run `modelreg validate`")
        raise suggest(name, sorted(repo.models), "model")
    return entry


def resolve(repo: Repository, ref: str) -> Ref:
    """Resolve ``NAME``, ``NAME:VERSION`` or ``NAME@CHANNEL``.

    Raises:
        UnknownNameError: the model, version or channel is not declared.
    """
    name, sep, rest = ref, "", ""
    for mark in ("@", ":"):
        if mark in ref:
            name, sep, rest = ref.partition(mark)
            break
    model = model_entry(repo, name)
    versions = repo.versions.get(name, {})
    if sep == "@":
        channels = model.manifest.spec.channels
        if rest not in channels:
            raise suggest(rest, sorted(channels), "channel", f" for model {name!r}")
        version = channels[rest].version
        if version not in versions:
            raise UnknownNameError(
                f"channel {rest!r} of model {name!r} points at version {version}, "
                "which is not declared; run `modelreg validate`"
            )
        return Ref(model, versions[version], rest)
    if sep == ":":
        if rest not in versions:
            if (name, rest) in repo.broken:
                raise UnknownNameError(
                    f"version {rest} of model {name!r} does not load; run `modelreg validate`"
                )
            known = [v.version for v in repo.sorted_versions(name)]
            raise suggest(rest, known, "version", f" for model {name!r}")
        return Ref(model, versions[rest])
    return Ref(model)


def channels_of(model: ModelEntry) -> dict[str, dict[str, Any]]:
    """Channel -> ``{"version", "percent", "hold"}`` as the model declares them
    (``hold``: why its staged rollout is held, or None)."""
    return {
        name: {
            "version": channel.version,
            "percent": channel.rollout.percent if channel.rollout else None,
            "hold": channel.rollout.hold if channel.rollout else None,
        }
        for name, channel in sorted(model.manifest.spec.channels.items())
    }


def serving(model: ModelEntry, version: str) -> list[str]:
    """The channels that point at ``version``."""
    return sorted(c for c, a in model.manifest.spec.channels.items() if a.version == version)


def model_facts(repo: Repository, model: ModelEntry) -> dict[str, Any]:
    """A model's declared facts: description, owner, task, signature, channels, versions."""
    spec = model.manifest.spec
    versions = [v.version for v in repo.sorted_versions(model.name)]
    return {
        "kind": "model",
        "model": model.name,
        "file": model.file,
        "description": spec.description,
        "owner": spec.owner,
        "task": spec.task,
        "labels": dict(model.manifest.metadata.labels),
        "signature": spec.signature.model_dump(mode="json") if spec.signature else None,
        "channels": channels_of(model),
        "targets": list(spec.targets),
        "promotion": spec.promotion.model_dump(mode="json"),
        "versions": versions,
        "latest": versions[-1] if versions else None,
    }


def version_facts(repo: Repository, model: ModelEntry, entry: VersionEntry) -> dict[str, Any]:
    """A version's declared facts and where its artifact stands in DVC."""
    spec = entry.manifest.spec
    own = spec.signature is not None
    signature = spec.signature or model.manifest.spec.signature
    pointer = repo.pointers.get(spec.artifact.path)
    if pointer is None:  # not read when the parse cache served the manifest
        pointer = check_pointer(str(repo.root), repo.show.prefix, spec.artifact.path)
    return {
        "kind": "version",
        "model": entry.name,
        "version": entry.version,
        "file": entry.file,
        "parent": spec.parent,
        "description": spec.description,
        "labels": dict(entry.manifest.metadata.labels),
        "artifact": {
            "path": spec.artifact.path,
            "format": spec.artifact.format,
            "dvc_md5": pointer.md5 if pointer else None,
        },
        "signature": signature.model_dump(mode="json") if signature else None,
        "signature_from": ("version" if own else "model") if signature else None,
        "signature_change": spec.signature_change,
        "deprecated": spec.deprecated.reason if spec.deprecated else None,
        "metrics": dict(spec.metrics),
        "source": spec.source.model_dump(mode="json") if spec.source else None,
        "goldens": len(spec.goldens.cases) if spec.goldens else 0,
        "targets": [
            {"name": t.name, "engine": t.engine, "selector": dict(t.selector)} for t in spec.targets
        ],
        "channels": serving(model, entry.version),
    }


def list_models(repo: Repository) -> list[dict[str, Any]]:
    """One entry per model: its versions (SemVer order) and channels."""
    out = []
    for name in sorted(set(repo.models) | set(repo.versions)):
        versions = [v.version for v in repo.sorted_versions(name)]
        model = repo.models.get(name)
        out.append(
            {
                "model": name,
                "versions": versions,
                "latest": versions[-1] if versions else None,
                "channels": channels_of(model) if model else {},
                "loaded": model is not None,
            }
        )
    return out
