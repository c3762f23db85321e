"""Helpers shared by ``tests/unit/test_oms.py`` and ``tests/integration/test_oms_interop.py``.

A plain module, not a conftest: each test file defines its own ``key_pair`` fixture
from :class:`Keys`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from modelreg.examples import model_bytes
from signing import keys, oms

FACTS = oms.ModelFacts(
    model="mlp",
    version="1.0.0",
    git_commit="0123456789abcdef0123456789abcdef01234567",
    ci_run="https://ci.example.invalid/runs/42",
    parent=None,
    targets=("cpu-x86_64", "cpu-aarch64"),
)


class Keys:
    """A key pair as PEM files, and a second public key that must be refused."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.private = keys.generate()
        self.private_pem = folder / "signer.key"
        self.public_pem = folder / "signer.pub"
        self.other_pem = folder / "other.pub"
        self.private_pem.write_bytes(keys.private_pem(self.private))
        self.public_pem.write_bytes(keys.public_pem(self.private))
        self.other_pem.write_bytes(keys.public_pem(keys.generate()))


def make_model_file(folder: Path) -> Path:
    path = folder / "1.0.0.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model_bytes("mlp", "1.0.0"))
    return path


def make_model_dir(folder: Path, example_models: Path) -> Path:
    """A model folder: two ONNX files, a nested file, and git files both tools ignore."""
    model = folder / "mlp-bundle"
    (model / "extra" / "deep").mkdir(parents=True)
    shutil.copy(example_models / "mlp" / "1.0.0.onnx", model / "model.onnx")
    shutil.copy(example_models / "cnn" / "1.0.0.onnx", model / "extra" / "cnn.onnx")
    (model / "extra" / "deep" / "labels.txt").write_text("cat\ndog\n")
    (model / "a-b.json").write_text('{"note": "sorts between a/ and b"}\n')
    (model / ".git").mkdir()
    (model / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (model / ".gitattributes").write_text("*.onnx binary\n")
    return model


def flip_byte(model: Path) -> None:
    target = model / "extra" / "cnn.onnx"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))


def add_file(model: Path) -> None:
    (model / "extra" / "backdoor.onnx").write_bytes(b"not signed")


def remove_file(model: Path) -> None:
    (model / "extra" / "deep" / "labels.txt").unlink()
