"""The two repositories of the ``registry_scale`` benchmark: what they hold, how they are written.

Both hold the same registry, M models x V versions:

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

Reusing them and checking them is ``benchmarks._scale_fixtures``'s job.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from benchmarks._util import run_checked

GENERATOR_VERSION: Final = 1
"""Bump when the generated content changes, so stale fixtures are rebuilt."""
SEED: Final = 20240501

GtoLayout = Literal["compact", "per-model"]
"""What each commit of the GTO repository holds.

``compact``: one DVC pointer, ``models/model.onnx.dvc``, rewritten by every commit (a
three-file tree).  ``per-model``: ``models/<name>.onnx.dvc`` per model, so the tree
grows to one file per model.  gto builds an in-memory tree of each version's commit,
so its cost grows with the tree: ``compact`` is gto's best case and the default, and
reproduces the reference figure (docs/guide/benchmarks.md).
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
