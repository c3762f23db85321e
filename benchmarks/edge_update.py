"""The edge daemon's update latency, whole and by tensors, against its floors (issues 9
and 25).

Fleet repositories (``modelreg init``) release models through the real ``modelreg ci
release``, which signs each version's tensor manifest and writes its skeleton and
tensors as objects by digest.  A device then runs the real
:class:`~edge_sync.sync.updater.Updater` in this process (``benchmarks._edge_fleet``),
timed from "new metadata seen" (the end of the git detect stage) to the end of the
commit stage (the version serves from its swap), side by side in one run.  A version
replacing a serving one is checked in its other session setup after the commit
(``confirm``: a private prepacked copy of every weight, the replaced engine still
loaded); the stage tables show it, and the RSS of the whole sync beside the RSS until
the commit:

1. **mlp**: the ~100 MB MLP example, 1.0.0 then its 1.1.0 fine-tune (17 % of the weight
   bytes changed): a fresh device installs 1.1.0 whole (**full**); a device serving
   1.0.0 updates by **tensors** (it fetches the skeleton and the changed tensors only,
   and builds a session over memory-mapped weights, shared with the serving one:
   ``serve.prepack: off``, the default), and the same with ``serve.prepack: on``.
   Goals: full <= 1.3x its floor, tensors <= 0.35x full.
2. **1 GB**: a chain of 512 MatMul layers (``benchmarks._tensor_models``, 1.08 GB) whose
   1.1.0 changes exactly one 2.1 MB tensor.  Goals: tensors <= 0.1x full and <= 1.5x
   the tensor floor; bytes fetched <= 1.1x the changed tensor bytes; the process's
   RSS grows during the update by at most the changed bytes + 32 MB.
3. **sweep**: chain models of 100 MB and 1 GB x 1 % / 17 % / 100 % of the weights
   changed: update time against changed bytes, full and by tensors, written to
   ``benchmarks/results/edge_update_sweep.json`` and plotted to ``.svg`` (copied to
   ``docs/figures/``).  At 100 % the device holds no tensor of the new version, so its
   plan takes the whole file (the path column says which was taken).

Floors, measured in the same run (``benchmarks._edge_floors``): **full**, reading the
artifact with its SHA-256 plus an ONNX Runtime session; **tensors**, the update's own
``verify_metadata`` stage + reading exactly the changed objects with their SHA-256 + a
shared-weight session built from the skeleton with every tensor memory-mapped and
given by ``add_initializer`` + one run.

The idle poll (nothing new) is measured against a ``git daemon`` through a counting
TCP proxy (``benchmarks._idle_poll``).  Goal: one round trip, under 2 KB.

``--quick``: small chain models (4 and 16 MB) stand in for every case (the mlp case is
the 4 MB chain at 17 %); its figures are indicative only.
"""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from benchmarks._edge_fleet import Fleet, Release, config, device_holding, release, update
from benchmarks._edge_floors import full_floor, tensor_floor
from benchmarks._idle_poll import idle_poll
from benchmarks._sweep_plot import plot_sweep
from benchmarks._tensor_models import (
    ChainSpec,
    changed_layers,
    write_base,
    write_inputs,
    write_variant,
)
from benchmarks._util import BENCH_DIR, REPO_ROOT, machine_info
from modelreg.examples import write_examples

NAME: Final = "edge_update"
RESULTS: Final = REPO_ROOT / "benchmarks" / "results"
FIGURE: Final = REPO_ROOT / "docs" / "figures" / "edge_update_sweep.svg"

_SIZES: Final = (ChainSpec(512, 100), ChainSpec(725, 512))  # 105 MB, 1.08 GB
_SIZES_QUICK: Final = (ChainSpec(256, 16), ChainSpec(512, 16))  # 4 MB, 17 MB
_ONE_TENSOR: Final = "1.1.0"
_SHARES: Final = {"1.2.0": 0.01, "1.3.0": 0.17, "2.0.0": 1.0}
_RSS_SLACK: Final = 32e6
_PREPACK: Final = "tensors, prepack on"


def _goal(name: str, value: float, target: float, *, quick: bool) -> dict[str, Any]:
    return {
        "name": name,
        "value": round(value, 4),
        "target": target,
        "comparison": "<=",
        "passed": value <= target,
        "indicative": quick,
    }


@dataclass
class Model:
    """A released fleet, the artifact file of each version, and golden inputs."""

    fleet: Fleet
    artifacts: dict[str, Path]
    inputs: dict[str, Any]
    label: str


def _chain(work: Path, label: str, spec: ChainSpec, *, one_tensor: bool) -> Model:
    """Release chain model ``spec``: 1.0.0, its one-tensor fine-tune (``one_tensor``),
    and one version per share of :data:`_SHARES`."""
    ex = work / "examples"
    write_base(ex / "1.0.0.onnx", spec)
    write_inputs(ex / "inputs.npz")
    changes = {_ONE_TENSOR: [spec.layers // 2]} if one_tensor else {}
    changes |= {v: changed_layers(spec, share) for v, share in _SHARES.items()}
    for key, (version, layers) in enumerate(changes.items(), start=1):
        write_variant(ex / "1.0.0.onnx", ex / f"{version}.onnx", spec, layers, key)
    versions = ["1.0.0", *changes]
    files = {v: ex / f"{v}.onnx" for v in versions}
    fleet = release(work, "chain", [Release(v, files[v], ex / "inputs.npz") for v in versions])
    return Model(fleet, files, _inputs(ex / "inputs.npz"), f"chain {spec.label}")


def _mlp(work: Path) -> Model:
    """Release the large MLP example, 1.0.0 and its 17 % fine-tune 1.1.0."""
    built = write_examples(work / "examples", size="large", models=["mlp"], goldens=True)
    files = {f.version: f for f in built}
    releases = []
    for version, parent in (("1.0.0", None), ("1.1.0", "1.0.0")):
        f = files[version]
        assert f.golden_inputs is not None
        releases.append(Release(version, f.path, f.golden_inputs, parent))
    fleet = release(work, "mlp", releases)
    inputs = _inputs(releases[1].inputs)
    size = files["1.1.0"].path.stat().st_size / 1e6
    paths = {v: files[v].path for v in ("1.0.0", "1.1.0")}
    return Model(fleet, paths, inputs, f"mlp {size:.1f} MB")


def _inputs(path: Path) -> dict[str, Any]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _median_run(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda r: r["latency_s"])[len(runs) // 2]


def _case(model: Model, target: str, runs: int, *, prepack: bool) -> dict[str, Any]:
    """Full and tensor updates from 1.0.0 to ``target``, and both floors, interleaved
    ``runs`` times (so that load on the machine spreads over all of them)."""
    fleet = model.fleet
    cfg = config(fleet, fleet.work / "devices" / target, target)
    holds = device_holding(fleet, "1.0.0")
    kinds: dict[str, Callable[[], dict[str, Any]]] = {
        "full": lambda: update(cfg, None, fleet.model),
        "tensors": lambda: update(cfg, holds, fleet.model),
    }
    if prepack:
        kinds[_PREPACK] = lambda: update(cfg, holds, fleet.model, "on")
    samples: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    full_floors, parts = [], []
    for _ in range(runs):
        for kind, measure in kinds.items():
            samples[kind].append(measure())
        full_floors.append(full_floor(model.artifacts[target]))
        parts.append(tensor_floor(fleet, "1.0.0", target, model.inputs))
    return _summary(samples, full_floors, parts)


def _summary(
    samples: dict[str, list[dict[str, Any]]],
    full_floors: list[float],
    parts: list[dict[str, float]],
) -> dict[str, Any]:
    median = {k: _median_run(v) for k, v in samples.items()}
    verify = statistics.median(r["stages_ms"]["verify_metadata"] for r in samples["tensors"])
    floor_parts = {
        "verify_metadata": verify / 1000,
        "fetch_hash": statistics.median(p["fetch_hash"] for p in parts),
        "build_run": statistics.median(p["build_run"] for p in parts),
    }
    return {
        "runs": len(full_floors),
        "latency_s": {k: statistics.median(r["latency_s"] for r in v) for k, v in samples.items()},
        "path": {k: r["path"] for k, r in median.items()},
        "stages_ms": {k: r["stages_ms"] for k, r in median.items()},
        "bytes_fetched": {
            k: statistics.median(r["bytes_fetched"] for r in v) for k, v in samples.items()
        },
        "rss_growth_max": {k: max(r["rss_growth"] for r in v) for k, v in samples.items()},
        "rss_growth_sync_max": {
            k: max(r["rss_growth_sync"] for r in v) for k, v in samples.items()
        },
        "confirm_s": {k: statistics.median(r["confirm_s"] for r in v) for k, v in samples.items()},
        "floor_s": {"full": statistics.median(full_floors), "tensors": sum(floor_parts.values())},
        "tensor_floor_parts_s": floor_parts,
        "changed_bytes": parts[0]["changed_bytes"],
    }


def _stage_table(title: str, case: dict[str, Any]) -> dict[str, Any]:
    kinds = list(case["stages_ms"])
    stages: list[str] = []
    for kind in kinds:
        stages += [s for s in case["stages_ms"][kind] if s not in stages]
    rows = [[s, *(_ms(case["stages_ms"][k].get(s)) for k in kinds)] for s in stages]
    rows += [
        ["latency (s, median)", *(f"{case['latency_s'][k]:.3f}" for k in kinds)],
        ["path taken", *(case["path"][k] for k in kinds)],
        ["bytes fetched", *(f"{case['bytes_fetched'][k]:,.0f}" for k in kinds)],
        ["RSS growth to commit (MB, max)",
         *(f"{case['rss_growth_max'][k] / 1e6:.1f}" for k in kinds)],
        ["RSS growth, whole sync (MB, max)",
         *(f"{case['rss_growth_sync_max'][k] / 1e6:.1f}" for k in kinds)],
    ]  # fmt: skip
    return {"title": title, "headers": ["stage (ms)", *kinds], "rows": rows}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _floor_table(title: str, case: dict[str, Any]) -> dict[str, Any]:
    p = case["tensor_floor_parts_s"]
    rows = [
        ["verify_metadata (the tensor update's own)", f"{p['verify_metadata']:.3f}"],
        [f"read + SHA-256 of the {case['changed_bytes']:,.0f} changed bytes",
         f"{p['fetch_hash']:.3f}"],
        ["shared-weight session (skeleton + mapped tensors) + one run", f"{p['build_run']:.3f}"],
        ["tensor floor", f"{case['floor_s']['tensors']:.3f}"],
        ["full floor (read + SHA-256 + session of the file)", f"{case['floor_s']['full']:.3f}"],
    ]  # fmt: skip
    return {"title": title, "headers": ["floor part", "s"], "rows": rows}


def _point(label: str, spec: ChainSpec, version: str, case: dict[str, Any]) -> dict[str, Any]:
    lat = case["latency_s"]
    return {
        "size": label,
        "model_bytes": spec.layer_bytes * spec.layers,
        "version": version,
        "changed_bytes": case["changed_bytes"],
        "changed_share": case["changed_bytes"] / (spec.layer_bytes * spec.layers),
        "full_s": lat["full"],
        "tensors_s": lat["tensors"],
        "tensors_path": case["path"]["tensors"],
        "tensor_floor_s": case["floor_s"]["tensors"],
        "full_floor_s": case["floor_s"]["full"],
        "bytes_fetched": case["bytes_fetched"]["tensors"],
        "runs": case["runs"],
    }


def _sweep_table(points: Sequence[dict[str, Any]]) -> dict[str, Any]:
    rows = [
        [p["size"], p["version"], f"{100 * p['changed_share']:.2f} %",
         f"{p['changed_bytes'] / 1e6:.1f}", p["tensors_path"], f"{p['full_s']:.3f}",
         f"{p['tensors_s']:.3f}", f"{p['tensor_floor_s']:.3f}",
         f"{p['tensors_s'] / p['full_s']:.3f}"]
        for p in points
    ]  # fmt: skip
    headers = ["model", "version", "changed", "changed MB", "tensor path", "full s",
               "tensors s", "tensor floor s", "tensors / full"]  # fmt: skip
    return {"title": "sweep: update time against changed bytes", "headers": headers, "rows": rows}


def _write_sweep(points: list[dict[str, Any]], *, quick: bool) -> Path:
    import json

    stem = "edge_update_sweep" + (".quick" if quick else "")
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {"quick": quick, "points": points, "environment": machine_info()}
    (RESULTS / f"{stem}.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    svg = RESULTS / f"{stem}.svg"
    title = "device update time against changed bytes" + (" (quick, indicative)" if quick else "")
    plot_sweep(points, svg, title=title)
    if not quick:
        FIGURE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(svg, FIGURE)
    return svg


def _measure(work: Path, quick: bool) -> dict[str, Any]:
    """Release every model and measure every case (see the module doc)."""
    sizes = {spec.label: spec for spec in (_SIZES_QUICK if quick else _SIZES)}
    small, large = sizes
    runs, sweep_runs = (2, 1) if quick else (5, 3)
    chains = {label: _chain(work / label.replace(" ", ""), label, spec, one_tensor=label == large)
              for label, spec in sizes.items()}  # fmt: skip
    mlp = chains[small] if quick else _mlp(work / "mlp")
    mlp_target = "1.3.0" if quick else "1.1.0"
    out: dict[str, Any] = {"mlp_label": mlp.label, "large_label": chains[large].label}
    out["mlp"] = _case(mlp, mlp_target, runs, prepack=True)
    out["one_tensor"] = _case(chains[large], _ONE_TENSOR, 2 if quick else 3, prepack=False)
    points = [_point(large, sizes[large], _ONE_TENSOR, out["one_tensor"])]
    points += [
        _point(label, sizes[label], version, _case(model, version, sweep_runs, prepack=False))
        for label, model in chains.items()
        for version in _SHARES
    ]
    out["sweep"] = sorted(points, key=lambda p: (p["model_bytes"], p["changed_bytes"]))
    out["idle"] = idle_poll(work, mlp.fleet.repo)
    return out


def _goals(m: dict[str, Any], *, quick: bool) -> list[dict[str, Any]]:
    a, b = m["mlp"], m["one_tensor"]
    al, bl = a["latency_s"], b["latency_s"]
    one, big = m["mlp_label"], m["large_label"]
    changed = b["changed_bytes"]
    rss_target = round((changed + _RSS_SLACK) / 1e6, 1)
    return [
        _goal(f"{one}: full update / full floor", al["full"] / a["floor_s"]["full"], 1.3,
              quick=quick),
        _goal(f"{one}: tensor update / full update", al["tensors"] / al["full"], 0.35,
              quick=quick),
        _goal(f"{big}, one tensor: tensor update / full update", bl["tensors"] / bl["full"],
              0.1, quick=quick),
        _goal(f"{big}, one tensor: tensor update / tensor floor",
              bl["tensors"] / b["floor_s"]["tensors"], 1.5, quick=quick),
        _goal(f"{big}, one tensor: bytes fetched / changed tensor bytes",
              b["bytes_fetched"]["tensors"] / changed, 1.1, quick=quick),
        _goal(f"{big}, one tensor: RSS growth in the update (MB)",
              b["rss_growth_max"]["tensors"] / 1e6, rss_target, quick=quick),
        _goal("idle poll round trips", m["idle"]["connections"], 1, quick=quick),
        _goal("idle poll KB on the git host", m["idle"]["bytes"] / 1024, 2.0, quick=quick),
    ]  # fmt: skip


def _notes(m: dict[str, Any], svg: Path) -> list[str]:
    a, b = m["mlp"], m["one_tensor"]
    notes = [
        f"{m['mlp_label']}, {name}: {a['latency_s'][name]:.3f} s ({a['path'][name]})"
        for name in a["latency_s"]
    ]
    notes += [
        (
            f"{m['mlp_label']}: full floor {a['floor_s']['full']:.3f} s, tensor floor "
            f"{a['floor_s']['tensors']:.3f} s (medians of {a['runs']})"
        ),
        (
            f"{m['large_label']}, one tensor ({b['changed_bytes']:,.0f} bytes changed): full "
            f"{b['latency_s']['full']:.3f} s, tensors {b['latency_s']['tensors']:.3f} s, "
            f"floors: full {b['floor_s']['full']:.3f} s, tensors "
            f"{b['floor_s']['tensors']:.3f} s (medians of {b['runs']})"
        ),
        (
            f"{m['large_label']}, one tensor: then the other session setup is confirmed in "
            f"{b['confirm_s']['tensors']:.3f} s, the whole sync's RSS growing by "
            f"{b['rss_growth_sync_max']['tensors'] / 1e6:.0f} MB"
        ),
        f"idle poll: {m['idle']['connections']} connection(s), {m['idle']['bytes']} bytes",
        f"sweep figure: {svg.relative_to(REPO_ROOT) if svg.is_relative_to(REPO_ROOT) else svg}",
    ]
    return notes


def run(quick: bool) -> dict[str, Any]:
    """Release, then time device updates against their floors (quick: small models).

    Returns:
        JSON-ready figures: latencies, stage timings, bytes, RSS, ratios and goals.
    """
    work = BENCH_DIR / NAME / ("quick" if quick else "full")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        m = _measure(work, quick)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    svg = _write_sweep(m["sweep"], quick=quick)
    a, b = m["mlp"], m["one_tensor"]
    big = m["large_label"]
    return {
        "name": NAME,
        "quick": quick,
        "summary": f"device update of {m['mlp_label']} and {big}, whole and by tensors",
        "params": {"runs": a["runs"], "one_tensor_runs": b["runs"]},
        "measurements": {},
        "mlp": a,
        "one_tensor": b,
        "sweep": m["sweep"],
        "idle_poll": m["idle"],
        "tables": [
            _stage_table(f"{m['mlp_label']}, 17 % of the weights changed: stages", a),
            _floor_table(f"{m['mlp_label']}: floors (s)", a),
            _stage_table(f"{big}, one tensor changed: stages", b),
            _floor_table(f"{big}, one tensor changed: floors (s)", b),
            _sweep_table(m["sweep"]),
        ],
        "ratios": {
            f"{m['mlp_label']}: full / full floor": a["latency_s"]["full"] / a["floor_s"]["full"],
            f"{m['mlp_label']}: full / tensors": a["latency_s"]["full"] / a["latency_s"]["tensors"],
            f"{big}: full / tensors": b["latency_s"]["full"] / b["latency_s"]["tensors"],
            f"{big}: tensors / tensor floor": b["latency_s"]["tensors"] / b["floor_s"]["tensors"],
        },
        "notes": _notes(m, svg),
        "goals": _goals(m, quick=quick),
        "environment": machine_info(),
    }
