"""Pull-request approvals from the GitHub REST API, for the promotion approvals policy.

A RegisteredModel's ``spec.promotion.approvals`` is the number of reviewers who must
approve a pull request that moves one of its channels.  What counts is decided here
without I/O (:func:`approvers`): each reviewer's latest verdict, given on the commit
under review, by a person (not a bot) other than the author who has write access to
the repository.  Write access is what the API says of the reviewer's permission
(``GET /repos/{owner}/{repo}/collaborators/{username}/permission``), not the review's
``author_association``: an organization member, or a collaborator with read or triage
access, has no say in what the repository releases.

The I/O is :func:`fetch_approvers`: it reads the reviews
(``GET /repos/{owner}/{repo}/pulls/{number}/reviews``, every page), asks the
permission of each candidate (:func:`approval_candidates`) and decides.  The
workflow's token is sent to the API host only (never along a redirect or a
pagination link to another host), every answer is read up to a bound
(:class:`GitHubLimits`), and anything unexpected is a :class:`GitHubError`, so that
the caller fails closed.  Every request has a timeout; a server error (5xx) or a
refused or dropped connection is retried a bounded number of times with exponential
backoff (GitHub has short outages), a request that timed out is not (it already
waited), so an unreachable API fails in seconds, not minutes.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, overload

from pipelines.errors import GitHubError
from registry.errors import UsageError

if TYPE_CHECKING:
    from signing.provenance import Approval, PullRequestFacts

DEFAULT_API: Final = "https://api.github.com"
_NEXT: Final = re.compile(r'<([^>]+)>;\s*rel="next"')
_VERDICTS: Final = frozenset({"APPROVED", "CHANGES_REQUESTED", "DISMISSED"})
TRUSTED: Final = frozenset({"OWNER", "MEMBER", "COLLABORATOR"})
"""``author_association`` values of reviewers whose permission is worth asking.

Anyone with write access is one of these, so the association narrows whom we ask
(anyone may review a public repository's pull requests); it never decides alone."""
WRITE: Final = frozenset({"admin", "maintain", "write"})
"""Permissions whose holders may approve a promotion (they could push it anyway)."""
_BELOW_WRITE: Final = frozenset({"none", "read", "triage"})
"""Built-in role names below write: a ``role_name`` among them vetoes the permission."""


@dataclass(frozen=True, slots=True)
class GitHubLimits:
    """Bounds on what one count of approvals asks of, and reads from, the API.

    Attributes:
        page_size: reviews asked per page.
        max_pages: pages of reviews read before giving up.
        max_body: bytes read of any one answer.
        max_lookups: distinct reviewers whose permission is asked (drive-by approvals
            by strangers are not asked about, see :data:`TRUSTED`).
        timeout: seconds to connect, and to wait for each part of an answer.
        retries: further tries of a request that met a server error (5xx) or a
            refused or dropped connection.
        backoff: seconds before the first retry, doubled before each next one.
    """

    page_size: int = 100
    max_pages: int = 50
    max_body: int = 8 << 20
    max_lookups: int = 100
    timeout: float = 20
    retries: int = 2
    backoff: float = 0.5


DEFAULT_LIMITS: Final = GitHubLimits()


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
        id: GitHub's id of the review (None when the answer gave none).
    """

    reviewer: str
    state: str
    commit: str | None
    association: str = "NONE"
    bot: bool = False
    id: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Access:
    """A user's access to the repository, as the permission endpoint tells it.

    Attributes:
        permission: the base role (``admin``, ``write``, ``read``, ``none``; the API
            folds ``maintain`` into ``write`` and ``triage`` into ``read``, and a
            custom role into the role it is based on).
        role: ``role_name``, the role assigned (built-in or custom), if given.
    """

    permission: str
    role: str | None = None

    @property
    def can_approve(self) -> bool:
        """Whether this access lets its holder approve a promotion."""
        # Both fields must agree: an answer that says "write" for a "triage" role is
        # not one to count on.
        return self.permission in WRITE and self.role not in _BELOW_WRITE


NO_ACCESS: Final = Access("none")
"""Not a collaborator (the endpoint answers 404): no access at all."""


def approval_candidates(
    reviews: Iterable[Review], *, head: str, author: str | None
) -> frozenset[str]:
    """Reviewers whose approval of ``head`` counts if they have write access.

    Reviews are in submission order (as the API lists them).  A comment does not
    change a reviewer's verdict; a later request for changes or a dismissal revokes an
    approval; an approval of an older commit does not cover commits pushed after it;
    the author cannot approve their own pull request, nor can bots or accounts with
    no relation to the repository (see :data:`TRUSTED`).
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


def approvers(
    reviews: Iterable[Review],
    permissions: Mapping[str, Access],
    *,
    head: str,
    author: str | None,
) -> frozenset[str]:
    """Reviewers whose latest verdict approves ``head`` and who have write access.

    ``permissions`` maps logins to their access; a candidate missing from it has none
    (fail closed: an approval counts only when write access was confirmed).
    """
    return frozenset(
        name
        for name in approval_candidates(reviews, head=head, author=author)
        if (access := permissions.get(name)) is not None and access.can_approve
    )


def approvals(
    reviews: Iterable[Review],
    permissions: Mapping[str, Access],
    *,
    head: str,
    author: str | None,
) -> list[Approval]:
    """The approvals :func:`approvers` counts, each with its review and permission:
    what a release signs as its review provenance (``signing.provenance``)."""
    from signing.provenance import Approval

    counted = approvers(reviews, permissions, head=head, author=author)
    latest: dict[str, Review] = {}
    for review in reviews:
        if review.state in _VERDICTS:
            latest[review.reviewer] = review
    return [
        Approval(
            login=name,
            review_id=latest[name].id,
            permission=permissions[name].role or permissions[name].permission,
            commit=head,
        )
        for name in sorted(counted)
    ]


def _parse_reviews(payload: object) -> list[Review]:
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
        review_id = item.get("id")
        reviews.append(
            Review(
                login,
                state,
                commit if isinstance(commit, str) else None,
                association if isinstance(association, str) else "NONE",
                isinstance(user, dict) and user.get("type") == "Bot",
                review_id if type(review_id) is int and review_id >= 0 else None,
            )
        )
    return reviews


def _parse_access(payload: object, login: str) -> Access:
    permission = payload.get("permission") if isinstance(payload, dict) else None
    role = payload.get("role_name") if isinstance(payload, dict) else None
    if not isinstance(permission, str) or not isinstance(role, str | None):
        raise GitHubError(f"GitHub API: the permission of {login!r} is not readable")
    return Access(permission, role)


class _Retry(Exception):  # noqa: N818 - a signal between two methods, never raised out
    """A transient failure worth another try."""


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


class _Api:
    """GET requests to one API host with the token, bounded, errors typed."""

    def __init__(self, api: str, token: str, limits: GitHubLimits) -> None:
        self.api = api
        self.base = api.rstrip("/")
        self.host = urllib.parse.urlsplit(self.base).netloc
        self.token = token
        self.limits = limits
        self.opener = urllib.request.build_opener(_SameHostRedirects(self.host))

    @overload
    def get(
        self, url: str, what: str, *, missing: Literal[False] = False
    ) -> tuple[object, str]: ...
    @overload
    def get(self, url: str, what: str, *, missing: Literal[True]) -> tuple[object, str] | None: ...
    def get(self, url: str, what: str, *, missing: bool = False) -> tuple[object, str] | None:
        """The JSON answer at ``url`` and its ``Link`` header.

        Returns:
            None when ``missing`` allows a 404 and the API answers one.

        Raises:
            GitHubError: another host, an HTTP error, no answer, too large, not JSON.
        """
        if urllib.parse.urlsplit(url).netloc != self.host:
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
        request.add_unredirected_header("Authorization", f"Bearer {self.token}")
        for attempt in range(self.limits.retries + 1):
            if attempt:
                time.sleep(self.limits.backoff * 2 ** (attempt - 1))
            last = attempt == self.limits.retries
            try:
                return self._once(request, what, missing=missing, retry=not last)
            except _Retry:
                continue
        raise AssertionError("unreachable: the last attempt raises or answers")  # pragma: no cover

    def _once(
        self, request: urllib.request.Request, what: str, *, missing: bool, retry: bool
    ) -> tuple[object, str] | None:
        """One request; None for a 404 that ``missing`` allows.

        Raises:
            _Retry: a transient failure, when ``retry`` allows another try.
            GitHubError: any other failure, or a transient one on the last try.
        """
        limit = self.limits.max_body
        try:
            with self.opener.open(request, timeout=self.limits.timeout) as response:
                body = response.read(limit + 1)
                link = response.headers.get("Link", "")
        except urllib.error.HTTPError as e:
            e.close()
            if missing and e.code == HTTPStatus.NOT_FOUND:
                return None
            if retry and e.code >= HTTPStatus.INTERNAL_SERVER_ERROR:
                raise _Retry from None
            raise GitHubError(
                f"GitHub API: {what}: HTTP {e.code} {e.reason}", subject=self.api
            ) from None
        except (http.client.InvalidURL, ValueError):  # GITHUB_API_URL holds what no URL may
            raise GitHubError(
                f"GitHub API: {what}: {self.api!r} is not a usable URL", subject=self.api
            ) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, TimeoutError):
                reason = f"no answer within {self.limits.timeout:g} s"
            elif retry and isinstance(reason, ConnectionError):
                raise _Retry from None
            raise GitHubError(
                f"GitHub API unreachable at {self.api}: {reason}", subject=self.api
            ) from None
        if len(body) > limit:
            raise GitHubError(
                f"GitHub API: {what}: answer larger than {limit} bytes", subject=self.api
            )
        try:
            return json.loads(body), link
        except ValueError:
            raise GitHubError(f"GitHub API: {what}: answer is not JSON", subject=self.api) from None


def fetch_reviews(
    repository: str,
    number: int,
    token: str,
    *,
    api: str = DEFAULT_API,
    limits: GitHubLimits = DEFAULT_LIMITS,
) -> list[Review]:
    """Every review of pull request ``number`` of ``repository`` (``owner/name``).

    Raises:
        GitHubError: the API is unreachable, refuses the token, or answers nonsense.
    """
    client = _Api(api, token, limits)
    url: str | None = (
        f"{client.base}/repos/{repository}/pulls/{number}/reviews?per_page={limits.page_size}"
    )
    reviews: list[Review] = []
    for _ in range(limits.max_pages):
        if url is None:
            return reviews
        payload, link = client.get(url, f"reviews of pull request #{number}")
        reviews.extend(_parse_reviews(payload))
        found = _NEXT.search(link)
        url = found.group(1) if found else None
    if url is None:
        return reviews
    raise GitHubError(f"GitHub API: more than {limits.max_pages * limits.page_size} reviews")


def fetch_permissions(
    repository: str,
    logins: Iterable[str],
    token: str,
    *,
    api: str = DEFAULT_API,
    limits: GitHubLimits = DEFAULT_LIMITS,
) -> dict[str, Access]:
    """The access of each of ``logins`` to ``repository``; :data:`NO_ACCESS` on a 404.

    Raises:
        GitHubError: more logins than ``limits.max_lookups``, or the API is
            unreachable, refuses the token, or answers nonsense.
    """
    names = sorted(set(logins))
    if len(names) > limits.max_lookups:
        raise GitHubError(
            f"GitHub API: {len(names)} reviewers to check, more than {limits.max_lookups}"
        )
    client = _Api(api, token, limits)
    found: dict[str, Access] = {}
    for login in names:
        user = urllib.parse.quote(login, safe="")
        answer = client.get(
            f"{client.base}/repos/{repository}/collaborators/{user}/permission",
            f"permission of reviewer {login!r}",
            missing=True,  # not a collaborator (or no such user): no access
        )
        found[login] = NO_ACCESS if answer is None else _parse_access(answer[0], login)
    return found


def fetch_approvers(
    repository: str,
    number: int,
    token: str,
    *,
    head: str,
    author: str | None,
    api: str = DEFAULT_API,
    limits: GitHubLimits = DEFAULT_LIMITS,
) -> frozenset[str]:
    """Who approved commit ``head`` of pull request ``number`` with write access.

    Raises:
        GitHubError: the reviews or a candidate's permission could not be read (the
            caller fails closed: no approval is counted on a partial answer).
    """
    found = fetch_approvals(
        repository, number, token, head=head, author=author, api=api, limits=limits
    )
    return frozenset(a.login for a in found)


def fetch_approvals(
    repository: str,
    number: int,
    token: str,
    *,
    head: str,
    author: str | None,
    api: str = DEFAULT_API,
    limits: GitHubLimits = DEFAULT_LIMITS,
) -> list[Approval]:
    """The approvals of commit ``head`` of pull request ``number`` that count (see
    :func:`approvals`), by login.

    Raises:
        GitHubError: as :func:`fetch_approvers`.
    """
    reviews = fetch_reviews(repository, number, token, api=api, limits=limits)
    candidates = approval_candidates(reviews, head=head, author=author)
    permissions = fetch_permissions(repository, candidates, token, api=api, limits=limits)
    return approvals(reviews, permissions, head=head, author=author)


def merged_pull(payload: object, commit: str, branch: str | None) -> PullRequestFacts | None:
    """The merged pull request among GitHub's answer for ``commit`` (the pull requests
    associated with it): the one merged into ``branch`` (any branch when None), the
    earliest merged when several were.  None when none was merged."""
    from signing.provenance import PullRequestFacts

    if not isinstance(payload, list):
        raise GitHubError(f"GitHub API: the pull requests of commit {commit[:12]} are not a list")
    found: list[tuple[str, PullRequestFacts]] = []
    for item in payload:
        if not isinstance(item, dict):
            continue
        merged_at, number = _text(item, "merged_at"), item.get("number")
        base, head = _obj(item, "base"), _obj(item, "head")
        if merged_at is None or type(number) is not int:
            continue
        if branch is not None and _text(base, "ref") != branch:
            continue
        head_sha, base_sha = _text(head, "sha"), _text(base, "sha")
        if head_sha is None or base_sha is None:
            continue
        try:
            facts = PullRequestFacts(
                number=number, url=_text(item, "html_url"), head=head_sha, base=base_sha,
                merge_commit=_text(item, "merge_commit_sha"),
                author=_text(_obj(item, "user"), "login"),
            )  # fmt: skip
        except ValueError as e:
            raise GitHubError(f"GitHub API: pull request #{number} is not readable ({e})") from None
        found.append((merged_at, facts))
    return min(found, key=lambda f: f[0])[1] if found else None


def fetch_merged_pull(
    repository: str,
    commit: str,
    token: str,
    *,
    branch: str | None,
    api: str = DEFAULT_API,
    limits: GitHubLimits = DEFAULT_LIMITS,
) -> PullRequestFacts | None:
    """The pull request that merged ``commit`` into ``branch``
    (``GET /repos/{owner}/{repo}/commits/{sha}/pulls``); None when none did.

    Raises:
        GitHubError: the API is unreachable, refuses the token, or answers nonsense.
    """
    client = _Api(api, token, limits)
    payload, _ = client.get(
        f"{client.base}/repos/{repository}/commits/{commit}/pulls?per_page={limits.page_size}",
        f"pull requests of commit {commit[:12]}",
    )
    return merged_pull(payload, commit, branch)


@dataclass(frozen=True)
class ActionsRun:
    """The GitHub Actions run this process is part of, from its environment.

    Attributes:
        run_id: ``GITHUB_RUN_ID`` (None outside Actions).
        url: the run's page, when ``GITHUB_SERVER_URL`` and ``GITHUB_REPOSITORY`` say
            where it is.
    """

    run_id: str | None = None
    url: str | None = None
    repository: str | None = None
    workflow_ref: str | None = None
    attempt: str | None = None
    event: str | None = None
    runner_environment: str | None = None
    runner_os: str | None = None
    server: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ActionsRun:
        """Read the run from ``env`` (the one place the CI run is named from it)."""
        run = env.get("GITHUB_RUN_ID") or None
        server, repository = env.get("GITHUB_SERVER_URL"), env.get("GITHUB_REPOSITORY")
        url = None
        if run and server and repository:
            url = f"{server.rstrip('/')}/{repository}/actions/runs/{run}"
        return cls(
            run, url, repository or None,
            env.get("GITHUB_WORKFLOW_REF") or None, env.get("GITHUB_RUN_ATTEMPT") or None,
            env.get("GITHUB_EVENT_NAME") or None, env.get("RUNNER_ENVIRONMENT") or None,
            env.get("RUNNER_OS") or None, server or None,
        )  # fmt: skip

    @property
    def repository_url(self) -> str | None:
        """The repository's page, when the server and repository are known."""
        if self.server and self.repository:
            return f"{self.server.rstrip('/')}/{self.repository}"
        return None


@dataclass(frozen=True)
class PullRequest:
    """What the CI run knows about the pull request.

    Attributes:
        base: the commit the pull request is compared with.
        target_branch: the branch it would merge into, when known.
        number, head, author: the pull request's number, head commit and author's
            login; known only from a pull-request event (``GITHUB_EVENT_PATH``).
    """

    base: str
    target_branch: str | None = None
    number: int | None = None
    head: str | None = None
    author: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str], base: str | None) -> PullRequest:
        """From ``GITHUB_EVENT_PATH`` (a pull_request or pull_request_review event),
        else ``base``.

        Raises:
            UsageError: no base given and no pull-request event to read it from.
            GitHubError: ``GITHUB_EVENT_PATH`` names a file that is not a JSON object.
        """
        return cls.from_event(GitHubEnv.from_env(env), base)

    @classmethod
    def from_event(cls, github: GitHubEnv, base: str | None) -> PullRequest:
        """As :meth:`from_env`, from an environment already read."""
        event: object = {}
        path = github.event_path
        if path is not None and path.is_file():
            try:
                with path.open("rb") as fh:
                    raw = fh.read(_MAX_EVENT + 1)
                event = json.loads(raw) if len(raw) <= _MAX_EVENT else None
            except (OSError, ValueError, RecursionError) as e:
                raise GitHubError(
                    f"{path}: not a readable GitHub event ({e})", subject=str(path)
                ) from None
            if event is None:
                raise GitHubError(
                    f"{path}: larger than {_MAX_EVENT} bytes; not a GitHub event", subject=str(path)
                )
        if not isinstance(event, dict):
            raise GitHubError(f"{path}: not a GitHub event (a JSON object)", subject=str(path))
        pr = _obj(event, "pull_request")
        found = base or _text(_obj(pr, "base"), "sha")
        if not found:
            raise UsageError("no base to compare against: pass --base REF or run on a pull_request")
        branch = _text(_obj(pr, "base"), "ref") or github.base_ref
        number = pr.get("number")
        return cls(
            found,
            branch,
            number if isinstance(number, int) and not isinstance(number, bool) else None,
            _text(_obj(pr, "head"), "sha"),
            _text(_obj(pr, "user"), "login"),
        )


_MAX_EVENT: Final = 64 << 20
"""Largest GitHub event file read (GitHub caps webhook payloads at 25 MB)."""


def _obj(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _text(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True)
class GitHubEnv:
    """The GitHub Actions environment of a run: the one place ``GITHUB_*`` is read.

    Every field is None outside Actions (or when the variable is empty), and the code
    that uses one says what it does without it.

    Attributes:
        run: the Actions run (its id and page).
        ref: ``GITHUB_REF``, the ref the run is for.
        base_ref: ``GITHUB_BASE_REF``, the branch a pull request would merge into.
        event_path: ``GITHUB_EVENT_PATH``, the event that started the run.
        step_summary: ``GITHUB_STEP_SUMMARY``, the job summary file.
        output: ``GITHUB_OUTPUT``, the step outputs file.
        repository: ``GITHUB_REPOSITORY``, as ``owner/name``.
        api: ``GITHUB_API_URL`` (default: :data:`DEFAULT_API`).
        token: ``GITHUB_TOKEN``; never shown (``repr`` leaves it out).
    """

    run: ActionsRun = ActionsRun()
    ref: str | None = None
    base_ref: str | None = None
    event_path: Path | None = None
    step_summary: Path | None = None
    output: Path | None = None
    repository: str | None = None
    api: str = DEFAULT_API
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> GitHubEnv:
        """Read the run's GitHub environment from ``env`` (nothing else is read)."""

        def path(name: str) -> Path | None:
            value = env.get(name)
            return Path(value) if value else None

        return cls(
            run=ActionsRun.from_env(env),
            ref=env.get("GITHUB_REF") or None,
            base_ref=env.get("GITHUB_BASE_REF") or None,
            event_path=path("GITHUB_EVENT_PATH"),
            step_summary=path("GITHUB_STEP_SUMMARY"),
            output=path("GITHUB_OUTPUT"),
            repository=env.get("GITHUB_REPOSITORY") or None,
            api=env.get("GITHUB_API_URL") or DEFAULT_API,
            token=env.get("GITHUB_TOKEN") or None,
        )

    @property
    def branch(self) -> str | None:
        """The branch of ``GITHUB_REF`` (None: not in Actions, or a tag or a pull
        request's ref)."""
        if self.ref is None or not self.ref.startswith("refs/heads/"):
            return None
        return self.ref.removeprefix("refs/heads/")

    def pull_request(self, base: str | None) -> PullRequest:
        """The pull request of the event (see :meth:`PullRequest.from_env`)."""
        return PullRequest.from_event(self, base)
