"""Counting pull-request approvals: the pure decision, and the REST client on loopback."""

from __future__ import annotations

import socket

import pytest

from pipelines.github import GitHubError, Review, approvers, fetch_reviews
from tests.github_fake import TOKEN, fake_github

HEAD, OLD = "a" * 40, "b" * 40


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
    assert approvers(reviews, head=HEAD, author="zed") == {"ann", "bob", "dan"}


def test_stale_self_and_comment_only_reviews_do_not_count() -> None:
    reviews = [
        member("ann", "APPROVED", OLD),  # approved before the last push
        member("zed", "APPROVED", HEAD),  # the author
        member("bob", "COMMENTED", HEAD),
        member("cat", "PENDING", HEAD),
        member("dan", "APPROVED", None),
    ]
    assert approvers(reviews, head=HEAD, author="zed") == frozenset()
    # a fresh approval after the push counts again
    reviews.append(member("ann", "APPROVED", HEAD))
    assert approvers(reviews, head=HEAD, author="zed") == {"ann"}


def test_only_people_with_a_say_in_the_repository_count() -> None:
    reviews = [
        Review("owner", "APPROVED", HEAD, "OWNER"),
        Review("member", "APPROVED", HEAD, "MEMBER"),
        Review("collab", "APPROVED", HEAD, "COLLABORATOR"),
        Review("stranger", "APPROVED", HEAD, "NONE"),  # anyone may review a public repo
        Review("drive-by", "APPROVED", HEAD, "CONTRIBUTOR"),  # a merged PR gives no say
        Review("first", "APPROVED", HEAD, "FIRST_TIME_CONTRIBUTOR"),
        Review("ci-bot", "APPROVED", HEAD, "MEMBER", bot=True),
    ]
    assert approvers(reviews, head=HEAD, author=None) == {"owner", "member", "collab"}


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


def test_fetch_unreachable_api() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(GitHubError, match=r"^GitHub API unreachable at http://127.0.0.1:\d+: "):
        fetch_reviews("acme/fleet", 3, TOKEN, api=f"http://127.0.0.1:{port}", timeout=5)


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
