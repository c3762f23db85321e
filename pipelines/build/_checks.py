"""Build stages "check", "signature" and "load": is the artifact a sound ONNX model?

``compare_signatures`` is pure (no I/O) and says, one line per problem, how a declared
I/O signature differs from the graph's.  The other functions wrap ONNX and ONNX Runtime
and turn their errors into ``ArtifactError``s of one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.errors import ArtifactError
from pipelines.onnx import load_onnx, signature_from_model
from registry.errors import one_line
from registry.schema import Signature, TensorSpec
from registry.yamlsrc import Loc

if TYPE_CHECKING:
    import onnx


def check_onnx(path: Path, display: str) -> onnx.ModelProto:
    """Run the ONNX checker (full check) and strict shape inference on ``path``.

    Args:
        path: the ONNX file; its external data references are checked to stay beside
            it before the checker follows them (:func:`pipelines.onnx.load_onnx`).
        display: its name in messages.

    Returns:
        The ``onnx.ModelProto`` with inferred shapes.

    Raises:
        ArtifactError: not ONNX, an external data reference that is not safe to follow,
            or the checker or shape inference rejects it.
    """
    import onnx

    model = load_onnx(path, display)
    try:
        # A path: the checker reads the file rather than a re-serialized copy.
        onnx.checker.check_model(str(path), full_check=True)
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except onnx.checker.ValidationError as e:
        raise ArtifactError(display, f"ONNX checker: {one_line(str(e))}") from None
    except onnx.shape_inference.InferenceError as e:
        raise ArtifactError(display, f"ONNX shape inference: {one_line(str(e))}") from None
    except (OSError, ValueError) as e:
        raise ArtifactError(display, f"not an ONNX model ({one_line(str(e))})") from None


def graph_signature(model: onnx.ModelProto, display: str) -> Signature:
    """The I/O signature of a checked model (see ``pipelines.onnx``).

    Raises:
        ArtifactError: a graph input or output is not a dense tensor of a known dtype.
    """
    return signature_from_model(model, display)


@dataclass(frozen=True, slots=True)
class SignatureMismatch:
    """One way a declared signature differs from the graph.

    Attributes:
        loc: where in the declaring manifest (``spec.signature...``) the problem is.
        message: what differs, naming both sides.
    """

    loc: Loc
    message: str


def _shape(shape: list[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _tensor(t: TensorSpec) -> str:
    return f"{t.dtype}{_shape(t.shape)}"


def compare_signatures(declared: Signature, graph: Signature) -> list[SignatureMismatch]:
    """How ``declared`` differs from ``graph``; empty when they match.

    Tensors are matched by name (ONNX Runtime binds by name, so order is free).  A
    symbolic (``batch``) or unknown dimension on either side matches any size: only two
    fixed sizes can conflict.

    Args:
        declared: the manifest's signature.
        graph: the signature read from the ONNX graph.

    Returns:
        One mismatch per problem, located in the manifest.
    """
    found: list[SignatureMismatch] = []
    for side in ("inputs", "outputs"):
        what = side[:-1]
        in_graph: dict[str, TensorSpec] = {t.name: t for t in getattr(graph, side)}
        names = ", ".join(repr(n) for n in in_graph) or "none"
        for i, want in enumerate(getattr(declared, side)):
            loc: Loc = ("spec", "signature", side, i)
            have = in_graph.pop(want.name, None)
            if have is None:
                found.append(
                    SignatureMismatch(
                        (*loc, "name"),
                        f"declared {what} {want.name!r} is not in the graph (graph {side}: "
                        f"{names})",
                    )
                )
                continue
            if have.dtype != want.dtype:
                found.append(
                    SignatureMismatch(
                        (*loc, "dtype"),
                        f"{what} {want.name!r} is {have.dtype} in the graph but declared "
                        f"{want.dtype}",
                    )
                )
            if len(have.shape) != len(want.shape):
                found.append(
                    SignatureMismatch(
                        (*loc, "shape"),
                        f"{what} {want.name!r} has rank {len(have.shape)} in the graph "
                        f"{_shape(have.shape)} but declared rank {len(want.shape)} "
                        f"{_shape(want.shape)}",
                    )
                )
                continue
            for j, (h, w) in enumerate(zip(have.shape, want.shape, strict=True)):
                if isinstance(h, int) and isinstance(w, int) and h != w:
                    found.append(
                        SignatureMismatch(
                            (*loc, "shape", j),
                            f"{what} {want.name!r} dimension {j} is {h} in the graph but "
                            f"declared {w} (graph shape {_shape(have.shape)})",
                        )
                    )
        found.extend(
            SignatureMismatch(
                ("spec", "signature", side),
                f"graph {what} {extra.name!r} ({_tensor(extra)}) is not declared",
            )
            for extra in in_graph.values()
        )
    return found
