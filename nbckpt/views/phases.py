"""Which phase a process is in after its last event, when no span of its own is open.

The monitor (:mod:`nbckpt.views.monitor`) asks it for each running process; the words
are the protocol's (:mod:`nbckpt.protocol`).
"""

from __future__ import annotations

from nbckpt.protocol import Barrier, Event, Kind, Phase, TierBarrier, barrier_phase

__all__ = ["phase_after"]


def phase_after(kind: str, event: str, name: str | None, primary: bool) -> str:
    """The phase a process is in right after ``event``, when no span is open.

    The engine enters each phase right after the event before it (see
    :class:`nbckpt.engine.save.background.SaveJob`), so the phase is the protocol's word
    for what comes next, never an event's name.
    """
    if kind == Kind.BARRIER:
        return barrier_phase(name or "?")
    if kind == Kind.RESTORE:
        return Phase.READ
    if event == Event.REQUESTED:
        return Phase.SNAPSHOT
    if event == Event.SNAPSHOT_DONE:
        return Phase.PREPARE
    if event in (Event.TMP_READY, Event.WRITE_STARTED):
        return Phase.WRITE
    if event == Event.WRITE_DONE:
        return barrier_phase(Barrier.WRITE_COMPLETE)
    if event == Event.FINALIZED:
        return barrier_phase(Barrier.COMMIT_COMPLETE)
    if event == Event.BARRIER_EXIT:
        if name in (TierBarrier.LOCAL_READY, TierBarrier.LOCAL_WRITTEN):
            return Phase.LOCAL_WRITE  # writing its shards, or (its host's first) committing
        if name == TierBarrier.LOCAL_COMMITTED:
            return Phase.REPLICATE
        if name == TierBarrier.REPLICATED:
            return Phase.PREPARE  # the root's part, if the step goes there too
        if name == Barrier.TMP_READY:
            return Phase.WRITE
        if name == Barrier.WRITE_COMPLETE:
            return Phase.FINALIZE if primary else barrier_phase(Barrier.COMMIT_COMPLETE)
        # Past commit_complete comes ``committed`` at once: still the barrier's phase.
        return barrier_phase(name or "?")
    return Phase.PREPARE
