"""The ONNX Runtime engine: one session per model version, in one of the setups of
``registry.sessions``, over weights shared with the version it replaces or private
ones (``edge_sync.engine.weights``); a ``tensorrt`` target runs through ONNX Runtime's
TensorRT provider (``edge_sync.engine.tensorrt``).  It implements
``edge_sync.engine.base.Engine``; ``edge_sync.engine.host`` builds and holds them.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from edge_sync.engine import tensorrt
from edge_sync.engine.base import (
    DATATYPES,
    NUMPY_DTYPES,
    Engine,
    LoadRequest,
    TensorDecl,
    TensorLayout,
)
from edge_sync.engine.weights import Weights, external_tensors, split_model, stub_folder
from edge_sync.errors import EngineClosedError, EngineError, WeightError
from registry.schema import OnnxRuntimeTarget, TensorRTTarget
from registry.sessions import PREPACKED, SHARED, SessionSetup, session_setups
from registry.tensors import Piece, TensorCutError, relocate

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["CPU_TARGET", "OrtEngine"]

CPU_TARGET: Final = OnnxRuntimeTarget.model_validate({"name": "cpu", "engine": "onnxruntime"})
"""What a request without a target runs with: ONNX Runtime, with the manifest schema's
defaults (its CPU provider)."""


def _providers(request: LoadRequest, engine_cache: Path | None) -> list[Any]:
    """The execution providers ``request``'s target runs on, in order.

    Raises:
        EngineError: a provider (or TensorRT) this device lacks.
    """
    import onnxruntime as ort

    target = request.target or CPU_TARGET
    available = ort.get_available_providers()
    if isinstance(target, TensorRTTarget):
        reason = tensorrt.unavailable(available, target.precision)
        if reason is not None or request.kind != "artifact":
            raise EngineError(
                f"{request.model} {request.version}: target {target.name!r} needs TensorRT: "
                f"{reason or 'it builds its engine on the device, from the ONNX file'}"
            )
        cache = engine_cache or request.path.parent.parent / "trt-cache"
        return tensorrt.provider_options(target.precision, target.workspace, cache, request.sha256)
    missing = [p for p in target.providers if p not in available]
    if missing:
        raise EngineError(
            f"{request.model} {request.version}: provider(s) {', '.join(missing)} "
            f"are not available here ({', '.join(available)})"
        )
    return list(target.providers)


class OrtEngine:
    """One ONNX Runtime session, in one of the setups of ``registry.sessions``
    (chosen by :class:`InProcessHost`; :attr:`setup` says which):

    * **shared weights** (``share=True``, CPU only): the graph without its large
      tensors, which come from memory maps of the verified file, or from ``base`` (the
      version this one replaces) where their bytes are equal (``edge_sync.engine.weights``).
      Graph optimizations and prepacking are off: both would make private copies.
    * **prepacked** (private): the file as ONNX Runtime loads it, optimized at the
      target's level (a prebuilt engine as it is), with prepacking.
    """

    def __init__(
        self,
        request: LoadRequest,
        *,
        intra_op_threads: int = 1,
        share: bool = False,
        base: Engine | None = None,
        engine_cache: Path | None = None,
        log_severity: int = 3,
    ) -> None:
        """Create the session for ``request``.

        Args:
            request: what to load.
            intra_op_threads: ONNX Runtime threads for this session.
            share: build a shared-weight session (CPU only; see the class doc).
            base: the engine to share unchanged weights with.
            engine_cache: where TensorRT engines built here are cached
                (``edge_sync.engine.tensorrt``; None: a ``trt-cache`` folder beside the blob).
            log_severity: the least severe of ONNX Runtime's messages this session
                logs (0 verbose ... 4 fatal; ``edge_sync.engine.ortlog`` routes them).

        Raises:
            EngineError: not an ONNX model ONNX Runtime can load, or a provider (or
                TensorRT) this device lacks.
        """
        self.model, self.version, self.sha256 = request.model, request.version, request.sha256
        self.request = request
        self.providers = _providers(request, engine_cache)
        self.intra_op_threads = intra_op_threads
        self.log_severity = log_severity
        setups = session_setups(request.target, request.kind)
        self.setup: SessionSetup = next(
            (s for s in setups if s.name == (SHARED if share else PREPACKED)), setups[-1]
        )
        """The session setup this engine runs in (``registry.sessions``)."""
        self._live: _Live | None = None
        self.evicted = False
        """Unloaded to keep within the memory budget: the next run loads it again."""
        self.run_s: float | None = None
        """Seconds a run takes, averaged over recent runs (None before the first)."""
        self.on_reload: Callable[[OrtEngine], None] | None = None
        self._reload_lock = threading.Lock()
        try:
            self.size_bytes: int = request.path.stat().st_size
        except OSError:  # a version held as tensors: the file it stands for is not held
            self.size_bytes = 0
        if request.layout is not None:
            self.size_bytes = sum(t.length for t in request.layout.tensors)
        self._live = self._open(base)
        session = self._live.session
        self.inputs: list[TensorDecl] = [
            (i.name, i.type, list(i.shape)) for i in session.get_inputs()
        ]
        self.outputs: list[TensorDecl] = [
            (o.name, o.type, list(o.shape)) for o in session.get_outputs()
        ]
        self.output_names = [o.name for o in session.get_outputs()]

    def _open(self, base: Engine | None) -> _Live:
        """A session for the request, and the weights it runs on (see the class doc).

        Raises:
            EngineError: ONNX Runtime cannot load it.
            OSError: its file cannot be read now (out of file handles, memory: a retry
                may succeed, so this is no reason to reject the version).
        """
        import onnxruntime as ort

        request = self.request
        options = ort.SessionOptions()
        options.log_severity_level = self.log_severity
        options.intra_op_num_threads = self.intra_op_threads
        options.inter_op_num_threads = 1
        # no arena: it never shrinks, so one large request kept its peak for good (the
        # CNN at batch 21,399: +1.75 GiB 10 s later); small runs cost the same without
        options.enable_cpu_mem_arena = False
        source: str | bytes = str(request.path)
        weights: Weights | None = None
        if request.layout is not None:
            # a version held as tensors: built from its skeleton in every setup (a
            # private one copies what it prepacks; nothing else reads the weights)
            source, weights = self._from_layout(options)
        elif self.shared:
            try:
                source, weights = self._split(options, base)
            except WeightError:  # a file this cannot split loads whole, privately
                setups = session_setups(request.target, request.kind)
                self.setup = setups[-1]
        self.setup.configure(options)
        try:
            return _Live(ort.InferenceSession(source, options, providers=self.providers), weights)
        except Exception as e:  # noqa: BLE001 - ORT's pybind errors share no other base
            raise EngineError(
                f"{request.model} {request.version}: ONNX Runtime cannot load it "
                f"({type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''})"
            ) from None

    def unload(self) -> None:
        """Free the session to keep within a memory budget; the next run loads it again
        (from the verified blob the request names)."""
        with self._reload_lock:
            if self._live is not None:
                self._live = None  # a run in progress keeps its own reference
                self.evicted = True

    @property
    def shared(self) -> bool:
        """Whether this is a shared-weight session (see the class doc)."""
        return self.setup.shared

    @property
    def loaded(self) -> bool:
        """Whether the session is in memory (not evicted nor released)."""
        return self._live is not None

    @property
    def weights(self) -> Weights | None:
        """The weights the session runs on (shared-weight sessions; None otherwise)."""
        live = self._live
        return live.weights if live is not None else None

    def _split(self, options: Any, base: Engine | None) -> tuple[bytes, Weights]:
        """The graph to load and its large tensors, added to ``options`` (shared with
        ``base`` where equal).

        Raises:
            WeightError: the file cannot be split (it is loaded whole instead).
            OSError: it cannot be read.
        """
        path = self.request.path
        with path.open("rb") as fh:
            if not os.fstat(fh.fileno()).st_size:
                raise WeightError("the file is empty")
            with mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as view:
                # the file's own external data first: the cut marks its tensors external
                external = external_tensors(view)
                graph = split_model(view)
        base_weights = base.weights if base is not None and base.shared else None
        weights = Weights.load(path, graph.tensors, base_weights, self.sha256)
        # ONNX external data (a model over 2 GB): each data file beside the .onnx (the
        # updater's view of verified blobs, hard links) is memory-mapped the same way,
        # never read.  Its values name the .onnx's blob: pinning that keeps the view,
        # whose links keep the data files, for a reload after eviction.
        for file, tensors in external.items():
            weights.merge(Weights.load(path.parent / file, tensors, base_weights, self.sha256))
        # the view of a file with data files has the stub too (edge_sync.sync.external)
        folder = path.parent if external else stub_folder()
        _give(options, weights, folder)
        return graph.graph, weights

    def _from_layout(self, options: Any) -> tuple[bytes, Weights | None]:
        """The skeleton and the tensors of a version held as tensors
        (``LoadRequest.layout``), added to ``options``.

        Raises:
            OSError: a file cannot be read, or a blob is no longer as verified.
            EngineError: its tensors do not fit their files (a store altered since
                they were verified).
        """
        layout = self.request.layout
        assert layout is not None  # noqa: S101 - the caller checked
        if layout.check is not None:
            layout.check()  # every blob still as verified (a reload after eviction too)
        skeleton = layout.graph.read_bytes()
        if not self.shared:
            # a private session reads its weights itself (ONNX Runtime's optimizers
            # read a Constant's tensor from the graph): each names its blob and offset
            source, folder = _private_skeleton(skeleton, layout)
            options.add_session_config_entry(
                "session.model_external_initializers_file_folder_path", str(folder)
            )
            return source, None
        try:
            weights = Weights.mapped(layout.tensors)
        except WeightError as e:
            raise EngineError(f"{self.model} {self.version}: {e}") from None
        _give(options, weights, stub_folder())
        return skeleton, weights

    @property
    def memory_bytes(self) -> int:
        """What this engine adds to the memory budget: weight bytes it holds that the
        engine it replaced did not (shared ones count where they were first loaded);
        the file's size for a private session (a lower bound: ONNX Runtime's copies)."""
        weights = self.weights
        return weights.own_bytes if weights is not None else self.size_bytes

    def sample_inputs(self) -> dict[str, npt.NDArray[Any]]:
        """Zeros of every input's shape (symbolic dimensions as 1): warm-up data for a
        version without golden cases."""
        import numpy as np

        arrays = {}
        for name, kind, shape in self.inputs:
            dims = [d if isinstance(d, int) and d >= 0 else 1 for d in shape]
            dtype = NUMPY_DTYPES.get(DATATYPES.get(kind, "FP32"), "float32")
            arrays[name] = np.zeros(dims, dtype=dtype) if dtype != "object" else np.full(dims, "")
        return arrays

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> dict[str, npt.NDArray[Any]]:
        """Run once (thread-safe: ONNX Runtime sessions allow concurrent runs).

        Raises:
            EngineClosedError: the engine was released.
        """
        live = self._live  # held for the run: its weights stay mapped until it returns
        if live is None:
            live = self._reload()
        names = list(outputs) if outputs is not None else self.output_names
        start = time.perf_counter()
        values = live.session.run(names, dict(inputs))
        took = time.perf_counter() - start
        # a moving average of recent runs (the serving layer runs short ones inline)
        self.run_s = took if self.run_s is None else self.run_s * 0.9 + took * 0.1
        return dict(zip(names, values, strict=True))

    def _reload(self) -> _Live:
        """The session again, after an eviction (one thread loads it; the others wait).

        Raises:
            EngineClosedError: the engine was released, not evicted.
        """
        with self._reload_lock:
            if self._live is not None:
                return self._live
            if not self.evicted:
                raise EngineClosedError(f"{self.model} {self.version} was released")
            self._live = live = self._open(None)
            self.evicted = False
        if self.on_reload is not None:
            self.on_reload(self)
        return live

    def close(self) -> None:
        """Drop the session and the weights only it used (ONNX Runtime frees the
        session when the last reference goes; a mapping closes with its last array)."""
        self.detach()

    def detach(self) -> object:
        """Release the engine, and return what it held, for the caller to free where
        it likes (destroying a large session takes milliseconds)."""
        with self._reload_lock:
            live, self._live = self._live, None  # a run in progress keeps its own reference
            self.evicted = False
        return live


def _private_skeleton(skeleton: bytes, layout: TensorLayout) -> tuple[bytes, Path]:
    """The skeleton with each tensor at its blob (a name in the folder all the blobs
    share: ONNX Runtime takes no other path) and offset, and that folder.

    Raises:
        EngineError: the skeleton does not walk, names other tensors, or the blobs
            lie in several folders.
    """
    refs = layout.tensors
    folders = {ref.path.parent for ref in refs}
    if len(folders) > 1:
        raise EngineError(f"the tensors of {layout.graph.name[:12]} lie in several folders")
    folder = folders.pop() if folders else layout.graph.parent

    def where(index: int, piece: Piece) -> tuple[str, int]:
        if index >= len(refs) or refs[index].name != piece.name:
            raise TensorCutError(f"the skeleton's tensor {piece.name!r} is not the layout's")
        return refs[index].path.name, refs[index].offset

    try:
        return relocate(skeleton, where), folder
    except TensorCutError as e:
        raise EngineError(f"the skeleton of {layout.graph.name[:12]} does not walk ({e})") from None


def _give(options: Any, weights: Weights, folder: Path) -> None:
    """Hand every cut tensor to the session; ``folder`` holds the external files the
    skeleton names (ONNX Runtime checks they exist, and reads none of them)."""
    options.add_session_config_entry(
        "session.model_external_initializers_file_folder_path", str(folder)
    )
    for name, held in weights.values.items():
        options.add_initializer(name, held.value)


@dataclass(frozen=True)
class _Live:
    """A loaded session and the weights it runs on: one reference, so that whoever
    holds the session (a run in progress) holds its memory-mapped weights too."""

    session: Any
    weights: Weights | None
