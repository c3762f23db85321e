"""The fixture of the ``serving`` benchmark: the MLP example's models, goldens and request.

The constants both servers and the load generator agree on (the model, its two versions,
the swap period, the ONNX Runtime settings), :class:`Models` over one size of the example,
and :func:`check_answer`, which the load generator's process imports to judge each answer.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

MODEL: Final = "mlp"
V1, V2 = "1.0.0", "1.1.0"
SWAP_EVERY_S: Final = 0.5
EXPECTED_ENV: Final = "MODELREG_BENCH_EXPECTED"
ORT_SETTINGS: Final = {"intra_op_threads": 1, "optimization": 0, "disable_prepacking": True}
"""ONNX Runtime settings of every session here: those of our shared-weight sessions."""

# --- the check, run in the load generator's process -----------------------------------

_expected: dict[str, list[float]] = {}


def check_answer(doc: Mapping[str, Any]) -> str | None:
    """The answer equals the golden output of the version it names (the goldens of the
    fixture named by ``$MODELREG_BENCH_EXPECTED``; rtol 1e-4, atol 1e-5)."""
    if not _expected:
        _expected.update(json.loads(Path(os.environ[EXPECTED_ENV]).read_text()))
    version = doc.get("model_version")
    want = _expected.get(str(version))
    if want is None:
        return f"an answer from version {version!r}"
    try:
        got = doc["outputs"][0]["data"]
    except (KeyError, IndexError, TypeError):
        return "an answer without output data"
    if len(got) != len(want) or any(
        abs(g - w) > 1e-5 + 1e-4 * abs(w) for g, w in zip(got, want, strict=True)
    ):
        return f"{version}: not its golden output"
    return None


# --- the fixture: the models, their goldens and the request ---------------------------


@dataclass(frozen=True)
class Models:
    """One size of the MLP example: 1.0.0 and 1.1.0 with their goldens."""

    folder: Path

    def path(self, version: str) -> Path:
        return self.folder / MODEL / f"{version}.onnx"

    def golden(self, version: str, kind: str) -> dict[str, Any]:
        import numpy as np

        with np.load(self.folder / MODEL / f"{version}.{kind}.npz") as held:
            return {k: held[k] for k in held.files}

    def request(self, version: str) -> Any:
        from edge_sync.engine.base import LoadRequest

        path, digest = self.path(version), hashlib.sha256()
        with path.open("rb") as fh:  # a block at a time: no 100 MB in the measured RSS
            while block := fh.read(1 << 20):
                digest.update(block)
        return LoadRequest(MODEL, version, path, digest.hexdigest())

    def cases(self, version: str) -> list[Any]:
        from edge_sync.engine.selftest import GoldenArrays

        inputs, outputs = self.golden(version, "inputs"), self.golden(version, "outputs")
        return [GoldenArrays("golden", inputs, outputs, 1e-4, 1e-5)]

    def body(self) -> bytes:
        ((name, x),) = self.golden(V1, "inputs").items()
        tensor = {
            "name": name,
            "shape": list(x.shape),
            "datatype": "FP32",
            "data": x.reshape(-1).tolist(),
        }
        return json.dumps({"inputs": [tensor]}).encode()

    def expected(self) -> dict[str, list[float]]:
        return {
            v: next(iter(self.golden(v, "outputs").values())).reshape(-1).tolist() for v in (V1, V2)
        }


def make_models(work: Path, size: str) -> Models:
    """Write the MLP example of ``size`` with its goldens under ``work``."""
    from modelreg.examples import write_examples

    folder = work / f"models-{size}"
    write_examples(folder, size=size, models=[MODEL], goldens=True)
    return Models(folder)
