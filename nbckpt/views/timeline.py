"""What a timeline of one operation says besides its spans, decided once for every drawing.

The lab sidebar and the live widget draw an operation's timeline in TypeScript, and
:mod:`nbckpt.widgets.timeline` draws it with matplotlib; all three take their
decisions from here: when the step committed, why a row is marked failed (one
sentence), where its failure mark goes, and whom each barrier wait waited for.
:func:`timeline_view` sends them as :class:`~nbckpt.protocol.views.TimelineView`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from nbckpt.journal import (
    Failure,
    OperationRecord,
    PhaseSpan,
    ProcessRecord,
    failure_of,
    gave_up_note,
)
from nbckpt.protocol import BARRIER_PREFIX, BarrierState, Phase, Status
from nbckpt.protocol.views import BarrierWait, PreemptionNotice, ProcessDrawing, TimelineView
from nbckpt.views.naming import NAMED, listing

__all__ = [
    "NOT_FAILED",
    "BarrierEntries",
    "barrier_wait",
    "drawing",
    "commit_time",
    "everyone_of",
    "LOCAL_READ",
    "failure_note",
    "human_bytes",
    "latest_time",
    "local_read_note",
    "preempted",
    "tiered",
    "timeline_view",
]

#: A process whose part ended well, or has not ended: any other status is a failure.
NOT_FAILED: frozenset[str] = frozenset(
    {Status.RUNNING, Status.COMMITTED, Status.RESTORED, Status.RELEASED}
)

#: How a barrier wait's label names whom it waited for, by its state.
_WAIT_WORDS: dict[BarrierState, tuple[str, str]] = {
    BarrierState.RELEASED: ("waited", "for"),
    BarrierState.WAITING: ("waiting", "for"),
    BarrierState.FAILED: ("gave up", "on"),
}

#: A span's status, as a barrier state.
_SPAN_STATES: dict[str, BarrierState] = {
    Status.DONE: BarrierState.RELEASED,
    Status.OPEN: BarrierState.WAITING,
}


def commit_time(record: OperationRecord) -> float | None:
    """When a committed save's step became complete: the earliest end of a finalize.

    Only the primary finalizes; should more processes record one, the step was
    complete at the first end.
    """
    if record.status != Status.COMMITTED:
        return None
    ends = [
        s.end
        for r in record.processes.values()
        for s in r.phases
        if s.name == Phase.FINALIZE and s.end is not None
    ]
    return min(ends) if ends else None


def _latest(phases: list[PhaseSpan]) -> float | None:
    times = [t for s in phases for t in (s.start, s.end) if t is not None]
    return max(times) if times else None


def latest_time(record: OperationRecord) -> float | None:
    """The latest wall time the journal's spans show (their starts and ends)."""
    return _latest([s for r in record.processes.values() for s in r.phases])


def preempted(preemption: PreemptionNotice | None) -> str:
    """`` (preemption: process 2 told by SIGTERM)``, or nothing without a notice."""
    if preemption is None:
        return ""
    return f" (preemption: process {preemption['process']} told by {preemption['reason']})"


def tiered(tier: str | None) -> str:
    """`` (local tier only)``, `` (from the root)``...; nothing without a local tier."""
    return "" if tier is None else f" ({tier})"


#: A restore's ``tier`` when it read the hosts' local copies.
LOCAL_READ = "from the hosts' local copies"


def local_read_note(fetched: list[dict[str, Any]]) -> str:
    """Where a process of a local restore read from: its host's copy, and which peers."""
    if not fetched:
        return "read its host's local copy"
    got = "; ".join(
        f"process {','.join(map(str, e.get('processes', [])))}'s shards"
        f" ({human_bytes(int(e.get('bytes', 0)))}) from host {str(e.get('host', '?'))[:8]}"
        for e in fetched
    )
    return f"read its host's local copy, and from peers: {got}"


def human_bytes(n: float) -> str:
    """Format a byte count with a binary unit, e.g. ``64.0 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def failure_note(
    record: OperationRecord, process: int, account: Failure | None = None
) -> str | None:
    """Why a process's row is marked failed, in one sentence; None when it is not.

    The failure is said once, on its culprit's row: its own error when it failed on
    its own; for a dead process, what the first survivor saw, with who reports it.
    A survivor that gave up because of another says only whom
    (:func:`~nbckpt.journal.gave_up_note`: ``gave up: process 2 died``). A process
    still running in an operation that ended recorded no outcome; one reported dead
    before it recorded anything recorded nothing. ``account``: the operation's
    :func:`~nbckpt.journal.failure_of`, if the caller has it already.
    """
    proc = record.processes.get(process)
    if proc is None:
        return f"{Status.DEAD}: recorded nothing" if process in record.dead else None
    gave_up = gave_up_note(record, process)
    if gave_up is not None:
        return gave_up
    if proc.error:
        return proc.error
    if proc.status not in NOT_FAILED:
        by = listing(proc.dead_reported_by[:NAMED], len(proc.dead_reported_by))
        account = account or failure_of(record)
        # What the first survivor saw names this process: say it here, once.
        seen = account.reported if account is not None and process in account.culprits else None
        head = seen or str(proc.status)
        return f"{head} (reported by {by})" if by else head
    if proc.status == Status.RUNNING and record.status != Status.RUNNING:
        # The others finished or gave up; this one never recorded an outcome.
        return "recorded no outcome (the process died?)"
    return None


def _failed_at(proc: ProcessRecord) -> float | None:
    ends = [s.end for s in proc.phases if s.status == Status.FAILED and s.end is not None]
    return max(ends) if ends else _latest(proc.phases)


class BarrierEntries:
    """When each process entered one barrier wait (a phase name), sorted once.

    A timeline asks, for every process, whom it waited for; with the entries sorted
    once, each answer is a lookup and a handful of names, not a pass over the job.
    """

    def __init__(self, record: OperationRecord, name: str, everyone: list[int]) -> None:
        arrived: dict[int, float] = {}
        for other in record.processes.values():
            same = next((s for s in other.phases if s.name == name), None)
            if same is not None:
                arrived[other.process] = same.start
        self._order = sorted((t, p) for p, t in arrived.items())
        self._times = [t for t, _ in self._order]
        #: Processes of the job that never entered it.
        self.missing = [p for p in everyone if p not in arrived]

    def late(self, after: float, missing: bool) -> tuple[list[int], int]:
        """Who entered after ``after`` (with ``missing``, also who never did).

        Returns :data:`~nbckpt.views.naming.NAMED` of them at most, by index (the
        first that never entered, then the last to enter), and how many there are.
        """
        i = bisect.bisect_right(self._times, after)
        count = len(self._order) - i
        tail = self.missing[:NAMED] if missing else []
        if missing:
            count += len(self.missing)
        if len(tail) < NAMED:
            start = max(i, len(self._order) - (NAMED - len(tail)))
            tail = [p for _, p in self._order[start:]] + tail
        return sorted(tail), count


def barrier_wait(
    record: OperationRecord,
    process: int,
    span: PhaseSpan,
    everyone: list[int],
    entries: BarrierEntries | None = None,
) -> BarrierWait:
    """Whom ``process`` waited for at the barrier wait ``span``.

    Those that entered the same barrier after it; while it waits (or where it gave
    up), those that have not entered it yet, or entered after it stopped waiting.
    ``processes`` names at most :data:`~nbckpt.views.naming.NAMED` of them (those
    never seen first, then the last to arrive), and ``count`` counts them all. ``entries``:
    the span's :class:`BarrierEntries`, if the caller has them already.
    """
    if entries is None:
        entries = BarrierEntries(record, span.name, everyone)
    state = _SPAN_STATES.get(span.status, BarrierState.FAILED)
    if state == BarrierState.RELEASED:
        named, count = entries.late(span.start, missing=False)
    else:
        named, count = entries.late(span.end if span.end is not None else float("inf"), True)
    verb, on = _WAIT_WORDS[state]
    who = listing(named, count)
    return {
        "state": state,
        "processes": named,
        "count": count,
        "label": f"{verb} {on} {who}" if count else "",
        "short": f"{on} {who}" if count else "",
    }


def everyone_of(record: OperationRecord) -> list[int]:
    """Every process of an operation: those it counts, those seen, those reported dead."""
    return sorted(set(range(record.process_count)) | set(record.processes) | set(record.dead))


def timeline_view(record: OperationRecord, only: Iterable[int] | None = None) -> TimelineView:
    """The decisions a drawing of ``record`` takes, as data for the TypeScript side.

    Returns
    -------
    TimelineView
        ``commit_time`` (:func:`commit_time`), ``latest`` (:func:`latest_time`), and
        for every process (:func:`everyone_of`, keyed by its index as a string) its
        ``failure`` (:func:`failure_note`), ``failed_at`` and ``waits``
        (:func:`barrier_wait` of each barrier span, by phase name). With ``only``,
        the drawings of those processes alone (their waits still count everyone).
    """
    everyone = everyone_of(record)
    processes: dict[str, ProcessDrawing] = {}
    entries: dict[str, BarrierEntries] = {}
    wanted = None if only is None else set(only)
    drawn = everyone if wanted is None else [p for p in everyone if p in wanted]
    account = failure_of(record)
    for p in drawn:
        proc = record.processes.get(p)
        failure = failure_note(record, p, account)
        waits: dict[str, BarrierWait] = {}
        for span in proc.phases if proc is not None else []:
            if span.name.startswith(BARRIER_PREFIX) and span.name not in waits:
                if span.name not in entries:
                    entries[span.name] = BarrierEntries(record, span.name, everyone)
                waits[span.name] = barrier_wait(record, p, span, everyone, entries[span.name])
        processes[str(p)] = {
            "failure": failure,
            "failed_at": _failed_at(proc) if proc is not None and failure is not None else None,
            "waits": waits,
        }
    return {
        "commit_time": commit_time(record),
        "latest": latest_time(record),
        "processes": processes,
    }


def drawing(
    record: OperationRecord, only: Iterable[int] | None = None, *, events: bool = True
) -> dict[str, Any]:
    """The merged journal as sent to a front end, with ``view``, its drawing's decisions.

    ``record.to_dict(events=events)`` plus :func:`timeline_view`; with ``only``, both
    for those processes alone (a job of many processes sends the few that matter).
    """
    shown = record
    if only is not None:
        keep = set(only)
        shown = replace(record, processes={p: r for p, r in record.processes.items() if p in keep})
    d = shown.to_dict(events=events)
    d["view"] = timeline_view(record, only)
    return d
