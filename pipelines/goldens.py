"""Golden tests: record expected outputs with ONNX Runtime, and check them."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from pipelines.build_checks import ort_errors
from pipelines.errors import ArtifactError


def record_outputs(model: Path, inputs_npz: Path) -> tuple[bytes, bytes]:
    """Run ``model`` on the arrays of ``inputs_npz`` (CPU, ONNX Runtime).

    Returns:
        (inputs, outputs) as ``.npz`` bytes, arrays keyed by tensor name.

    Raises:
        ArtifactError: the inputs don't match the model or the model does not run.
    """
    import numpy as np
    import onnxruntime as ort

    try:
        with np.load(inputs_npz, allow_pickle=False) as data:
            inputs: dict[str, Any] = {k: data[k] for k in data.files}
    except (OSError, ValueError) as e:
        raise ArtifactError(str(inputs_npz), f"not a readable .npz file ({e})") from None
    try:
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        wanted = {i.name for i in session.get_inputs()}
        if set(inputs) != wanted:
            raise ArtifactError(
                str(inputs_npz),
                f"holds arrays {sorted(inputs)} but the model takes {sorted(wanted)}",
            )
        names = [o.name for o in session.get_outputs()]
        values = session.run(names, inputs)
    except ort_errors() as e:
        raise ArtifactError(str(model), f"ONNX Runtime failed: {e}") from None
    return _npz(inputs), _npz(dict(zip(names, values, strict=True)))


def _npz(arrays: dict[str, Any]) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **arrays)
    return buf.getvalue()
