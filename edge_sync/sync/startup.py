"""A daemon's start-up (docs/reference/daemon.md): serve what the state file names, with no
network, before the first sync.

Each model serves its current version, else its previous or last known good one whose
blob still verifies.  A version whose health gate was open, or that was being loaded,
when the daemon stopped is settled first by :func:`edge_sync.decide.gate_state.after_restart`
(the decisions of :mod:`edge_sync.decide.restarts`); a gate left open is watched again
(:class:`~edge_sync.sync.gates.Gates`) with what it replaced loaded to fall back to.
"""

from __future__ import annotations

import time

from edge_sync.clock import now_iso
from edge_sync.config import EdgeConfig
from edge_sync.decide.gate_state import after_restart, restored
from edge_sync.engine.base import Engine
from edge_sync.errors import EngineError
from edge_sync.state.models import DeviceState, Installed, ModelState, reason_text
from edge_sync.state.store import StateDir
from edge_sync.sync.gates import Gates, OpenGate, load_state, shadow_policy
from edge_sync.sync.install import Installer
from edge_sync.sync.trust import trusted_targets
from signing.target_names import artifact_path
from signing.tuf_facts import ChannelsDoc

__all__ = ["resume"]


def resume(
    config: EdgeConfig, state: StateDir, installer: Installer, gates: Gates, *, unclean: bool
) -> dict[str, str]:
    """Serve what the state names (see the module doc); ``unclean``: the daemon's last
    stop was (killed, crashed, out of memory, a power cut), which is counted against
    the version being tried.  The count is committed before any engine is loaded, so a
    version that kills the daemon while it loads at start-up is counted too.

    Returns:
        What could not be resumed, by model (a corrupt blob, an engine that fails).
    """
    loaded = load_state(state)
    at, gated = now_iso(), gates.enabled
    settled = _rebuilt(config, state, loaded)
    for name, held in settled.models.items():
        settled = settled.with_model(name, after_restart(held, unclean=unclean, gated=gated, at=at))
    if settled != loaded:
        state.commit(settled)  # counted before anything loads (see above)
    state.blobs.clear_tmp()
    problems: dict[str, str] = {}
    served = settled
    for name, held in settled.models.items():
        installed = _serve_first(state, installer, name, held, problems)
        if installed is not None and installed is not held.serving:
            served = served.with_model(name, held.model_copy(update={"serving": installed}))
    if served != settled:
        # an older version serves: the next sync must not take the repository for
        # unchanged and the device for current
        why = "; ".join(f"{name}: {problem}" for name, problem in sorted(problems.items()))
        sync = served.sync.model_copy(update={"result": "failed", "reason": reason_text(why)})
        served = served.model_copy(update={"sync": sync})
        state.commit(served)
    _reopen_gates(state, installer, gates, served)
    return problems


def _serve_first(
    state: StateDir, installer: Installer, name: str, model: ModelState, problems: dict[str, str]
) -> Installed | None:
    """Build and serve the first of ``model``'s versions that verifies and builds;
    which (None: none did; ``problems`` says why)."""
    host = installer.host
    for installed in (model.serving, model.previous, model.last_known_good):
        if installed is None:
            continue
        if not installer.verify_held(name, installed):
            # A rotten file is never served, nor taken as a cached copy later.
            problems[name] = f"blob of {installed.version} is missing or corrupt"
            continue
        try:
            engine = host.build(installer.load_request(name, installed))
        except (EngineError, OSError) as e:
            problems[name] = str(e)
            continue
        old = host.swap(name, engine)
        if old is not None:
            host.retire(old)
        if installed is model.serving:
            problems.pop(name, None)
        else:  # said: the daemon logs it, and the next sync installs the assigned one again
            problems[name] = f"serving {installed.version} instead: {problems.get(name)}"
        return installed
    return None


def _reopen_gates(state: StateDir, installer: Installer, gates: Gates, doc: DeviceState) -> None:
    """Watch again, after a restart, each version whose gate was open; the version it
    replaced is loaded to fall back to (without it the version stands)."""
    if not gates.enabled:
        return
    host = installer.host
    try:
        channels = ChannelsDoc.model_validate(doc.channels) if doc.channels else None
    except ValueError:
        channels = None
    for name, model in doc.models.items():
        gate, serving = model.gate, host.current(name)
        if gate is None or serving is None or serving.sha256 != gate.sha256:
            continue
        fallback = gate.restore_serving
        old: Engine | None = None
        if fallback is not None and installer.verify_held(name, fallback):
            try:
                old = host.build(installer.load_request(name, fallback))
            except (EngineError, OSError):
                old = None
        if old is None or model.serving is None:
            continue
        now = time.monotonic()  # no baseline: the recorder starts empty
        sub = next(s for s in installer.config.models if s.name == name)
        gates.watch_or_retire(OpenGate(
            name, gate.version, serving, old, restored(model, gate), model.serving,
            gate.signed, now, now, shadow=shadow_policy(sub, channels)))  # fmt: skip


def _rebuilt(config: EdgeConfig, state: StateDir, doc: DeviceState) -> DeviceState:
    """``doc`` with what each subscribed model served filled in from the device's own
    verified records, when the state file was lost (a fresh one names nothing): the
    last verified channels document says the version, the trusted targets metadata its
    digest, and a blob of that digest is served if it still verifies.
    """
    if doc.channels is None:
        return doc
    try:
        channels = ChannelsDoc.model_validate(doc.channels)
    except ValueError:
        return doc
    found = trusted_targets(state.root)
    for sub in config.models:
        model = doc.models.get(sub.name)
        if model is not None and model.serving is not None:
            continue
        entry = channels.models.get(sub.name, {}).get(sub.channel)
        sha256 = found.get(artifact_path(sub.name, entry.version)) if entry else None
        if entry is None or sha256 is None or not state.blobs.verify(sha256):
            continue
        installed = Installed(
            version=entry.version, sha256=sha256, artifact_sha256=sha256, model_sha256=sha256
        )
        base = model or ModelState(channel=sub.channel)
        doc = doc.with_model(sub.name, base.model_copy(update={"serving": installed}))
    return doc
