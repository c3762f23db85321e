"""``modelreg sign`` / ``verify`` on a model stored with ONNX external data (issue 23):
the bundle covers the ``.onnx`` and every data file it names, as the release bundles of
``ci release`` do, so a changed weight fails ``verify``, ours and ``model_signing``'s; a
model whose data cannot be signed safely, and a bundle over the graph alone, are refused
with the reason."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_oms_interop import their_verify

pytestmark = pytest.mark.integration


@pytest.fixture
def model(tmp_path: Path, external_models: Path) -> Path:
    """A real ONNX model saved with external data: ``model.onnx`` + ``model.onnx.data``."""
    folder = tmp_path / "mlp"
    folder.mkdir()
    for name in ("model.onnx", "model.onnx.data"):
        shutil.copy(external_models / "1.0.0" / name, folder / name)
    return folder / "model.onnx"


@pytest.fixture
def keys(tmp_path: Path, cli: Any) -> Path:
    out = tmp_path / "keys"
    assert cli("keys", "generate", "--role", "targets", "--out", str(out), cwd=tmp_path).code == 0
    return out


def _flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 1
    path.write_bytes(bytes(raw))


def _sign(cli: Any, model: Path, keys: Path, bundle: Path, *extra: str) -> Any:
    return cli("sign", str(model), "--bundle", str(bundle), "--private-key",
               str(keys / "targets.key"), *extra, cwd=model.parent.parent)  # fmt: skip


def _verify(cli: Any, model: Path, keys: Path, bundle: Path, *extra: str) -> Any:
    return cli("verify", str(model), "--bundle", str(bundle), "--public-key",
               str(keys / "targets.pub"), *extra, cwd=model.parent.parent)  # fmt: skip


def test_sign_covers_every_data_file_and_verify_checks_each(
    cli: Any, model: Path, keys: Path, tmp_path: Path
) -> None:
    bundle = tmp_path / "model.sigstore.json"
    r = _sign(cli, model, keys, bundle, "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["external_data"] == ["model.onnx.data"]
    r = _verify(cli, model, keys, bundle, "--json")
    assert r.code == 0, r.err
    assert sorted(json.loads(r.out)["files"]) == ["model.onnx", "model.onnx.data"]

    # the reference verifier accepts it for a folder holding exactly those files
    folder = model.parent
    proc = their_verify(folder, bundle, keys / "targets.pub")
    assert proc.returncode == 0, proc.stderr

    data = model.with_name("model.onnx.data")
    saved = data.read_bytes()
    _flip(data, len(saved) // 2)  # one byte of one weight
    r = _verify(cli, model, keys, bundle)
    assert r.code == 1
    (line,) = r.err.strip().splitlines()
    assert "model.onnx.data" in line
    assert their_verify(folder, bundle, keys / "targets.pub").returncode != 0
    data.write_bytes(saved)
    assert _verify(cli, model, keys, bundle).code == 0
    # a data file gone is a failure too, not a graph that verifies alone
    data.unlink()
    r = _verify(cli, model, keys, bundle)
    assert r.code == 1
    (line,) = r.err.strip().splitlines()
    assert "model.onnx.data" in line


def test_sign_refuses_external_data_it_cannot_sign_safely(
    cli: Any, model: Path, keys: Path, tmp_path: Path
) -> None:
    data = model.with_name("model.onnx.data")
    elsewhere = tmp_path / "weights.bin"
    data.rename(elsewhere)
    bundle = tmp_path / "b.json"
    r = _sign(cli, model, keys, bundle)
    assert r.code == 1
    (line,) = r.err.strip().splitlines()
    assert "external data file 'model.onnx.data' is missing" in line
    data.symlink_to(elsewhere)  # a link could make the bundle sign any file
    r = _sign(cli, model, keys, bundle)
    assert r.code == 1
    (line,) = r.err.strip().splitlines()
    assert "symbolic link" in line
    assert not bundle.exists()


def test_verify_refuses_a_bundle_over_the_graph_alone(
    cli: Any, model: Path, keys: Path, tmp_path: Path
) -> None:
    """What ``modelreg sign`` wrote before: the ``.onnx`` alone; its weights unsigned."""
    from signing import oms
    from signing.keys import load_private_key

    bundle = tmp_path / "graph-only.json"
    graph_only = oms.sign_model(model, load_private_key(keys / "targets.key"))
    oms.write_bundle(graph_only, bundle)
    _flip(model.with_name("model.onnx.data"), 100)
    r = _verify(cli, model, keys, bundle)
    assert r.code == 1
    (line,) = r.err.strip().splitlines()
    assert "signs the graph only, not its external data (model.onnx.data)" in line


def test_a_self_contained_model_signs_as_before(
    cli: Any, keys: Path, tmp_path: Path, example_models: Path
) -> None:
    single = tmp_path / "inline/model.onnx"
    single.parent.mkdir()
    shutil.copy(example_models / "mlp/1.0.0.onnx", single)
    bundle = tmp_path / "inline.json"
    r = _sign(cli, single, keys, bundle, "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["external_data"] == []
    r = _verify(cli, single, keys, bundle, "--json")
    assert r.code == 0, r.err
    assert list(json.loads(r.out)["files"]) == ["."]
