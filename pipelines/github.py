"""Pull-request reviews from the GitHub REST API, for the promotion approvals policy.

A RegisteredModel's ``spec.promotion.approvals`` is the number of reviewers who must
approve a pull request that moves one of its channels.  What counts is decided here
without I/O (:func:`approvers`): each reviewer's latest verdict, given on the commit
under review, by a person with a say in the repository (owner, organization member or
collaborator; not a bot) other than the author.  :func:`fetch_reviews` reads the
reviews (``GET /repos/{owner}/{repo}/pulls/{number}/reviews``, every page) with the
workflow's token, which is sent to the API host only (never along a redirect or a
pagination link to another host).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from pipelines.errors import PipelineError

DEFAULT_API: Final = "https://api.github.com"
_PAGE: Final = 100
_MAX_PAGES: Final = 50
_MAX_BODY: Final = 8 << 20
_NEXT: Final = re.compile(r'<([^>]+)>;\s*rel="next"')
_VERDICTS: Final = frozenset({"APPROVED", "CHANGES_REQUESTED", "DISMISSED"})
TRUSTED: Final = frozenset({"OWNER", "MEMBER", "COLLABORATOR"})
"""``author_association`` values whose approval counts (GitHub's names)."""


class GitHubError(PipelineError):
    """The GitHub API could not be asked, or its answer could not be read."""


@dataclass(frozen=True, slots=True)
class Review:
    """One submitted review of a pull request.

    Attributes:
        reviewer: the reviewer's login.
        state: ``APPROVED``, ``CHANGES_REQUESTED``, ``COMMENTED``, ``DISMISSED``, ...
        commit: the commit the review was given on.
        association: the reviewer's relation to the repository (``OWNER``,
            ``MEMBER``, ``COLLABORATOR``, ``CONTRIBUTOR``, ``NONE``, ...).
        bot: whether the account is a bot (an app or an action).
    """

    reviewer: str
    state: str
    commit: str | None
    association: str = "NONE"
    bot: bool = False


def approvers(reviews: Iterable[Review], *, head: str, author: str | None) -> frozenset[str]:
    """Reviewers whose latest verdict approves commit ``head``.

    Reviews are in submission order (as the API lists them).  A comment does not
    change a reviewer's verdict; a later request for changes or a dismissal revokes an
    approval; an approval of an older commit does not cover commits pushed after it;
    the author cannot approve their own pull request, nor can bots or accounts with
    no say in the repository (anyone can review a public repository's pull requests).
    """
    latest: dict[str, Review] = {}
    for review in reviews:
        if review.state in _VERDICTS:
            latest[review.reviewer] = review
    return frozenset(
        name
        for name, review in latest.items()
        if review.state == "APPROVED"
        and review.commit == head
        and name != author
        and review.association in TRUSTED
        and not review.bot
    )


def _parse(payload: object) -> list[Review]:
    if not isinstance(payload, list):
        raise GitHubError("GitHub API: reviews are not a JSON list")
    reviews = []
    for item in payload:
        if not isinstance(item, dict):
            continue
        user = item.get("user")
        login = user.get("login") if isinstance(user, dict) else None
        state, commit = item.get("state"), item.get("commit_id")
        association = item.get("author_association")
        if not isinstance(login, str) or not isinstance(state, str):
            continue  # a review by a deleted account: no one to count
        reviews.append(
            Review(
                login,
                state,
                commit if isinstance(commit, str) else None,
                association if isinstance(association, str) else "NONE",
                isinstance(user, dict) and user.get("type") == "Bot",
            )
        )
    return reviews


class _SameHostRedirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects within the API host only (the token is not resent anyway)."""

    def __init__(self, host: str) -> None:
        self.host = host

    def redirect_request(  # noqa: PLR0917 - the stdlib's signature
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        if urllib.parse.urlsplit(newurl).netloc != self.host:
            raise GitHubError(f"GitHub API: refusing a redirect to another host ({newurl})")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch_reviews(
    repository: str, number: int, token: str, *, api: str = DEFAULT_API, timeout: float = 20
) -> list[Review]:
    """Every review of pull request ``number`` of ``repository`` (``owner/name``).

    Raises:
        GitHubError: the API is unreachable, refuses the token, or answers nonsense.
    """
    base = api.rstrip("/")
    host = urllib.parse.urlsplit(base).netloc
    opener = urllib.request.build_opener(_SameHostRedirects(host))
    url: str | None = f"{base}/repos/{repository}/pulls/{number}/reviews?per_page={_PAGE}"
    reviews: list[Review] = []
    for _ in range(_MAX_PAGES):
        if url is None:
            return reviews
        if urllib.parse.urlsplit(url).netloc != host:
            raise GitHubError(f"GitHub API: refusing a page link to another host ({url})")
        request = urllib.request.Request(  # noqa: S310 - the URL is built from https/GITHUB_API_URL
            url,
            headers={
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": "2022-11-28",
                "User-Agent": "modelreg",
            },
        )
        # Unredirected: urllib would otherwise copy the token into a redirected request.
        request.add_unredirected_header("Authorization", f"Bearer {token}")
        try:
            with opener.open(request, timeout=timeout) as response:
                body = response.read(_MAX_BODY + 1)
                link = response.headers.get("Link", "")
        except urllib.error.HTTPError as e:
            e.close()
            raise GitHubError(
                f"GitHub API: reviews of pull request #{number}: HTTP {e.code} {e.reason}"
            ) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise GitHubError(f"GitHub API unreachable at {api}: {reason}") from None
        if len(body) > _MAX_BODY:
            raise GitHubError("GitHub API: reviews page larger than 8 MiB")
        try:
            reviews.extend(_parse(json.loads(body)))
        except ValueError:
            raise GitHubError("GitHub API: reviews page is not JSON") from None
        found = _NEXT.search(link)
        url = found.group(1) if found else None
    raise GitHubError(f"GitHub API: more than {_MAX_PAGES * _PAGE} reviews")
