"""JSON Schema of the manifests, for editors (yaml-language-server) and other tools."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Final

from pydantic import TypeAdapter

from registry.config import RepoConfig
from registry.errors import UsageError
from registry.schema import Manifest, ModelVersion, RegisteredModel

SCHEMA_DIR: Final = ".modelreg/schemas"
_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_FILES: Final = {
    "RegisteredModel": "model.schema.json",
    "ModelVersion": "version.schema.json",
    "RegistryConfig": "config.schema.json",
}
_MODELS: Final[dict[str, Any]] = {
    "RegisteredModel": RegisteredModel,
    "ModelVersion": ModelVersion,
    "RegistryConfig": RepoConfig,
}


def json_schema(kind: str | None = None) -> dict[str, Any]:
    """The JSON Schema of one kind, or of any manifest (``kind=None``).

    Raises:
        ValueError: unknown kind.
    """
    if kind is None:
        schema = TypeAdapter(Manifest).json_schema(by_alias=True)
        title = "modelreg manifest"
    elif kind in _MODELS:
        schema = _MODELS[kind].model_json_schema(by_alias=True)
        title = kind
    else:
        raise UsageError(f"unknown kind {kind!r}; expected one of {', '.join(_MODELS)}")
    return {
        "$schema": _DIALECT,
        "title": title,
        **{k: v for k, v in schema.items() if k != "title"},
    }


def schema_text(kind: str | None = None) -> str:
    """``json_schema`` serialized the way it is written to disk."""
    return json.dumps(json_schema(kind), indent=2, sort_keys=True) + "\n"


def schema_comment(file: Path, root: Path, kind: str) -> str:
    """The ``# yaml-language-server: $schema=...`` line for a file of ``kind``."""
    target = root / SCHEMA_DIR / SCHEMA_FILES[kind]
    rel = Path(os.path.relpath(target, file.parent)).as_posix()
    return f"# yaml-language-server: $schema={rel}\n"


def write_schemas(root: Path) -> list[Path]:
    """Write every kind's schema under ``<root>/.modelreg/schemas/``."""
    from registry.atomic import write_atomic

    folder = root / SCHEMA_DIR
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, name in SCHEMA_FILES.items():
        write_atomic(folder / name, schema_text(kind).encode())
        written.append(folder / name)
    return written
