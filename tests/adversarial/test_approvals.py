"""Issue 8, point 10: a promotion's approvals count only from reviewers with write access.

The attack: a pull request promotes a released version to production, and gets it
"approved" by accounts GitHub marks MEMBER or COLLABORATOR on the review but which
cannot write to the repository (an organization member with the default read role, a
triage collaborator, a former collaborator).  ``modelreg ci pr`` asks the API for each
approver's permission and counts none of them.
"""

from __future__ import annotations

import pytest

from tests.adversarial.conftest import Fleet
from tests.github_fake import TOKEN, fake_github

pytestmark = pytest.mark.integration


def _promote(fleet: Fleet) -> tuple[str, str]:
    base = fleet.branch("promote")
    assert fleet.cli("promote", "mlp", "1.0.0", "-c", "production", cwd=fleet.root).code == 0
    return base, fleet.commit("mlp 1.0.0 to production")


def test_approvals_without_write_access_do_not_count(fleet: Fleet) -> None:
    base, head = _promote(fleet)
    with fake_github() as gh:
        fleet.monkeypatch.setenv("GITHUB_API_URL", gh.url)
        fleet.monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        for user, association, role in (
            ("org-member", "MEMBER", "read"),
            ("triager", "COLLABORATOR", "triage"),
            ("former", "COLLABORATOR", None),  # the API answers 404
        ):
            gh.review("acme/fleet", 7, user, "APPROVED", head, association=association)
            gh.access("acme/fleet", user, role)
        r = fleet.ci_pr(base)
        assert r.code == 1
        assert r.err.strip().endswith(
            f"spec.channels.production: promoting 'mlp' needs 1 approval(s) of commit "
            f"{head[:12]}; it has 0"
        )
        assert "approval(s) of" in fleet.comment()
        # one reviewer who may write is enough
        gh.review("acme/fleet", 7, "maintainer", "APPROVED", head, association="MEMBER")
        gh.access("acme/fleet", "maintainer", "maintain")
        r = fleet.ci_pr(base)
        assert r.code == 0, r.err
        assert f"1 approval(s) of {head[:12]} (maintainer)" in fleet.comment()


def test_a_permission_the_api_will_not_tell_fails_closed(fleet: Fleet) -> None:
    base, head = _promote(fleet)
    with fake_github() as gh:
        fleet.monkeypatch.setenv("GITHUB_API_URL", gh.url)
        fleet.monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        gh.review("acme/fleet", 7, "ann", "APPROVED", head)  # write access, but...
        gh.broken_permissions = 403  # ...the token may not ask
        r = fleet.ci_pr(base)
    assert r.code == 1
    assert r.err.strip().endswith(
        "spec.channels.production: cannot count the approvals this promotion needs: "
        "GitHub API: permission of reviewer 'ann': HTTP 403 Forbidden"
    )
    assert len(r.err.strip().splitlines()) == 1
