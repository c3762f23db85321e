"""``registry.layout``: where each manifest lives, and a path read back to its model and
version (issue 24, point 2).

The paths are a contract with every repository already written: the expected values
below are literal on purpose.  Each row of the parse table names the exact answer, so a
path the loader would not read as a manifest must come back as None.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest

from registry.layout import (
    ManifestPath,
    model_dir,
    model_file,
    parse_manifest_path,
    version_file,
    version_file_name,
    versions_dir,
)

BUILT: list[tuple[Callable[[str], str], str]] = [
    (lambda m: model_dir(m, "mlp"), "/mlp"),
    (lambda m: model_file(m, "mlp"), "/mlp/model.yaml"),
    (lambda m: versions_dir(m, "mlp"), "/mlp/versions"),
    (lambda m: version_file(m, "mlp", "1.2.0"), "/mlp/versions/1.2.0.yaml"),
    (lambda m: version_file(m, "mlp", "1.2.0-rc.1+b.5"), "/mlp/versions/1.2.0-rc.1+b.5.yaml"),
]


@pytest.mark.parametrize(("build", "tail"), BUILT)
@pytest.mark.parametrize("manifests", ["manifests", "sub/m2"])
def test_each_path_is_built_under_the_configured_folder(
    build: Callable[[str], str], tail: str, manifests: str
) -> None:
    assert build(manifests) == manifests + tail


@pytest.mark.parametrize(("build", "tail"), BUILT)
def test_a_path_object_gives_a_path_object(build: Callable[[Path], Path], tail: str) -> None:
    root = Path("/repo/manifests")
    built = build(root)
    assert isinstance(built, Path)
    assert built == Path(f"/repo/manifests{tail}")


@pytest.mark.parametrize(("build", "tail"), BUILT)
def test_an_empty_folder_names_the_paths_inside_it(build: Callable[[str], str], tail: str) -> None:
    assert build("") == tail.removeprefix("/")


def test_a_version_file_is_named_by_its_version() -> None:
    assert version_file_name("2.0.0") == "2.0.0.yaml"
    assert version_file_name("<version>") == "<version>.yaml"


MODEL = ManifestPath("mlp", None)


@pytest.mark.parametrize(
    ("path", "manifests", "expected"),
    [
        ("manifests/mlp/model.yaml", "manifests", MODEL),
        ("manifests/mlp/versions/1.0.0.yaml", "manifests", ManifestPath("mlp", "1.0.0")),
        ("m2/sub/mlp/versions/2.1.0.yaml", "m2/sub", ManifestPath("mlp", "2.1.0")),
        ("m2/sub/mlp/versions/2.1.0.yaml", "m2/sub/", ManifestPath("mlp", "2.1.0")),
        ("mlp/model.yaml", "", MODEL),
        ("mlp/model.yaml", ".", MODEL),
        # named as the file is, SemVer or not: the loader reports a bad name
        ("manifests/mlp/versions/latest.yaml", "manifests", ManifestPath("mlp", "latest")),
        # not a manifest of this layout
        ("manifests/mlp/versions/1.0.0.yml", "manifests", None),
        ("manifests/mlp/versions/1.0.0.json", "manifests", None),
        ("manifests/mlp/versions/.yaml", "manifests", None),
        ("manifests/mlp/versions/..yaml", "manifests", None),
        ("manifests/mlp/versions/old/1.0.0.yaml", "manifests", None),
        ("manifests/mlp/versions", "manifests", None),
        ("manifests/mlp", "manifests", None),
        ("manifests/mlp/README.md", "manifests", None),
        ("manifests/mlp/goldens/1.0.0/inputs.npz", "manifests", None),
        ("manifests/mlp/other/1.0.0.yaml", "manifests", None),
        ("manifests/model.yaml", "manifests", None),
        ("manifests", "manifests", None),
        # outside the folder, or only looking like it
        ("models/mlp/model.yaml", "manifests", None),
        ("manifests2/mlp/model.yaml", "manifests", None),
        ("sub/manifests/mlp/model.yaml", "manifests", None),
        # parts that climb or are empty name no model
        ("manifests/../mlp/model.yaml", "manifests", None),
        ("manifests/./model.yaml", "manifests", None),
        ("manifests//mlp/model.yaml", "manifests", None),
        ("manifests/mlp/versions/../model.yaml", "manifests", None),
    ],
)
def test_a_path_reads_back_to_its_model_and_version(
    path: str, manifests: str, expected: ManifestPath | None
) -> None:
    assert parse_manifest_path(path, manifests) == expected


@pytest.mark.parametrize(
    ("model", "version"), [("mlp", None), ("mlp", "1.0.0"), ("a-b", "1.2.3-rc.1+b.7")]
)
@pytest.mark.parametrize("manifests", ["manifests", "sub/m2"])
def test_what_is_built_reads_back(model: str, version: str | None, manifests: str) -> None:
    path = (
        model_file(manifests, model) if version is None else version_file(manifests, model, version)
    )
    assert parse_manifest_path(path, manifests) == ManifestPath(model, version)


def test_absolute_paths_read_back_as_the_loader_scans_them() -> None:
    folder = Path("/repo/manifests")
    assert parse_manifest_path(version_file(folder, "mlp", "1.0.0"), folder) == ManifestPath(
        "mlp", "1.0.0"
    )
    assert parse_manifest_path(PurePosixPath("/repo/manifests/mlp/model.yaml"), folder) == MODEL
    assert parse_manifest_path(Path("/elsewhere/mlp/model.yaml"), folder) is None
