"""The hash locks the workflows install modelreg's dependencies from: strict, complete.

``scripts/lock_workflow_requirements.py`` writes them from pip's resolver; these tests
hold the result to the format pip's hash-checking mode needs and to pyproject.toml.
"""

from __future__ import annotations

import re
import tomllib

import pytest
from packaging.requirements import Requirement

from modelreg import __version__
from pipelines.authoring.requirements_lock import (
    BUILD_LOCK_FILE,
    LOCK_FILE,
    LOCK_FILES,
    Pin,
    lock_problems,
    normalized,
    parse_lock,
    render_lock,
)
from tests.conftest import REPO_ROOT

TEMPLATES = REPO_ROOT / "pipelines" / "templates"
# What pip's hash-checking mode accepts and nothing looser, written out apart from the
# module's own parser: a requirement line, then its hashes on continuation lines.
_REQUIREMENT = re.compile(r"^[a-z0-9][a-z0-9.-]*==[A-Za-z0-9.+!]+ \\$")
_HASH = re.compile(r"^    --hash=sha256:[0-9a-f]{64}( \\)?$")


def _pins(lock: str) -> dict[str, Pin]:
    return {p.name: p for p in parse_lock((TEMPLATES / lock.rsplit("/", 1)[1]).read_text())}


@pytest.mark.parametrize("lock", LOCK_FILES)
def test_every_line_is_pinned_with_a_sha256(lock: str) -> None:
    text = (TEMPLATES / lock.rsplit("/", 1)[1]).read_text()
    assert lock_problems(text) == []
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines, lock
    expect_hash = False
    for line in lines:
        if expect_hash:
            assert _HASH.match(line), line
            expect_hash = line.endswith("\\")
        else:
            assert _REQUIREMENT.match(line), line  # a pin is followed by its hash(es)
            expect_hash = True
    assert not expect_hash, "the last requirement has no hash"


def test_modelreg_is_pinned_to_this_version() -> None:
    """The workflows pin modelreg by version (see test_workflows); the locks name that
    version and cannot hold modelreg's own hash: they ship inside its wheel."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__
    assert "modelreg" not in _pins(LOCK_FILE)
    header = (TEMPLATES / "modelreg-requirements.txt").read_text().split("\n\n")[0]
    assert f"modelreg=={__version__} itself with --no-deps" in header.replace("\n# ", " ")


def test_the_lock_satisfies_pyproject() -> None:
    """Every requirement of modelreg and its ci extra, as the runner (Linux x86_64,
    CPython 3.11) evaluates the markers, is locked at a version it allows; `pip check`
    in the workflows covers the dependencies of those in turn."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    pins = _pins(LOCK_FILE)
    # Marker.evaluate overrides this machine's environment with these
    runner = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
              "python_version": "3.11", "implementation_name": "cpython"}  # fmt: skip
    wanted = [*project["dependencies"], *project["optional-dependencies"]["ci"]]
    for text in wanted:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(runner):
            continue
        name = normalized(req.name)
        assert name in pins, f"{text}: not in {LOCK_FILE}"
        assert req.specifier.contains(pins[name].version, prereleases=True), (text, pins[name])


def test_the_build_lock_holds_a_backend_that_needs_no_wheel_package() -> None:
    """setuptools 70.1 and later build wheels on their own: the runner's Python 3.11
    has setuptools 65.5 and no `wheel`, and --no-build-isolation uses what is installed."""
    pins = _pins(BUILD_LOCK_FILE)
    assert set(pins) == {"setuptools"}
    major, minor = (int(x) for x in pins["setuptools"].version.split(".")[:2])
    assert (major, minor) >= (70, 1)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "click>=8.1 \\\n    --hash=sha256:" + "a" * 64 + "\n",
            "'click>=8.1' is not name==version",
        ),
        ("click==8.1.7\n", "click has no --hash=sha256:"),
        ("click==8.1.7 --hash=sha256:abc\n", "is not --hash=sha256:<64 hex>"),
        ("click==8.1.7 --hash=md5:" + "a" * 32 + "\n", "is not --hash=sha256:<64 hex>"),
        ("click==8.1.7 --hash=sha256:" + "A" * 64 + "\n", "is not --hash=sha256:<64 hex>"),
        ("-e .\n", "'-e' is not name==version"),
        ("--index-url https://evil.example/simple\n", "is not name==version"),
        ("click @ https://x.example/click.whl\n", "'click' is not name==version"),
        ("click[extra]==8.1.7 --hash=sha256:" + "a" * 64 + "\n", "is not name==version"),
        (
            f"click==8.1.7 --hash=sha256:{'a' * 64}\nClick==8.1.7 --hash=sha256:{'b' * 64}\n",
            "click is pinned twice",
        ),
        ("# only a comment\n", "no requirement is pinned"),
    ],
)
def test_a_loose_lock_is_refused(text: str, problem: str) -> None:
    problems = lock_problems(text)
    assert any(problem in p for p in problems), problems
    with pytest.raises(ValueError, match=r"line|no requirement"):
        parse_lock(text)


def test_render_and_parse_round_trip() -> None:
    pins = [Pin("ruamel.yaml", "0.18.6", ("b" * 64, "a" * 64)), Pin("Click", "8.1.7", ("c" * 64,))]
    text = render_lock(pins, "a header\nof two lines")
    assert text.startswith("# a header\n# of two lines\nclick==8.1.7 \\\n")
    assert lock_problems(text) == []
    assert parse_lock(text) == [
        Pin("click", "8.1.7", ("c" * 64,)),
        Pin("ruamel-yaml", "0.18.6", ("a" * 64, "b" * 64)),
    ]
