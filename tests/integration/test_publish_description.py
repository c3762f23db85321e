"""Each version's device-facing description and golden files are signed targets
(issue 9, point 0), read back by a real device client.

A device reads nothing about a version from the git checkout: ``publish`` signs
``versions/<m>/<v>.json`` and one ``.npz`` per golden case side, for new versions and
for versions released before descriptions existed, without changing any released file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_sync.sync.trust import DeviceTrust
from registry.goldens import read_npz
from signing.errors import TargetMismatchError
from signing.tuf_repo import TrustRepo
from signing.version_doc import GoldenCaseDoc, VersionDoc
from tests.conftest import git

pytestmark = pytest.mark.integration

V1_DOC = "versions/mlp/1.0.0.json"
V2_DOC = "versions/mlp/1.1.0.json"
V1_GOLDENS = ["goldens/mlp/1.0.0/default.inputs.npz", "goldens/mlp/1.0.0/default.outputs.npz"]
V2_GOLDENS = ["goldens/mlp/1.1.0/inline-1.inputs.npz", "goldens/mlp/1.1.0/inline-1.outputs.npz"]
NEW_TARGETS = sorted([V1_DOC, V2_DOC, *V1_GOLDENS, *V2_GOLDENS])


def _arrays(path: Path) -> dict[str, Any]:
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def _inline(arrays: dict[str, Any]) -> str:
    """Inline tensors (YAML flow) holding ``arrays``' values exactly."""
    tensors = {
        name: {"dtype": str(a.dtype), "shape": list(a.shape), "data": [float(x) for x in a.flat]}
        for name, a in arrays.items()
    }
    return json.dumps(tensors)


def _make_repo(root: Path, cli: Any, example_models: Path) -> Path:
    """mlp 1.0.0 (golden files, an ORT target) and 1.1.0 (inline goldens, labels)."""
    assert cli("init", str(root), cwd=root.parent).code == 0
    assert cli("model", "add", "mlp", "--channel-order", "canary,production", cwd=root).code == 0
    r = cli("version", "add", "mlp", "1.0.0", "--artifact", str(example_models / "mlp/1.0.0.onnx"),
            "--golden-inputs", str(example_models / "mlp/1.0.0.inputs.npz"),
            "--target", "cpu=onnxruntime", cwd=root)  # fmt: skip
    assert r.code == 0, r.err
    r = cli("version", "add", "mlp", "1.1.0", "--artifact", str(example_models / "mlp/1.1.0.onnx"),
            "--target", "cpu=onnxruntime", cwd=root)  # fmt: skip
    assert r.code == 0, r.err
    manifest = root / "manifests/mlp/versions/1.1.0.yaml"
    inputs = _inline(_arrays(example_models / "mlp/1.1.0.inputs.npz"))
    outputs = _inline(_arrays(example_models / "mlp/1.1.0.outputs.npz"))
    text = manifest.read_text().replace(
        "  version: 1.1.0\n", "  version: 1.1.0\n  labels:\n    stage: beta\n"
    )
    text = text.replace(
        "  targets:\n",
        "  goldens:\n    rtol: 0.001\n    cases:\n      - name: inline-1\n"
        f"        inputs: {inputs}\n        outputs: {outputs}\n        atol: 0.0001\n"
        "  targets:\n",
    )
    manifest.write_text(text)
    assert cli("validate", cwd=root).code == 0
    assert cli("promote", "mlp", "1.0.0", "-c", "canary", cwd=root).code == 0
    git(root, "add", "-A")
    git(root, "commit", "-qm", "mlp 1.0.0 and 1.1.0")
    return root


@pytest.fixture
def repo(tmp_path: Path, cli: Any, example_models: Path) -> Path:
    (tmp_path / "a").mkdir()
    return _make_repo(tmp_path / "a" / "fleet", cli, example_models)


def _device(root: Path, state: Path) -> DeviceTrust:
    if not state.exists():
        DeviceTrust.provision(state, (root / "trust/metadata/1.root.json").read_bytes())
    device = DeviceTrust(state, root, root / ".modelreg/remote/modelreg")
    device.refresh()
    return device


def _signed_targets(root: Path) -> dict[str, Any]:
    """The targets of the newest signed targets metadata (path -> TUF target info)."""
    metadata = root / "trust/metadata"
    ts = json.loads((metadata / "timestamp.json").read_text())["signed"]
    snap = json.loads(
        (metadata / f"{ts['meta']['snapshot.json']['version']}.snapshot.json").read_text()
    )
    version = snap["signed"]["meta"]["targets.json"]["version"]
    targets: dict[str, Any] = json.loads((metadata / f"{version}.targets.json").read_text())
    return dict(targets["signed"]["targets"])


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def test_publish_signs_each_versions_description_and_goldens(
    repo: Path, cli: Any, tmp_path: Path, example_models: Path
) -> None:
    r = cli("publish", "--json", cwd=repo)
    assert r.code == 0, r.err
    added = json.loads(r.out)["added"]
    assert sorted(t for t in added if t.startswith(("versions/", "goldens/"))) == NEW_TARGETS
    device = _device(repo, tmp_path / "device")
    head = git(repo, "rev-parse", "HEAD").strip()
    for path in NEW_TARGETS:
        facts = device.target_info(path).facts
        version = path.split("/")[2].removesuffix(".json")
        kind = "version" if path.startswith("versions/") else "golden"
        assert (facts.kind, facts.model, facts.version, facts.git_commit) == (
            kind, "mlp", version, head
        ), path  # fmt: skip
    got = tmp_path / "got"
    doc_file = device.fetch(V1_DOC, got, model="mlp", version="1.0.0", kind="version")
    doc = VersionDoc.from_bytes(doc_file.read_bytes())
    assert doc.to_bytes() == doc_file.read_bytes()  # canonical
    assert (doc.model, doc.version, doc.parent, doc.artifact) == (
        "mlp", "1.0.0", None, "models/mlp/1.0.0.onnx"
    )  # fmt: skip
    assert doc.signature is not None
    assert [t.name for t in doc.signature.inputs] == ["input"]
    assert [(t.name, t.engine) for t in doc.targets] == [("cpu", "onnxruntime")]
    assert doc.engines == {}  # publish alone builds nothing: engines are built on the device
    assert doc.goldens == [
        GoldenCaseDoc(name="default", inputs=V1_GOLDENS[0], outputs=V1_GOLDENS[1], rtol=1e-4,
                      atol=1e-5)
    ]  # fmt: skip
    for target, source in zip(
        V1_GOLDENS, ("mlp/1.0.0.inputs.npz", "mlp/1.0.0.outputs.npz"), strict=True
    ):
        fetched = device.fetch(target, got, model="mlp", version="1.0.0", kind="golden")
        arrays, expected = read_npz(fetched, target), _arrays(example_models / source)
        assert sorted(arrays) == sorted(expected)
        for name, array in expected.items():
            assert arrays[name].dtype == array.dtype
            np.testing.assert_array_equal(arrays[name], array)
    second = VersionDoc.from_bytes(
        device.fetch(V2_DOC, got, model="mlp", version="1.1.0", kind="version").read_bytes()
    )
    assert (second.parent, second.labels) == ("1.0.0", {"stage": "beta"})
    assert [(c.name, c.rtol, c.atol) for c in second.goldens] == [("inline-1", 1e-3, 1e-4)]
    for target, source in zip(
        V2_GOLDENS, ("mlp/1.1.0.inputs.npz", "mlp/1.1.0.outputs.npz"), strict=True
    ):
        fetched = device.fetch(target, got, model="mlp", version="1.1.0", kind="golden")
        arrays, expected = read_npz(fetched, target), _arrays(example_models / source)
        for name, array in expected.items():  # inline float32 values, exactly
            assert arrays[name].dtype == np.float32
            np.testing.assert_array_equal(arrays[name], array)
    with pytest.raises(TargetMismatchError):
        device.fetch(V1_DOC, got, kind="artifact")
    with pytest.raises(TargetMismatchError):
        device.fetch(V1_GOLDENS[0], got, version="1.1.0")
    again = cli("publish", "--json", cwd=repo)
    assert again.code == 0, again.err
    assert (json.loads(again.out)["added"], json.loads(again.out)["metadata"]) == ([], [])


def test_descriptions_and_goldens_are_the_same_bytes_in_every_run(
    repo: Path, cli: Any, tmp_path: Path, example_models: Path
) -> None:
    (tmp_path / "b").mkdir()
    other = _make_repo(tmp_path / "b" / "fleet", cli, example_models)
    for root in (repo, other):
        r = cli("publish", cwd=root)
        assert r.code == 0, r.err
    first, second = _signed_targets(repo), _signed_targets(other)
    for path in NEW_TARGETS:
        if path in (V1_DOC, V2_DOC):
            continue  # each names the run that released it: compared below
        assert first[path]["hashes"] == second[path]["hashes"], path
        assert first[path]["length"] == second[path]["length"], path
    # a description is the same bytes in every run but for where it came from (the
    # commit and time of the release): its provenance
    for path in (V1_DOC, V2_DOC):
        docs = [
            VersionDoc.from_bytes(
                TrustRepo.load(root / "trust/metadata").read_target(
                    root / ".modelreg/remote/modelreg", path
                )
            )
            for root in (repo, other)
        ]
        assert all(d.provenance is not None for d in docs), path
        bare = [d.model_copy(update={"provenance": None}).to_bytes() for d in docs]
        assert bare[0] == bare[1], path


def test_a_version_released_before_descriptions_gets_one_and_nothing_released_changes(
    repo: Path, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipelines.publish._stage

    # The release an older modelreg made: artifacts, bundles, delta, engines, channels.
    with monkeypatch.context() as older:
        older.setattr(pipelines.publish._stage, "stage_description", lambda *args, **kwargs: [])
        first = cli("ci", "release", "--json", cwd=repo)
    assert first.code == 0, first.err
    assert not any(
        t.startswith(("versions/", "goldens/")) for t in json.loads(first.out)["published"]
    )
    remote = repo / ".modelreg/remote/modelreg"
    metadata = repo / "trust/metadata"
    before_remote, before_metadata = _files(remote), _files(metadata)
    before_targets = _signed_targets(repo)
    assert "engines/mlp/1.0.0/cpu.ort.onnx" in before_targets
    release = cli("ci", "release", "--json", cwd=repo)
    assert release.code == 0, release.err
    assert sorted(json.loads(release.out)["published"]) == NEW_TARGETS
    after_remote, after_metadata = _files(remote), _files(metadata)
    # the metadata mirror's timestamp moves on with every release, as the repository's does
    mirrored_timestamp = "metadata/timestamp.json"
    assert mirrored_timestamp in before_remote
    assert {p: after_remote.get(p) for p in before_remote if p != mirrored_timestamp} == {
        p: b for p, b in before_remote.items() if p != mirrored_timestamp
    }
    assert after_remote[mirrored_timestamp] == after_metadata["timestamp.json"]
    assert {p: after_metadata.get(p) for p in before_metadata if p != "timestamp.json"} == {
        p: b for p, b in before_metadata.items() if p != "timestamp.json"
    }  # every N.*.json as it was: only new versions were written
    after_targets = _signed_targets(repo)
    assert {p: after_targets[p] for p in before_targets} == before_targets
    device = _device(repo, tmp_path / "device")
    doc = VersionDoc.from_bytes(
        device.fetch(
            V1_DOC, tmp_path / "got", model="mlp", version="1.0.0", kind="version"
        ).read_bytes()
    )
    assert doc.engines == {"cpu": "engines/mlp/1.0.0/cpu.ort.onnx"}  # released by the older run
    assert doc.goldens[0].inputs == V1_GOLDENS[0]
    # A released description is never signed again, even when the manifest changes.
    manifest = repo / "manifests/mlp/versions/1.0.0.yaml"
    manifest.write_text(manifest.read_text().replace("  goldens:\n", "  goldens:\n    rtol: 0.5\n"))
    git(repo, "commit", "-qam", "looser goldens for a released version")
    signed = _files(metadata)
    again = cli("ci", "release", "--json", cwd=repo)
    assert again.code == 0, again.err
    assert json.loads(again.out)["published"] == []
    assert _files(metadata) == signed
    device.refresh()
    assert device.target_info(V1_DOC).sha256 == after_targets[V1_DOC]["hashes"]["sha256"]


def _break_file(repo: Path) -> None:
    (repo / "manifests/mlp/goldens/1.0.0/outputs.npz").write_bytes(b"not a zip")


def _dot_name(repo: Path) -> None:
    manifest = repo / "manifests/mlp/versions/1.0.0.yaml"
    manifest.write_text(manifest.read_text().replace("name: default", "name: .."))


@pytest.mark.parametrize(
    ("attack", "problem"),
    [
        (
            _break_file,
            (
                "24:18: spec.goldens.cases[0].outputs: golden case 'default' cannot be published: "
                "manifests/mlp/goldens/1.0.0/outputs.npz: not a readable .npz file (File is not a "
                "zip file)"
            ),
        ),
        (
            _dot_name,  # the manifest schema allows it
            (
                "22:15: spec.goldens.cases[0].name: golden case '..' cannot be published: a case "
                "name may not start with '.' (it names the case's golden files)"
            ),
        ),
    ],
)
def test_a_golden_case_that_cannot_be_published_stops_the_publish_in_one_line(
    repo: Path, cli: Any, attack: Any, problem: str
) -> None:
    before = _files(repo / "trust/metadata")
    attack(repo)
    git(repo, "commit", "-qam", "a golden case that cannot be published")
    assert cli("validate", cwd=repo).code == 0
    r = cli("publish", cwd=repo)
    assert r.code == 1
    assert r.err.strip() == f"manifests/mlp/versions/1.0.0.yaml:{problem}"
    assert _files(repo / "trust/metadata") == before
