"""A small stand-in for GitHub's REST API on 127.0.0.1.

It serves pull-request reviews (paginated), each user's permission on a repository
(``/repos/{owner}/{repo}/collaborators/{username}/permission``) and the pull requests
of a commit (``/repos/{owner}/{repo}/commits/{sha}/pulls``, set by :meth:`FakeGitHub.merge`).  A reviewer added with
:meth:`FakeGitHub.review` has write access unless told otherwise, so that an approval
means what it says; :meth:`FakeGitHub.access` sets a user's role, ``None`` for a user
who is not a collaborator (the API answers 404).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

TOKEN = "ghs_test-token"  # noqa: S105 - a test token for the fake API


@dataclass
class FakeGitHub:
    """Reviews by (repository, number); ``url`` is set while serving."""

    reviews: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    url: str = ""
    requests: list[str] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    broken: int | None = None  # answer every request with this HTTP status
    # answer the next requests with these HTTP statuses, one each (0: close the
    # connection without an answer), then as usual: a flaky API
    flaky: list[int] = field(default_factory=list)
    redirect: str | None = None  # answer every request with a 302 to this URL
    next_link: str | None = None  # the Link of the first page points here instead
    # role_name by (repository, user); None: not a collaborator (404)
    roles: dict[tuple[str, str], str | None] = field(default_factory=dict)
    broken_permissions: int | None = None  # answer permission requests with this status
    permission_body: Any = None  # answer permission requests with this JSON instead
    # the pull requests GitHub associates with each commit, by (repository, sha)
    pulls: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)

    def merge(
        self, repository: str, number: int, *, commits: list[str], head: str, base: str,
        merge_commit: str, author: str = "dev", branch: str = "main",
    ) -> None:  # fmt: skip
        """Pull request ``number`` merged into ``branch``: each of ``commits`` (and the
        merge commit) is associated with it."""
        pull = {"number": number, "html_url": f"https://github.example/{repository}/pull/{number}",
                "merged_at": "2026-12-01T10:00:00Z", "merge_commit_sha": merge_commit,
                "user": {"login": author}, "head": {"sha": head, "ref": f"pr-{number}"},
                "base": {"sha": base, "ref": branch}}  # fmt: skip
        for sha in [*commits, merge_commit]:
            self.pulls.setdefault((repository, sha), []).append(pull)

    def review(
        self, repository: str, number: int, user: str, state: str, commit: str,
        *, association: str = "MEMBER", bot: bool = False,
    ) -> None:  # fmt: skip
        self.roles.setdefault((repository, user), "write")
        self.reviews.setdefault((repository, number), []).append(
            {"id": len(self.requests), "state": state, "commit_id": commit,
             "user": {"login": user, "type": "Bot" if bot else "User"},
             "author_association": association}
        )  # fmt: skip

    def access(self, repository: str, user: str, role: str | None) -> None:
        """Give ``user`` the role ``role`` (admin, maintain, write, triage, read or a
        custom role based on write), or none at all."""
        self.roles[(repository, user)] = role

    def permission(self, repository: str, user: str) -> dict[str, Any] | None:
        """The API's answer for ``user``: the legacy permission folds maintain into
        write and triage into read; a custom role is based on write here."""
        role = self.roles.get((repository, user))
        if role is None:
            return None
        legacy = {"maintain": "write", "triage": "read"}.get(role, role)
        if legacy not in {"admin", "write", "read", "none"}:
            legacy = "write"
        return {"permission": legacy, "role_name": role,
                "user": {"login": user, "type": "User"}}  # fmt: skip


def _handler(fake: FakeGitHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fake.requests.append(self.path)
            fake.authorizations.append(self.headers.get("Authorization"))
            parts = urlsplit(self.path)
            segments = parts.path.strip("/").split("/")
            if fake.redirect is not None:
                self.send_response(302)
                self.send_header("Location", fake.redirect)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if fake.flaky:
                status = fake.flaky.pop(0)
                if status == 0:
                    self.close_connection = True  # no status line: RemoteDisconnected
                    return
                self._send(status, {"message": "flaky on purpose"})
                return
            if fake.broken is not None:
                self._send(fake.broken, {"message": "broken on purpose"})
                return
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._send(401, {"message": "Bad credentials"})
                return
            if len(segments) == 6 and segments[0] == "repos" and segments[3:6:2] == [
                "collaborators", "permission"
            ]:  # fmt: skip
                self._permission(f"{segments[1]}/{segments[2]}", unquote(segments[4]))
                return
            if len(segments) == 6 and segments[0] == "repos" and segments[3:6:2] == [
                "commits", "pulls"
            ]:  # fmt: skip
                self._send(200, fake.pulls.get((f"{segments[1]}/{segments[2]}", segments[4]), []))
                return
            if (
                len(segments) != 6
                or segments[0] != "repos"
                or segments[3:6:2] != ["pulls", "reviews"]
            ):
                self._send(404, {"message": "Not Found"})
                return
            key = (f"{segments[1]}/{segments[2]}", int(segments[4]))
            if key not in fake.reviews:
                self._send(404, {"message": "Not Found"})
                return
            query = parse_qs(parts.query)
            per_page = int(query.get("per_page", ["30"])[0])
            page = int(query.get("page", ["1"])[0])
            items = fake.reviews[key]
            chunk = items[(page - 1) * per_page : page * per_page]
            link = None
            if page * per_page < len(items):
                base = fake.next_link or f"{fake.url}{parts.path}"
                link = f'<{base}?per_page={per_page}&page={page + 1}>; rel="next"'
            self._send(200, chunk, link)

        def _permission(self, repository: str, user: str) -> None:
            if fake.broken_permissions is not None:
                self._send(fake.broken_permissions, {"message": "broken on purpose"})
                return
            if fake.permission_body is not None:
                self._send(200, fake.permission_body)
                return
            answer = fake.permission(repository, user)
            if answer is None:
                self._send(404, {"message": f"{user} is not a user"})
            else:
                self._send(200, answer)

        def _send(self, status: int, payload: Any, link: str | None = None) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if link:
                self.send_header("Link", link)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def fake_github() -> Iterator[FakeGitHub]:
    """Serve a :class:`FakeGitHub` on an ephemeral loopback port."""
    fake = FakeGitHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
