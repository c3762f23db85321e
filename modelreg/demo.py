"""``make demo``: the main job end to end on embedded defaults, narrated.

Builds the example ONNX models, scaffolds a GitOps model repository (local git, DVC
with a local remote), declares models and versions with golden tests, promotes through
canary to production, shows what a bad manifest looks like to a reviewer, and prints
the version-state table.  Each step runs the real ``modelreg`` command line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import Any

from modelreg.examples import write_examples
from registry.layout import model_file, version_file

_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "modelreg demo",
    "GIT_AUTHOR_EMAIL": "demo@modelreg.invalid",
    "GIT_COMMITTER_NAME": "modelreg demo",
    "GIT_COMMITTER_EMAIL": "demo@modelreg.invalid",
}


class Demo:
    """Runs and narrates commands in a work folder."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.repo = work / "fleet-models"
        self.env = {**os.environ, **_GIT_IDENTITY, "DVC_NO_ANALYTICS": "1"}

    def step(self, title: str) -> None:
        print(f"\n=== {title}")

    def run(
        self,
        *args: str,
        cwd: Path | None = None,
        expect: int = 0,
        env: dict[str, str] | None = None,
    ) -> str:
        """Run ``modelreg ARGS`` (or git) and echo it like a terminal session."""
        argv = list(args)
        shown = shlex.join(argv)
        if argv[0] == "modelreg":
            argv = [sys.executable, "-m", "modelreg", *argv[1:]]
        print(f"$ {shown}")
        proc = subprocess.run(
            argv, cwd=cwd or self.repo, env={**self.env, **(env or {})},
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        for stream in (proc.stdout, proc.stderr):
            if stream.strip():
                print("  " + stream.rstrip().replace("\n", "\n  "))
        if proc.returncode != expect:
            raise SystemExit(f"demo failed: `{shown}` exited {proc.returncode}, expected {expect}")
        return proc.stdout

    def device(self) -> None:
        """What a device verifies (the edge daemon builds on this)."""
        from edge_sync.sync.trust import DeviceTrust
        from signing.errors import VerificationError
        from signing.target_names import artifact_path

        print("$ # on a device provisioned with trust/metadata/1.root.json")
        state = self.work / "device"
        DeviceTrust.provision(state, (self.repo / "trust/metadata/1.root.json").read_bytes())
        remote = self.repo / ".modelreg/remote/modelreg"
        trust = DeviceTrust(state, self.repo, remote)
        trust.refresh()
        production = trust.channels().models["mlp"]["production"]
        path = artifact_path("mlp", production.version)
        got = trust.fetch(path, state / "artifacts", model="mlp", version=production.version)
        facts = trust.target_info(path).facts
        print(f"  production is mlp {production.version} (sequence {production.sequence})")
        print(f"  fetched {got.name}: signed by CI at commit {facts.git_commit}, verified")
        where = PurePosixPath(path)
        stored = next((remote / "targets" / where.parent).glob(f"*.{where.name}"))
        original = stored.read_bytes()
        stored.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
        got.unlink()
        try:
            trust.fetch(path, state / "artifacts")
        except VerificationError as e:
            print(f"  a tampered copy on the remote is refused: {e}")
        finally:
            stored.write_bytes(original)

    def main(self) -> None:
        """The whole story."""
        self.step("Example models (ONNX, built locally with onnx.helper)")
        examples = self.work / "examples"
        # medium: its weight matrices are large enough to travel as tensors
        for f in write_examples(examples, size="medium"):
            print(f"  {f.path.relative_to(self.work)}  {f.path.stat().st_size:>6} bytes")
        ex = "../examples"

        self.step("Scaffold a GitOps model repository (git + DVC with a local remote)")
        self.run("modelreg", "init", self.repo.name, cwd=self.work)
        self.run("git", "commit", "-qm", "modelreg init")

        self.step("Declare a model and its first version (signature read from the graph)")
        self.run("modelreg", "model", "add", "mlp", "--owner", "vision@example.com",
                 "--task", "classification", "--target", "cpu", "--target", "gpu-trt",
                 "--channel-order", "canary,production")  # fmt: skip
        self.run("modelreg", "version", "add", "mlp", "1.0.0", "--artifact", f"{ex}/mlp/1.0.0.onnx",
                 "--golden-inputs", f"{ex}/mlp/1.0.0.inputs.npz", "--metric", "accuracy=0.912",
                 "--target", "cpu=onnxruntime", "--target", "gpu-trt=tensorrt:fp16")  # fmt: skip
        self.run("git", "commit", "-qm", "mlp 1.0.0")

        self.step("Promotion follows the policy: canary before production")
        self.run("modelreg", "promote", "mlp", "1.0.0", "--channel", "production", expect=1)
        self.run("modelreg", "promote", "mlp", "1.0.0", "--channel", "canary")
        self.run("modelreg", "promote", "mlp", "1.0.0", "--channel", "production")
        self.run("git", "commit", "-qam", "promote mlp 1.0.0 to production")

        self.step("Release v1 on main: build, sign, publish, mirror into MLflow")
        self.run("modelreg", "ci", "release")
        self.run("git", "log", "--oneline", "-3")

        self.pull_request(ex)

    def pull_request(self, ex: str) -> None:
        """A v2 pull request: review comment with the diff, a broken variant, merge, release."""
        self.step("A pull request: a fine-tune (same graph, some tensors changed) to 10% canary")
        self.run("git", "checkout", "-qb", "mlp-1.1.0")
        self.run("modelreg", "version", "add", "mlp", "1.1.0", "--artifact", f"{ex}/mlp/1.1.0.onnx",
                 "--golden-inputs", f"{ex}/mlp/1.1.0.inputs.npz", "--metric", "accuracy=0.924",
                 "--target", "cpu=onnxruntime")  # fmt: skip
        self.run("modelreg", "promote", "mlp", "1.1.0", "--channel", "canary", "--percent", "10")
        self.run("git", "commit", "-qam", "mlp 1.1.0 to 10% canary")
        self.run("modelreg", "ci", "pr", "--base", "main")
        comment = (self.repo / ".modelreg/ci/pr-comment.md").read_text(encoding="utf-8")
        print("  --- the pull request comment ---")
        print("  " + comment.strip().replace("\n", "\n  "))

        self.step("What a reviewer sees when a pull request breaks a manifest")
        version = version_file(self.repo / "manifests", "mlp", "1.1.0")
        model = model_file(self.repo / "manifests", "mlp")
        saved = {p: p.read_text(encoding="utf-8") for p in (version, model)}
        version.write_text(saved[version].replace("format: onnx", "fromat: onnx"), encoding="utf-8")
        model.write_text(
            saved[model].replace("production: 1.0.0", "production: 1.2.0"), encoding="utf-8"
        )
        self.run("modelreg", "validate", expect=1)
        for path, text in saved.items():
            path.write_text(text, encoding="utf-8")

        self.step("Merged and released by the release workflow, which signs who approved it")
        base = self.run("git", "rev-parse", "main").strip()
        head = self.run("git", "rev-parse", "HEAD").strip()
        self.run("git", "checkout", "-q", "main")
        self.run("git", "merge", "-q", "--ff-only", "mlp-1.1.0")
        with _github_stand_in(base, head) as api:
            print("  (the demo plays GitHub Actions: the run's variables, and a stand-in for "
                  f"GitHub's REST API at {api} that answers as github.com would for pull "
                  "request #1, approved by ann)")  # fmt: skip
            self.run("modelreg", "ci", "release", env=_actions_env(api))
        self.run("modelreg", "show", "mlp:1.1.0", "--provenance")
        self.run("modelreg", "status", "--mlflow")
        self.mlflow()

        self.step("Channels move only from the promotion branch (main), whatever runs publish")
        self.run("git", "checkout", "-qb", "hotfix")
        self.run("modelreg", "promote", "mlp", "1.1.0", "--channel", "production")
        self.run("git", "commit", "-qam", "1.1.0 to production from a side branch")
        self.run("modelreg", "publish", expect=1)
        self.run("git", "checkout", "-q", "main")
        self.run("git", "branch", "-qD", "hotfix")
        self.device()
        self.trust()
        self.edge()

    def mlflow(self) -> None:
        """A data scientist loads the production model with MLflow's own API."""
        import logging
        import warnings

        import mlflow
        import mlflow.onnx

        print("$ python -c 'mlflow.onnx.load_model(\"models:/mlp@production\")'")
        logging.getLogger("mlflow").setLevel(logging.ERROR)
        mlflow.set_tracking_uri(f"sqlite:///{self.repo / '.modelreg/mlflow.db'}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = mlflow.onnx.load_model("models:/mlp@production")
            version = mlflow.MlflowClient().get_model_version_by_alias("mlp", "production")
        inputs = [(i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim])
                  for i in model.graph.input]  # fmt: skip
        print(f"  loaded MLflow version {version.version}: inputs {inputs}")
        tags = version.tags
        semver, commit = tags.get("modelreg.semver"), tags.get("modelreg.git_commit", "")[:8]
        digest = tags.get("modelreg.sha256", "")[:12]
        print(f"  tags: semver {semver}, git commit {commit}, sha256 {digest}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            client = mlflow.MlflowClient()
            canary = client.get_model_version_by_alias("mlp", "canary")
            files = [f.path for f in client.list_artifacts(canary.run_id or "", "modelreg")]
        tags = canary.tags
        print(f"  @canary is MLflow version {canary.version} ({tags.get('modelreg.semver')})")
        print(f"    diff: {tags.get('modelreg.diff_summary')}")
        print(f"    attached: {', '.join(files)}")

    def trust(self) -> None:
        """Signing, publishing, what a device verifies, key lifecycle."""
        self.step("Trust: an OMS signature bundle for the release, checked byte for byte")
        bundle = "../mlp-1.1.0.sigstore.json"
        head = self.run("git", "rev-parse", "--short", "HEAD").strip()
        self.run("modelreg", "sign", "models/mlp/1.1.0.onnx", "--bundle", bundle, "--model", "mlp",
                 "--version", "1.1.0", "--parent", "1.0.0", "--git-commit", head,
                 "--ci-run", "demo")  # fmt: skip
        self.run("modelreg", "verify", "models/mlp/1.1.0.onnx", "--bundle", bundle,
                 "--public-key", ".modelreg/keys/targets.pub")  # fmt: skip
        tampered = self.work / "tampered.onnx"
        data = bytearray((self.repo / "models/mlp/1.1.0.onnx").read_bytes())
        data[-10] ^= 0x01
        tampered.write_bytes(bytes(data))
        self.run("modelreg", "verify", "../tampered.onnx", "--bundle", bundle,
                 "--public-key", ".modelreg/keys/targets.pub", expect=1)  # fmt: skip

        self.step("Trust: TUF metadata kept fresh, and an online key rotated")
        self.run("modelreg", "freshness", "refresh")
        self.run("modelreg", "keys", "rotate", "--role", "timestamp")
        self.run("git", "add", "trust")
        self.run("git", "commit", "-qm", "rotate the timestamp key")
        self.run("git", "ls-files", "trust")

    def edge(self) -> None:
        """Two devices running the edge daemon, one following git and one the metadata
        mirrored to the artifact remote, both reporting to a folder: production
        installed in full, then 1.1.0 promoted and installed by delta (under traffic on
        the first), each update's stage timeline printed, then the fleet's view."""
        from edge_sync.config import load_edge_config
        from edge_sync.daemon import status_document

        self.step("Devices: the edge daemon follows production (modelreg edge run)")
        reports = self.work / "fleet-reports"
        sources = {
            "cam-0042": f"{{url: {self.repo}, branch: main, poll_interval: 1h}}",
            # no git on this one: the metadata `ci release` mirrored to the remote
            "cam-0043": "{source: artifacts, poll_interval: 1h}",
        }
        devices: dict[str, tuple[Path, Any]] = {}
        for name, repository in sources.items():
            device = self.work / f"device-{name}"
            device.mkdir()
            shutil.copy(self.repo / "trust/metadata/1.root.json", device / "1.root.json")
            config = device / "edge.yaml"
            config.write_text(
                "apiVersion: modelreg/v1\n"
                "kind: EdgeConfig\n"
                f"device: {{id: {name}, labels: {{arch: x86_64, accelerator: none}}}}\n"
                f"repository: {repository}\n"
                "trust: {root: 1.root.json}\n"
                f"artifacts: {{url: {self.repo / '.modelreg/remote/modelreg'}}}\n"
                "models: [{name: mlp, channel: production}]\n"
                "state_dir: state\n"
                "serve: {listen: 127.0.0.1:0, grpc_listen: 127.0.0.1:0}\n"
                f"report: {{url: {reports}, heartbeat: 1h}}\n",
                encoding="utf-8",
            )
            print(f"  {device.name}/edge.yaml:")
            print("    " + config.read_text(encoding="utf-8").strip().replace("\n", "\n    "))
            devices[name] = (device, load_edge_config(config))
        first, (device, edge) = next(iter(devices.items()))

        def serving(config: Any) -> str | None:
            model = status_document(config)["models"]["mlp"]["serving"]
            return None if model is None else str(model["version"])

        def wait_for(version: str) -> None:
            deadline = time.monotonic() + 120
            for name, (folder, config) in devices.items():
                while serving(config) != version:
                    if daemons[name].poll() is not None or time.monotonic() > deadline:
                        log = (folder / "daemon.log").read_text(encoding="utf-8")
                        raise SystemExit(f"demo failed: {name} did not install {version}\n{log}")
                    time.sleep(0.2)

        daemons: dict[str, Any] = {}
        try:
            for name, (folder, _) in devices.items():
                print(f"$ modelreg edge run --config {folder.name}/edge.yaml &")
                with (folder / "daemon.log").open("w") as log:
                    daemons[name] = subprocess.Popen(
                        [sys.executable, "-m", "modelreg", "edge", "run", "--config", "edge.yaml"],
                        cwd=folder, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                    )  # fmt: skip
            wait_for("1.0.0")
            self.infer(edge)
            self.run("modelreg", "edge", "status", "--config", "edge.yaml", cwd=device)
            self.step("v2 reaches production; under traffic, SIGHUP syncs at once; by the "
                      "tensors it changed")  # fmt: skip
            self.run("modelreg", "promote", "mlp", "1.1.0", "--channel", "production")
            self.run("git", "commit", "-qam", "promote mlp 1.1.0 to production")
            self.run("modelreg", "ci", "release")
            for name, process in daemons.items():
                if name != first:
                    process.send_signal(signal.SIGHUP)
            self.under_traffic(edge, daemons[first], lambda: wait_for("1.1.0"))
            self.infer(edge)
            self.run("modelreg", "edge", "status", "--config", "edge.yaml", cwd=device)
            self.step("The device never rebuilt the file; it can still write it, verified")
            self.run("modelreg", "edge", "export", "mlp", "--config", "edge.yaml",
                     "--out", "../mlp-1.1.0.exported.onnx", cwd=device)  # fmt: skip
            self.fleet(reports, devices)
        finally:
            for name, process in daemons.items():
                print(f"$ kill -TERM <{name}>")
                process.send_signal(signal.SIGTERM)
                print(f"  the daemon exited {process.wait(timeout=60)}")

    def fleet(self, reports: Path, devices: dict[str, tuple[Path, Any]]) -> None:
        """What the fleet's reports say, once every device has reported 1.1.0: then
        the devices enrolled, and a forged report that does not count."""
        from cryptography.hazmat.primitives.asymmetric import ed25519

        from fleet.reports import read_entry
        from registry.errors import RegistryError
        from signing.device_reports import seal_report

        self.step("The fleet: each device reports to a folder (S3 or HTTP PUT at scale)")
        deadline = time.monotonic() + 60
        for name in devices:
            report = reports / f"{name}.json"
            while True:
                with contextlib.suppress(OSError, RegistryError, KeyError, AttributeError):
                    held = read_entry(report.name, report.read_bytes()).models["mlp"].serving
                    if held is not None and held.version == "1.1.0":
                        break
                if time.monotonic() > deadline:
                    raise SystemExit(f"demo failed: {name} did not report 1.1.0")
                time.sleep(0.2)
        self.run("modelreg", "fleet", "status", "--reports", str(reports))
        self.step("Devices sign their reports: enroll their keys, and a forged report "
                  "counts for nothing")  # fmt: skip
        keys = self.work / "device-keys"
        keys.mkdir()
        for name, (folder, _) in devices.items():
            self.run("modelreg", "edge", "key", "--config", "edge.yaml",
                     "--out", str(keys / f"{name}.pub"), cwd=folder)  # fmt: skip
        self.run("modelreg", "fleet", "enroll", "--from", str(keys))
        self.run("git", "commit", "-qm", "enroll cam-0042 and cam-0043")
        # whoever can write to the sink writes a report for cam-0042, signed by a key of
        # their own: it claims the device serves something else
        first = next(iter(devices))
        genuine = read_entry(f"{first}.json", (reports / f"{first}.json").read_bytes())
        forged = genuine.model_copy(update={"sequence": (genuine.sequence or 0) + 1000})
        payload = forged.model_dump_json().encode()
        (reports / f"{first}.json").write_bytes(
            seal_report(payload, ed25519.Ed25519PrivateKey.generate())
        )
        self.run("modelreg", "fleet", "status", "--reports", str(reports))

    def under_traffic(self, edge: Any, daemon: Any, wait: Any) -> None:
        """Send SIGHUP while 16 clients keep requests in flight; print what they saw
        (requests, failures, p99 before and during the update) and what the swap cost
        in memory (the daemon's peak resident set during the update over before it)."""
        import json
        import threading

        import numpy as np

        from edge_sync.daemon import status_document
        from modelreg.loadgen import LoadResult, run_load_subprocess

        listen = status_document(edge)["daemon"]["listen"]
        with np.load(self.work / "examples/mlp/1.0.0.inputs.npz") as held:
            x = held["input"][:1]
        body = json.dumps(
            {
                "inputs": [
                    {
                        "name": "input",
                        "shape": list(x.shape),
                        "datatype": "FP32",
                        "data": x.reshape(-1).tolist(),
                    }
                ]
            }
        )
        url = f"http://{listen}/v2/models/mlp/infer"
        results: list[LoadResult] = []
        load = threading.Thread(target=lambda: results.append(run_load_subprocess(
            url, body.encode(), concurrency=16, duration_s=8)))  # fmt: skip
        print(f"$ python -m modelreg.loadgen {url} --concurrency 16 --duration 8 &")
        load.start()
        time.sleep(3)
        proc = Path(f"/proc/{daemon.pid}")
        steady = _vm(proc, "VmRSS")
        with contextlib.suppress(OSError):
            (proc / "clear_refs").write_text("5")  # the peak starts from here
        print("$ kill -HUP <daemon>")
        daemon.send_signal(signal.SIGHUP)
        wait()
        peak = _vm(proc, "VmHWM")
        load.join()
        result = results[0]
        update = status_document(edge)["models"]["mlp"]["last_update"]
        took = sum(update["stages_ms"].values()) / 1000
        first_new = min(t for t, v in zip(result.finished_s, result.versions, strict=True)
                        if v == "1.1.0")  # fmt: skip
        before = [lat for t, lat in zip(result.finished_s, result.latencies_s, strict=True)
                  if t < first_new - took - 0.5]  # fmt: skip
        during = [lat for t, lat in zip(result.finished_s, result.latencies_s, strict=True)
                  if first_new - took - 0.5 <= t <= first_new + 0.5]  # fmt: skip
        counts = ", ".join(f"{v}: {n}" for v, n in sorted(result.version_counts().items()))
        print(f"  traffic: {result.requests} requests ({counts}), {result.failed} failed")
        print(f"  p99 before the update {_p99(before):.1f} ms; during it {_p99(during):.1f} ms")
        if steady and peak:
            cost = (peak - steady) / 1024
            print(f"  memory: {steady / 1024:.0f} MiB serving 1.0.0, peak {peak / 1024:.0f} "
                  f"MiB during the update (+{cost:.1f} MiB for the swap)")  # fmt: skip
        if result.failed:
            raise SystemExit(f"demo failed: {result.failed} requests failed during the swap")

    def infer(self, edge: Any) -> None:
        """One Open Inference Protocol request to the device, as an application sends it."""
        import json
        import urllib.request

        import numpy as np

        from edge_sync.daemon import status_document

        listen = status_document(edge)["daemon"]["listen"]
        with np.load(self.work / "examples/mlp/1.0.0.inputs.npz") as held:
            x = held["input"][:1]
        body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                            "data": x.reshape(-1).tolist()}]}  # fmt: skip
        url = f"http://{listen}/v2/models/mlp/infer"
        print(f"$ curl -s {url} -d '{{\"inputs\": [...]}}'")
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
            answer = json.loads(response.read())
        probs = ", ".join(f"{v:.3f}" for v in answer["outputs"][0]["data"])
        print(f"  model_version {answer['model_version']}: probs [{probs}]")
        self.infer_grpc(status_document(edge)["daemon"]["grpc_listen"], x)

    @staticmethod
    def infer_grpc(where: str, x: Any) -> None:
        """The same request over gRPC (``serve.grpc_listen``), as a client generated from
        the protocol's ``.proto`` (or ``tritonclient.grpc``) sends it."""
        import grpc
        import numpy as np

        from edge_sync.serve.proto import oip_v2_pb2 as pb

        request = pb.ModelInferRequest(model_name="mlp")
        request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
        request.raw_input_contents.append(np.ascontiguousarray(x, "<f4").tobytes())
        print(f"$ grpcurl -plaintext {where} inference.GRPCInferenceService/ModelInfer  # ...")
        with grpc.insecure_channel(where) as channel:
            call = channel.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            answer = call(request, timeout=30)
        values = np.frombuffer(answer.raw_output_contents[0], "<f4")
        probs = ", ".join(f"{v:.3f}" for v in values)
        print(f"  gRPC: model_version {answer.model_version}: probs [{probs}]")


_DEMO_REPOSITORY = "demo/fleet-models"


def _actions_env(api: str) -> dict[str, str]:
    """What a GitHub Actions release job's environment says (the demo's stand-in)."""
    return {
        "GITHUB_REPOSITORY": _DEMO_REPOSITORY, "GITHUB_SERVER_URL": api, "GITHUB_API_URL": api,
        "GITHUB_TOKEN": "demo-token", "GITHUB_RUN_ID": "1", "GITHUB_RUN_ATTEMPT": "1",
        "GITHUB_REF": "refs/heads/main", "GITHUB_EVENT_NAME": "push",
        "GITHUB_WORKFLOW_REF": f"{_DEMO_REPOSITORY}/.github/workflows/release.yml@refs/heads/main",
        "RUNNER_ENVIRONMENT": "self-hosted", "RUNNER_OS": "Linux",
    }  # fmt: skip


@contextlib.contextmanager
def _github_stand_in(base: str, head: str) -> Any:
    """A stand-in for the three GitHub REST endpoints a release reads, on loopback:
    pull request #1 (``head`` on ``base``, merged into main by fast-forward), approved
    by ``ann``, who has write access.  Yields its URL."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    repo = f"/repos/{_DEMO_REPOSITORY}"
    pull = {"number": 1, "html_url": f"https://github.example/{_DEMO_REPOSITORY}/pull/1",
            "merged_at": "2026-12-01T10:00:00Z", "merge_commit_sha": head,
            "user": {"login": "dev"}, "head": {"sha": head},
            "base": {"sha": base, "ref": "main"}}  # fmt: skip
    answers = {
        f"{repo}/commits/{head}/pulls": [pull],
        f"{repo}/pulls/1/reviews": [{"id": 101, "state": "APPROVED", "commit_id": head,
                                    "user": {"login": "ann", "type": "User"},
                                    "author_association": "MEMBER"}],
        f"{repo}/collaborators/ann/permission": {"permission": "write", "role_name": "write"},
    }  # fmt: skip

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = answers.get(self.path.split("?", 1)[0])
            body = json.dumps(found if found is not None else []).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _vm(proc: Path, field: str) -> int:
    """A ``/proc/<pid>/status`` size in KiB (0 where there is none)."""
    try:
        for line in (proc / "status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _p99(latencies: list[float]) -> float:
    """The 99th percentile in milliseconds (0 without samples)."""
    if not latencies:
        return 0.0
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


def main(argv: list[str] | None = None) -> None:
    """Run the demo in ``--dir`` (kept) or a temporary folder (removed unless --keep)."""
    parser = argparse.ArgumentParser(prog="python -m modelreg.demo", description=__doc__)
    parser.add_argument("--dir", type=Path, help="work folder to use and keep")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    if args.dir is not None:
        if args.dir.exists() and any(args.dir.iterdir()):
            parser.error(f"{args.dir} is not empty")
        args.dir.mkdir(parents=True, exist_ok=True)
        Demo(args.dir.resolve()).main()
        print(f"\nThe demo repository is in {args.dir.resolve() / 'fleet-models'}")
        return
    work = Path(tempfile.mkdtemp(prefix="modelreg-demo-"))
    try:
        Demo(work).main()
    finally:
        if args.keep:
            print(f"\nThe demo repository is in {work / 'fleet-models'}")
        else:
            shutil.rmtree(work, ignore_errors=True)
            print("\n(the demo ran in a temporary folder, now removed; --keep keeps it)")
    print(path_hint())


def path_hint() -> str:
    """How to run ``modelreg`` as the README's tour does (the demo ran it from the
    virtual environment ``make`` made, which is not on PATH)."""
    bin_dir = Path(sys.executable).parent
    if shutil.which("modelreg") == str(bin_dir / "modelreg"):
        return "modelreg is on your PATH: the README's tour runs as written"
    return (
        f"To run the README's tour, put modelreg on your PATH: source {bin_dir / 'activate'}"
        f" (or export PATH={bin_dir}:$PATH)"
    )


if __name__ == "__main__":
    main()
