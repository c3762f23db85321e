"""Pull-request reviews from the GitHub REST API, for the promotion approvals policy.

A RegisteredModel's ``spec.promotion.approvals`` is the number of reviewers who must
approve a pull request that moves one of its channels.  What counts is decided here
without I/O (:func:`approvers`): each reviewer's latest verdict, given on the commit
under review, by someone other than the author.  :func:`fetch_reviews` reads the
reviews (``GET /repos/{owner}/{repo}/pulls/{number}/reviews``, every page) with the
workflow's token.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from pipelines.errors import PipelineError

DEFAULT_API: Final = "https://api.github.com"
_PAGE: Final = 100
_MAX_PAGES: Final = 50
_MAX_BODY: Final = 8 << 20
_NEXT: Final = re.compile(r'<([^>]+)>;\s*rel="next"')
_VERDICTS: Final = frozenset({"APPROVED", "CHANGES_REQUESTED", "DISMISSED"})


class GitHubError(PipelineError):
    """The GitHub API could not be asked, or its answer could not be read."""


@dataclass(frozen=True, slots=True)
class Review:
    """One submitted review of a pull request.

    Attributes:
        reviewer: the reviewer's login.
        state: ``APPROVED``, ``CHANGES_REQUESTED``, ``COMMENTED``, ``DISMISSED``, ...
        commit: the commit the review was given on.
    """

    reviewer: str
    state: str
    commit: str | None


def approvers(reviews: Iterable[Review], *, head: str, author: str | None) -> frozenset[str]:
    """Reviewers whose latest verdict approves commit ``head``.

    Reviews are in submission order (as the API lists them).  A comment does not
    change a reviewer's verdict; a later request for changes or a dismissal revokes an
    approval; an approval of an older commit does not cover commits pushed after it;
    the author cannot approve their own pull request.
    """
    latest: dict[str, Review] = {}
    for review in reviews:
        if review.state in _VERDICTS:
            latest[review.reviewer] = review
    return frozenset(
        name
        for name, review in latest.items()
        if review.state == "APPROVED" and review.commit == head and name != author
    )


def _parse(payload: object) -> list[Review]:
    if not isinstance(payload, list):
        raise GitHubError("GitHub API: reviews are not a JSON list")
    reviews = []
    for item in payload:
        user = item.get("user") if isinstance(item, dict) else None
        login = user.get("login") if isinstance(user, dict) else None
        state = item.get("state") if isinstance(item, dict) else None
        commit = item.get("commit_id") if isinstance(item, dict) else None
        if not isinstance(login, str) or not isinstance(state, str):
            continue  # a review by a deleted account: no one to count
        reviews.append(Review(login, state, commit if isinstance(commit, str) else None))
    return reviews


def fetch_reviews(
    repository: str, number: int, token: str, *, api: str = DEFAULT_API, timeout: float = 20
) -> list[Review]:
    """Every review of pull request ``number`` of ``repository`` (``owner/name``).

    Raises:
        GitHubError: the API is unreachable, refuses the token, or answers nonsense.
    """
    url: str | None = (
        f"{api.rstrip('/')}/repos/{repository}/pulls/{number}/reviews?per_page={_PAGE}"
    )
    reviews: list[Review] = []
    for _ in range(_MAX_PAGES):
        if url is None:
            return reviews
        request = urllib.request.Request(  # noqa: S310 - the URL is built from https/GITHUB_API_URL
            url,
            headers={
                "Accept": "application/vnd.github+json",
                "Authorization": f"Bearer {token}",
                "X-GitHub-Api-Version": "2022-11-28",
                "User-Agent": "modelreg",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
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
