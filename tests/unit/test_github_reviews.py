"""Counting pull-request approvals: the pure decision, and the REST client on loopback."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from pipelines.errors import GitHubError
from pipelines.github import (
    NO_ACCESS,
    Access,
    GitHubLimits,
    Review,
    approval_candidates,
    approvals,
    approvers,
    fetch_approvers,
    fetch_merged_pull,
    fetch_permissions,
    fetch_reviews,
    merged_pull,
)
from tests.github_fake import TOKEN, fake_github

HEAD, OLD = "a" * 40, "b" * 40


def writers(reviews: list[Review]) -> dict[str, Access]:
    """Everyone who reviewed has write access (the permission is tested on its own)."""
    return {r.reviewer: Access("write", "write") for r in reviews}


def member(name: str, state: str, commit: str | None) -> Review:
    return Review(name, state, commit, "MEMBER")


def test_latest_verdict_on_the_head_commit_counts() -> None:
    reviews = [
        member("ann", "APPROVED", HEAD),
        member("bob", "APPROVED", HEAD),
        member("bob", "COMMENTED", HEAD),  # a comment keeps bob's approval
        member("cat", "APPROVED", HEAD),
        member("cat", "CHANGES_REQUESTED", HEAD),  # cat changed her mind
        member("dan", "CHANGES_REQUESTED", HEAD),
        member("dan", "APPROVED", HEAD),  # and dan his
        member("eve", "APPROVED", HEAD),
        member("eve", "DISMISSED", HEAD),  # an admin dismissed eve's approval
    ]
    assert approvers(reviews, writers(reviews), head=HEAD, author="zed") == {"ann", "bob", "dan"}


def test_stale_self_and_comment_only_reviews_do_not_count() -> None:
    reviews = [
        member("ann", "APPROVED", OLD),  # approved before the last push
        member("zed", "APPROVED", HEAD),  # the author
        member("bob", "COMMENTED", HEAD),
        member("cat", "PENDING", HEAD),
        member("dan", "APPROVED", None),
    ]
    assert approvers(reviews, writers(reviews), head=HEAD, author="zed") == frozenset()
    # a fresh approval after the push counts again
    reviews.append(member("ann", "APPROVED", HEAD))
    assert approvers(reviews, writers(reviews), head=HEAD, author="zed") == {"ann"}


def test_only_people_related_to_the_repository_are_candidates() -> None:
    reviews = [
        Review("owner", "APPROVED", HEAD, "OWNER"),
        Review("member", "APPROVED", HEAD, "MEMBER"),
        Review("collab", "APPROVED", HEAD, "COLLABORATOR"),
        Review("stranger", "APPROVED", HEAD, "NONE"),  # anyone may review a public repo
        Review("drive-by", "APPROVED", HEAD, "CONTRIBUTOR"),  # a merged PR gives no say
        Review("first", "APPROVED", HEAD, "FIRST_TIME_CONTRIBUTOR"),
        Review("ci-bot", "APPROVED", HEAD, "MEMBER", bot=True),
    ]
    # whom to ask about: the association narrows, the permission decides (below)
    assert approval_candidates(reviews, head=HEAD, author=None) == {"owner", "member", "collab"}
    assert approvers(reviews, writers(reviews), head=HEAD, author=None) == {
        "owner",
        "member",
        "collab",
    }


def test_only_reviewers_with_write_access_count() -> None:
    names = ("admin", "maintainer", "writer", "custom", "member", "triager", "reader",
             "outsider", "unasked", "mismatch")  # fmt: skip
    reviews = [Review(n, "APPROVED", HEAD, "MEMBER") for n in names]
    permissions = {
        "admin": Access("admin", "admin"),
        "maintainer": Access("write", "maintain"),  # the API folds maintain into write
        "writer": Access("write", "write"),
        "custom": Access("write", "release-manager"),  # a custom role based on write
        "member": Access("read", "read"),  # an org member with the default read role
        "triager": Access("read", "triage"),
        "reader": Access("read"),
        "outsider": NO_ACCESS,  # not a collaborator
        "mismatch": Access("write", "triage"),  # an answer that contradicts itself
        # "unasked": no answer at all, so no approval
    }
    assert approvers(reviews, permissions, head=HEAD, author=None) == {
        "admin", "maintainer", "writer", "custom"
    }  # fmt: skip
    # the brief's raw values: maintain counts even if it is not folded into write
    assert Access("maintain").can_approve
    assert not Access("triage").can_approve
    assert not Access("none").can_approve


def test_fetch_reads_every_page_with_the_token() -> None:
    with fake_github() as gh:
        for i in range(250):
            gh.review("acme/fleet", 3, f"user{i}", "APPROVED", HEAD)
        reviews = fetch_reviews("acme/fleet", 3, TOKEN, api=gh.url)
        assert len(reviews) == 250
        assert reviews[0] == Review("user0", "APPROVED", HEAD, "MEMBER")
        assert reviews[-1].reviewer == "user249"
        assert len(gh.requests) == 3  # 100 per page


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("bad token", "GitHub API: reviews of pull request #3: HTTP 401 Unauthorized"),
        ("no such pr", "GitHub API: reviews of pull request #4: HTTP 404 Not Found"),
        ("server error", "GitHub API: reviews of pull request #3: HTTP 502 Bad Gateway"),
    ],
)
def test_fetch_failures_are_one_typed_line(setup: str, message: str) -> None:
    with fake_github() as gh:
        gh.review("acme/fleet", 3, "ann", "APPROVED", HEAD)
        token, number = TOKEN, 3
        if setup == "bad token":
            token = "wrong"  # noqa: S105
        elif setup == "no such pr":
            number = 4
        else:
            gh.broken = 502
        with pytest.raises(GitHubError) as info:
            fetch_reviews("acme/fleet", number, token, api=gh.url)
    assert str(info.value) == message  # and no token in it
    assert info.value.subject == gh.url


def test_fetch_unreachable_api() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(GitHubError, match=r"^GitHub API unreachable at http://127.0.0.1:\d+: "):
        fetch_reviews(
            "acme/fleet", 3, TOKEN, api=f"http://127.0.0.1:{port}", limits=GitHubLimits(timeout=5)
        )


def test_the_token_never_leaves_the_api_host() -> None:
    with fake_github() as gh, fake_github() as elsewhere:
        for i in range(150):
            gh.review("acme/fleet", 3, f"user{i}", "APPROVED", HEAD)
        gh.next_link = f"{elsewhere.url}/repos/acme/fleet/pulls/3/reviews"
        with pytest.raises(GitHubError, match="refusing a page link to another host"):
            fetch_reviews("acme/fleet", 3, TOKEN, api=gh.url)
        gh.next_link = None
        gh.redirect = f"{elsewhere.url}/repos/acme/fleet/pulls/3/reviews"
        with pytest.raises(GitHubError, match="refusing a redirect to another host"):
            fetch_reviews("acme/fleet", 3, TOKEN, api=gh.url)
    assert elsewhere.requests == []
    assert set(gh.authorizations) == {f"Bearer {TOKEN}"}


def test_reviews_without_a_user_are_skipped_and_bots_marked() -> None:
    with fake_github() as gh:
        gh.review("acme/fleet", 3, "ann", "APPROVED", HEAD, association="OWNER")
        gh.review("acme/fleet", 3, "dependabot", "APPROVED", HEAD, bot=True)
        gh.reviews[("acme/fleet", 3)].append({"state": "APPROVED", "user": None})
        reviews = fetch_reviews("acme/fleet", 3, TOKEN, api=gh.url)
    assert reviews == [
        Review("ann", "APPROVED", HEAD, "OWNER"),
        Review("dependabot", "APPROVED", HEAD, "MEMBER", bot=True),
    ]


def test_approvals_count_only_with_write_permission_on_the_api() -> None:
    with fake_github() as gh:
        gh.review("acme/fleet", 3, "org-member", "APPROVED", HEAD)  # MEMBER, role read
        gh.access("acme/fleet", "org-member", "read")
        gh.review("acme/fleet", 3, "reader", "APPROVED", HEAD, association="COLLABORATOR")
        gh.access("acme/fleet", "reader", "triage")
        gh.review("acme/fleet", 3, "writer", "APPROVED", HEAD, association="COLLABORATOR")
        gh.access("acme/fleet", "writer", "write")
        gh.review("acme/fleet", 3, "gone", "APPROVED", HEAD)  # no longer a collaborator
        gh.access("acme/fleet", "gone", None)
        gh.review("acme/fleet", 3, "lead", "APPROVED", HEAD, association="OWNER")
        gh.access("acme/fleet", "lead", "maintain")
        gh.review("acme/fleet", 3, "stranger", "APPROVED", HEAD, association="NONE")
        gh.review("acme/fleet", 3, "zed", "APPROVED", HEAD)  # the author
        gh.review("acme/fleet", 3, "old", "APPROVED", OLD)  # before the last push
        names = fetch_approvers("acme/fleet", 3, TOKEN, head=HEAD, author="zed", api=gh.url)
        asked = sorted(r.split("/")[5] for r in gh.requests if r.endswith("/permission"))
    assert names == {"writer", "lead"}
    # only the candidates were asked about (not the stranger, the author, a stale review)
    assert asked == ["gone", "lead", "org-member", "reader", "writer"]


def test_the_permission_endpoint_answers_with_a_404_for_non_collaborators() -> None:
    with fake_github() as gh:
        gh.access("acme/fleet", "writer", "write")
        gh.access("acme/fleet", "read-only", "read")
        found = fetch_permissions("acme/fleet", ["writer", "read-only", "nobody"], TOKEN,
                                  api=gh.url)  # fmt: skip
    assert found == {
        "writer": Access("write", "write"),
        "read-only": Access("read", "read"),
        "nobody": NO_ACCESS,
    }


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (403, None, "GitHub API: permission of reviewer 'ann': HTTP 403 Forbidden"),
        (502, None, "GitHub API: permission of reviewer 'ann': HTTP 502 Bad Gateway"),
        (None, [1], "GitHub API: the permission of 'ann' is not readable"),
        (None, {"permission": 7}, "GitHub API: the permission of 'ann' is not readable"),
    ],
)
def test_a_permission_that_cannot_be_read_fails_closed(
    status: int | None, body: object, message: str
) -> None:
    """No count at all rather than a count of the reviewers who could be asked."""
    with fake_github() as gh:
        gh.review("acme/fleet", 3, "ann", "APPROVED", HEAD)
        gh.broken_permissions, gh.permission_body = status, body
        with pytest.raises(GitHubError) as info:
            fetch_approvers("acme/fleet", 3, TOKEN, head=HEAD, author=None, api=gh.url)
    assert str(info.value) == message


def test_permission_lookups_keep_the_token_on_the_api_host_and_are_bounded() -> None:
    with fake_github() as gh, fake_github() as elsewhere:
        gh.access("acme/fleet", "ann", "write")
        gh.redirect = f"{elsewhere.url}/repos/acme/fleet/collaborators/ann/permission"
        with pytest.raises(GitHubError, match="refusing a redirect to another host"):
            fetch_permissions("acme/fleet", ["ann"], TOKEN, api=gh.url)
        gh.redirect = None
        with pytest.raises(GitHubError, match="3 reviewers to check, more than 2"):
            fetch_permissions("acme/fleet", ["a", "b", "c"], TOKEN, api=gh.url,
                              limits=GitHubLimits(max_lookups=2))  # fmt: skip
        # a login is one path segment, whatever it holds
        assert fetch_permissions("acme/fleet", ["../../x"], TOKEN, api=gh.url) == {
            "../../x": NO_ACCESS
        }
        assert gh.requests[-1] == "/repos/acme/fleet/collaborators/..%2F..%2Fx/permission"
        gh.permission_body = {"permission": "write", "role_name": "write", "pad": "x" * 64}
        with pytest.raises(GitHubError, match="answer larger than 32 bytes"):
            fetch_permissions("acme/fleet", ["ann"], TOKEN, api=gh.url,
                              limits=GitHubLimits(max_body=32))  # fmt: skip
    assert elsewhere.requests == []
    assert set(gh.authorizations) == {f"Bearer {TOKEN}"}


def test_server_errors_and_dropped_connections_are_retried_with_backoff() -> None:
    with fake_github() as gh:
        gh.review("acme/fleet", 3, "ann", "APPROVED", HEAD)
        gh.flaky = [503, 0]  # an outage, then a connection closed without an answer
        start = time.monotonic()
        reviews = fetch_reviews(
            "acme/fleet", 3, TOKEN, api=gh.url, limits=GitHubLimits(retries=2, backoff=0.2)
        )
        elapsed = time.monotonic() - start
        assert [r.reviewer for r in reviews] == ["ann"]
        assert len(gh.requests) == 3
    assert 0.2 + 0.4 <= elapsed < 10  # backoff doubles between tries


def test_retries_are_bounded_and_the_last_error_is_one_line() -> None:
    with fake_github() as gh:
        gh.review("acme/fleet", 3, "ann", "APPROVED", HEAD)
        gh.flaky = [502, 502, 502, 502]
        with pytest.raises(GitHubError) as info:
            fetch_reviews(
                "acme/fleet", 3, TOKEN, api=gh.url, limits=GitHubLimits(retries=2, backoff=0.01)
            )
        assert len(gh.requests) == 3  # one try and two retries, no more
    assert str(info.value) == "GitHub API: reviews of pull request #3: HTTP 502 Bad Gateway"


def test_client_errors_are_not_retried() -> None:
    with fake_github() as gh:
        gh.flaky = [403]
        with pytest.raises(GitHubError, match="HTTP 403 Forbidden"):
            fetch_reviews("acme/fleet", 3, TOKEN, api=gh.url)
        assert len(gh.requests) == 1


def test_a_silent_api_fails_after_one_timeout() -> None:
    with socket.socket() as s:  # listens, never answers
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        start = time.monotonic()
        with pytest.raises(GitHubError) as info:
            fetch_reviews("acme/fleet", 3, TOKEN, api=f"http://127.0.0.1:{s.getsockname()[1]}",
                          limits=GitHubLimits(timeout=1, retries=2))  # fmt: skip
        elapsed = time.monotonic() - start
    assert str(info.value).endswith(": no answer within 1 s")
    assert elapsed < 5  # not retried: the timeout already waited


def test_an_unreachable_api_is_retried_then_one_line() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(GitHubError) as info:
        fetch_reviews("acme/fleet", 3, TOKEN, api=f"http://127.0.0.1:{port}",
                      limits=GitHubLimits(retries=2, backoff=0.1))  # fmt: skip
    assert 0.1 + 0.2 <= time.monotonic() - start < 5
    assert (
        str(info.value)
        == f"GitHub API unreachable at http://127.0.0.1:{port}: [Errno 111] Connection refused"
    )


@pytest.mark.parametrize(
    ("env", "run_id", "url"),
    [
        ({}, None, None),
        ({"GITHUB_RUN_ID": ""}, None, None),
        ({"GITHUB_RUN_ID": "42"}, "42", None),
        ({"GITHUB_RUN_ID": "42", "GITHUB_SERVER_URL": "https://github.example/",
          "GITHUB_REPOSITORY": "acme/fleet"}, "42",
         "https://github.example/acme/fleet/actions/runs/42"),
        ({"GITHUB_SERVER_URL": "https://github.example", "GITHUB_REPOSITORY": "a/b"},
         None, None),
    ],
)  # fmt: skip
def test_the_actions_run_is_read_from_the_environment_in_one_place(
    env: dict[str, str], run_id: str | None, url: str | None
) -> None:
    from pipelines.github import ActionsRun

    run = ActionsRun.from_env(env)
    assert (run.run_id, run.url) == (run_id, url)


def test_the_run_facts_a_release_signs_are_read_from_the_environment() -> None:
    from pipelines.github import ActionsRun

    env = {"GITHUB_RUN_ID": "42", "GITHUB_SERVER_URL": "https://github.example",
           "GITHUB_REPOSITORY": "acme/fleet", "GITHUB_RUN_ATTEMPT": "2",
           "GITHUB_WORKFLOW_REF": "acme/fleet/.github/workflows/release.yml@refs/heads/main",
           "GITHUB_EVENT_NAME": "push", "RUNNER_ENVIRONMENT": "github-hosted",
           "RUNNER_OS": "Linux"}  # fmt: skip
    run = ActionsRun.from_env(env)
    assert (run.repository, run.attempt, run.event) == ("acme/fleet", "2", "push")
    assert run.workflow_ref == "acme/fleet/.github/workflows/release.yml@refs/heads/main"
    assert (run.runner_environment, run.runner_os) == ("github-hosted", "Linux")
    assert run.repository_url == "https://github.example/acme/fleet"
    assert ActionsRun.from_env({}).repository_url is None


@pytest.mark.parametrize(
    "content", [b"not json", b"[]", b"x" * 8], ids=["not json", "a list", "garbage"]
)
def test_an_unreadable_event_file_is_a_github_error_naming_it(
    tmp_path: Path, content: bytes
) -> None:
    from pipelines.github import PullRequest

    event = tmp_path / "event.json"
    event.write_bytes(content)
    with pytest.raises(GitHubError) as info:
        PullRequest.from_env({"GITHUB_EVENT_PATH": str(event)}, None)
    assert info.value.subject == str(event)
    assert str(info.value).startswith(f"{event}: ")


def test_the_approvals_a_release_signs_are_those_counted_with_review_and_role() -> None:
    """Issue 28: the release signs the approvals ``ci pr`` counts (same rule), each with
    the id of the review that approved and the reviewer's role."""
    reviews = [
        Review("ann", "COMMENTED", HEAD, "MEMBER", id=10),
        Review("ann", "APPROVED", HEAD, "MEMBER", id=11),
        Review("bob", "APPROVED", OLD, "MEMBER", id=12),  # an older commit
        Review("carol", "APPROVED", HEAD, "MEMBER", id=13),  # triage: no write access
        Review("dave", "APPROVED", HEAD, "COLLABORATOR", id=14),
        Review("dev", "APPROVED", HEAD, "OWNER", id=15),  # the author
    ]
    access = {"ann": Access("write", "write"), "bob": Access("write", "write"),
              "carol": Access("read", "triage"), "dave": Access("write", "releaser"),
              "dev": Access("admin", "admin")}  # fmt: skip
    found = approvals(reviews, access, head=HEAD, author="dev")
    assert [(a.login, a.review_id, a.permission, a.commit) for a in found] == [
        ("ann", 11, "write", HEAD), ("dave", 14, "releaser", HEAD),
    ]  # fmt: skip
    assert {a.login for a in found} == approvers(reviews, access, head=HEAD, author="dev")


def _pull(
    number: int, *, merged: bool = True, branch: str = "main", at: str = "2026-12-01T10:00:00Z"
) -> dict[str, object]:
    return {"number": number, "merged_at": at if merged else None, "merge_commit_sha": "c" * 40,
            "html_url": f"https://github.example/acme/fleet/pull/{number}",
            "user": {"login": "dev"}, "head": {"sha": HEAD}, "base": {"sha": OLD, "ref": branch}}  # fmt: skip


def test_the_pull_request_of_a_commit_is_the_one_merged_into_the_branch() -> None:
    listed = [
        _pull(3, merged=False),
        _pull(4, branch="dev"),
        _pull(5),
        _pull(2, at="2026-12-02T00:00:00Z"),
    ]
    found = merged_pull(listed, HEAD, "main")
    assert found is not None
    assert (found.number, found.head, found.base, found.merge_commit, found.author) == (
        5, HEAD, OLD, "c" * 40, "dev",
    )  # fmt: skip
    assert merged_pull(listed, HEAD, None) is not None
    assert merged_pull([_pull(3, merged=False)], HEAD, "main") is None
    assert merged_pull([], HEAD, "main") is None
    with pytest.raises(GitHubError, match="are not a list"):
        merged_pull({"message": "?"}, HEAD, "main")


def test_the_pull_request_of_a_commit_is_asked_of_the_api() -> None:
    with fake_github() as gh:
        gh.merge("acme/fleet", 9, commits=[HEAD], head=HEAD, base=OLD, merge_commit="c" * 40)
        found = fetch_merged_pull("acme/fleet", HEAD, TOKEN, branch="main", api=gh.url)
        assert found is not None
        assert found.number == 9
        assert fetch_merged_pull("acme/fleet", OLD, TOKEN, branch="main", api=gh.url) is None
        assert gh.requests[-1].startswith(f"/repos/acme/fleet/commits/{OLD}/pulls")
