"""One model's install within a sync (docs/reference/daemon.md, "The loop"): plan, fetch, verify
bytes, apply the delta chain, external data, build, self-test, swap, commit, and (replacing
a serving version) confirm: the goldens in the session setups other than its own.

:class:`Installer` gathers the facts the plan needs (I/O: the signed metadata, the blob
store), lets :func:`edge_sync.decide.plan.plan_update` decide, then acts on the plan.
The swap and the gate it opens go through :class:`edge_sync.sync.gates.Gates`.  It also
keeps the signed description of each installed version (``descriptions/``), from which
a start-up builds engines with no network (:meth:`Installer.load_request`).
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from pydantic import ValidationError

from edge_sync.clock import now_iso
from edge_sync.config import EdgeConfig, Subscription
from edge_sync.decide import plan as planning
from edge_sync.decide.gate_state import confirmed, restored, rolled_back
from edge_sync.decide.plan import (
    DeltaLink,
    Method,
    Plan,
    PlanFacts,
    Refusal,
    Signed,
    plan_update,
    said,
    worst,
)
from edge_sync.decide.shadow import ShadowPolicy
from edge_sync.engine.base import Engine, EngineHost, LoadRequest, TensorLayout
from edge_sync.engine.selftest import GoldenArrays, confirm_setups, other_setups, self_test
from edge_sync.errors import EngineError, StateError, StoppedError
from edge_sync.state.models import (
    Attempt,
    DeviceState,
    Installed,
    ModelState,
    Rejected,
    UpdateRecord,
    reason_text,
)
from edge_sync.state.store import StateDir
from edge_sync.sync import tensors as held_tensors
from edge_sync.sync.external import held_verified, model_view, obtain_data, signed_data
from edge_sync.sync.gates import Gates, OpenGate, shadow_policy
from edge_sync.sync.trust import DeviceTrust, SignedTarget, expect_facts
from registry.cohort import in_cohort
from registry.errors import RegistryError
from signing.errors import FileSetError, VerificationError
from signing.target_names import (
    artifact_path,
    delta_path,
    engine_path,
    golden_path,
    version_path,
)
from signing.tuf_facts import ChannelsDoc
from signing.version_doc import MAX_VERSION_DOC_BYTES, VersionDoc

if TYPE_CHECKING:
    from registry.schema import Target
    from signing.version_doc import TensorManifest

__all__ = ["DESCRIPTIONS_DIR", "Installer", "Observer", "Stages", "stop_if_stopping"]

DESCRIPTIONS_DIR: Final = "descriptions"
"""Signed descriptions of installed versions, kept to rebuild engines offline."""

Observer = Callable[[str, str], None]
"""Called with (stage, "start" | "end") around every stage (metrics, crash tests)."""
Commit = Callable[[ModelState], None]
"""Commits the model's state within the sync's state (from then a restart serves it)."""


class Stages:
    """Milliseconds per stage of one update; each stage boundary may end the sync."""

    def __init__(
        self,
        start: Mapping[str, float] | None = None,
        observer: Observer | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self.ms: dict[str, float] = dict(start or {})
        self.observer = observer
        self.should_stop = should_stop

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        if self.should_stop is not None and self.should_stop():
            raise StoppedError(f"stopped before {stage}")
        if self.observer is not None:
            self.observer(stage, "start")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.ms[stage] = round(self.ms.get(stage, 0.0) + (time.perf_counter() - t0) * 1000, 3)
        if self.observer is not None:
            self.observer(stage, "end")


class _RejectedError(Exception):
    """The version cannot be installed on this device: reject it (no backoff)."""


def stop_if_stopping(
    should_stop: Callable[[], bool] | None,
    error: Exception,
    then: Callable[[], None] | None = None,
) -> None:
    """A poll or a download cut by a stopping daemon is no failure of the source: end
    the sync as at a stage boundary, recording nothing but what ``then`` commits first
    (kept as it was if that write fails: a restart counts it as clean).

    Raises:
        StoppedError: the daemon is stopping.
    """
    if should_stop is not None and should_stop():
        if then is not None:
            with contextlib.suppress(OSError):
                then()
        raise StoppedError(f"stopped during the sync ({error})") from error


@dataclass(frozen=True)
class _Version:
    """What one install is about: the model, the version and its signed files."""

    name: str
    version: str
    art: SignedTarget
    doc: VersionDoc | None
    signed: str
    target: Target | None


@dataclass
class _Progress:
    """What an install has done so far: its record says it, whatever the outcome, and
    ``model`` is the model's state as of its last step (what a failure keeps)."""

    model: ModelState
    stages: Stages
    fetched_before: int
    plan: Plan | None = None
    signed: str = ""

    def record(
        self,
        trust: DeviceTrust,
        result: Literal["installed", "failed", "rejected"],
        version: str,
        reason: str | None = None,
    ) -> UpdateRecord:
        """The update record of this install as it stands."""
        return UpdateRecord(
            result=result, version=version,
            method=said(self.plan.method) if self.plan else None,
            bytes_fetched=trust.bytes_downloaded - self.fetched_before, reason=reason,
            finished=now_iso(), stages_ms=self.stages.ms,
        )  # fmt: skip


class Installer:
    """Installs one model's assigned version at a time (see the module doc)."""

    def __init__(
        self,
        config: EdgeConfig,
        state: StateDir,
        host: EngineHost,
        gates: Gates,
        *,
        observer: Observer | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self.config = config
        self.state = state
        self.host = host
        self.gates = gates
        self.observer = observer
        self.should_stop = should_stop

    # --- one model ----------------------------------------------------------------------

    def update(  # noqa: PLR0917 - one call site, the sync's context
        self,
        trust: DeviceTrust,
        channels: ChannelsDoc,
        name: str,
        model: ModelState,
        sync_stages: Stages,
        commit: Commit,
    ) -> tuple[UpdateRecord | None, ModelState]:
        """Bring ``name`` to its channel's version; (the update record, new state).

        A version that cannot run here is rejected and one whose bytes cannot be had
        fails; either way what the device serves stays served.

        Raises:
            StoppedError: the daemon is stopping (the sync ends at a stage boundary).
        """
        entry = channels.models.get(name, {}).get(model.channel)
        if entry is None:
            return None, model  # nothing assigned: keep serving what we serve
        version = entry.version
        if not in_cohort(self.config.device.id, name, version, entry.percent):
            return None, model
        if (
            model.serving is not None
            and model.serving.version == version
            and self.serves(name, model.serving.sha256)
        ):
            return None, model
        stages = Stages(sync_stages.ms, self.observer, self.should_stop)
        progress = _Progress(model, stages, trust.bytes_downloaded)
        try:
            shadow = shadow_policy(self._subscription(name), channels)
            record = self._install(trust, name, version, progress, commit, shadow)
        except (_RejectedError, EngineError, ValueError) as e:
            # ValueError: signed data that cannot be used here (a bad case name)
            reason = _one_line(e)
            progress.model = progress.model.with_rejected(Rejected(
                version=version, sha256=progress.plan.sha256 if progress.plan else "",
                signed=progress.signed, reason=reason, at=now_iso()))  # fmt: skip
            record = progress.record(trust, "rejected", version, reason)
        except (RegistryError, OSError) as e:
            # a download cut by the stop is resumed, not failed; the attempt is taken
            # back (a clean stop blames no version)
            stop_if_stopping(self.should_stop, e, then=lambda: commit(progress.model))
            record = progress.record(trust, "failed", version, _one_line(e))
        finally:
            shutil.rmtree(self._work(name), ignore_errors=True)
        if record is None:
            return None, progress.model
        return record, progress.model.model_copy(update={"last_update": record})

    def _subscription(self, name: str) -> Subscription:
        return next(s for s in self.config.models if s.name == name)

    def _install(  # noqa: PLR0917 - the sync's context, and the comparison it asks
        self,
        trust: DeviceTrust,
        name: str,
        version: str,
        progress: _Progress,
        commit: Commit,
        shadow: ShadowPolicy | None = None,
    ) -> UpdateRecord | None:
        """Install ``version`` (see the module doc); its record (None: nothing to do).

        ``progress.model`` follows each step's state; ``shadow``: the comparison its
        health gate runs (``edge_sync.serve.shadow``).
        """
        stages, model = progress.stages, progress.model
        with stages("plan"):
            why = trust.deprecation(name, version)
            if why is not None:
                # CI never assigns a deprecated version (validation refuses it): a
                # signing mistake or a compromise.  Never install it, keep serving.
                record, progress.model = _refuse_deprecated(model, version, why)
                return record
            about = self._about(trust, name, version)
            progress.signed = about.signed
            plan = self._plan(trust, about, model)
            if plan is None:
                return None  # rejected before, and nothing signed changed since
            progress.plan = plan
        path, method = self._obtain(trust, about, plan, progress)
        path, method, external = self._external_data(trust, about, (path, method, plan), stages)
        progress.plan = plan = Plan(method, plan.kind, plan.sha256, plan.path)
        layout, graph = self._lay_out(about, plan, stages, external)
        whole = plan.kind == "artifact" and method != "tensors"
        origin = about.doc.provenance if about.doc is not None else None
        installed = Installed(
            version=version, sha256=plan.sha256,
            artifact_sha256=about.art.sha256 if whole else None,
            target=about.target.name if about.target is not None else None,
            kind=plan.kind, external=external, graph=graph, model_sha256=about.art.sha256,
            provenance=origin.report() if origin is not None else None,
        )  # fmt: skip
        self._keep_description(name, version, about.doc)
        progress.model, attempt = _attempt(model, installed, about.signed, commit)
        request = LoadRequest(name, version, path, plan.sha256, plan.kind, about.target, layout,
                              model_sha256=about.art.sha256)  # fmt: skip
        # Replacing a serving version, only the new engine's own session setup is
        # checked before the swap; the others right after it (_confirm).
        replacing = self.host.current(name) is not None
        engine, cases = self._build_and_test(trust, request, about.doc, stages, whole=not replacing)
        with stages("swap"):
            old, carried = self.gates.swap_in(name, engine)
        swapped = time.monotonic()
        unconfirmed = old is not None and replacing and bool(other_setups(engine, cases, self.host))
        with stages("commit"):
            before = carried.before if carried is not None else progress.model
            progress.model = self._commit_install(
                progress.model, installed, progress.record(trust, "installed", version),
                (old, engine), commit, before=before, signed=about.signed,
                stops=attempt.unclean_stops, confirmed=not unconfirmed,
            )  # fmt: skip
        if old is None:
            return progress.record(trust, "installed", version)
        signed = about.signed
        gate = OpenGate(name, version, engine, old, before, installed, signed, swapped, swapped,
                        shadow=shadow)  # fmt: skip
        if unconfirmed:
            refused = self._confirm(trust, gate, cases, progress, commit)
            if refused is not None:
                return refused
        # the health gate's window opens now; the old version's baseline ends at the swap
        self.gates.watch_or_retire(replace(gate, swapped=time.monotonic()))
        return progress.record(trust, "installed", version)

    def _confirm(
        self,
        trust: DeviceTrust,
        gate: OpenGate,
        cases: list[GoldenArrays],
        progress: _Progress,
        commit: Commit,
    ) -> UpdateRecord | None:
        """Check ``gate.new``, serving since its swap, in the session setups other than
        its own (``confirm_setups``) while ``gate.old`` is still loaded; None when it
        passes (committed as confirmed).  A version that fails is swapped back and
        rejected with the reason a device serving it in the failing setup gives; any
        other failure swaps it back unjudged and is raised (the next sync tries again).
        """
        try:
            with progress.stages("confirm"):
                confirm_setups(gate.new, cases, self.host)
        except EngineError as e:
            self._take_back(gate)
            reason = _one_line(e)
            record = progress.record(trust, "rejected", gate.version, reason)
            rejection = Rejected(
                version=gate.version, sha256=gate.installed.sha256, signed=gate.signed,
                reason=reason, at=record.finished,
            )  # fmt: skip
            progress.model = rolled_back(progress.model, gate.before, gate.installed,
                                         rejection, record)  # fmt: skip
            commit(progress.model)
            return record
        except BaseException:
            self._take_back(gate)
            if progress.model.gate is not None:
                progress.model = restored(progress.model, progress.model.gate)
                with contextlib.suppress(OSError):  # else a restart does the same
                    commit(progress.model)
            raise
        progress.model = confirmed(progress.model, gate.installed, gated=self.gates.enabled)
        commit(progress.model)
        return None

    def _take_back(self, gate: OpenGate) -> None:
        """Serve ``gate.old`` again and release ``gate.new`` (its requests finish first)."""
        with self.gates.lock:
            self.host.swap(gate.model, gate.old)
        self.host.retire(gate.new)

    # --- what is signed, and the plan ---------------------------------------------------

    def _about(self, trust: DeviceTrust, name: str, version: str) -> _Version:
        """The version's signed artifact and description, and the device target chosen."""
        art = trust.target_info(artifact_path(name, version))
        # the facts signed with it, before any way to its bytes (a held blob too)
        expect_facts(art, model=name, version=version, kind="artifact")
        doc, doc_sha = self._description(trust, name, version)
        signed = hashlib.sha256(f"{art.sha256}:{doc_sha}".encode()).hexdigest()
        target = None
        if doc is not None and doc.targets:
            target = doc.target_for(dict(self.config.device.labels))
        return _Version(name, version, art, doc, signed, target)

    def _description(
        self, trust: DeviceTrust, name: str, version: str
    ) -> tuple[VersionDoc | None, str]:
        """The signed description of a version (None for releases made before
        descriptions were published), and its digest ("" when absent)."""
        path = version_path(name, version)
        try:
            info = trust.target_info(path)
        except FileSetError:
            return None, ""
        if info.length > MAX_VERSION_DOC_BYTES:
            limit = MAX_VERSION_DOC_BYTES
            raise _RejectedError(
                f"{path}: {info.length} bytes, over the {limit} a description may be"
            )
        fetched = trust.fetch(path, self._work(name), model=name, version=version, kind="version")
        try:
            return VersionDoc.from_bytes(fetched.read_bytes()), info.sha256
        except ValidationError as e:
            raise _RejectedError(f"{path}: not a version description ({_said(e)})") from None
        except ValueError as e:
            raise _RejectedError(f"{path}: not a version description ({_one_line(e)})") from None

    def _plan(self, trust: DeviceTrust, about: _Version, model: ModelState) -> Plan | None:
        """The plan (``edge_sync.decide.plan``) from the facts gathered here."""
        art = about.art
        facts = PlanFacts(
            version=about.version,
            artifact=Signed(art.path, art.sha256, art.length),
            signed=about.signed,
            rejected=frozenset(r.signed for r in model.rejected if r.version == about.version),
            matched=about.target is not None or about.doc is None or not about.doc.targets,
            engine=about.target.engine if about.target is not None else None,
        )
        plan = plan_update(self._gathered(trust, facts, about, model))
        if isinstance(plan, Refusal):
            raise _RejectedError(self._refusal(plan, about))
        return plan

    def _gathered(
        self, trust: DeviceTrust, facts: PlanFacts, about: _Version, model: ModelState
    ) -> PlanFacts:
        """``facts`` with what the blob store holds and the signed ways to the bytes
        (nothing more is looked at when the plan is settled without them)."""
        blobs = self.state.blobs
        if facts.settled:
            return facts
        if facts.needs_prebuilt:
            return self._prebuilt(trust, facts, about)
        art = facts.artifact.sha256
        held = {art} if held_verified(blobs, art) else set()  # a rotten one is gone now
        installed = {
            i.version: i.artifact_sha256
            for i in (model.serving, model.previous, model.last_known_good)
            if i is not None and i.artifact_sha256 and blobs.has(i.artifact_sha256)
        }
        held |= set(installed.values())
        links = _links(trust, about.name, about.version, set(installed))
        manifest = self._manifest(about)
        tensors = None
        if manifest is not None:
            data = signed_data(trust, about.name, about.version, about.doc)
            whole = about.art.length + sum(info.length for _, info in data.values())
            tensors = held_tensors.tensor_facts(manifest, self.state.root, blobs, whole)
        return replace(
            facts, held=frozenset(held), installed=installed, links=links, tensors=tensors
        )

    @staticmethod
    def _manifest(about: _Version) -> TensorManifest | None:
        """The version's tensor manifest, when this device builds it from tensors: an
        ONNX Runtime target (TensorRT reads a whole file)."""
        doc = about.doc
        if doc is None or doc.tensors is None:
            return None
        if about.target is not None and about.target.engine != "onnxruntime":
            return None
        return doc.tensors

    def _prebuilt(self, trust: DeviceTrust, facts: PlanFacts, about: _Version) -> PlanFacts:
        """``facts`` with the target's signed prebuilt engine, when one is published."""
        assert about.target is not None  # noqa: S101 - an engine kind needs a target
        target = about.target
        path = engine_path(about.name, about.version, target.name, target.engine)
        try:
            info = trust.target_info(path)
        except FileSetError:
            return facts
        held = frozenset({info.sha256} if held_verified(self.state.blobs, info.sha256) else ())
        return replace(facts, prebuilt=Signed(path, info.sha256, info.length), held=held)

    def _refusal(self, refusal: Refusal, about: _Version) -> str:
        """Why the version is rejected, in words."""
        if refusal.why == "no prebuilt engine" and about.target is not None:
            target = about.target
            return (
                f"target {target.name!r} needs a prebuilt {target.engine} engine and none "
                "is published"
            )
        labels = ", ".join(f"{k}={v}" for k, v in sorted(self.config.device.labels.items()))
        model = about.doc.model if about.doc is not None else about.name
        return (
            f"no target of {model} {about.version} matches this device's labels "
            f"({labels or 'none'})"
        )

    # --- the bytes ----------------------------------------------------------------------

    def _obtain(
        self, trust: DeviceTrust, about: _Version, plan: Plan, progress: _Progress
    ) -> tuple[Path, Method]:
        """The plan's file in the blob store, verified; and the method that made it (a
        failed delta or tensor fetch falls back to the full file, which the record
        then names, whatever its outcome)."""
        stages = progress.stages
        blobs = self.state.blobs
        if plan.method == "cached":
            return blobs.path(plan.sha256), "cached"
        name = about.name
        work = self._work(name)
        work.mkdir(parents=True, exist_ok=True)
        if plan.method == "tensors":
            try:
                held_tensors.fetch_missing(
                    trust, blobs, plan.objects, work, self.state.partials, stages
                )
                return blobs.path(plan.sha256), "tensors"
            except StoppedError:
                raise
            except (VerificationError, RegistryError, OSError):
                # a remote serving a wrong or cut object: the whole file decides
                plan = progress.plan = Plan("full", "artifact", plan.sha256, plan.path)
        if plan.method == "delta":
            try:
                return self._apply_chain(trust, name, plan, stages), "delta"
            except StoppedError:
                raise
            except (VerificationError, RegistryError, OSError):
                # A bad delta (or a remote serving garbage for it): the full file decides.
                plan = progress.plan = Plan("full", "artifact", plan.sha256, plan.path)
        with stages("fetch"):
            # DeviceTrust verifies length and SHA-256 while fetching (verify_bytes is
            # folded in: the bytes are hashed as they arrive).
            fetched = trust.fetch(
                plan.path, work, model=name, version=about.version, kind=plan.kind,
                partial_dir=self.state.partials,
            )  # fmt: skip
        with stages("verify_bytes"):
            return blobs.adopt(fetched, plan.sha256), plan.method

    def _apply_chain(self, trust: DeviceTrust, name: str, plan: Plan, stages: Stages) -> Path:
        """Apply the plan's deltas, base first, each result verified and kept."""
        from registry.delta import decode

        blobs = self.state.blobs
        assert plan.base_sha256 is not None  # noqa: S101 - a delta plan has a base
        work = self._work(name)
        result = blobs.path(plan.base_sha256)
        for link in plan.chain:
            with stages("fetch"):
                fetched = trust.fetch(
                    link.path, work, model=name, version=link.version, kind="delta",
                    partial_dir=self.state.partials,
                )  # fmt: skip
            if link.base != link.parent:
                raise VerificationError(f"signed as a delta from {link.base}", link.path)
            out = work / f"{link.sha256}.onnx"
            with stages("apply_delta"):
                decode(result, fetched, out, expected_sha256=link.sha256)
            with stages("verify_bytes"):
                result = blobs.adopt(out, link.sha256)
        return result

    def _external_data(
        self,
        trust: DeviceTrust,
        about: _Version,
        obtained: tuple[Path, Method, Plan],
        stages: Stages,
    ) -> tuple[Path, Method, dict[str, str]]:
        """The version's ONNX external data files in the blob store, verified, and the
        file to load: the ``.onnx`` in a view beside them (``edge_sync.sync.external``)."""
        path, method, plan = obtained
        if plan.kind != "artifact":  # a prebuilt engine is one self-contained file
            return path, method, {}
        name, version = about.name, about.version
        if method == "tensors":  # its data files' tensors came as tensors (_lay_out)
            signed = signed_data(trust, name, version, about.doc)
            return path, method, {file: info.sha256 for file, (_, info) in signed.items()}
        external, data_method = obtain_data(
            trust, self.state.blobs, name, version, about.doc, about.art.facts.parent,
            self._work(name), self.state.partials, stages,
        )  # fmt: skip
        if not external:
            return path, method, {}
        view = model_view(self.state.root, self.state.blobs, plan.sha256, external)
        return view, worst(method, data_method), external

    def _lay_out(
        self, about: _Version, plan: Plan, stages: Stages, external: dict[str, str]
    ) -> tuple[TensorLayout | None, str | None]:
        """The version as tensors (``edge_sync.sync.tensors``), kept with its layout;
        (None, None) for a version built from its whole file.  ``external``: its data
        files' blobs by name (installed whole, their tensors are spans of them).

        Raises:
            _RejectedError: the signed manifest does not describe the artifact.
            OSError: a tensor is not held, or the layout cannot be kept.
        """
        manifest = self._manifest(about)
        if manifest is None or plan.kind != "artifact":
            return None, None
        blobs, root = self.state.blobs, self.state.root
        with stages("layout"):
            try:
                if plan.method == "tensors":
                    placed = held_tensors.layout_from_objects(
                        manifest, about.art.length, root, blobs
                    )
                else:
                    placed = held_tensors.layout_from_artifact(
                        manifest, plan.sha256, blobs, self._work(about.name), external
                    )
            except VerificationError as e:
                raise _RejectedError(str(e)) from None
            graph = manifest.graph.sha256
            held_tensors.save_layout(root, about.name, about.version, graph, placed)
        return self._layout(about.name, about.version, graph, placed), graph

    # --- build, self-test, commit -------------------------------------------------------

    def _build_and_test(
        self,
        trust: DeviceTrust,
        request: LoadRequest,
        doc: VersionDoc | None,
        stages: Stages,
        *,
        whole: bool,
    ) -> tuple[Engine, list[GoldenArrays]]:
        """An engine for ``request`` that passed its self-test (not yet serving), and
        the golden cases it passed.  ``whole``: in every session setup this host may
        switch the version to (one verdict on every device of the target:
        ``registry.sessions``); else in its own, the others left to :meth:`_confirm`.

        Raises:
            EngineError: it cannot be built here, or it failed its self-test.
        """
        with stages("build"):  # a build from tensors checks its blobs first (_layout)
            engine = self.host.build(request)
        try:
            with stages("self_test"):
                cases = self._goldens(trust, request.model, request.version, doc)
                self_test(engine, cases, host=self.host, confirm=whole)
        except BaseException:
            engine.close()
            raise
        return engine, cases

    def _layout(
        self, name: str, version: str, graph: str, placed: list[held_tensors.Placed]
    ) -> TensorLayout:
        """The layout an engine is built from.  Before each build from it (a reload
        after an eviction too) every blob it maps must be as verified: one ``stat``
        each, hashed again when this process has not verified it; an altered one is
        removed, to be fetched again, and the build fails (``OSError``)."""
        blobs = self.state.blobs
        wanted = list(dict.fromkeys([graph, *(p.blob for p in placed)]))

        def check() -> None:
            for blob in wanted:
                if not blobs.checked(blob):
                    blobs.discard(blob)
                    raise OSError(
                        f"{name} {version}: blob {blob[:12]} was altered since it was verified"
                    )

        return held_tensors.tensor_layout(blobs, graph, placed, check)

    def _goldens(
        self, trust: DeviceTrust, name: str, version: str, doc: VersionDoc | None
    ) -> list[GoldenArrays]:
        """The signed golden cases of a version, read within caps."""
        if doc is None or not doc.goldens:
            return []
        from registry.goldens import read_npz

        cases = []
        work = self._work(name)
        for case in doc.goldens:
            arrays = {}
            for side in ("inputs", "outputs"):
                path = getattr(case, side)
                expected = golden_path(name, version, case.name, side)
                if path != expected:
                    raise _RejectedError(
                        f"golden case {case.name!r}: {side} at {path}, not {expected}"
                    )
                fetched = trust.fetch(path, work, model=name, version=version, kind="golden")
                try:
                    arrays[side] = read_npz(fetched, path)
                except RegistryError as e:
                    raise _RejectedError(f"golden case {case.name!r}: {e}") from None
            cases.append(
                GoldenArrays(case.name, arrays["inputs"], arrays["outputs"], case.rtol, case.atol)
            )
        return cases

    def _commit_install(
        self,
        model: ModelState,
        installed: Installed,
        record: UpdateRecord,
        engines: tuple[Engine | None, Engine],
        commit: Commit,
        *,
        before: ModelState,
        signed: str,
        stops: int = 0,
        confirmed: bool = True,
    ) -> ModelState:
        """Commit ``installed`` as the version served (``engines``: the old and the new
        one, already swapped: swapped back when the commit fails); with a health gate,
        or while it is not ``confirmed`` in every session setup, the gate is kept in the
        state with what to serve again."""
        old, new = engines
        gate = (
            None
            if old is None
            else self.gates.record(installed, signed, before, stops, confirmed=confirmed)
        )
        committed = model.model_copy(
            update={
                "serving": installed,
                "previous": model.serving or model.previous,
                # known good once its health gate passed
                "last_known_good": model.last_known_good if gate else installed,
                "last_update": record,
                "gate": gate,
                "attempt": None,
            }
        )
        try:
            commit(committed)  # from here a restart serves the new version
        except BaseException:
            # Not committed: serve what the state names, not what it does not.
            self.swap_back(new.model, old, new)
            raise
        return committed

    # --- the device's copies ------------------------------------------------------------

    def serves(self, name: str, sha256: str) -> bool:
        """Whether the host serves ``name`` from the blob ``sha256`` (a start-up that
        could not build it serves nothing, or an older version)."""
        engine = self.host.current(name)
        return engine is not None and engine.sha256 == sha256

    def swap_back(self, name: str, old: Engine | None, new: Engine) -> None:
        """Serve ``old`` again (nothing when there was none) and release ``new``."""
        if old is not None:
            self.host.swap(name, old)
        else:
            self.host.drop(name)
        self.host.retire(new)  # requests already on it finish first

    def load_request(self, name: str, installed: Installed) -> LoadRequest:
        """What building ``installed`` takes, from the device's own copies (no network):
        its blob (in a view with its data files) and its kept signed description."""
        target = None
        # The target's settings are in the signed description, kept beside the blob.
        desc = self.state.root / DESCRIPTIONS_DIR / f"{name}-{installed.version}.json"
        if installed.target and desc.is_file():
            try:
                doc = VersionDoc.from_bytes(desc.read_bytes())
                target = next((t for t in doc.targets if t.name == installed.target), None)
            except ValueError:
                target = None
        path = self.state.blobs.path(installed.sha256)
        layout = None
        if installed.graph is not None:  # held as tensors (edge_sync.sync.tensors)
            graph, placed = held_tensors.load_layout(self.state.root, name, installed.version)
            if graph != installed.graph:
                raise OSError(f"{name} {installed.version}: its layout names another skeleton")
            layout = self._layout(name, installed.version, graph, placed)
        elif installed.external:  # the .onnx with its data files beside it
            path = model_view(self.state.root, self.state.blobs, installed.sha256,
                              installed.external)  # fmt: skip
        return LoadRequest(
            name, installed.version, path, installed.sha256, installed.kind, target, layout,
            model_sha256=installed.model_sha256,
        )  # fmt: skip

    def verify_held(self, name: str, installed: Installed) -> bool:
        """Whether every blob ``installed`` is built from is held and hashes to its
        name (at start-up: a disk may rot, a local process may write); a bad one is
        removed, never served."""
        blobs = self.state.blobs
        wanted = [installed.sha256]
        if installed.graph is not None:
            try:
                graph, placed = held_tensors.load_layout(self.state.root, name, installed.version)
            except OSError:
                return False
            wanted = list(dict.fromkeys([graph, *(p.blob for p in placed)]))
        for blob in wanted:
            try:
                if blobs.verify(blob):
                    continue
                blobs.discard(blob)
            except StateError:  # a layout naming something that is no digest
                pass
            return False
        return True

    def kept_blobs(self, state: DeviceState) -> set[str]:
        """The blobs the layouts of the versions ``state`` names map (skeletons, tensor
        blobs, artifacts whose spans they use)."""
        return held_tensors.layout_blobs(self.state.root, _kept(state).__contains__)

    def collect_descriptions(self, state: DeviceState) -> None:
        """Remove kept descriptions of versions the state no longer names."""
        kept = _kept(state)
        held_tensors.collect_layouts(self.state.root, kept.__contains__)
        folder = self.state.root / DESCRIPTIONS_DIR
        if not folder.is_dir():
            return
        for path in folder.iterdir():
            if path.suffix != ".json" or path.stem not in kept:
                path.unlink(missing_ok=True)

    def _keep_description(self, name: str, version: str, doc: VersionDoc | None) -> None:
        if doc is None:
            return
        folder = self.state.root / DESCRIPTIONS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        from registry.atomic import write_atomic

        write_atomic(folder / f"{name}-{version}.json", doc.to_bytes(), mode=0o644)

    def _work(self, name: str) -> Path:
        return self.state.blobs.tmp / f"update-{name}"


def _links(trust: DeviceTrust, name: str, version: str, bases: set[str]) -> tuple[DeltaLink, ...]:
    """The signed deltas leading back from ``version``, newest first, until a version in
    ``bases`` (at most ``MAX_DELTA_CHAIN``; a version signed without a parent, or
    without a delta from it, ends them)."""
    links: list[DeltaLink] = []
    current = version
    while current not in bases and len(links) < planning.MAX_DELTA_CHAIN:
        art = trust.target_info(artifact_path(name, current))
        parent = art.facts.parent
        if parent is None:
            break
        try:
            delta = trust.target_info(delta_path(name, current, parent))
        except FileSetError:
            break
        links.append(DeltaLink(current, art.sha256, parent, delta.path, delta.length,
                               delta.facts.base))  # fmt: skip
        current = parent
    return tuple(links)


def _kept(state: DeviceState) -> set[str]:
    """``<model>-<version>`` of each version the state names (its description and
    layout are kept)."""
    return {
        f"{name}-{installed.version}"
        for name, model in state.models.items()
        for installed in model.held()
    }


def _attempt(
    model: ModelState, installed: Installed, signed: str, commit: Commit
) -> tuple[ModelState, Attempt]:
    """Record, fsynced, that ``installed`` is about to be loaded (a version that kills
    the daemon now is counted at the next start: :mod:`edge_sync.decide.restarts`); the
    model without the record (what a refusal or failure commits) and the record."""
    prior = model.attempt
    same = prior is not None and (prior.version, prior.signed) == (installed.version, signed)
    attempt = Attempt(
        version=installed.version, signed=signed, sha256=installed.sha256,
        started=now_iso(), unclean_stops=prior.unclean_stops if prior and same else 0,
    )  # fmt: skip
    model = model.model_copy(update={"attempt": None})
    commit(model.model_copy(update={"attempt": attempt}))
    return model, attempt


def _refuse_deprecated(
    model: ModelState, version: str, why: str
) -> tuple[UpdateRecord | None, ModelState]:
    signed = hashlib.sha256(f"deprecated:{why}".encode()).hexdigest()
    if any(r.version == version and r.signed == signed for r in model.rejected):
        return None, model  # said once: not again at every poll
    reason = reason_text(f"version {version} is deprecated ({why}); not installed")
    refused = Rejected(version=version, sha256="", signed=signed, reason=reason, at=now_iso())
    record = UpdateRecord(result="rejected", version=version, reason=reason, finished=now_iso())
    return record, model.with_rejected(refused)


def _said(error: ValidationError) -> str:
    """A schema refusal in one line: where and why, for the first few problems
    (pydantic's own first line only counts them)."""
    said = []
    for found in error.errors()[:3]:
        where = ".".join(str(part) for part in found["loc"])
        said.append(f"{where}: {found['msg']}" if where else str(found["msg"]))
    more = error.error_count() - len(said)
    return reason_text("; ".join(said) + (f"; and {more} more" if more > 0 else ""))


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return reason_text(text[0] if text else type(error).__name__)
