"""Render new manifests as YAML text in the house style."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from registry.edit import signature_node
from registry.jsonschema import schema_comment
from registry.schema import API_VERSION, Signature


def _dump(data: CommentedMap) -> str:
    yaml = YAML(typ="rt")
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def _drop_empty(node: CommentedMap) -> CommentedMap:
    for key in [k for k, v in node.items() if v in (None, "", [], {})]:
        del node[key]
    return node


def render_model(
    path: Path,
    root: Path,
    name: str,
    *,
    owner: str = "",
    task: str = "",
    description: str = "",
    labels: Mapping[str, str] | None = None,
    signature: Signature | None = None,
    targets: Sequence[str] = (),
    order: Sequence[str] = (),
) -> str:
    """Text of a new ``RegisteredModel`` manifest to be written at ``path``."""
    spec = _drop_empty(
        CommentedMap(
            description=description,
            owner=owner,
            task=task,
            signature=signature_node(signature) if signature else None,
            channels=CommentedMap(),
            targets=list(targets),
        )
    )
    spec["channels"] = CommentedMap()
    if order:
        spec["promotion"] = CommentedMap(order=list(order))
    doc = CommentedMap(
        apiVersion=API_VERSION,
        kind="RegisteredModel",
        metadata=_drop_empty(CommentedMap(name=name, labels=dict(labels or {}))),
        spec=spec,
    )
    return schema_comment(path, root, "RegisteredModel") + _dump(doc)


def render_version(
    path: Path,
    root: Path,
    name: str,
    version: str,
    *,
    artifact: str,
    parent: str | None = None,
    description: str = "",
    signature: Signature | None = None,
    source: Mapping[str, Any] | None = None,
    metrics: Mapping[str, float] | None = None,
    goldens: Mapping[str, Any] | None = None,
    targets: Sequence[Mapping[str, Any]] = (),
) -> str:
    """Text of a new ``ModelVersion`` manifest to be written at ``path``."""
    spec = _drop_empty(
        CommentedMap(
            artifact=CommentedMap(path=artifact, format="onnx"),
            parent=parent,
            description=description,
            signature=signature_node(signature) if signature else None,
            source=_drop_empty(CommentedMap(source or {})),
            metrics=dict(metrics or {}),
            goldens=goldens,
            targets=[CommentedMap(t) for t in targets],
        )
    )
    doc = CommentedMap(
        apiVersion=API_VERSION,
        kind="ModelVersion",
        metadata=CommentedMap(name=name, version=version),
        spec=spec,
    )
    return schema_comment(path, root, "ModelVersion") + _dump(doc)
