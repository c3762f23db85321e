"""The version-state table and the published JSON Schema."""

from __future__ import annotations

import json

from registry.jsonschema import SCHEMA_DIR, SCHEMA_FILES, json_schema, schema_text
from registry.status import VersionStatus, render_table
from tests.conftest import REPO_ROOT, assert_golden


def rows() -> list[VersionStatus]:
    base = {"parent": None, "file": "f", "committed_at": None}
    return [
        VersionStatus(model="cnn", version="1.0.0", commit="0123456789abcdef", dirty=False,
                      channels=("production",), **base),  # type: ignore[arg-type]
        VersionStatus(model="cnn", version="2.0.0", commit="89abcdef01234567", dirty=True,
                      channels=("canary (10%)", "dev"), mlflow_version="4", ci_run="1234",
                      signed=True, published=False, **base),  # type: ignore[arg-type]
        VersionStatus(model="mlp-large", version="10.0.0-rc.1", commit=None, dirty=True,
                      channels=(), **base),  # type: ignore[arg-type]
    ]  # fmt: skip


def test_status_table_golden() -> None:
    assert_golden("status_table.txt", render_table(rows()))


def test_status_json_row() -> None:
    row = rows()[1].to_json()
    assert row["channels"] == ["canary (10%)", "dev"]
    assert row["signed"] is True
    assert row["published"] is False
    assert json.loads(json.dumps(row)) == row


def test_committed_schemas_are_current() -> None:
    # Editors read these files; a schema change without regenerating them is a bug.
    for kind, name in SCHEMA_FILES.items():
        assert (REPO_ROOT / SCHEMA_DIR / name).read_text() == schema_text(kind), name


def test_schema_rejects_unknown_keys_everywhere() -> None:
    schema = json_schema("ModelVersion")
    objects = [
        d for d in schema["$defs"].values() if d.get("type") == "object" and "properties" in d
    ]
    assert objects
    for definition in objects:
        assert definition.get("additionalProperties") is False, definition.get("title")
