"""Where a released version came from, signed (stable API).

Two documents, both written by ``ci release`` and signed with the targets key (CI's
online key):

**Review provenance** (:class:`Provenance`), inside the version's signed description
(``signing.version_doc.VersionDoc.provenance``), so that a device can say who approved
what it serves: the pull request that declared the version (number, head, base and
merge commits), the approvals counted (reviewer, review id, permission, the commit
approved: counted by the same rule as ``ci pr``), the policy that judged it (the base
commit's ``model.yaml`` and its SHA-256), the CI run (repository, workflow ref, run id
and attempt, runner environment) and the time.  A fact the run cannot know (a release
made by hand, outside GitHub Actions; a commit that came by no pull request) is absent,
and ``unknown`` says why: nothing is ever invented.

**SLSA provenance** (:func:`slsa_statement`): an in-toto Statement v1 whose subjects
are the version's released files (the ``.onnx`` and its external data files, by target
path and SHA-256) with a SLSA Provenance v1 predicate: the builder (the workflow, or
``local`` for a release by hand), the build type, the external parameters (repository,
model, version), the resolved dependencies (the source commit, and the parent's
artifact a delta is made from) and the run's metadata; the review provenance rides in
``internalParameters``.  It travels in a DSSE envelope (:func:`sign_envelope`,
securesystemslib's), published as the signed target
``provenance/<model>/<version>.intoto.json``, and any DSSE/in-toto verifier checks it
with the targets public key (:func:`verify_envelope` is securesystemslib's check).

Pure except :func:`sign_envelope` (which signs with a private key in memory).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Final

from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import Field, StringConstraints

if TYPE_CHECKING:
    from registry.device_report import ProvenanceReport

from registry.schema import Name, SemVer, Strict
from signing.errors import SignatureError, VerificationError
from signing.tuf_facts import GitCommit, Sha256Hex

__all__ = [
    "BUILD_TYPE",
    "LOCAL_BUILDER",
    "PAYLOAD_TYPE",
    "SLSA_PREDICATE",
    "STATEMENT_TYPE",
    "Approval",
    "CiRun",
    "Policy",
    "Provenance",
    "PullRequestFacts",
    "open_envelope",
    "review_of",
    "sign_envelope",
    "slsa_statement",
    "verify_envelope",
]

STATEMENT_TYPE: Final = "https://in-toto.io/Statement/v1"
SLSA_PREDICATE: Final = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE: Final = "application/vnd.in-toto+json"
BUILD_TYPE: Final = "https://modelreg.dev/buildtypes/ci-release/v1"
"""What ``ci release`` does: validate, build, test, delta and sign a declared version."""
LOCAL_BUILDER: Final = "https://modelreg.dev/builders/local"
"""The builder id of a release made outside GitHub Actions (by hand)."""
MAX_ENVELOPE_BYTES: Final = 1 << 20

Text = Annotated[str, StringConstraints(min_length=1, max_length=512)]
Login = Annotated[str, StringConstraints(min_length=1, max_length=100)]


class Approval(Strict):
    """One approval ``ci release`` counted (by the rule ``ci pr`` counts with).

    Attributes:
        login: the reviewer.
        review_id: GitHub's id of the review that approved (None when GitHub gave none).
        permission: the reviewer's role on the repository (``write``, ``maintain``,
            ``admin``, or a custom role based on write).
        commit: the commit the review approved (the pull request's head).
    """

    login: Login
    review_id: Annotated[int, Field(ge=0)] | None = None
    permission: Text
    commit: GitCommit


class PullRequestFacts(Strict):
    """The pull request that declared the version.

    Attributes:
        number: its number.
        url: its page.
        head: the head commit its approvals count for.
        base: the base commit it was judged against.
        merge_commit: the commit that merged it (None when GitHub gives none).
        author: who opened it.
    """

    number: Annotated[int, Field(ge=1)]
    url: Text | None = None
    head: GitCommit
    base: GitCommit
    merge_commit: GitCommit | None = None
    author: Login | None = None


class Policy(Strict):
    """The policy that judged the pull request: its base commit's ``model.yaml``."""

    file: Text
    commit: GitCommit
    sha256: Sha256Hex


class CiRun(Strict):
    """The CI run that released the version (GitHub Actions' environment).

    Attributes:
        repository: ``owner/name``.
        workflow_ref: ``GITHUB_WORKFLOW_REF`` (the workflow file at its ref).
        run_id, run_attempt: the run, and which attempt of it.
        url: the run's page.
        event: what started it (``push``, ``workflow_dispatch``).
        runner_environment: ``github-hosted`` or ``self-hosted``.
        runner_os: the runner's operating system.
    """

    repository: Text | None = None
    workflow_ref: Text | None = None
    run_id: Text
    run_attempt: Text | None = None
    url: Text | None = None
    event: Text | None = None
    runner_environment: Text | None = None
    runner_os: Text | None = None


class Provenance(Strict):
    """Where a released version came from (see the module doc).

    Attributes:
        commit: the commit the release was built from.
        released_at: when ``ci release`` signed it (UTC, ISO 8601).
        pull_request: the pull request that declared it; None when unknown.
        approvals: the approvals counted for it; None when they could not be counted
            (``unknown`` says why), empty when there were none.
        policy: the base commit's ``model.yaml`` that judged it; None when unknown.
        ci: the run that released it; None outside CI.
        unknown: each fact left out (``pull_request``, ``approvals``, ``policy``,
            ``ci``) and why.
    """

    commit: GitCommit
    released_at: Annotated[str, StringConstraints(min_length=20, max_length=40)]
    pull_request: PullRequestFacts | None = None
    approvals: list[Approval] | None = Field(default=None, max_length=100)
    policy: Policy | None = None
    ci: CiRun | None = None
    unknown: dict[Annotated[str, StringConstraints(pattern=r"^[a-z_]{1,32}$")], Text] = Field(
        default_factory=dict, max_length=16
    )

    @property
    def approvers(self) -> list[str]:
        """The logins of the approvals counted (empty when none or unknown)."""
        return sorted(a.login for a in self.approvals or ())

    def report(self) -> ProvenanceReport:
        """What a device says of it in its status and reports (``registry.device_report``)."""
        from registry.device_report import ProvenanceReport

        ci = None
        if self.ci is not None:
            ci = self.ci.url or self.ci.run_id
        return ProvenanceReport(
            commit=self.commit,
            pull_request=self.pull_request.number if self.pull_request else None,
            approvers=None if self.approvals is None else self.approvers,
            ci_run=ci, released_at=self.released_at, unknown=sorted(self.unknown),
        )  # fmt: skip

    def summary(self) -> str:
        """One line: ``PR #12 approved by ann, bob; run 4242 attempt 1``."""
        parts = []
        if self.pull_request is not None:
            pr = f"PR #{self.pull_request.number}"
            if self.approvals is not None:
                pr += " approved by " + (", ".join(self.approvers) or "no one")
            parts.append(pr)
        else:
            parts.append(f"no pull request ({self.unknown.get('pull_request', 'unknown')})")
        if self.ci is not None:
            attempt = f" attempt {self.ci.run_attempt}" if self.ci.run_attempt else ""
            parts.append(f"CI run {self.ci.run_id}{attempt}")
        else:
            parts.append(f"not released by CI ({self.unknown.get('ci', 'unknown')})")
        return "; ".join(parts)


def slsa_statement(
    subjects: Mapping[str, str],
    *,
    model: Name,
    version: SemVer,
    provenance: Provenance,
    repository_url: str | None,
    parent_artifact: tuple[str, str] | None,
    finished_on: str,
) -> dict[str, Any]:
    """The in-toto Statement v1 with a SLSA Provenance v1 predicate for a version.

    Args:
        subjects: target path -> SHA-256 of each released file of the version.
        model, version: the version.
        provenance: its review provenance (carried in ``internalParameters``).
        repository_url: the source repository's URL, when known.
        parent_artifact: (target path, SHA-256) of the parent's artifact, a delta's base.
        finished_on: when the release signed it (UTC, ISO 8601).
    """
    ci = provenance.ci
    builder = LOCAL_BUILDER
    if ci is not None and ci.workflow_ref:
        builder = f"https://github.com/{ci.workflow_ref}"
    source_uri = f"git+{repository_url}" if repository_url else "git+unknown"
    dependencies: list[dict[str, Any]] = [
        {"uri": f"{source_uri}@{provenance.commit}", "digest": {"gitCommit": provenance.commit}}
    ]
    if parent_artifact is not None:
        path, digest = parent_artifact
        dependencies.append({"name": path, "digest": {"sha256": digest}})
    metadata: dict[str, Any] = {"startedOn": provenance.released_at, "finishedOn": finished_on}
    if ci is not None:
        metadata["invocationId"] = ci.url or ci.run_id
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": name, "digest": {"sha256": digest}} for name, digest in subjects.items()
        ],
        "predicateType": SLSA_PREDICATE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "repository": repository_url,
                    "model": model,
                    "version": version,
                    "workflow": ci.workflow_ref if ci is not None else None,
                },
                "internalParameters": {
                    "review": provenance.model_dump(mode="json", exclude_none=True)
                },
                "resolvedDependencies": dependencies,
            },
            "runDetails": {"builder": {"id": builder}, "metadata": metadata},
        },
    }


def sign_envelope(statement: Mapping[str, Any], key: ec.EllipticCurvePrivateKey) -> bytes:
    """``statement`` in a DSSE envelope signed by ``key`` (securesystemslib's), as JSON.

    The signature's keyid is securesystemslib's id of the public key, which is how
    a DSSE verifier finds the key to check it with.
    """
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import CryptoSigner, SSlibKey

    public = SSlibKey.from_crypto(key.public_key())
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    envelope = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(CryptoSigner(key, public))
    return (json.dumps(envelope.to_dict(), sort_keys=True, indent=1) + "\n").encode()


def open_envelope(data: bytes, subject: str) -> dict[str, Any]:
    """The statement inside a DSSE envelope, without checking its signature (the bytes
    were checked against their signed digest first: a published target).

    Raises:
        VerificationError: not a DSSE envelope of an in-toto statement.
    """
    if len(data) > MAX_ENVELOPE_BYTES:
        raise VerificationError(f"{len(data)} bytes, over {MAX_ENVELOPE_BYTES}", subject)
    try:
        doc = json.loads(data)
        kind = doc.get("payloadType")
        statement = json.loads(base64.b64decode(doc["payload"], validate=True))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise VerificationError(
            f"not a DSSE envelope of an in-toto statement ({e})", subject
        ) from None
    if kind != PAYLOAD_TYPE:
        raise VerificationError(f"the envelope's payloadType is {kind!r}", subject)
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise VerificationError("the envelope holds no in-toto Statement v1", subject)
    return statement


def verify_envelope(
    data: bytes, public_keys: Sequence[ec.EllipticCurvePublicKey], subject: str
) -> dict[str, Any]:
    """The statement of a DSSE envelope signed by one of ``public_keys``.

    Raises:
        SignatureError: no signature by any of the keys verifies.
        VerificationError: not a DSSE envelope of an in-toto statement.
    """
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError as SslibVerificationError
    from securesystemslib.signer import Key, SSlibKey

    statement = open_envelope(data, subject)
    keys: list[Key] = [SSlibKey.from_crypto(k) for k in public_keys]
    try:
        Envelope.from_dict(json.loads(data)).verify(keys, 1)
    except (SslibVerificationError, ValueError, KeyError) as e:
        raise SignatureError(f"the provenance envelope does not verify ({e})", subject) from None
    return statement


def review_of(statement: Mapping[str, Any], subject: str) -> Provenance:
    """The review provenance a SLSA statement of ours carries.

    Raises:
        VerificationError: it carries none, or not one of this schema.
    """
    try:
        review = statement["predicate"]["buildDefinition"]["internalParameters"]["review"]
        return Provenance.model_validate(review)
    except (KeyError, TypeError, ValueError) as e:
        raise VerificationError(f"no review provenance in the statement ({e})", subject) from None
