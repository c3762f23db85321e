"""``modelreg validate`` and ``modelreg status`` against ``gto show`` on large registries.

Two repositories hold the same registry, M models x V versions (default 1,000 x 10 =
10,000 versions; ``--quick``: 100 x 10):

* a modelreg repository: ``modelreg.yaml``, one ``RegisteredModel`` per model (a
  signature, ``production`` and ``canary`` (10 %) on the latest version, promotion
  order ``[canary, production]``), one ``ModelVersion`` file per version (about 40
  lines: artifact, parent, source run, metrics, signature, one ONNX Runtime target)
  and its DVC pointer, all in one commit;
* a GTO repository: one commit per version (each rewrites one small DVC pointer,
  gto's best case, see ``GtoLayout``), an annotated ``<model>@v<version>`` tag per
  version and ``<model>#canary#1`` and ``<model>#production#2`` stage tags on each
  model's latest version, the tags gto 1.10.1 itself writes.  Refs are packed, as in
  a clone.

Both are generated under ``.bench/registry_scale/<M>x<V>/`` and reused while the
generator parameters (kept in ``stamp.json``) match.  Each is checked once after
generation: ``modelreg validate`` must pass and count every version, and gto's own
state loader must see every version and stage.

Timed, as subprocesses, median of 3 runs taken round-robin (so a burst of other work
hits every command alike): ``modelreg validate``, ``modelreg validate --jobs 1``,
``modelreg status`` (output to a pipe) and ``gto show`` (one run when the first takes
over 20 s).  Goals at 10,000 versions: validate and status within 2 s
each, and at least 10x faster than ``gto show``.
"""

from __future__ import annotations

import importlib.metadata
import json
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final, Literal

from benchmarks._util import (
    BENCH_DIR,
    REPO_ROOT,
    BenchmarkError,
    Command,
    busy_warning,
    isolated_env,
    load_average,
    machine_info,
    run_checked,
    time_interleaved,
    tool_version,
)

NAME: Final = "registry_scale"
GENERATOR_VERSION: Final = 1
"""Bump when the generated content changes, so stale fixtures are rebuilt."""
GTO_VERSION: Final = "1.10.1"
FULL: Final = (1000, 10)
QUICK: Final = (100, 10)
SEED: Final = 20240501
RUNS: Final = 3
GTO_SINGLE_RUN_AFTER_S: Final = 20.0
GOAL_SECONDS: Final = 2.0
GOAL_SPEEDUP: Final = 10.0
GOAL_VERSIONS: Final = 10_000
SPEC_GTO_SHOW_10K_S: Final = 28.1
"""``gto show`` on 10,000 versions per SPEC section 9 (a reference, not a measurement)."""

GtoLayout = Literal["compact", "per-model"]
"""What each commit of the GTO repository holds.

``compact``: one DVC pointer, ``models/model.onnx.dvc``, rewritten by every commit (a
three-file tree).  ``per-model``: ``models/<name>.onnx.dvc`` per model, so the tree
grows to one file per model.  gto builds an in-memory tree of each version's commit,
so its cost grows with the tree: ``compact`` is gto's best case and the default, and
reproduces the SPEC's reference figure.
"""

_EPOCH: Final = 1_700_000_000
_IDENT: Final = "bench <bench@example.invalid>"
_GIT_ID: Final = ("-c", "user.name=bench", "-c", "user.email=bench@example.invalid")

CONFIG_TEXT: Final = (
    "apiVersion: modelreg/v1\nkind: RegistryConfig\nmanifests: manifests\nartifacts: models\n"
)

_FAMILIES: Final = ("resnet", "mobilenet", "efficientnet", "yolo", "vit")
_TEAMS: Final = ("vision", "quality", "robotics", "retail")
_ARCHES: Final = ("x86_64", "aarch64")

_SIGNATURE: Final = """\
  signature:
    inputs:
      - name: input
        dtype: float32
        shape: [batch, 3, 224, 224]
    outputs:
      - name: logits
        dtype: float32
        shape: [batch, {classes}]
"""

_MODEL: Final = """\
apiVersion: modelreg/v1
kind: RegisteredModel
metadata:
  name: {name}
  labels:
    team: {team}
    family: {family}
    tier: edge
spec:
  description: Synthetic {family} classifier {index} of {total} (modelreg benchmark).
  owner: {team}-ml@example.invalid
  task: image-classification
{signature}\
  channels:
    production: {latest}
    canary:
      version: {latest}
      rollout: {{percent: 10}}
  targets: [cpu]
  promotion:
    order: [canary, production]
    branch: main
    approvals: 1
"""

_VERSION: Final = """\
apiVersion: modelreg/v1
kind: ModelVersion
metadata:
  name: {name}
  version: {version}
  labels:
    trained-by: {team}
spec:
  artifact:
    path: models/{name}/{version}.onnx
    format: onnx
{parent}\
  description: Retrained {family} on the {month} data snapshot.
{signature}\
  source:
    run: runs:/{run}/model
    code: git+https://git.example.invalid/ml/{name}.git@{code}
    datasets:
      - dvc://datasets/{name}/train@{snapshot}
      - dvc://datasets/{name}/val@{snapshot}
  metrics:
    accuracy: {accuracy:.4f}
    top5_accuracy: {top5:.4f}
    f1_macro: {f1:.4f}
    loss: {loss:.4f}
    latency_ms_p50: {p50:.2f}
    latency_ms_p95: {p95:.2f}
  targets:
    - name: cpu
      selector:
        arch: {arch}
      engine: onnxruntime
      providers: [CPUExecutionProvider]
      optimization: all
"""

_POINTER: Final = """\
outs:
- md5: {md5}
  size: {size}
  hash: md5
  path: {file}
"""


@dataclass(frozen=True)
class ScaleParams:
    """What a generated pair of repositories depends on (the stamp compares these)."""

    models: int
    versions: int
    seed: int = SEED
    gto_layout: GtoLayout = "compact"
    generator: int = GENERATOR_VERSION

    @property
    def total(self) -> int:
        """Versions in the registry."""
        return self.models * self.versions


def model_name(index: int) -> str:
    """Name of the ``index``-th model (0-based): ``m0001``, ``m0002``, ..."""
    return f"m{index + 1:04d}"


def version_name(k: int) -> str:
    """The ``k``-th version (0-based) of every model: ``1.<k>.0``."""
    return f"1.{k}.0"


def _write(path: Path, text: str) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def write_modelreg_tree(root: Path, models: int, versions: int, *, seed: int = SEED) -> int:
    """Write the manifests and DVC pointers of a modelreg repository (no git).

    Args:
        root: empty or missing folder to fill.
        models: number of RegisteredModels.
        versions: ModelVersions per model (``1.0.0`` .. ``1.<versions-1>.0``).
        seed: seed of the pseudo-random metrics and digests.

    Returns:
        Number of files written.
    """
    if models < 1 or versions < 1:
        raise ValueError("need at least one model and one version")
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    _write(root / "modelreg.yaml", CONFIG_TEXT)
    _write(root / ".gitignore", "/.modelreg/\n")
    files = 2
    latest = version_name(versions - 1)
    for i in range(models):
        name = model_name(i)
        team, family = _TEAMS[i % len(_TEAMS)], _FAMILIES[i % len(_FAMILIES)]
        signature = _SIGNATURE.format(classes=(10, 100, 1000)[i % 3])
        mdir = root / "manifests" / name
        vdir = mdir / "versions"
        adir = root / "models" / name
        vdir.mkdir(parents=True)
        adir.mkdir(parents=True)
        _write(
            mdir / "model.yaml",
            _MODEL.format(
                name=name,
                team=team,
                family=family,
                index=i + 1,
                total=models,
                signature=signature,
                latest=latest,
            ),
        )
        ignored: list[str] = []
        accuracy = 0.70 + rng.random() * 0.1
        for k in range(versions):
            version = version_name(k)
            accuracy = min(0.999, accuracy + rng.random() * 0.01)
            parent = f"  parent: {version_name(k - 1)}\n" if k else ""
            _write(
                vdir / f"{version}.yaml",
                _VERSION.format(
                    name=name,
                    version=version,
                    team=team,
                    family=family,
                    parent=parent,
                    month=f"2024-{k % 12 + 1:02d}",
                    signature=signature,
                    run=f"{rng.getrandbits(128):032x}",
                    code=f"{rng.getrandbits(160):040x}",
                    snapshot=f"v{k + 1}",
                    accuracy=accuracy,
                    top5=min(0.9999, accuracy + 0.15),
                    f1=accuracy - 0.02,
                    loss=1.5 - accuracy,
                    p50=2 + rng.random() * 8,
                    p95=12 + rng.random() * 10,
                    arch=_ARCHES[(i + k) % 2],
                ),
            )
            _write(
                adir / f"{version}.onnx.dvc",
                _POINTER.format(
                    md5=f"{rng.getrandbits(128):032x}",
                    size=rng.randrange(1 << 20, 200 << 20),
                    file=f"{version}.onnx",
                ),
            )
            ignored.append(f"/{version}.onnx\n")
        _write(adir / ".gitignore", "".join(ignored))
        files += 2 + 2 * versions
    return files


def _git_init(root: Path, env: Mapping[str, str]) -> None:
    run_checked(["git", "init", "-q", "-b", "main", str(root)], cwd=root.parent, env=env)


def generate_modelreg_repo(
    root: Path, models: int, versions: int, env: Mapping[str, str], *, seed: int = SEED
) -> int:
    """Write a modelreg repository and commit it (one commit).

    Args:
        root: folder to create (must not exist or be empty).
        models: number of models.
        versions: versions per model.
        env: environment for git (isolated HOME and config).
        seed: seed of the pseudo-random content.

    Returns:
        Number of files committed.

    Raises:
        BenchmarkError: git fails.
    """
    files = write_modelreg_tree(root, models, versions, seed=seed)
    _git_init(root, env)
    run_checked(["git", "add", "-A"], cwd=root, env=env)
    run_checked(
        [
            "git",
            *_GIT_ID,
            "commit",
            "-q",
            "--no-verify",
            "-m",
            f"Registry of {models} models x {versions} versions",
        ],
        cwd=root,
        env=env,
    )
    return files


class _Stream:
    """A ``git fast-import`` command stream built in memory."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def line(self, text: str) -> None:
        self.parts.append(text.encode() + b"\n")

    def data(self, text: str) -> None:
        raw = text.encode()
        self.parts.append(b"data %d\n" % len(raw))
        self.parts.append(raw + b"\n")

    def blob_inline(self, path: str, text: str) -> None:
        self.line(f"M 100644 inline {path}")
        self.data(text)

    def bytes(self) -> bytes:
        return b"".join(self.parts)


def gto_stream(
    models: int, versions: int, *, seed: int = SEED, layout: GtoLayout = "compact"
) -> tuple[bytes, int]:
    """The fast-import stream of the GTO repository.

    One initial commit, then one commit per version (in release order: every model's
    ``1.0.0``, then every ``1.1.0``, ...) rewriting a DVC pointer (see ``GtoLayout``);
    an annotated registration tag on each, then ``#canary#1`` and ``#production#2``
    tags on each model's latest version, tagger times increasing as gto requires.

    Args:
        models: number of artifacts.
        versions: versions per artifact.
        seed: seed of the pseudo-random digests.
        layout: which pointer files the commits hold.

    Returns:
        The stream and the number of tags it creates.
    """
    rng = random.Random(seed)
    s = _Stream()
    when = _EPOCH
    s.line("commit refs/heads/main")
    s.line("mark :1")
    s.line(f"author {_IDENT} {when} +0000")
    s.line(f"committer {_IDENT} {when} +0000")
    s.data("Model registry layout\n")
    s.blob_inline("README.md", "# Models\n\nVersions and stages are git tags managed by gto.\n")
    s.blob_inline(".gitignore", "/models/*.onnx\n")
    mark = 1
    marks: dict[tuple[int, int], int] = {}
    for k in range(versions):
        for i in range(models):
            mark += 1
            when += 1
            name = model_name(i)
            marks[i, k] = mark
            s.line("commit refs/heads/main")
            s.line(f"mark :{mark}")
            s.line(f"author {_IDENT} {when} +0000")
            s.line(f"committer {_IDENT} {when} +0000")
            s.data(f"{name}: retrain, version {version_name(k)}\n")
            file = f"{name}.onnx" if layout == "per-model" else "model.onnx"
            s.blob_inline(
                f"models/{file}.dvc",
                _POINTER.format(
                    md5=f"{rng.getrandbits(128):032x}",
                    size=rng.randrange(1 << 20, 200 << 20),
                    file=file,
                ),
            )
    tags = 0
    for k in range(versions):
        for i in range(models):
            when += 1
            name, version = model_name(i), f"v{version_name(k)}"
            s.line(f"tag {name}@{version}")
            s.line(f"from :{marks[i, k]}")
            s.line(f"tagger {_IDENT} {when} +0000")
            s.data(f"Registering artifact {name} version {version}")
            tags += 1
    latest = f"v{version_name(versions - 1)}"
    for counter, stage in enumerate(("canary", "production"), start=1):
        for i in range(models):
            when += 1
            name = model_name(i)
            s.line(f"tag {name}#{stage}#{counter}")
            s.line(f"from :{marks[i, versions - 1]}")
            s.line(f"tagger {_IDENT} {when} +0000")
            s.data(f"Assigning stage {stage} to artifact {name} version {latest}")
            tags += 1
    s.line("done")
    return s.bytes(), tags


def generate_gto_repo(
    root: Path,
    models: int,
    versions: int,
    env: Mapping[str, str],
    *,
    seed: int = SEED,
    layout: GtoLayout = "compact",
) -> int:
    """Create the GTO repository with ``git fast-import``, pack its refs, check it out.

    Args:
        root: folder to create.
        models: number of artifacts.
        versions: versions per artifact.
        env: environment for git.
        seed: seed of the pseudo-random content.
        layout: which pointer files the commits hold.

    Returns:
        Number of tags created.

    Raises:
        BenchmarkError: git fails.
    """
    root.mkdir(parents=True, exist_ok=True)
    _git_init(root, env)
    stream, tags = gto_stream(models, versions, seed=seed, layout=layout)
    run_checked(["git", "fast-import", "--quiet", "--done"], cwd=root, env=env, input_bytes=stream)
    run_checked(["git", "pack-refs", "--all"], cwd=root, env=env)
    run_checked(["git", "reset", "-q", "--hard", "main"], cwd=root, env=env)
    return tags


@dataclass(frozen=True)
class GtoTool:
    """The gto used for the comparison."""

    exe: Path
    python: Path
    version: str
    source: str


def ensure_gto(env: Mapping[str, str]) -> GtoTool:
    """Find gto 1.10.1 in this interpreter's environment, or install it into ``.bench``.

    Args:
        env: environment for pip (isolated HOME).

    Returns:
        Paths of its executable and interpreter, and its version.

    Raises:
        BenchmarkError: it cannot be installed.
    """
    bindir = Path(sys.executable).parent
    try:
        here = importlib.metadata.version("gto")
    except importlib.metadata.PackageNotFoundError:
        here = None
    if here == GTO_VERSION and (bindir / "gto").exists():
        return GtoTool(bindir / "gto", Path(sys.executable), here, "benchmark interpreter")
    venv = BENCH_DIR / "gto-venv"
    python, exe = venv / "bin" / "python", venv / "bin" / "gto"
    probe = [str(python), "-c", "import importlib.metadata as m; print(m.version('gto'))"]
    if not exe.exists() or tool_version(probe, env) != GTO_VERSION:
        print(f"installing gto=={GTO_VERSION} into {venv} ...", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        run_checked([sys.executable, "-m", "venv", str(venv)], cwd=REPO_ROOT, env=env)
        run_checked(
            [str(python), "-m", "pip", "install", "-q", f"gto=={GTO_VERSION}"],
            cwd=REPO_ROOT,
            env=env,
            timeout=1800,
        )
    version = tool_version(probe, env)
    if version != GTO_VERSION:
        raise BenchmarkError(f"gto {GTO_VERSION} wanted, {venv} has {version}")
    return GtoTool(exe, python, version, str(venv))


def modelreg_argv() -> list[str]:
    """How to run the modelreg CLI of this interpreter (its console script)."""
    script = Path(sys.executable).parent / "modelreg"
    return [str(script)] if script.exists() else [sys.executable, "-m", "modelreg"]


def validate_report(repo: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """``modelreg validate --json`` in ``repo``.

    Raises:
        BenchmarkError: it exits non-zero (the repository is invalid).
    """
    proc = subprocess.run(
        [*modelreg_argv(), "validate", "--json"],
        cwd=repo,
        env=dict(env),
        capture_output=True,
        check=False,
    )
    try:
        report: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        report = {}
    if proc.returncode != 0 or not report.get("ok"):
        shown = [p.get("text", p) for p in report.get("problems", [])[:20]]
        detail = "\n".join(map(str, shown)) or proc.stderr.decode(errors="replace")[-2000:]
        raise BenchmarkError(
            f"generated repository {repo} is not valid "
            f"(modelreg validate exited {proc.returncode}):\n{detail}"
        )
    return report


_GTO_COUNT: Final = """\
import json, sys
from gto.registry import GitRegistry
with GitRegistry.from_url(sys.argv[1]) as reg:
    state = reg.get_state()
arts = state.get_artifacts()
versions = sum(1 for a in arts.values() for v in a.versions if v.is_registered)
stages = sum(len(v.get_vstages()) for a in arts.values() for v in a.versions)
print(json.dumps({"artifacts": len(arts), "versions": versions, "assignments": stages}))
"""


def gto_counts(gto: GtoTool, repo: Path, env: Mapping[str, str]) -> dict[str, int]:
    """Artifacts, registered versions and stage assignments that gto itself sees.

    Raises:
        BenchmarkError: gto fails on the repository.
    """
    proc = run_checked([str(gto.python), "-c", _GTO_COUNT, str(repo)], cwd=repo, env=env)
    counts: dict[str, int] = json.loads(proc.stdout)
    return counts


def _expect(counts: Mapping[str, int], wanted: Mapping[str, int], what: str) -> None:
    wrong = {k: (counts.get(k), v) for k, v in wanted.items() if counts.get(k) != v}
    if wrong:
        detail = ", ".join(f"{k}: got {got}, expected {exp}" for k, (got, exp) in wrong.items())
        raise BenchmarkError(f"{what}: {detail}")


def prepare(
    params: ScaleParams, base: Path, env: Mapping[str, str], gto: GtoTool
) -> dict[str, Any]:
    """Generate and check both repositories, or reuse them when the stamp matches.

    Args:
        params: sizes and seed.
        base: folder for this size (``modelreg/``, ``gto/``, ``stamp.json``).
        env: isolated environment.
        gto: the gto to check the GTO repository with.

    Returns:
        The stamp: parameters, counts and generation times.

    Raises:
        BenchmarkError: a generated repository fails its check.
    """
    stamp_file = base / "stamp.json"
    wanted = asdict(params)
    try:
        stamp: dict[str, Any] = json.loads(stamp_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        stamp = {}
    if (
        stamp.get("params") == wanted
        and (base / "modelreg" / ".git").is_dir()
        and (base / "gto" / ".git").is_dir()
    ):
        return {**stamp, "reused": True}
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    print(f"generating {params.models} x {params.versions} registries in {base} ...", flush=True)
    t0 = time.perf_counter()
    files = generate_modelreg_repo(
        base / "modelreg", params.models, params.versions, env, seed=params.seed
    )
    t1 = time.perf_counter()
    tags = generate_gto_repo(
        base / "gto",
        params.models,
        params.versions,
        env,
        seed=params.seed,
        layout=params.gto_layout,
    )
    t2 = time.perf_counter()
    report = validate_report(base / "modelreg", env)
    _expect(report, {"models": params.models, "versions": params.total}, "modelreg validate")
    t3 = time.perf_counter()
    counts = gto_counts(gto, base / "gto", env)
    _expect(
        counts,
        {"artifacts": params.models, "versions": params.total, "assignments": 2 * params.models},
        "gto state",
    )
    t4 = time.perf_counter()
    stamp = {
        "params": wanted,
        "modelreg": {"files": files, "versions": report["versions"], "models": report["models"]},
        "gto": {"tags": tags, **counts, "gto_version": gto.version},
        "generation_s": {
            "modelreg_repo": round(t1 - t0, 3),
            "gto_repo": round(t2 - t1, 3),
            "check_modelreg": round(t3 - t2, 3),
            "check_gto": round(t4 - t3, 3),
        },
    }
    stamp_file.write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    return {**stamp, "reused": False}


def _contains(*needles: str) -> Callable[[bytes], None]:
    def check(out: bytes) -> None:
        text = out.decode(errors="replace")
        missing = [n for n in needles if n not in text]
        if missing:
            raise BenchmarkError(f"output lacks {missing}: {text[:500]!r}")

    return check


def _lines(expected: int) -> Callable[[bytes], None]:
    def check(out: bytes) -> None:
        got = len(out.splitlines())
        if got != expected:
            raise BenchmarkError(f"expected {expected} output lines, got {got}")

    return check


def _goal(name: str, value: float, target: float, *, at_most: bool, quick: bool) -> dict[str, Any]:
    passed = value <= target if at_most else value >= target
    return {
        "name": name,
        "value": round(value, 4),
        "target": target,
        "comparison": "<=" if at_most else ">=",
        "passed": passed,
        "indicative": quick,
    }


def run(quick: bool) -> dict[str, Any]:
    """Generate (or reuse) the registries and time modelreg against gto on them.

    Args:
        quick: 100 x 10 versions instead of 1,000 x 10; goals are then indicative.

    Returns:
        JSON-ready figures: measurements, ratios, goals, generation and environment.

    Raises:
        BenchmarkError: generation, a check or a timed command failed.
    """
    models, versions = QUICK if quick else FULL
    params = ScaleParams(models, versions)
    env = isolated_env(BENCH_DIR / "home")
    gto = ensure_gto(env)
    base = BENCH_DIR / NAME / f"{models}x{versions}"
    stamp = prepare(params, base, env, gto)
    mr_repo, gto_repo = base / "modelreg", base / "gto"
    modelreg = modelreg_argv()
    total = params.total
    last = model_name(models - 1)
    valid = _contains(f"{versions * models} versions")

    print(f"timing on {total:,} versions ...", flush=True)
    load_before = load_average()
    if warning := busy_warning():
        print(warning, flush=True)
    commands = {
        "modelreg validate": Command([*modelreg, "validate"], mr_repo, check_output=valid),
        "modelreg validate --jobs 1": Command(
            [*modelreg, "validate", "--jobs", "1"], mr_repo, check_output=valid
        ),
        "modelreg status": Command([*modelreg, "status"], mr_repo, check_output=_lines(total + 1)),
        "gto show": Command(
            [str(gto.exe), "show"],
            gto_repo,
            check_output=_contains(model_name(0), last),
            stop_after_s=GTO_SINGLE_RUN_AFTER_S,
        ),
    }
    measurements = time_interleaved(commands, env=env, runs=RUNS)
    gto_s = measurements["gto show"].median_s
    validate_s = measurements["modelreg validate"].median_s
    status_s = measurements["modelreg status"].median_s
    ratios = {
        "gto_show_s / modelreg_validate_s": gto_s / validate_s,
        "gto_show_s / modelreg_validate_jobs1_s": gto_s
        / measurements["modelreg validate --jobs 1"].median_s,
        "gto_show_s / modelreg_status_s": gto_s / status_s,
    }
    scale = f"at {total:,} versions" + (" (quick: goals are set for 10,000)" if quick else "")
    goals = [
        _goal(
            f"modelreg validate <= {GOAL_SECONDS:g} s {scale}",
            validate_s,
            GOAL_SECONDS,
            at_most=True,
            quick=quick,
        ),
        _goal(
            f"modelreg status <= {GOAL_SECONDS:g} s {scale}",
            status_s,
            GOAL_SECONDS,
            at_most=True,
            quick=quick,
        ),
        _goal(
            f"modelreg validate >= {GOAL_SPEEDUP:g}x faster than gto show",
            ratios["gto_show_s / modelreg_validate_s"],
            GOAL_SPEEDUP,
            at_most=False,
            quick=quick,
        ),
        _goal(
            f"modelreg status >= {GOAL_SPEEDUP:g}x faster than gto show",
            ratios["gto_show_s / modelreg_status_s"],
            GOAL_SPEEDUP,
            at_most=False,
            quick=quick,
        ),
    ]
    machine = machine_info()
    load_after = machine.pop("load_average")
    environment = {
        **machine,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "modelreg": tool_version([*modelreg, "--version"], env),
        "gto": gto.version,
        "gto_source": gto.source,
    }
    return {
        "name": NAME,
        "quick": quick,
        "summary": f"{models:,} models x {versions} versions = {total:,} versions",
        "params": asdict(params),
        "versions": {"modelreg": stamp["modelreg"]["versions"], "gto": stamp["gto"]["versions"]},
        "generation": {
            "reused": stamp["reused"],
            "seconds": stamp["generation_s"],
            "modelreg_files": stamp["modelreg"]["files"],
            "gto_tags": stamp["gto"]["tags"],
            "path": str(base),
        },
        "measurements": {k: v.to_json() for k, v in measurements.items()},
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "goals": goals,
        "reference": {
            "spec_gto_show_10000_versions_s": SPEC_GTO_SHOW_10K_S,
            "goal_versions": GOAL_VERSIONS,
        },
        "environment": environment,
    }
