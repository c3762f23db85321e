"""What a health gate does to a model's recorded state (docs/reference/daemon.md): pure, no I/O,
no clock of its own (the time of a record is given).

The gate's verdict is :func:`edge_sync.decide.health.judge`; what a start-up does with a
gate or an attempt left open is :func:`edge_sync.decide.restarts.after_stop`.  This
module turns those decisions into the next :class:`~edge_sync.state.models.ModelState`:

==========================  ==========================================================
event                       the model afterwards
==========================  ==========================================================
confirmed                   its goldens passed in every session setup after its swap:
                            the gate record says so, or is gone (no health gate: the
                            version is last known good)
gate passed                 the version is last known good, the gate record is gone
                            (unless another version is served by now: unchanged)
gate failed                 the version is rejected; what it replaced is served again
                            (only rejected when a newer install replaced it since)
start-up: unconfirmed       what it replaced serves again, and the version is an
                            attempt again (``keep``, counted) or rejected (``reject``)
start-up: ``stand``         gates are off now: the version served is known good
start-up: ``reopen``        the gate record stays, with its unclean stops counted
start-up: ``reject``        rejected; the gate's record of what it replaced is served
start-up: attempt ``keep``  the attempt stays, counted; ``reject``: rejected, dropped
start-up: a comparison      its sums stay, no longer open (its thread stopped with the
still open                  daemon; a gate watched again starts a new one)
==========================  ==========================================================
"""

from __future__ import annotations

from edge_sync.decide.restarts import after_stop, rejection_reason
from edge_sync.state.models import (
    Attempt,
    GateRecord,
    Installed,
    ModelState,
    Rejected,
    UpdateRecord,
    reason_text,
)

__all__ = [
    "after_restart",
    "baseline_span",
    "confirmed",
    "kept",
    "rejected",
    "restored",
    "rolled_back",
]


def baseline_span(
    swapped: float, baseline_until: float, window_s: float, windows: int
) -> tuple[float, float]:
    """The previous version's baseline: (since, until) on the monotonic clock, the
    ``windows`` windows before the swap (``baseline_until``; 0: the window's start)."""
    until = baseline_until or swapped
    return until - window_s * windows, until


def restored(model: ModelState, gate: GateRecord) -> ModelState:
    """``model`` serving again what ``gate``'s version replaced, with no gate open."""
    return model.model_copy(update={
        "serving": gate.restore_serving, "previous": gate.restore_previous,
        "last_known_good": gate.restore_last_known_good, "gate": None})  # fmt: skip


def kept(model: ModelState, installed: Installed) -> ModelState | None:
    """``model`` after ``installed`` passed its gate: known good, the gate closed;
    None when it no longer serves ``installed`` (nothing to record)."""
    if model.serving != installed:
        return None
    return model.model_copy(update={"last_known_good": installed, "gate": None})


def confirmed(model: ModelState, installed: Installed, *, gated: bool) -> ModelState:
    """``model`` after ``installed``, swapped in, passed its goldens in the other session
    setups: its gate record says so (``gated``: a health gate watches it now), or with
    no health gate it is known good; unchanged when it no longer serves ``installed``."""
    gate = model.gate
    if model.serving != installed or gate is None or gate.sha256 != installed.sha256:
        return model
    if gated:
        return model.model_copy(update={"gate": gate.model_copy(update={"confirmed": True})})
    return model.model_copy(update={"last_known_good": installed, "gate": None})


def rolled_back(
    model: ModelState,
    before: ModelState,
    installed: Installed,
    rejection: Rejected,
    record: UpdateRecord,
) -> ModelState:
    """``model`` after ``installed`` failed its gate: rejected, and ``before`` (what it
    replaced) served again when ``installed`` is still served."""
    model = model.with_rejected(rejection)
    update: dict[str, object] = {"last_update": record}
    if model.serving == installed:
        update |= {
            "serving": before.serving,
            "previous": before.previous,
            "last_known_good": before.last_known_good,
            "gate": None,
        }
    return model.model_copy(update=update)


def rejected(  # noqa: PLR0917 - the fields of one rejection
    model: ModelState, version: str, sha256: str, signed: str, reason: str, at: str
) -> ModelState:
    """``model`` with ``version`` rejected for ``reason`` at ``at`` (its last update
    says so)."""
    reason = reason_text(reason)
    record = UpdateRecord(result="rejected", version=version, reason=reason, finished=at)
    entry = Rejected(version=version, sha256=sha256, signed=signed, reason=reason, at=at)
    return model.with_rejected(entry).model_copy(update={"last_update": record})


def after_restart(model: ModelState, *, unclean: bool, gated: bool, at: str) -> ModelState:
    """``model`` with its open attempt and gate settled for a start-up (the table in
    the module doc; ``gated``: a health gate is configured now)."""
    if model.shadow is not None and model.shadow.open:
        ended = model.shadow.model_copy(update={"open": False})
        model = model.model_copy(update={"shadow": ended})
    attempt, gate = model.attempt, model.gate
    if attempt is not None:
        decision, stops = after_stop("attempt", attempt.unclean_stops, unclean=unclean)
        if decision == "reject":
            reason = rejection_reason("attempt", stops)
            model = rejected(model, attempt.version, attempt.sha256, attempt.signed, reason, at)
            model = model.model_copy(update={"attempt": None})
        else:
            counted = attempt.model_copy(update={"unclean_stops": stops})
            model = model.model_copy(update={"attempt": counted})
    if gate is not None and not gate.confirmed:
        # swapped in, not yet checked in every setup: as if it had not been committed
        decision, stops = after_stop("attempt", gate.unclean_stops, unclean=unclean)
        if decision == "reject":
            reason = rejection_reason("attempt", stops)
            model = rejected(model, gate.version, gate.sha256, gate.signed, reason, at)
            return restored(model, gate)
        again = Attempt(version=gate.version, signed=gate.signed, sha256=gate.sha256,
                        started=at, unclean_stops=stops)  # fmt: skip
        return restored(model, gate).model_copy(update={"attempt": again})
    if gate is not None:
        decision, stops = after_stop("gate", gate.unclean_stops, unclean=unclean, gated=gated)
        if decision == "stand":
            model = model.model_copy(update={"gate": None, "last_known_good": model.serving})
        elif decision == "reopen":
            counted_gate = gate.model_copy(update={"unclean_stops": stops})
            model = model.model_copy(update={"gate": counted_gate})
        else:
            reason = rejection_reason("gate", stops)
            model = rejected(model, gate.version, gate.sha256, gate.signed, reason, at)
            model = restored(model, gate)
    return model
