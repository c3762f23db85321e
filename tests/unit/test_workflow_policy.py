"""The re-check after a review (pr.yml's ``recheck`` job), run with a stand-in ``gh``.

The script is taken from the workflow template as GitHub runs it (``bash -e``); the
stand-in ``gh`` logs its arguments and answers what the test sets, so each test checks
which runs the job re-runs, and that it re-runs none it must not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT

HEAD, NEWER = "a" * 40, "b" * 40
FAKE_GH = """#!/bin/bash
printf '%s\\n' "$*" >> "$GH_LOG"
case "$1 $2" in
  "pr list") printf '%s' "$FAKE_HEADS" ;;
  "run list") printf '%s' "$FAKE_RUN" ;;
  "api --paginate") printf '%s' "$FAKE_REVIEWS" ;;
esac
"""


def recheck_script() -> str:
    pr = yaml.safe_load((REPO_ROOT / "pipelines/templates/workflows/pr.yml").read_text())
    (step,) = pr["jobs"]["recheck"]["steps"]
    assert set(step["env"]) == {"GH_TOKEN", "GH_REPO", "HEAD_SHA"}
    return str(step["run"])


def recheck(
    tmp_path: Path, head: str, *, heads: str = "", run: str = "", reviews: str = "MEMBER\n"
) -> tuple[int, list[str]]:
    """Run the job's script; its exit code and the ``gh`` commands it ran.

    ``heads`` is what ``gh pr list`` answers (``NUMBER HEAD`` lines), ``reviews`` the
    author associations of the reviews of ``head``, ``run`` the check's run id.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "gh").write_text(FAKE_GH)
    (bin_dir / "gh").chmod(0o755)
    log = tmp_path / "gh.log"
    log.unlink(missing_ok=True)
    bash = shutil.which("bash")
    assert bash is not None
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "GH_LOG": str(log),
        "GH_TOKEN": "ghs_test",
        "GH_REPO": "acme/fleet",
        "HEAD_SHA": head,
        "FAKE_HEADS": heads,
        "FAKE_RUN": run,
        "FAKE_REVIEWS": reviews,
    }
    proc = subprocess.run(
        [bash, "-e", "-c", recheck_script()],
        env=env, capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    calls = log.read_text().splitlines() if log.exists() else []
    return proc.returncode, calls


def test_the_check_of_the_reviewed_head_is_run_again(tmp_path: Path) -> None:
    code, calls = recheck(tmp_path, HEAD, heads=f"7 {HEAD}\n", run="4242")
    assert code == 0
    assert calls[-2:] == ["run watch 4242", "run rerun 4242"]
    assert calls[1].startswith("api --paginate repos/acme/fleet/pulls/7/reviews")
    listed = calls[2].split()
    assert listed[:2] == ["run", "list"]
    # only the judge of this very commit, as pull_request_target ran it
    assert "pull_request_target" in listed
    assert listed[listed.index("--commit") + 1] == HEAD


def test_a_review_found_by_no_search_still_rechecks(tmp_path: Path) -> None:
    """Search may lag behind a push: only a head that has moved on skips the re-run."""
    code, calls = recheck(tmp_path, HEAD, heads="", run="4242")
    assert code == 0
    assert calls[-1] == "run rerun 4242"


def test_a_review_of_an_old_commit_reruns_nothing(tmp_path: Path) -> None:
    """Its approval counts for nothing, and re-running the old check would cancel the
    check of the new head (same concurrency group)."""
    code, calls = recheck(tmp_path, HEAD, heads=f"7 {NEWER}\n", run="4242")
    assert code == 0
    assert [c.split()[:2] for c in calls] == [["pr", "list"]]


def test_no_check_to_run_again(tmp_path: Path) -> None:
    code, calls = recheck(tmp_path, HEAD, heads=f"7 {HEAD}\n", run="")
    assert code == 0
    assert not any(c.startswith("run rerun") for c in calls)


@pytest.mark.parametrize("head", ["", "HEAD", "a" * 39, "A" * 40, f"{HEAD}; rm -rf /", "-x"])
def test_anything_but_a_commit_id_is_refused(tmp_path: Path, head: str) -> None:
    code, calls = recheck(tmp_path, head, heads=f"7 {HEAD}\n", run="4242")
    assert code == 1
    assert calls == []


@pytest.mark.parametrize("reviews", ["", "NONE\n", "CONTRIBUTOR\nFIRST_TIME_CONTRIBUTOR\n"])
def test_reviews_by_outsiders_rerun_nothing(tmp_path: Path, reviews: str) -> None:
    """Anyone can review a public pull request; only the repository's people count, so
    only their reviews cost a re-run."""
    code, calls = recheck(tmp_path, HEAD, heads=f"7 {HEAD}\n", run="4242", reviews=reviews)
    assert code == 0
    assert [c.split()[:2] for c in calls] == [["pr", "list"], ["api", "--paginate"]]


def test_a_collaborators_review_among_outsiders_reruns_once(tmp_path: Path) -> None:
    reviews = "NONE\nCOLLABORATOR\nNONE\n"
    code, calls = recheck(tmp_path, HEAD, heads=f"7 {HEAD}\n", run="4242", reviews=reviews)
    assert code == 0
    assert calls.count("run rerun 4242") == 1


def test_a_burst_of_reviews_queues_one_recheck_per_commit() -> None:
    pr = yaml.safe_load((REPO_ROOT / "pipelines/templates/workflows/pr.yml").read_text())
    concurrency = pr["jobs"]["recheck"]["concurrency"]
    assert concurrency["group"].endswith("${{ github.event.workflow_run.head_sha }}")
    assert concurrency["cancel-in-progress"] is False  # a dismissal is never cancelled
