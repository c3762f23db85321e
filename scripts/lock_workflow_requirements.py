#!/usr/bin/env python3
"""Lock the dependencies the workflows install: every one pinned to a file by SHA-256.

Usage (part of the release process, before the wheel is built; ``make lock``)::

    python scripts/lock_workflow_requirements.py [--index-url URL]

and, for a repository whose DVC remote is on S3 (the workflows then need dvc-s3)::

    python scripts/lock_workflow_requirements.py --extras s3 --out PATH/TO/fleet-models

pip's own resolver (``pip install --dry-run --report``, nothing is installed or
downloaded but metadata) resolves ``modelreg[ci]`` from this source tree against the
index; the report names, for each distribution, the file pip chose and the SHA-256 the
index gives for it. Written:

* ``pipelines/templates/modelreg-requirements.txt``, which ``modelreg init`` copies to
  ``.github/modelreg-requirements.txt``, and that copy in this repository;
* ``modelreg-build-requirements.txt`` beside it: setuptools, the build backend of the
  lock's one sdist (see ``pipelines/requirements_lock.py``);
* this repository's ``.github/modelreg-self-requirements.txt``, the pin of modelreg
  itself at the version in ``pyproject.toml`` (by version: ``modelreg init`` writes a
  repository's own with the hashes the index lists for the release).

With ``--out``, only the two locks, into ``OUT/.github/`` (a repository ``modelreg
init`` made).

Environment markers and wheel tags are those of the interpreter that runs this, so it
must be what the workflows run: CPython 3.11 on Linux x86_64 (``actions/setup-python``
with ``python-version: "3.11"`` on ``ubuntu-latest``); it refuses anything else. Only
the index counts: pip's configuration files, find-links folders and extra indexes of
this machine are ignored (a file from a local folder is not one the runner can fetch).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from pipelines.authoring.requirements_lock import (
    BUILD_LOCK_FILE,
    LOCK_FILE,
    SELF_LOCK_FILE,
    Pin,
    lock_problems,
    render_lock,
    render_self_lock,
)

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "pipelines" / "templates"
# ubuntu-22.04, the oldest runner image in service, has glibc 2.35: a wheel built for a
# newer glibc would not install there
MAX_GLIBC = (2, 35)
# setuptools builds wheels without the `wheel` package from 70.1 on (the runner's
# Python 3.11 comes with setuptools 65.5 and no `wheel`)
_BUILD_BACKEND = "setuptools>=70.1"


def _check_platform() -> None:
    here = (sys.implementation.name, sys.version_info[:2], sys.platform, platform.machine())
    if here != ("cpython", (3, 11), "linux", "x86_64"):
        sys.exit(f"lock: run this with CPython 3.11 on Linux x86_64, as the workflows; not {here}")


def _resolve(index_url: str, requirement: str) -> list[dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
    env["PIP_CONFIG_FILE"] = os.devnull  # no config file: no local wheels, no constraints
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
             "--quiet", "--disable-pip-version-check", "--index-url", index_url,
             "--report", str(report), requirement],
            check=True, env=env,
        )  # fmt: skip
        data = json.loads(report.read_text(encoding="utf-8"))
    return list(data["install"])


def _pins(resolved: list[dict[str, object]]) -> list[Pin]:
    pins = []
    for item in resolved:
        meta, info = item["metadata"], item["download_info"]
        if not isinstance(meta, dict) or not isinstance(info, dict):
            sys.exit("lock: pip's installation report is not in the format it documents")
        name, version = str(meta["name"]), str(meta["version"])
        if name == "modelreg":
            continue  # this tree: pinned by version in the workflows (see requirements_lock)
        sha = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        if not sha:
            sys.exit(f"lock: {name} {version} comes from {info.get('url')}, not an index file")
        file = str(info["url"]).rsplit("/", 1)[-1]
        for major, minor in re.findall(r"manylinux_?(\d+)_(\d+)", file):
            if (int(major), int(minor)) > MAX_GLIBC:
                sys.exit(f"lock: {file} needs glibc {major}.{minor}, newer than the runners'")
        pins.append(Pin(name, version, (sha,)))
    return pins


_FOOTER = (
    "Resolved for CPython 3.11 on Linux x86_64, as the workflows run, by\n"
    "scripts/lock_workflow_requirements.py in modelreg's source tree; regenerate it\n"
    "there, never by hand. Written by `modelreg init`."
)


def _write(name: str, text: str, out: Path | None) -> None:
    problems = lock_problems(text)
    if problems:
        sys.exit(f"lock: {name}: " + "; ".join(problems))
    for path in (TEMPLATES / Path(name).name, ROOT / name) if out is None else (out / name,):
        path.write_text(text, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--index-url", default="https://pypi.org/simple")
    parser.add_argument("--extras", default="ci", help="modelreg's extras (default: ci)")
    parser.add_argument("--out", type=Path, help="write the locks to OUT/.github/ only")
    args = parser.parse_args()
    _check_platform()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    pins = _pins(_resolve(args.index_url, f"{ROOT}[{args.extras}]"))
    build = _pins(_resolve(args.index_url, _BUILD_BACKEND))
    _write(
        BUILD_LOCK_FILE,
        render_lock(build, "The build backend for the sdists of modelreg-requirements.txt,\n"
                    "installed first so that pip builds them with --no-build-isolation and\n"
                    "nothing it runs comes unchecked from the index.\n" + _FOOTER),
        args.out,
    )  # fmt: skip
    header = (
        f"The dependencies of modelreg[{args.extras}] {version}, each pinned to one file by\n"
        "its SHA-256 (an S3 DVC remote needs them with the extra s3: --extras s3).\n"
        "The workflows run\n"
        "  python -m pip install --require-hashes --no-deps --no-build-isolation -r <this>\n"
        f"and then modelreg=={version} itself with --no-deps: a lock shipped inside\n"
        "modelreg's wheel cannot hold that wheel's own hash.\n" + _FOOTER
    )
    _write(LOCK_FILE, render_lock(pins, header), args.out)
    if args.out is not None:
        print(f"locked {len(pins)} distributions for modelreg {version} in {args.out}")
        return
    # This repository's own pin of modelreg (a repository made by `modelreg init` gets
    # the index's hashes then); the workflows read it, so they name no version.
    (ROOT / SELF_LOCK_FILE).write_text(
        render_self_lock(version, [], args.index_url.removesuffix("/simple")), encoding="utf-8"
    )
    print(f"locked {len(pins)} distributions for modelreg {version} in {LOCK_FILE}")


if __name__ == "__main__":
    main()
