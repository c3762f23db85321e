"""The floors a device update is measured against (``benchmarks.edge_update``).

* **full**: what any verified install of the whole file costs: reading it with its
  SHA-256, plus creating the ONNX Runtime session with the daemon's options.
* **tensors**: what any verified update by tensors costs, past the metadata check (the
  update's own ``verify_metadata`` stage is added by the caller): reading exactly the
  changed objects (skeleton and tensors the held version lacks) from the remote with
  their SHA-256, then a shared-weight session built from the new skeleton with every
  tensor given by ``add_initializer`` (the unchanged ones the values a serving session
  of the held version already maps and ran on, the changed ones memory-mapped from
  their objects), and one run of the model.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._edge_fleet import Fleet

__all__ = ["changed_objects", "full_floor", "tensor_floor"]


def _options() -> Any:
    """Session options as the daemon's shared-weight sessions have them."""
    import onnxruntime as ort

    from edge_sync.engine.weights import stub_folder
    from registry.sessions import session_setups

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = False
    setup = session_setups(None)[0]
    assert setup.shared  # the CPU's first setup
    setup.configure(options)
    options.add_session_config_entry(
        "session.model_external_initializers_file_folder_path", str(stub_folder())
    )
    return options


def full_floor(artifact: Path) -> float:
    """Read + SHA-256 of the file + an ONNX Runtime session with the daemon's options."""
    import onnxruntime as ort

    start = time.perf_counter()
    hasher = hashlib.sha256()
    with artifact.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            hasher.update(chunk)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    ort.InferenceSession(str(artifact), options, providers=["CPUExecutionProvider"])
    return time.perf_counter() - start


def changed_objects(fleet: Fleet, base: str, target: str) -> list[dict[str, Any]]:
    """The objects of ``target``'s manifest that ``base``'s lacks (each digest once)."""
    old, new = fleet.manifest(base), fleet.manifest(target)
    held = {t["sha256"] for t in old["tensors"]} | {old["graph"]["sha256"]}
    found: dict[str, dict[str, Any]] = {}
    for obj in [new["graph"], *new["tensors"]]:
        if obj["sha256"] not in held:
            found.setdefault(obj["sha256"], obj)
    return list(found.values())


def _map(path: Path, tensor: dict[str, Any]) -> tuple[Any, Any]:
    """A tensor object mapped read-only, and its OrtValue."""
    import onnxruntime as ort

    fd = os.open(path, os.O_RDONLY)
    try:
        view = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    array = np.frombuffer(view, dtype=tensor["dtype"]).reshape(tensor["shape"])
    return array, ort.OrtValue.ortvalue_from_numpy(array)


def _session(skeleton: bytes, values: dict[str, tuple[Any, Any]]) -> Any:
    import onnxruntime as ort

    options = _options()
    for name, (_array, value) in values.items():
        options.add_initializer(name, value)
    return ort.InferenceSession(skeleton, options, providers=["CPUExecutionProvider"])


def _hash_objects(fleet: Fleet, objects: list[dict[str, Any]]) -> float:
    start = time.perf_counter()
    for obj in objects:
        hasher = hashlib.sha256()
        with fleet.object_file(obj["sha256"]).open("rb") as fh:
            while chunk := fh.read(1 << 20):
                hasher.update(chunk)
        if hasher.hexdigest() != obj["sha256"]:
            raise ValueError(f"object {obj['sha256']} does not hash to its digest")
    return time.perf_counter() - start


def tensor_floor(fleet: Fleet, base: str, target: str, inputs: dict[str, Any]) -> dict[str, float]:
    """The tensor floor's parts past the metadata check (see the module doc), seconds:
    ``fetch_hash`` and ``build_run``; also ``changed_bytes``."""
    old, new = fleet.manifest(base), fleet.manifest(target)
    serving = {t["name"]: (t["sha256"], _map(fleet.object_file(t["sha256"]), t))
               for t in old["tensors"]}  # fmt: skip
    skeleton = fleet.object_file(old["graph"]["sha256"]).read_bytes()
    _session(skeleton, {k: v for k, (_d, v) in serving.items()}).run(None, inputs)
    changed = changed_objects(fleet, base, target)
    fetch_hash = _hash_objects(fleet, changed)
    start = time.perf_counter()
    values: dict[str, tuple[Any, Any]] = {}
    for t in new["tensors"]:
        held = serving.get(t["name"])
        same = held is not None and held[0] == t["sha256"]
        values[t["name"]] = held[1] if same and held else _map(fleet.object_file(t["sha256"]), t)
    skeleton = fleet.object_file(new["graph"]["sha256"]).read_bytes()
    _session(skeleton, values).run(None, inputs)
    build_run = time.perf_counter() - start
    return {
        "fetch_hash": fetch_hash,
        "build_run": build_run,
        "changed_bytes": float(sum(o["length"] for o in changed)),
    }
