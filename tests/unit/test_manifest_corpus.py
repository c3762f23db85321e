"""A corpus of bad manifests: each gets exact, positioned one-line errors and never a crash.

Every case is one input file in ``tests/data/bad_manifests/<case>.yaml`` (or, when it would
be too big or too odd to commit, written by a function below) placed into its own model
folder of a small repository beside valid companions, so that cases never interfere.
``expected.txt`` holds, per case, the exact lines ``modelreg validate`` prints.  Regenerate
it with ``MODELREG_REGEN_GOLDEN=1 pytest tests/unit/test_manifest_corpus.py`` and review the
diff.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from registry.checks import validate_paths
from registry.errors import ManifestError, Problem
from registry.loader import load_manifest
from registry.repository import load_repository
from registry.yamlsrc import DEFAULT_LIMITS, read_yaml

DATA = Path(__file__).resolve().parents[1] / "data" / "bad_manifests"
GOLDEN = DATA / "expected.txt"
REGEN = os.environ.get("MODELREG_REGEN_GOLDEN") == "1"

MODEL = "manifests/{case}/model.yaml"
VERSION = "manifests/{case}/versions/1.0.0.yaml"
POINTER = "models/{case}/1.0.0.onnx.dvc"

CONFIG = "apiVersion: modelreg/v1\nkind: RegistryConfig\nmanifests: manifests\nartifacts: models\n"


def model_text(name: str) -> str:
    """A valid RegisteredModel that allows the targets ``cpu`` and ``jetson``."""
    return (
        "apiVersion: modelreg/v1\nkind: RegisteredModel\n"
        f"metadata:\n  name: {name}\nspec:\n  targets: [cpu, jetson]\n"
    )


def version_text(name: str, version: str) -> str:
    """A valid ModelVersion with its artifact under ``models/<name>/``."""
    return (
        "apiVersion: modelreg/v1\nkind: ModelVersion\n"
        f"metadata:\n  name: {name}\n  version: {version}\n"
        f"spec:\n  artifact:\n    path: models/{name}/{version}.onnx\n"
    )


def pointer_text(version: str) -> str:
    """A valid DVC pointer for ``<version>.onnx``."""
    return (
        f"outs:\n- md5: {'0123456789abcdef' * 2}\n  size: 123\n  hash: md5\n"
        f"  path: {version}.onnx\n"
    )


def _huge_file(dest: Path) -> None:
    # 50 MiB, sparse: the loader must refuse it from its size alone.
    with dest.open("wb") as fh:
        fh.write(b"apiVersion: modelreg/v1\n")
        fh.truncate(50 * 1024 * 1024)


def _deep_flow(dest: Path) -> None:
    depth = 100_000
    dest.write_text(
        version_text("deep-flow", "1.0.0").split("spec:")[0]
        + "spec:\n  artifact: "
        + "[" * depth
        + "]" * depth
        + "\n",
        encoding="utf-8",
    )


def _directory(dest: Path) -> None:
    dest.mkdir(parents=True)


@dataclass(frozen=True)
class Case:
    """Where a case's input goes, what surrounds it, and which CLI run covers it.

    Attributes:
        group: cases of one group share a repository and one ``modelreg validate`` run.
        dest: repository path of the input (``{case}`` is the case name).
        omit: valid companions (MODEL, VERSION, POINTER) that are left out.
        extra_versions: further valid versions (with pointers) of the case's model.
        make: writes the input at ``dest`` instead of copying the data file.
    """

    group: str
    dest: str
    omit: tuple[str, ...] = ()
    extra_versions: tuple[str, ...] = ()
    make: Callable[[Path], None] | None = None

    @property
    def standalone(self) -> bool:
        """Whether the input file alone explains its errors (no cross-references)."""
        return (
            self.group in ("syntax", "refused", "tags", "envelope", "schema")
            and self.dest in (MODEL, VERSION)
            and self.make is None
        )


CASES: dict[str, Case] = {
    # malformed YAML
    "yaml-unclosed-flow": Case("syntax", VERSION),
    "yaml-mismatched-bracket": Case("syntax", VERSION),
    "yaml-unclosed-quote": Case("syntax", VERSION),
    "yaml-mapping-in-scalar": Case("syntax", VERSION),
    "yaml-bad-dedent": Case("syntax", VERSION),
    "yaml-sequence-in-mapping": Case("syntax", VERSION),
    "yaml-stray-brace": Case("syntax", MODEL),
    "tab-indent": Case("syntax", VERSION),
    "control-character": Case("syntax", VERSION),
    "non-utf8": Case("syntax", VERSION),
    "unicode-line-separator": Case("syntax", VERSION),
    "empty-file": Case("syntax", VERSION),
    "comments-only": Case("syntax", MODEL),
    "multi-document": Case("syntax", VERSION),
    "duplicate-key": Case("syntax", VERSION),
    "deep-block-nesting": Case("syntax", VERSION),
    "deep-flow": Case("syntax", VERSION, make=_deep_flow),
    "huge-file": Case("syntax", VERSION, make=_huge_file),
    # YAML features manifests refuse
    "billion-laughs": Case("refused", VERSION),
    "merge-key": Case("refused", VERSION),
    "non-string-key": Case("refused", VERSION),
    # tags
    "python-object-tag": Case("tags", VERSION),
    "local-tag": Case("tags", VERSION),
    "explicit-int-tag": Case("tags", MODEL),
    "explicit-bool-tag": Case("tags", VERSION),
    # apiVersion and kind
    "top-level-list": Case("envelope", VERSION),
    "wrong-api-version": Case("envelope", VERSION),
    "wrong-kind": Case("envelope", VERSION),
    "kind-is-mapping": Case("envelope", VERSION),
    "kind-mismatch-path": Case("envelope", MODEL),
    # schema
    "invalid-model-name": Case("schema", MODEL),
    "string-for-int": Case("schema", MODEL),
    "number-for-version": Case("schema", VERSION),
    "bool-for-string": Case("schema", MODEL),
    "unknown-top-level-key": Case("schema", VERSION),
    "unknown-nested-key": Case("schema", VERSION),
    "unknown-target-key": Case("schema", VERSION),
    "unknown-engine": Case("schema", VERSION),
    "key-with-newline": Case("schema", VERSION),
    "bad-semver": Case("schema", VERSION),
    "bad-semver-parent": Case("schema", VERSION),
    "missing-artifact": Case("schema", VERSION),
    "artifact-path-escape": Case("schema", VERSION),
    "rollout-over-100": Case("schema", MODEL),
    "rollout-negative": Case("schema", MODEL),
    "rollout-waves-not-increasing": Case("schema", MODEL),
    "rollout-percent-not-a-wave": Case("schema", MODEL),
    "rollout-wave-bad-soak": Case("schema", MODEL),
    "rollout-last-wave-soak": Case("schema", MODEL),
    "rollout-stop-without-waves": Case("schema", MODEL),
    "rollout-stop-share-over-1": Case("schema", MODEL),
    "duplicate-target": Case("schema", VERSION),
    # cross-references
    "name-mismatch-folder": Case("xref", MODEL),
    "version-name-mismatch": Case("xref", VERSION),
    "dangling-parent": Case("xref", VERSION),
    "parent-newer": Case("xref", VERSION, extra_versions=("1.1.0",)),
    "channel-undeclared": Case("xref", MODEL),
    "channel-not-in-order": Case("xref", MODEL),
    "target-not-allowed": Case("xref", VERSION),
    # DVC pointers
    "missing-dvc-pointer": Case("dvc", VERSION, omit=(POINTER,)),
    "malformed-dvc-pointer": Case("dvc", POINTER),
    "dvc-pointer-wrong-file": Case("dvc", POINTER),
    "dvc-pointer-not-yaml": Case("dvc", POINTER),
    # repository layout
    "dir-as-file": Case("layout", MODEL, make=_directory),
    "yml-extension": Case("layout", "manifests/{case}/versions/1.0.0.yml", omit=(VERSION,)),
    "versions-without-model": Case("layout", VERSION, omit=(MODEL,)),
    "stray-manifest": Case("layout", "manifests/{case}/1.0.0.yaml", omit=(VERSION,)),
}
GROUPS = sorted({c.group for c in CASES.values()})


def build_case(root: Path, name: str) -> None:
    """Add case ``name`` (its input and valid companions) to the repository at ``root``."""
    case = CASES[name]
    config = root / "modelreg.yaml"
    if not config.exists():
        root.mkdir(parents=True, exist_ok=True)
        config.write_text(CONFIG, encoding="utf-8")
    companions = {MODEL: model_text(name), VERSION: version_text(name, "1.0.0")}
    companions[POINTER] = pointer_text("1.0.0")
    for v in case.extra_versions:
        companions[f"manifests/{{case}}/versions/{v}.yaml"] = version_text(name, v)
        companions[f"models/{{case}}/{v}.onnx.dvc"] = pointer_text(v)
    for rel, text in companions.items():
        if rel != case.dest and rel not in case.omit:
            path = root / rel.format(case=name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    dest = root / case.dest.format(case=name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if case.make is not None:
        case.make(dest)
    else:
        shutil.copyfile(DATA / f"{name}.yaml", dest)


def problems_in(root: Path) -> list[Problem]:
    """What ``modelreg validate`` reports for the repository at ``root``, in its order."""
    with contextlib.chdir(root):
        repo = load_repository(root, jobs=1)
        return sorted(validate_paths(repo), key=Problem.sort_key)


def read_golden() -> dict[str, list[str]]:
    """``expected.txt``: ``[case]`` headers, each followed by its lines."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in GOLDEN.read_text(encoding="utf-8").splitlines():
        if line.startswith("[") and line.endswith("]"):
            current = out.setdefault(line[1:-1], [])
        elif line and not line.startswith("#"):
            assert current is not None, f"line before the first [case] header: {line!r}"
            current.append(line)
    return out


def write_golden(expected: dict[str, list[str]]) -> None:
    """Rewrite ``expected.txt`` in case order."""
    parts = [
        (
            "# Exact lines `modelreg validate` prints for each case of tests/data/bad_manifests.\n"
            "# Regenerate: MODELREG_REGEN_GOLDEN=1 pytest tests/unit/test_manifest_corpus.py\n"
        )
    ]
    for name in CASES:
        body = "".join(f"{line}\n" for line in expected.get(name, []))
        parts.append(f"\n[{name}]\n{body}")
    GOLDEN.write_text("".join(parts), encoding="utf-8")


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """The expected lines per case; recomputed and rewritten under MODELREG_REGEN_GOLDEN."""
    expected = read_golden() if GOLDEN.exists() else {}
    if REGEN:
        for name in CASES:
            root = tmp_path_factory.mktemp(name)
            build_case(root, name)
            try:
                expected[name] = [str(p) for p in problems_in(root)]
            except Exception as e:  # noqa: BLE001 - a crashing case keeps its hand-written lines
                print(f"regen: kept the old lines of {name}: {type(e).__name__}: {e}")
        write_golden(expected)
    return expected


def test_corpus_files_match_cases(golden: dict[str, list[str]]) -> None:
    files = {p.stem for p in DATA.glob("*.yaml")}
    assert files == {name for name, case in CASES.items() if case.make is None}
    assert list(golden) == list(CASES)
    assert all(golden[name] for name in CASES), "every case must produce at least one line"


@pytest.mark.parametrize("name", list(CASES))
def test_case_lines(name: str, tmp_path: Path, golden: dict[str, list[str]]) -> None:
    build_case(tmp_path, name)
    assert [str(p) for p in problems_in(tmp_path)] == golden[name]


def _line_count(path: Path) -> int:
    raw = path.read_bytes()
    return raw.count(b"\n") + (1 if raw and not raw.endswith(b"\n") else 0)


@pytest.mark.parametrize("name", list(CASES))
def test_case_errors_point_into_the_file(name: str, tmp_path: Path) -> None:
    build_case(tmp_path, name)
    problems = problems_in(tmp_path)
    assert problems
    for problem in problems:
        parts = Path(problem.file).parts
        assert not Path(problem.file).is_absolute()
        assert parts[:2] in (("manifests", name), ("models", name)), str(problem)
        assert "\n" not in str(problem), f"one problem, several lines: {str(problem)!r}"
        assert "\r" not in str(problem), f"one problem, several lines: {str(problem)!r}"
        if problem.line is None:
            continue
        path = tmp_path / problem.file
        lines = max(1, _line_count(path))
        assert 1 <= problem.line <= lines, f"{problem} (the file has {lines} lines)"
        assert problem.col is None or problem.col >= 1, str(problem)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.standalone])
def test_case_standalone_load_manifest(name: str, golden: dict[str, list[str]]) -> None:
    """The schema layer alone, on the committed file, reports the same lines."""
    dest = CASES[name].dest
    kind = "RegisteredModel" if dest == MODEL else "ModelVersion"
    with pytest.raises(ManifestError) as info:
        load_manifest(read_yaml(DATA / f"{name}.yaml", dest.format(case=name)), kind)
    assert [str(p) for p in info.value.problems] == golden[name]


def test_huge_file_is_refused_by_size(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    _huge_file(path)
    with pytest.raises(ManifestError) as info:
        read_yaml(path, "big.yaml")
    (problem,) = info.value.problems
    size = 50 * 1024 * 1024
    assert str(problem) == (
        f"big.yaml:1:1: file is {size} bytes; manifests are limited to {DEFAULT_LIMITS.max_bytes}"
    )


def run_cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m modelreg validate ARGS`` in ``root``, as a user would run it."""
    env = {k: v for k, v in os.environ.items() if k != "MODELREG_TRACEBACK"}
    return subprocess.run(
        [sys.executable, "-m", "modelreg", "validate", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _assert_cli_lines(result: subprocess.CompletedProcess[str], expected: Iterable[str]) -> None:
    wanted = list(expected)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert result.stdout == ""
    printed = result.stderr.splitlines()
    missing = [line for line in wanted if line not in printed]
    assert not missing, f"not printed: {missing}\nstderr:\n{result.stderr}"
    assert sorted(printed) == sorted(wanted)
    assert result.returncode == 1, result.stderr


@pytest.mark.parametrize("group", GROUPS)
def test_cli_prints_every_line(group: str, tmp_path: Path, golden: dict[str, list[str]]) -> None:
    names = [n for n, c in CASES.items() if c.group == group]
    for name in names:
        build_case(tmp_path, name)
    result = run_cli(tmp_path)
    _assert_cli_lines(result, (line for n in names for line in golden[n]))


def test_cli_reports_only_the_paths_asked_for(tmp_path: Path, golden: dict[str, list[str]]) -> None:
    names = [n for n, c in CASES.items() if c.group == "xref"]
    for name in names:
        build_case(tmp_path, name)
    asked = ["dangling-parent", "channel-undeclared"]
    result = run_cli(tmp_path, *(f"manifests/{n}" for n in asked))
    _assert_cli_lines(result, (line for n in asked for line in golden[n]))
