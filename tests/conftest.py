"""Shared fixtures: every test runs with its own HOME and git identity (like gto's suite)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from modelreg.cli.main import main

REPO_ROOT = Path(__file__).resolve().parents[1]


# `modelreg init` asks the package index for the hashes of modelreg's own release; the
# tests never leave loopback (a closed port: refused at once), whatever a fixture runs.
os.environ["MODELREG_INDEX_URL"] = "http://127.0.0.1:9"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--dist loadgroup`` as xdist means it, under pytest 9: xdist names a test's
    ``xdist_group`` in its id through ``item._nodeid``, which pytest 9 no longer reads,
    so each group was spread over the workers (the team services and the fleet
    simulation started in both).  In a worker, name it in the id pytest 9 reads."""
    if not getattr(config.option, "loadgroup", False):
        return
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # an older pytest: xdist's own renaming works
        return
    for item in items:
        marks = item.iter_markers("xdist_group")
        groups = sorted(
            {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks}
        )
        if groups and "@" not in item.nodeid and hasattr(item, "_id"):
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(groups)}")


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private HOME and git config so tests never read or write the developer's."""
    home = tmp_path_factory.mktemp("home")
    gitconfig = home / ".gitconfig"
    gitconfig.write_text(
        "[user]\n\tname = modelreg tests\n\temail = tests@modelreg.invalid\n"
        "[init]\n\tdefaultBranch = main\n[commit]\n\tgpgsign = false\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(gitconfig))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    monkeypatch.setenv("DVC_SITE_CACHE_DIR", str(home / ".dvc-site"))
    for var in (
        "MLFLOW_TRACKING_URI",
        "GITHUB_ACTIONS",
        # progress lines on stderr only where a test asks for them (CI=true on a runner)
        "CI",
        "MODELREG_PROGRESS",
        "MODELREG_TRACEBACK",
        "GIT_DIR",
        "GIT_WORK_TREE",
    ):
        monkeypatch.delenv(var, raising=False)
    # a run of the suite on GitHub Actions: no test reads the runner's own run, token or
    # API (a release looks its pull request up on GitHub; tests use a fake on loopback)
    for var in [v for v in os.environ if v.startswith(("GITHUB_", "RUNNER_"))]:
        monkeypatch.delenv(var, raising=False)
    return home


@dataclass(frozen=True)
class Result:
    """Outcome of one CLI invocation."""

    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run ``modelreg ARGS`` in-process in a given directory, returning code/out/err."""

    def run(*args: str, cwd: Path) -> Result:
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        try:
            main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        else:  # pragma: no cover - main always exits
            code = 0
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def run_modelreg(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Result:
    """Run the real ``modelreg`` entry point in a subprocess."""
    proc = subprocess.run(
        [sys.executable, "-m", "modelreg", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
        timeout=300,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def git(cwd: Path, *args: str) -> str:
    """Run git in ``cwd`` and return stdout (raises on failure)."""
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture(scope="session")
def example_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small example models and their golden inputs, built once per session."""
    from modelreg.examples import write_examples

    out = tmp_path_factory.mktemp("examples")
    write_examples(out, size="small")
    return out


@pytest.fixture(scope="session")
def external_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small mlp versions stored with ONNX external data, as exporters name them:
    ``<version>/model.onnx`` + ``<version>/model.onnx.data`` (the same names for every
    version, so ``version add`` must rename them)."""
    from modelreg.examples import EXAMPLE_VERSIONS, build_model, save_external

    out = tmp_path_factory.mktemp("external")
    for version in EXAMPLE_VERSIONS["mlp"]:
        (out / version).mkdir()
        save_external(build_model("mlp", version), out / version / "model.onnx")
    return out


GOLDEN_DIR = Path(__file__).parent / "golden"
REGEN_ENV = "MODELREG_REGEN_GOLDEN"


def assert_golden(name: str, text: str) -> None:
    """Compare ``text`` with ``tests/golden/NAME``; ``MODELREG_REGEN_GOLDEN=1`` rewrites it."""
    path = GOLDEN_DIR / name
    if os.environ.get(REGEN_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"missing golden file {path}; run with {REGEN_ENV}=1 and review it"
    assert text == path.read_text(encoding="utf-8")


@contextlib.contextmanager
def quiet_mlflow() -> Iterator[Any]:
    """MLflow for a test's own look at a store, its internal warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"mlflow\.")
        import mlflow

        yield mlflow


@contextlib.contextmanager
def session_cli(base: Path) -> Iterator[Callable[..., None]]:
    """``run(*ARGS, cwd=...)``: ``modelreg ARGS`` in-process for a session fixture that
    builds a repository once for many tests to copy, with a HOME and git identity of
    its own under ``base`` (as :func:`isolated_env` gives each test); asserts success."""
    mp = pytest.MonkeyPatch()
    try:
        home = base / "home"
        home.mkdir()
        (home / ".gitconfig").write_text(
            "[user]\n\tname = modelreg tests\n\temail = tests@modelreg.invalid\n"
            "[init]\n\tdefaultBranch = main\n[commit]\n\tgpgsign = false\n"
        )
        mp.setenv("HOME", str(home))
        mp.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
        mp.setenv("GIT_CONFIG_NOSYSTEM", "1")
        mp.setenv("DVC_NO_ANALYTICS", "1")
        mp.setenv("DVC_SITE_CACHE_DIR", str(home / ".dvc-site"))
        for var in (
            "MLFLOW_TRACKING_URI",
            "CI",
            "MODELREG_PROGRESS",
            "GITHUB_EVENT_PATH",
            "GITHUB_REF",
            "GITHUB_OUTPUT",
            "GITHUB_STEP_SUMMARY",
        ):
            mp.delenv(var, raising=False)

        def run(*args: str, cwd: Path) -> None:
            mp.chdir(cwd)
            try:
                main(list(args))
            except SystemExit as e:
                if e.code not in (0, None):
                    raise AssertionError(f"modelreg {' '.join(args)} failed") from None

        yield run
    finally:
        mp.undo()


@pytest.fixture(scope="session")
def _released_template(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> Path:
    """mlp 1.0.0 (with goldens and an ORT target) released once by ``ci release``."""
    base = tmp_path_factory.mktemp("released")
    root = base / "fleet"
    with session_cli(base) as run:
        run("init", str(root), cwd=base)
        run("model", "add", "mlp", "--channel-order", "canary,production", cwd=root)
        run("version", "add", "mlp", "1.0.0", "--artifact", str(example_models / "mlp/1.0.0.onnx"),
            "--golden-inputs", str(example_models / "mlp/1.0.0.inputs.npz"),
            "--target", "cpu=onnxruntime", cwd=root)  # fmt: skip
        run("promote", "mlp", "1.0.0", "-c", "canary", cwd=root)
        git(root, "add", "-A")
        git(root, "commit", "-qm", "mlp 1.0.0")
        run("ci", "release", cwd=root)
        # The runner's local state is not part of what a fresh CI checkout has.
        shutil.rmtree(root / ".modelreg/build", ignore_errors=True)
        shutil.rmtree(root / ".modelreg/ci", ignore_errors=True)
    return root


# --- an S3-compatible server (moto) on loopback -------------------------------------

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",  # moto accepts any
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from tests.services import s3_server

    with s3_server("fleet") as url:
        for key, value in CREDENTIALS.items():
            monkeypatch.setenv(key, value)
        import boto3

        s3 = boto3.client("s3", endpoint_url=url)  # the bucket is made by s3_server
        # Devices read the TUF targets anonymously (as through a CDN); the DVC store
        # beside them stays private.
        public = {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                  "Resource": "arn:aws:s3:::fleet/store/modelreg/*"}  # fmt: skip
        s3.put_bucket_policy(
            Bucket="fleet", Policy=json.dumps({"Version": "2012-10-17", "Statement": [public]})
        )
        yield url
