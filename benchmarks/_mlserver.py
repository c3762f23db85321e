"""MLServer in the ``serving`` benchmark: its venv, a custom runtime and its process.

MLServer 1.7.1 lives in a venv of its own (``make bench`` builds ``.bench/mlserver-venv``);
:func:`mlserver_versions` reads what it holds.  :func:`start_mlserver` serves the MLP with
a custom runtime around one ONNX Runtime session with the settings of ours
(:data:`~benchmarks._serving_fixture.ORT_SETTINGS`) and swaps by its repository API: the
model's settings rewritten, then ``POST /v2/repository/models/mlp/load``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from benchmarks._serving_fixture import MODEL, ORT_SETTINGS, SWAP_EVERY_S, V1, V2, Models
from benchmarks._serving_process import Server, Swaps, free_port, spawn
from benchmarks._serving_runner import BATCH_DELAY_S, BATCH_SIZE
from benchmarks._util import BENCH_DIR

MLSERVER_VENV: Final = BENCH_DIR / "mlserver-venv"
"""A venv of its own, never ``.venv`` (the Makefile's ``bench`` target builds it)."""
_MLSERVER_RUNTIME: Final = '''"""One ONNX Runtime session as an MLServer runtime."""
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OrtRuntime(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra or {}
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = int(extra["intra_op_threads"])
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel(int(extra["optimization"]))
        if extra["disable_prepacking"]:
            options.add_session_config_entry("session.disable_prepacking", "1")
        uri = await get_model_uri(self.settings)
        self._session = ort.InferenceSession(uri, options, providers=["CPUExecutionProvider"])
        self._outputs = [o.name for o in self._session.get_outputs()]
        self._served = str(extra["served_version"])
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inputs = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        results = self._session.run(self._outputs, inputs)
        return InferenceResponse(
            model_name=self.name, model_version=self._served, id=payload.id,
            outputs=[NumpyCodec.encode_output(n, r) for n, r in zip(self._outputs, results)],
        )
'''


def _mlserver_settings(folder: Path, models: Models, version: str, batching: bool) -> None:
    settings: dict[str, object] = {
        "name": MODEL,
        "implementation": "ort_runtime.OrtRuntime",
        "parameters": {
            "uri": str(models.path(version)),
            "extra": {**ORT_SETTINGS, "served_version": version, "batching": batching},
        },
    }
    if batching:  # its adaptive batching, with our batch bounds
        settings |= {"max_batch_size": BATCH_SIZE, "max_batch_time": BATCH_DELAY_S}
    path = folder / MODEL / "model-settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_text(json.dumps(settings))
    path.with_suffix(".tmp").replace(path)


def start_mlserver(
    models: Models, work: Path, workers: int, cpus: set[int] | None, *, batching: bool = False
) -> Server:
    """MLServer with ``parallel_workers=workers`` serving 1.0.0 (pinned to ``cpus``), REST
    and gRPC, with its adaptive batching when asked."""
    folder = work / f"mlserver-pw{workers}{'-batching' if batching else ''}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ort_runtime.py").write_text(_MLSERVER_RUNTIME)
    port, grpc, metrics = free_port(), free_port(), free_port()
    settings = {
        "debug": False,
        "host": "127.0.0.1",
        "http_port": port,
        "grpc_port": grpc,
        "metrics_port": metrics,
        "parallel_workers": workers,
    }
    (folder / "settings.json").write_text(json.dumps(settings))
    _mlserver_settings(folder, models, V1, batching)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    argv = [str(MLSERVER_VENV / "bin" / "mlserver"), "start", "."]
    proc = spawn(argv, cpus, folder, work / f"{folder.name}.log", env)
    base = f"http://127.0.0.1:{port}"

    @contextlib.contextmanager
    def swapping() -> Iterator[Swaps]:
        """Its repository API: the settings name the other version, then load."""
        found, stop = Swaps(), threading.Event()
        url = f"{base}/v2/repository/models/{MODEL}/load"

        def reload() -> None:
            while not stop.is_set():
                start = time.perf_counter()
                current = _mlserver_settings_version(folder)
                _mlserver_settings(folder, models, V2 if current == V1 else V1, batching)
                try:
                    request = urllib.request.Request(url, data=b"", method="POST")  # noqa: S310
                    with urllib.request.urlopen(request, timeout=60) as r:  # noqa: S310
                        r.read()
                    found.durations_ms.append((time.perf_counter() - start) * 1000)
                except OSError as e:  # urllib's HTTPError included
                    found.errors.append(str(e))
                stop.wait(max(0.0, SWAP_EVERY_S - (time.perf_counter() - start)))

        thread = threading.Thread(target=reload, daemon=True)
        thread.start()
        try:
            yield found
        finally:
            stop.set()
            thread.join(timeout=120)

    label = f"MLServer (parallel_workers={workers}{', adaptive batching' if batching else ''})"
    return Server(label, proc, base, swapping, f"127.0.0.1:{grpc}", batching)


def _mlserver_settings_version(folder: Path) -> str:
    doc = json.loads((folder / MODEL / "model-settings.json").read_text())
    return str(doc["parameters"]["extra"]["served_version"])


def mlserver_versions() -> dict[str, str] | None:
    """mlserver's and onnxruntime's versions in the MLServer venv (None: no venv)."""
    python = MLSERVER_VENV / "bin" / "python"
    if not python.exists():
        return None
    code = (
        "import importlib.metadata as m, json; "
        "print(json.dumps({p: m.version(p) for p in ('mlserver', 'onnxruntime', 'uvloop')}))"
    )
    proc = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    return json.loads(proc.stdout) if proc.returncode == 0 else None
