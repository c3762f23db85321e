"""ONNX on the CI side: loading models (with external data), reading their I/O signature,
and opening ONNX Runtime sessions; the one place each of these is done.
"""

from __future__ import annotations

from pipelines.onnx._external import ExternalData, ExternalDataLimits, ExternalTensor, external_data
from pipelines.onnx._session import NodeArg, Session, load_session, ort_errors
from pipelines.onnx._signature import (
    load_onnx,
    load_onnx_external,
    read_signature,
    signature_from_model,
)

__all__ = [
    "ExternalData",
    "ExternalDataLimits",
    "ExternalTensor",
    "NodeArg",
    "Session",
    "external_data",
    "load_onnx",
    "load_onnx_external",
    "load_session",
    "ort_errors",
    "read_signature",
    "signature_from_model",
]
