"""Read the I/O signature of an ONNX graph."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pydantic import ValidationError

from pipelines.errors import ArtifactError
from pipelines.onnx._external import ExternalData, external_data
from registry.errors import quote
from registry.schema import MAX_RANK, Signature, TensorSpec

if TYPE_CHECKING:
    import onnx

# TensorProto.DataType values (stable in the ONNX spec) -> manifest dtype names.
_DTYPES: Final = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32",
    7: "int64", 8: "string", 9: "bool", 10: "float16", 11: "float64",
    12: "uint32", 13: "uint64", 16: "bfloat16",
}  # fmt: skip
_SYMBOL: Final = re.compile(r"[^A-Za-z0-9_]")
_NAME: Final = re.compile(r"[A-Za-z0-9_.:-]{1,62}")
"""A dimension parameter that names a dimension (``batch_size``, ``unk__12``,
``seq-len``), as opposed to an expression an exporter derived (``floor(height/2 -
1/2)``, ``2*s0``): a name is kept (as a symbol), an expression is recorded as unnamed."""


def _dim(dim: object) -> int | str | None:
    if dim.HasField("dim_value"):  # type: ignore[attr-defined]
        value = int(dim.dim_value)  # type: ignore[attr-defined]
        return value if value >= 0 else None  # -1: some exporters' "unknown"
    if dim.HasField("dim_param"):  # type: ignore[attr-defined]
        param = str(dim.dim_param)  # type: ignore[attr-defined]
        if not _NAME.fullmatch(param):
            # PyTorch writes what it derived of other dimensions: unnamed here (the
            # device checks it as any unnamed dimension: its size is the model's say)
            return None
        symbol = _SYMBOL.sub("_", param)
        return symbol if symbol[:1].isalpha() or symbol[:1] == "_" else f"d_{symbol}"
    return None


def signature_from_model(model: object, display: str) -> Signature:
    """The signature of a loaded ``onnx.ModelProto``.

    Raises:
        ArtifactError: a tensor is not a dense tensor or has an unsupported dtype.
    """
    graph = model.graph  # type: ignore[attr-defined]
    initializers = {init.name for init in graph.initializer}
    sides: dict[str, list[TensorSpec]] = {"inputs": [], "outputs": []}
    for side, values in (("inputs", graph.input), ("outputs", graph.output)):
        kind = side[:-1]
        for value in values:
            if value.name in initializers:
                continue  # IR < 4 lists initializers among the inputs
            if not value.type.HasField("tensor_type"):
                raise ArtifactError(
                    display, f"{side[:-1]} {quote(value.name)} is not a dense tensor"
                )
            tensor = value.type.tensor_type
            dtype = _DTYPES.get(tensor.elem_type)
            if dtype is None:
                raise ArtifactError(
                    display,
                    f"{kind} {quote(value.name)} has unsupported element type {tensor.elem_type}",
                )
            shape = [_dim(d) for d in tensor.shape.dim] if tensor.HasField("shape") else []
            try:
                spec = TensorSpec(name=value.name, dtype=dtype, shape=shape)  # type: ignore[arg-type]
            except ValidationError as e:
                # A name or symbolic dimension the manifests could not declare.
                error = e.errors()[0]
                reason = (
                    f"{len(shape)} dimensions, at most {MAX_RANK}"
                    if error["loc"] == ("shape",)
                    else error["msg"]
                )
                raise ArtifactError(
                    display, f"{kind} {quote(value.name)} cannot be declared: {reason}"
                ) from None
            sides[side].append(spec)
    try:
        return Signature(inputs=sides["inputs"], outputs=sides["outputs"])
    except ValidationError as e:
        raise ArtifactError(
            display, f"its signature cannot be declared: {e.errors()[0]['msg']}"
        ) from None


def load_onnx(source: Path | bytes, display: str) -> onnx.ModelProto:
    """Parse an ONNX model from a file or bytes, refusing what is not one, and external
    data references that are not safe to follow (:mod:`pipelines.onnx._external`).

    A file's external data must be plain files beside it; bytes have no folder, so a
    model given as bytes must be self-contained.  The external data itself is not read.

    Args:
        source: the model file, or its bytes.
        display: its name in messages.

    Returns:
        The ``onnx.ModelProto`` (external tensors left as references).

    Raises:
        ArtifactError: unreadable, not protobuf, no graph, or refused external data.
    """
    model = _parse(source, display)
    folder = source.parent if isinstance(source, Path) else None
    name = source.name if isinstance(source, Path) else None
    external_data(model, display, folder, model_name=name)
    return model


def load_onnx_external(path: Path, display: str) -> tuple[onnx.ModelProto, ExternalData]:
    """:func:`load_onnx` of a file, with its checked external data.

    Raises:
        ArtifactError: as :func:`load_onnx`.
    """
    model = _parse(path, display)
    return model, external_data(model, display, path.parent, model_name=path.name)


def _parse(source: Path | bytes, display: str) -> onnx.ModelProto:
    import onnx
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

    try:
        if isinstance(source, Path):
            model = onnx.load(str(source), load_external_data=False)
        else:
            model = onnx.load_from_string(source)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise ArtifactError(display, f"not an ONNX model ({e})") from None
    except OSError as e:
        raise ArtifactError(display, f"cannot read: {e.strerror or e}") from None
    if not model.graph.node and not model.graph.output:
        raise ArtifactError(display, "not an ONNX model (no graph)")
    return model


def read_signature(path: Path, display: str | None = None) -> Signature:
    """Load ``path`` as ONNX (checking its external data) and return its signature.

    Raises:
        ArtifactError: not a readable ONNX model.
    """
    shown = display or str(path)
    return signature_from_model(load_onnx(path, shown), shown)
