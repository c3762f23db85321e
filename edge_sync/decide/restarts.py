"""What a start-up does with a version that was being tried when the daemon stopped
(docs/reference/daemon.md): pure decisions, no I/O (the updater acts on them: ``Updater.resume``).

A device loses power all the time; one unexplained stop is no verdict on a version, but
a version that kills the daemon must not hold it in a restart loop.  Two records in the
state say what was being tried: an *attempt* (written, fsynced, before a new version is
loaded and swapped in; gone once it is committed or refused) and an open *gate*
(``GateRecord``, while the health gate watches the version).  Each counts the unclean
stops (SIGKILL, power cut, out of memory, a native crash: the daemon's announcement was
left behind) that happened while it was open.

=================  ===================  ===============================================
record at start    stop                 decision
=================  ===================  ===============================================
gate               clean                ``reopen``: watch it again, count unchanged
gate               unclean, 1st         ``reopen``, counted (1)
gate               unclean, 2nd         ``reject``: "stopped twice during its health
                                        gate"; what it replaced is served again
gate, no gate      clean or unclean     ``stand``: gates were turned off; the version
configured any                          is kept as known good
more
gate, unconfirmed  clean or unclean     as ``attempt`` (below): the version swapped in
                                        but not yet checked in every session setup is
                                        taken back, what it replaced serves, and it is
                                        loaded again (or rejected) like an attempt
attempt            clean                ``keep``, count unchanged (a clean stop ends
                                        the sync at a stage boundary, which takes the
                                        attempt back: none is left but by accident)
attempt            unclean, 1st         ``keep``, counted (1)
attempt            unclean, 2nd         ``reject``: "stopped twice while it was being
                                        loaded"; it is not tried again while its signed
                                        description stays the same
=================  ===================  ===============================================

So a version that kills the daemon at load, or on its first requests, is rejected after
at most two restarts, and the device then serves its last known good version; a version
that only shared the device with one power cut is watched again.
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = ["MAX_UNCLEAN_STOPS", "after_stop", "rejection_reason"]

MAX_UNCLEAN_STOPS: Final = 2
"""Unclean stops while a version was tried that reject it."""

Record = Literal["gate", "attempt"]
Decision = Literal["reopen", "reject", "stand", "keep"]


def after_stop(
    record: Record, stops_before: int, *, unclean: bool, gated: bool = True
) -> tuple[Decision, int]:
    """The start-up's decision for a version ``record`` names, and its new count of
    unclean stops (see the module doc's table).

    Args:
        record: ``gate`` (its health gate was open) or ``attempt`` (it was being loaded).
        stops_before: unclean stops already counted for it.
        unclean: whether the daemon's last stop was unclean.
        gated: whether a health gate is configured now (gates only).
    """
    stops = stops_before + 1 if unclean else stops_before
    if stops >= MAX_UNCLEAN_STOPS:
        return "reject", stops
    if record == "attempt":
        return "keep", stops
    return ("reopen" if gated else "stand"), stops


def rejection_reason(record: Record, stops: int) -> str:
    """Why a version is rejected after ``stops`` unclean stops while ``record`` was open."""
    during = "during its health gate" if record == "gate" else "while it was being loaded"
    times = "twice" if stops == 2 else f"{stops} times"
    return (
        f"the daemon stopped unexpectedly {times} {during} (killed, crashed or out of "
        "memory): this version is taken for the cause"
    )
