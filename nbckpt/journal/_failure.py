"""An operation's failure, said once: the culprit and its cause first, then who gave up.

When one process of eight dies, seven survivors journal the same ~190-character
sentence ("process 2 died (no heartbeat for 3.0 s) during barrier:write_complete"),
and a view that printed each survivor's error, or led with the first survivor's
number, would have a student read a survivor as the culprit. Every surface (the
save's error, ``%ckpt_ls`` and ``%ckpt_fsck``, the watch table, the timelines) takes
its words from :func:`failure_of`, which reads who failed on its own from each
``failed`` event's ``cause`` (data, never the wording).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nbckpt.journal._reader import OperationRecord, ProcessRecord
from nbckpt.protocol import Cause, Event, Status
from nbckpt.views.naming import who

__all__ = ["Failure", "failure_of", "gave_up_note"]


@dataclass(frozen=True)
class Failure:
    """Who made an operation fail, and why; who gave up because of it.

    Attributes
    ----------
    causes
        The processes that failed on their own, each with its error text; empty when
        none did (a process died, or never arrived: nobody journaled a cause of its own).
    reported
        Without ``causes``: the first survivor's account of what happened to the
        culprit (``"process 2 died (no heartbeat for 3.0 s) during ..."``), which
        names it; None otherwise.
    culprits
        The processes to blame: those of ``causes``, else those reported dead or named
        as the culprit by the survivors.
    gave_up
        The processes that failed because of another.
    """

    causes: dict[int, str]
    reported: str | None
    culprits: list[int]
    gave_up: list[int]

    @property
    def lead(self) -> str:
        """The cause in words, its culprit first: ``process 1: OSError: ...``.

        Processes that failed alike are named together, the first eight of them.
        """
        if not self.causes:
            return self.reported or "failed"
        grouped: dict[str, list[int]] = {}
        for p, text in sorted(self.causes.items()):
            grouped.setdefault(text, []).append(p)
        return "; ".join(f"{who(ps)}: {text}" for text, ps in grouped.items())

    @property
    def sentence(self) -> str:
        """The cause, then who gave up, counted past eight: the cause said once, first."""
        return self.lead + (f" (then {who(self.gave_up)} gave up)" if self.gave_up else "")

    @property
    def clause(self) -> str:
        """What follows "failed": `` on process 1: X ...`` or ``: process 2 died ...``."""
        return (" on " if self.causes else ": ") + self.sentence


def _failed_event(proc: ProcessRecord) -> dict[str, Any]:
    return next((e for e in reversed(proc.events) if e.get("event") == Event.FAILED), {})


def _named(ev: dict[str, Any]) -> list[int]:
    """Whom a survivor's ``failed`` event blames: its ``dead`` list, else its ``culprit``."""
    dead = ev.get("dead")
    if isinstance(dead, list) and dead:
        return [p for p in dead if isinstance(p, int)]
    culprit = ev.get("culprit")
    return [culprit] if isinstance(culprit, int) else []


def failure_of(rec: OperationRecord) -> Failure | None:
    """The failure of ``rec``, said once; None when no process failed or died.

    A ``failed`` event without a ``cause`` (a journal older than that field) counts as
    the process's own error.
    """
    failed = {p: r for p, r in rec.processes.items() if r.status == Status.FAILED}
    dead = sorted({p for p, r in rec.processes.items() if r.status == Status.DEAD} | set(rec.dead))
    if not failed and not dead:
        return None
    events = {p: _failed_event(r) for p, r in failed.items()}
    errors = {p: r.error or str(Status.FAILED) for p, r in failed.items()}
    causes = {p: errors[p] for p in failed if events[p].get("cause", Cause.ERROR) == Cause.ERROR}
    gave_up = sorted(set(failed) - set(causes))
    if causes:
        return Failure(causes, None, sorted(causes), gave_up)
    first = min(failed, key=lambda p: float(events[p].get("t", float("inf"))), default=None)
    named = dead or (_named(events[first]) if first is not None else [])
    reported = errors[first] if first is not None else f"{who(dead)} died"
    return Failure({}, reported, named, gave_up)


def gave_up_note(rec: OperationRecord, process: int) -> str | None:
    """A survivor's row, short: ``gave up: process 2 died``; None if it did not give up.

    The whole sentence is said once, on the culprit's row and in the operation's
    :attr:`Failure.sentence`; a survivor's row says only whom it gave up on.
    """
    proc = rec.processes.get(process)
    if proc is None or proc.status != Status.FAILED:
        return None
    ev = _failed_event(proc)
    cause = ev.get("cause", Cause.ERROR)
    if cause == Cause.ERROR:
        return None
    named = [p for p in _named(ev) if p != process]
    if not named:
        return None
    verbs = {Cause.PEER_DEAD: "died", Cause.TIMEOUT: "did not arrive"}
    return f"gave up: {who(sorted(named))} {verbs.get(cause, 'failed')}"
