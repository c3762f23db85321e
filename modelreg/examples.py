"""Deterministic example ONNX models for demos, tests and benchmarks.

Two small models are built from scratch with :mod:`onnx.helper` and numpy, so
nothing is ever downloaded:

* ``mlp``: a classifier, ``input`` float32 ``[batch, 16]`` to ``probs`` float32
  ``[batch, 4]``.  ``1.1.0`` fine-tunes the last hidden layer and the head (about
  17% of the parameters, every other tensor byte-identical); ``2.0.0`` inserts an
  extra hidden layer with the same I/O signature.  The ``large`` size is the
  benchmark case: a ~100 MB MLP whose fine-tune changes ~17% of its weight bytes.
* ``cnn``: an image classifier, ``image`` float32 ``[batch, 1, 28, 28]`` to
  ``logits`` float32 ``[batch, 10]``.  ``1.1.0`` fine-tunes the head; ``2.0.0``
  takes 32x32 images (the graph is H/W agnostic thanks to GlobalAveragePool).

Everything is seeded, so the same arguments always serialize to the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from registry.atomic import write_atomic
from registry.errors import UsageError
from registry.goldens import npz_bytes

__all__ = [
    "EXAMPLE_SIZES",
    "EXAMPLE_VERSIONS",
    "ExampleFile",
    "build_model",
    "golden_inputs",
    "model_bytes",
    "run_onnxruntime",
    "save_external",
    "write_examples",
    "write_large_external",
]

EXAMPLE_VERSIONS: dict[str, tuple[str, ...]] = {
    "mlp": ("1.0.0", "1.1.0", "2.0.0"),
    "cnn": ("1.0.0", "1.1.0", "2.0.0"),
}
"""Versions of each example model, oldest first."""

EXAMPLE_SIZES: dict[str, tuple[str, ...]] = {
    "mlp": ("small", "medium", "large", "huge"),
    "cnn": ("small",),
}
"""Size variants each example model can be built in."""

_OPSET = 17
_IR_VERSION = 8
_PRODUCER = "modelreg-examples"
_PRODUCER_VERSION = "1"
_BATCH = "batch"

# MLP: 16 -> W x 7 hidden layers -> 4.  Six of the eight weight matrices are W x W,
# so fine-tuning the last of them plus the head touches ~1/6 (~17%) of the bytes.
_MLP_IN = 16
_MLP_OUT = 4
_MLP_DEPTH = 7
# medium: six 64 KiB matrices, the smallest whose weights a device holds as tensors
_MLP_WIDTH = {"small": 32, "medium": 128, "large": 2048, "huge": 6656}  # huge: ~1.06 GB
_SIZE_ID = {"small": 0, "large": 1, "huge": 2, "medium": 3}
_CNN_CLASSES = 10
_CNN_CHANNELS = (8, 32)
_CNN_SIDE = {"1.0.0": 28, "1.1.0": 28, "2.0.0": 32}
_FINE_TUNE_NOISE = 0.05  # relative to each tensor's init scale

FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True)
class ExampleFile:
    """One example model written by :func:`write_examples`.

    Attributes:
        model: Example model name, e.g. ``"mlp"``.
        version: Semantic version, e.g. ``"1.1.0"``.
        size: Size variant, ``"small"`` or ``"large"``.
        path: The ``.onnx`` file.
        golden_inputs: ``.inputs.npz`` keyed by ONNX input names, or None.
        golden_outputs: ``.outputs.npz`` keyed by ONNX output names, or None.
    """

    model: str
    version: str
    size: str
    path: Path
    golden_inputs: Path | None
    golden_outputs: Path | None


def _check(model: str, version: str, size: str | None = None) -> None:
    if model not in EXAMPLE_VERSIONS:
        raise UsageError(
            f"unknown example model {model!r}; choose one of {sorted(EXAMPLE_VERSIONS)}"
        )
    if version not in EXAMPLE_VERSIONS[model]:
        raise UsageError(
            f"unknown version {version!r} of example {model!r}; "
            f"choose one of {list(EXAMPLE_VERSIONS[model])}"
        )
    if size is not None and size not in EXAMPLE_SIZES[model]:
        raise UsageError(
            f"unknown size {size!r} for example {model!r}; "
            f"choose one of {list(EXAMPLE_SIZES[model])}"
        )


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(list(key))


def _weights(shape: tuple[int, ...], fan_in: int, key: tuple[int, ...]) -> FloatArray:
    scale = np.float32(np.sqrt(2.0 / fan_in))  # He init keeps ReLU activations O(1)
    out = _rng(*key).standard_normal(shape, dtype=np.float32)
    out *= scale
    return out


def _fine_tune(array: FloatArray, fan_in: int, key: tuple[int, ...]) -> FloatArray:
    noise = _rng(*key).standard_normal(array.shape, dtype=np.float32)
    noise *= np.float32(_FINE_TUNE_NOISE * np.sqrt(2.0 / fan_in))
    return array + noise


def _value_info(name: str, dims: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))


def _finish(
    name: str,
    *,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    weights: Mapping[str, FloatArray],
    version: str,
) -> onnx.ModelProto:
    initializers = [numpy_helper.from_array(arr, name=key) for key, arr in weights.items()]
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", _OPSET)],
        producer_name=_PRODUCER,
        producer_version=_PRODUCER_VERSION,
        ir_version=_IR_VERSION,
        doc_string=f"modelreg example {name} {version}",
    )
    helper.set_model_props(model, {"modelreg.example": name, "modelreg.version": version})
    return model


def _build_mlp(version: str, size: str) -> onnx.ModelProto:
    width = _MLP_WIDTH[size]
    size_id = _SIZE_ID[size]
    dims = [_MLP_IN, *[width] * _MLP_DEPTH, _MLP_OUT]
    if version == "2.0.0":  # extra bottleneck layer before a new head
        dims = [*dims[:-1], max(width // 4, 4), _MLP_OUT]
    layers = len(dims) - 1
    fine_tuned = {layers - 2, layers - 1} if version == "1.1.0" else set()
    retrained = {layers - 2, layers - 1} if version == "2.0.0" else set()

    weights: dict[str, FloatArray] = {}
    nodes: list[onnx.NodeProto] = []
    x = "input"
    for i in range(layers):
        fan_in, fan_out = dims[i], dims[i + 1]
        key = (1, size_id, i, 2 if i in retrained else 0)
        w = _weights((fan_in, fan_out), fan_in, (*key, 0))
        b = _weights((fan_out,), fan_in, (*key, 1)) * np.float32(0.1)
        if i in fine_tuned:
            w = _fine_tune(w, fan_in, (*key, 10))
            b = _fine_tune(b, fan_in, (*key, 11))
        weights[f"fc{i}.weight"], weights[f"fc{i}.bias"] = w, b
        last = i == layers - 1
        nodes.append(
            helper.make_node("MatMul", [x, f"fc{i}.weight"], [f"fc{i}/mm"], f"fc{i}/MatMul")
        )
        nodes.append(
            helper.make_node("Add", [f"fc{i}/mm", f"fc{i}.bias"], [f"fc{i}/add"], f"fc{i}/Add")
        )
        if last:
            nodes.append(helper.make_node("Softmax", [f"fc{i}/add"], ["probs"], "Softmax", axis=1))
        else:
            nodes.append(helper.make_node("Relu", [f"fc{i}/add"], [f"fc{i}/relu"], f"fc{i}/Relu"))
            x = f"fc{i}/relu"
    return _finish(
        "mlp",
        nodes=nodes,
        inputs=[_value_info("input", [_BATCH, _MLP_IN])],
        outputs=[_value_info("probs", [_BATCH, _MLP_OUT])],
        weights=weights,
        version=version,
    )


def _build_cnn(version: str) -> onnx.ModelProto:
    side = _CNN_SIDE[version]
    c1, c2 = _CNN_CHANNELS
    gen = 2 if version == "2.0.0" else 0  # 2.0.0 was retrained for 32x32 input
    weights: dict[str, FloatArray] = {
        "conv1.weight": _weights((c1, 1, 3, 3), 9, (2, gen, 0, 0)),
        "conv1.bias": _weights((c1,), 9, (2, gen, 0, 1)) * np.float32(0.1),
        "conv2.weight": _weights((c2, c1, 3, 3), 9 * c1, (2, gen, 1, 0)),
        "conv2.bias": _weights((c2,), 9 * c1, (2, gen, 1, 1)) * np.float32(0.1),
        "fc.weight": _weights((_CNN_CLASSES, c2), c2, (2, gen, 2, 0)),
        "fc.bias": _weights((_CNN_CLASSES,), c2, (2, gen, 2, 1)) * np.float32(0.1),
    }
    if version == "1.1.0":  # head fine-tune; the convolutions stay frozen
        weights["conv2.bias"] = _fine_tune(weights["conv2.bias"], 9 * c1, (2, gen, 1, 11))
        weights["fc.weight"] = _fine_tune(weights["fc.weight"], c2, (2, gen, 2, 10))
        weights["fc.bias"] = _fine_tune(weights["fc.bias"], c2, (2, gen, 2, 11))
    pads = [1, 1, 1, 1]
    nodes = [
        helper.make_node(
            "Conv", ["image", "conv1.weight", "conv1.bias"], ["c1"], "conv1", pads=pads
        ),
        helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], "pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "conv2.weight", "conv2.bias"], ["c2"], "conv2", pads=pads),
        helper.make_node("Relu", ["c2"], ["r2"], "relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"], "gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], "flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], "fc", transB=1),
    ]
    return _finish(
        "cnn",
        nodes=nodes,
        inputs=[_value_info("image", [_BATCH, 1, side, side])],
        outputs=[_value_info("logits", [_BATCH, _CNN_CLASSES])],
        weights=weights,
        version=version,
    )


def build_model(model: str, version: str, size: str = "small") -> onnx.ModelProto:
    """Build one example model in memory.

    Args:
        model: ``"mlp"`` or ``"cnn"``.
        version: One of ``EXAMPLE_VERSIONS[model]``.
        size: ``"small"`` (a few KB), ``"medium"`` (~400 KB), ``"large"`` (~100 MB,
            ``mlp`` only for the last three) or ``"huge"``
            (~1 GiB, ``mlp`` only: the delta codec's memory benchmark).

    Returns:
        The ONNX model (opset 17, IR version 8, inline initializers).

    Raises:
        ValueError: If the model, version or size is unknown.
    """
    _check(model, version, size)
    if model == "mlp":
        return _build_mlp(version, size)
    return _build_cnn(version)


def model_bytes(model: str, version: str, size: str = "small") -> bytes:
    """Serialize an example model; the same arguments always give the same bytes.

    Args:
        model: ``"mlp"`` or ``"cnn"``.
        version: One of ``EXAMPLE_VERSIONS[model]``.
        size: ``"small"``, ``"medium"``, ``"large"`` or ``"huge"`` (``mlp`` only for
            all but the first).

    Returns:
        The serialized ``ModelProto``.

    Raises:
        ValueError: If the model, version or size is unknown.
    """
    # google.protobuf ships no type information, so Message methods are untyped (Any).
    return cast("bytes", build_model(model, version, size).SerializeToString(deterministic=True))


def golden_inputs(model: str, version: str, cases: int = 2, seed: int = 0) -> dict[str, FloatArray]:
    """Random inputs matching a version's input signature.

    Args:
        model: ``"mlp"`` or ``"cnn"``.
        version: One of ``EXAMPLE_VERSIONS[model]``.
        cases: Batch size of the generated inputs.
        seed: Seed of the generator.

    Returns:
        Arrays keyed by ONNX input name.

    Raises:
        ValueError: If the model or version is unknown or ``cases`` is below 1.
    """
    _check(model, version)
    if cases < 1:
        raise UsageError(f"cases must be at least 1, got {cases}")
    rng = np.random.default_rng(seed)
    if model == "mlp":
        return {"input": rng.standard_normal((cases, _MLP_IN), dtype=np.float32)}
    side = _CNN_SIDE[version]
    return {"image": rng.random((cases, 1, side, side), dtype=np.float32)}


def run_onnxruntime(
    model: bytes, inputs: Mapping[str, npt.NDArray[Any]]
) -> dict[str, npt.NDArray[Any]]:
    """Run a serialized model once on onnxruntime's CPU execution provider.

    Args:
        model: Serialized ONNX model.
        inputs: Arrays keyed by ONNX input name.

    Returns:
        Arrays keyed by ONNX output name, in the session's output order.

    Raises:
        onnxruntime.capi.onnxruntime_pybind11_state.Fail: If ORT rejects the model
            or the inputs (ORT's own exception types).
    """
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    names = [str(out.name) for out in session.get_outputs()]
    # onnxruntime ships no type information: run() returns a list of ndarrays.
    results = cast("list[npt.NDArray[Any]]", session.run(names, dict(inputs)))
    return dict(zip(names, results, strict=True))


def write_examples(
    out_dir: Path,
    size: str = "small",
    models: Sequence[str] | None = None,
    goldens: bool = True,
) -> list[ExampleFile]:
    """Write every version of the example models, with optional golden I/O.

    Files are ``<out_dir>/<model>/<version>.onnx`` plus, with ``goldens``,
    ``<version>.inputs.npz`` and ``<version>.outputs.npz`` keyed by ONNX tensor
    names.  Each file is written to a temporary file and renamed into place.

    Args:
        out_dir: Output directory, created if missing.
        size: ``"small"``, ``"medium"``, ``"large"`` or ``"huge"`` (``mlp`` only for
            all but the first).
        models: Models to write; by default every model available in ``size``.
        goldens: Whether to write golden inputs and onnxruntime outputs.

    Returns:
        One entry per written model version, in model then version order.

    Raises:
        ValueError: If a model is unknown or not available in ``size``.
    """
    if models is None:
        models = [name for name, sizes in EXAMPLE_SIZES.items() if size in sizes]
        if not models:
            known = sorted({s for sizes in EXAMPLE_SIZES.values() for s in sizes})
            raise UsageError(f"unknown size {size!r}; choose one of {known}")
    for name in models:
        _check(name, EXAMPLE_VERSIONS[name][0] if name in EXAMPLE_VERSIONS else "", size)
    written: list[ExampleFile] = []
    for name in models:
        for version in EXAMPLE_VERSIONS[name]:
            data = model_bytes(name, version, size)
            path = Path(out_dir) / name / f"{version}.onnx"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, data)
            inputs_path = outputs_path = None
            if goldens:
                inputs = golden_inputs(name, version)
                outputs = run_onnxruntime(data, inputs)
                inputs_path = path.with_name(f"{version}.inputs.npz")
                outputs_path = path.with_name(f"{version}.outputs.npz")
                write_atomic(inputs_path, npz_bytes(inputs))
                write_atomic(outputs_path, npz_bytes(outputs))
            written.append(ExampleFile(name, version, size, path, inputs_path, outputs_path))
    return written


EXTERNAL_THRESHOLD = 1024
"""Initializers of at least this many bytes go to the external data file."""
_EXTERNAL_ALIGN = 64  # tensor offsets in the data file: aligned for mmap'd numpy views


def save_external(model: onnx.ModelProto, path: Path, data_name: str | None = None) -> Path:
    """Write ``model`` as ``path`` plus one external data file beside it (ONNX external
    data, how every model over 2 GB is stored), deterministically.

    Every top-level initializer of at least :data:`EXTERNAL_THRESHOLD` bytes is moved to
    ``data_name`` (default ``<path name>.data``) at a 64-byte aligned offset; ``model``
    itself is not changed.

    Args:
        model: the model (inline initializers).
        path: the ``.onnx`` file to write.
        data_name: the data file's name, in the same folder.

    Returns:
        The data file's path.
    """
    from registry.atomic import AtomicFile

    data_path = path.with_name(data_name or f"{path.name}.data")
    graph_model = onnx.ModelProto()
    graph_model.CopyFrom(model)
    with AtomicFile(data_path) as out:
        offset = 0
        for tensor in graph_model.graph.initializer:
            raw = (
                numpy_helper.to_array(tensor).tobytes() if not tensor.raw_data else tensor.raw_data
            )
            if len(raw) < EXTERNAL_THRESHOLD:
                continue
            pad = -offset % _EXTERNAL_ALIGN
            out.file.write(bytes(pad))
            offset += pad
            out.file.write(raw)
            for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data"):
                tensor.ClearField(field)
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data_path.name), ("offset", str(offset)),
                               ("length", str(len(raw)))):  # fmt: skip
                tensor.external_data.add(key=key, value=value)
            offset += len(raw)
    write_atomic(path, graph_model.SerializeToString(deterministic=True))
    return data_path


LARGE_WIDTH = 8192
"""Hidden width of :func:`write_large_external`'s MLP: one layer is 256 MiB of float32."""
_LARGE_SIZE_ID = 3
_PAGE = 4096  # large tensors page-aligned, so readers can map them


def write_large_external(
    folder: Path, version: str, gib: float, *, width: int = LARGE_WIDTH
) -> tuple[Path, Path]:
    """Write a ``mlp`` version of at least ``gib`` GiB as ``folder/model.onnx`` plus
    ``folder/model.onnx.data`` (ONNX external data), streaming: one layer in memory
    at a time, never the whole model (the benchmark's model over 2 GB).

    Its layers are ``16 -> width -> ... -> width -> 4``; ``1.1.0`` fine-tunes the last
    hidden layer and the head (as the small ``mlp`` does), every other tensor is
    byte-identical to ``1.0.0``'s.  Deterministic, like every example.

    Args:
        folder: created if missing.
        version: ``"1.0.0"`` or ``"1.1.0"``.
        gib: least size of the weights, in GiB.
        width: hidden width (the default makes 256 MiB layers; tests use less).

    Returns:
        The ``.onnx`` file and the data file.

    Raises:
        ValueError: an unknown version or a size below one layer.
    """
    from registry.atomic import AtomicFile

    if version not in ("1.0.0", "1.1.0"):
        raise UsageError(f"large example versions are 1.0.0 and 1.1.0, not {version!r}")
    layer = width * width * 4
    square = int(np.ceil(gib * (1 << 30) / layer))  # width x width matrices
    if square < 1 or width < 1:
        raise UsageError(f"{gib} GiB at width {width} holds no layer")
    dims = [_MLP_IN, *[width] * (square + 1), _MLP_OUT]
    layers = len(dims) - 1
    fine_tuned = {layers - 2, layers - 1} if version == "1.1.0" else set()
    folder.mkdir(parents=True, exist_ok=True)
    path, data_path = folder / "model.onnx", folder / "model.onnx.data"
    initializers: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    x = "input"
    with AtomicFile(data_path) as out:
        offset = 0
        for i in range(layers):
            fan_in, fan_out = dims[i], dims[i + 1]
            key = (1, _LARGE_SIZE_ID, i, 0)
            w = _weights((fan_in, fan_out), fan_in, (*key, 0))
            b = _weights((fan_out,), fan_in, (*key, 1)) * np.float32(0.1)
            if i in fine_tuned:
                w = _fine_tune(w, fan_in, (*key, 10))
                b = _fine_tune(b, fan_in, (*key, 11))
            for name, array in ((f"fc{i}.weight", w), (f"fc{i}.bias", b)):
                pad = -offset % _PAGE
                out.file.write(bytes(pad))
                offset += pad
                out.file.write(np.ascontiguousarray(array).data)
                tensor = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT)
                tensor.dims.extend(array.shape)
                tensor.data_location = TensorProto.EXTERNAL
                for k, v in (("location", data_path.name), ("offset", str(offset)),
                             ("length", str(array.nbytes))):  # fmt: skip
                    tensor.external_data.add(key=k, value=v)
                initializers.append(tensor)
                offset += array.nbytes
            del w, b
            nodes.append(helper.make_node("MatMul", [x, f"fc{i}.weight"], [f"fc{i}/mm"]))
            nodes.append(helper.make_node("Add", [f"fc{i}/mm", f"fc{i}.bias"], [f"fc{i}/add"]))
            if i == layers - 1:
                nodes.append(helper.make_node("Softmax", [f"fc{i}/add"], ["probs"], axis=1))
            else:
                nodes.append(helper.make_node("Relu", [f"fc{i}/add"], [f"fc{i}/relu"]))
                x = f"fc{i}/relu"
    graph = helper.make_graph(
        nodes, "mlp", [_value_info("input", [_BATCH, _MLP_IN])],
        [_value_info("probs", [_BATCH, _MLP_OUT])], initializer=initializers,
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name=_PRODUCER,
        producer_version=_PRODUCER_VERSION, ir_version=_IR_VERSION,
        doc_string=f"modelreg example mlp {version} (large, external data)",
    )  # fmt: skip
    write_atomic(path, model.SerializeToString(deterministic=True))
    return path, data_path
