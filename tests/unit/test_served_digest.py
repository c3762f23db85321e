"""Which digest an answer names (issue 28, point 4): always the signed artifact's."""

from __future__ import annotations

from pathlib import Path

from edge_sync.engine.base import LoadRequest
from edge_sync.state.models import Installed

ARTIFACT, ENGINE = "a" * 64, "e" * 64


def test_an_artifact_names_its_own_digest_and_an_engine_its_artifacts() -> None:
    plain = LoadRequest("mlp", "1.0.0", Path("blob"), ARTIFACT, model_sha256=ARTIFACT)
    assert plain.served_sha256 == ARTIFACT
    engine = LoadRequest("mlp", "1.0.0", Path("blob"), ENGINE, "engine", model_sha256=ARTIFACT)
    assert engine.served_sha256 == ARTIFACT  # never the prebuilt engine file's


def test_a_state_kept_before_the_digest_was_recorded() -> None:
    # an artifact's file is the signed artifact; a prebuilt engine names none rather
    # than a digest no signed release lists as the model
    assert LoadRequest("mlp", "1.0.0", Path("blob"), ARTIFACT).served_sha256 == ARTIFACT
    assert LoadRequest("mlp", "1.0.0", Path("blob"), ENGINE, "engine").served_sha256 is None
    old = Installed.model_validate({"version": "1.0.0", "sha256": ENGINE, "kind": "engine"})
    assert old.model_sha256 is None
    kept = Installed(version="1.0.0", sha256=ENGINE, kind="engine", model_sha256=ARTIFACT)
    assert Installed.model_validate_json(kept.model_dump_json()).model_sha256 == ARTIFACT
