"""``modelreg ci pr`` and ``modelreg ci release``: what the GitHub workflows run.

``ci pr`` answers a reviewer's questions about a pull request in one comment: are the
manifests valid, does every promotion follow its model's policy, do the changed
versions load and pass their goldens, and what changed against their parents.  Every
problem is also one line on stderr, and the exit code is 1 if there is any.

``ci release`` runs on the main branch: it builds the versions not yet released,
publishes them (DVC push, OMS bundles, signed TUF targets and channels), commits the
re-signed metadata with ``[skip ci]`` and mirrors the release into MLflow; with
nothing new it changes nothing.

Both read the GitHub Actions environment when present (``GITHUB_REF``,
``GITHUB_RUN_ID``, ``GITHUB_SERVER_URL``, ``GITHUB_REPOSITORY``, ``GITHUB_EVENT_PATH``,
``GITHUB_STEP_SUMMARY``, ``GITHUB_OUTPUT``, and ``GITHUB_TOKEN``/``GITHUB_API_URL``
for review approvals) and work without it.  The commit a release records is the
checkout's ``HEAD``, what was built; ``GITHUB_SHA`` only names the commit that started
the run, which a re-run or a manual run may have moved past.
"""

from __future__ import annotations

from pipelines.ci._pr import approval_problems, ci_pr, uncommitted_note
from pipelines.ci._release import ci_release
from pipelines.ci._report import CI_DIR, CiReport

__all__ = [
    "CI_DIR",
    "CiReport",
    "approval_problems",
    "ci_pr",
    "ci_release",
    "uncommitted_note",
]
