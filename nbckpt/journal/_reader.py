"""Merge the per-process events of an operation into one record.

:func:`merge_events` turns each process's events into its phases, bytes and end, and
the operation's status; the files are read by :mod:`nbckpt.journal._files`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from nbckpt.protocol import (
    BARRIER_PREFIX,
    END_EVENT,
    END_STATUS,
    END_STATUSES,
    SPANS,
    SPANS_BY_KIND,
    Cause,
    Event,
    Kind,
    Status,
    Tier,
    parse_op_id,
)
from nbckpt.protocol.views import PreemptionNotice


@dataclass
class PhaseSpan:
    """One phase of one process: ``name`` from ``start`` to ``end`` (wall times).

    ``status`` is ``"done"``, ``"open"`` (still running, ``end`` is None) or
    ``Status.FAILED`` (the process failed, or died, inside it; ``end`` is the failure
    time, or for a dead process the time another process first reported its death).
    """

    name: str
    start: float
    end: float | None
    status: str


@dataclass
class ProcessRecord:
    """Everything one process recorded for an operation.

    Attributes
    ----------
    status
        :class:`~nbckpt.protocol.Status`: ``running``, the operation's end
        (``committed``, ``restored``), ``failed``, or ``dead`` when it recorded no end
        of its own and other processes report that it died or became unreachable.
    bytes_total
        A save: the bytes of its own shards (its snapshot). A restore: the bytes it
        reads (known once its reads are issued, or from ``read_done``).
    bytes_written, bytes_read
        Bytes durable so far (a save), or read and checked so far (a restore).
    dead_reported_by, dead_reported_at
        For a dead process: who reported its death, and when first.
    unreachable
        For a dead process: whether those reports say it became unreachable (it may
        still run, cut off) rather than died.
    fault
        The fault injected into its write (``slow-io x4``), as its journal says.
    """

    process: int
    events: list[dict[str, Any]] = field(default_factory=list)
    phases: list[PhaseSpan] = field(default_factory=list)
    status: str = Status.RUNNING
    error: str | None = None
    bytes_total: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    dead_reported_by: list[int] = field(default_factory=list)
    dead_reported_at: float | None = None
    unreachable: bool = False
    fault: str | None = None


@dataclass
class OperationRecord:
    """The merged journal of one operation across its processes.

    ``status`` is :class:`~nbckpt.protocol.Status` ``COMMITTED`` (a save every process
    finished), ``RESTORED``, ``FAILED`` (some process recorded a failure) or ``RUNNING``.
    ``name`` is a user barrier's name (None for other kinds); a barrier has no step.
    ``dead`` lists every process reported dead that recorded no end of its own, those
    that recorded nothing at all (and so have no :class:`ProcessRecord`) included.
    ``preemption`` says who was told to stop when the save was of the step every
    process agreed after a preemption notice (None otherwise). ``tier`` says where a
    checkpointer with a local tier put a save (``"local tier + root"``, ``"local tier
    only"``) or read a restore from (``"from the hosts' local copies"``, ``"from the
    root"``); None without a local tier.
    """

    op: str
    kind: str
    step: int | None
    status: str
    start: float | None
    end: float | None
    process_count: int
    processes: dict[int, ProcessRecord]
    name: str | None = None
    dead: list[int] = field(default_factory=list)
    #: Set when the save was of the step agreed after a preemption notice.
    preemption: PreemptionNotice | None = None
    #: With a local tier: where the save went, or where the restore read from.
    tier: str | None = None

    def to_dict(self, events: bool = True) -> dict[str, Any]:
        """Return a JSON-able dict (process keys become strings).

        Without each process's ``events`` if ``events`` is False. Written out rather
        than ``dataclasses.asdict``, which copied every event deeply: most of the 0.6 s
        a thousand processes' record took.
        """
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["dead"] = list(self.dead)
        d["preemption"] = copy.deepcopy(self.preemption)
        d["processes"] = {str(k): _process_dict(p, events) for k, p in self.processes.items()}
        return d


def _process_dict(proc: ProcessRecord, events: bool) -> dict[str, Any]:
    d = {f.name: getattr(proc, f.name) for f in fields(proc)}
    d["phases"] = [
        {"name": s.name, "start": s.start, "end": s.end, "status": s.status} for s in proc.phases
    ]
    d["dead_reported_by"] = list(proc.dead_reported_by)
    if events:
        d["events"] = copy.deepcopy(proc.events)
    else:
        del d["events"]
    return d


def _process_record(process: int, events: list[dict[str, Any]], kind: str) -> ProcessRecord:
    rec = ProcessRecord(process=process, events=events)
    open_spans: dict[str, tuple[str, float]] = {}  # end event key -> (phase, start)
    failed_at: float | None = None
    done = END_EVENT.get(kind, Event.COMMITTED)
    ended = END_STATUS.get(kind, Status.COMMITTED)
    # A restore or a barrier never records a snapshot: its ``requested`` opens nothing.
    spans = SPANS_BY_KIND.get(kind, SPANS)
    for ev in events:
        name, t = ev.get("event"), float(ev.get("t", 0.0))
        for start_ev, end_ev, span in spans:
            if name == start_ev:
                open_spans[end_ev] = (span, t)
            elif name == end_ev and end_ev in open_spans:
                phase, t0 = open_spans.pop(end_ev)
                rec.phases.append(PhaseSpan(phase, t0, t, Status.DONE))
        barrier_end = f"{Event.BARRIER_EXIT}:{ev.get('name')}"
        if name == Event.BARRIER_ENTER:
            open_spans[barrier_end] = (f"{BARRIER_PREFIX}{ev.get('name')}", t)
        elif name == Event.BARRIER_EXIT and barrier_end in open_spans:
            waited, t0 = open_spans.pop(barrier_end)
            rec.phases.append(PhaseSpan(waited, t0, t, Status.DONE))
        if name == Event.SNAPSHOT_DONE:
            rec.bytes_total = int(ev.get("bytes", rec.bytes_total))
        elif name == Event.WRITE_STARTED:
            rec.fault = str(ev["fault"]) if ev.get("fault") else rec.fault
        elif name in (Event.WRITE_PROGRESS, Event.WRITE_DONE):
            rec.bytes_written = max(rec.bytes_written, int(ev.get("bytes", 0)))
        elif name in (Event.READ_PROGRESS, Event.READ_DONE):
            rec.bytes_read = max(rec.bytes_read, int(ev.get("bytes", 0)))
            total = (
                ev.get("total", ev.get("bytes", 0)) if name == Event.READ_DONE else ev.get("total")
            )
            rec.bytes_total = max(rec.bytes_total, int(total or 0))
        elif name == Event.FAILED:
            failed_at = t
            rec.status = Status.FAILED
            rec.error = str(ev.get("error", ""))
        elif name == done:
            rec.status = str(ended)
    for phase, t0 in open_spans.values():
        if failed_at is not None:
            rec.phases.append(PhaseSpan(phase, t0, failed_at, Status.FAILED))
        else:
            rec.phases.append(PhaseSpan(phase, t0, None, Status.OPEN))
    rec.phases.sort(key=lambda s: s.start)
    return rec


def _death_reports(procs: Mapping[int, ProcessRecord]) -> dict[int, list[tuple[int, float, bool]]]:
    """Who reports whom dead: per process, ``(reporter, time, unreachable)`` each.

    A survivor's ``failed`` event with cause ``peer_dead`` names the processes it found
    silent in ``dead`` (and, among them, those whose host did not answer in
    ``unreachable``); a journal older than those fields names one, its ``culprit``.
    """
    reports: dict[int, list[tuple[int, float, bool]]] = {}
    for reporter, rec in procs.items():
        for ev in rec.events:
            if ev.get("event") != Event.FAILED or ev.get("cause") != Cause.PEER_DEAD:
                continue
            named = ev.get("dead")
            if not isinstance(named, list):
                culprit = ev.get("culprit")
                named = [culprit] if isinstance(culprit, int) else []
            lost = ev.get("unreachable")
            lost = lost if isinstance(lost, list) else []
            for p in named:
                if isinstance(p, int) and p != reporter:
                    t = float(ev.get("t", 0.0))
                    reports.setdefault(p, []).append((reporter, t, p in lost))
    return reports


def _mark_dead(
    procs: dict[int, ProcessRecord], reports: dict[int, list[tuple[int, float, bool]]]
) -> list[int]:
    """Mark the processes reported dead that recorded no end (nor anything since)."""
    dead = []
    for p, said in sorted(reports.items()):
        first = min(t for _, t, _ in said)
        rec = procs.get(p)
        if rec is not None:
            last = max((float(e.get("t", 0.0)) for e in rec.events), default=first)
            # An end of its own, or an event after the report (a false alarm: it was
            # only slow), is the truth the process told itself.
            if rec.status in END_STATUSES or last > first:
                continue
            rec.status = str(Status.DEAD)
            rec.dead_reported_by = sorted({r for r, _, _ in said})
            rec.dead_reported_at = first
            rec.unreachable = all(u for _, _, u in said)
            # Whatever it was doing ended, at the latest, when its death was noticed.
            rec.phases = [
                PhaseSpan(s.name, s.start, first, Status.FAILED) if s.status == Status.OPEN else s
                for s in rec.phases
            ]
        dead.append(p)
    return dead


def merge_events(
    op: str, events_by_process: Mapping[int, Iterable[Mapping[str, Any]]]
) -> OperationRecord:
    """Merge already-parsed events into an :class:`OperationRecord`.

    Parameters
    ----------
    op
        The operation id.
    events_by_process
        For each process index, its events in the order written.

    Returns
    -------
    OperationRecord
        Phases per process, and the operation's overall status and time span. A
        process that recorded no end of its own but that others report dead (their
        ``failed`` events, cause ``peer_dead``) is ``dead``.
    """
    all_events = [dict(e) for evs in events_by_process.values() for e in evs]
    first = min(all_events, key=lambda e: e.get("t", 0.0)) if all_events else {}
    kind = str(first.get("kind", Kind.SAVE))
    step = first.get("step")
    counts = [int(e["process_count"]) for e in all_events if "process_count" in e]
    process_count = max(counts) if counts else len(events_by_process)
    procs = {
        p: _process_record(p, [dict(e) for e in evs], kind)
        for p, evs in sorted(events_by_process.items())
    }
    dead = _mark_dead(procs, _death_reports(procs))
    statuses = [r.status for r in procs.values()]
    done = str(END_STATUS.get(kind, Status.COMMITTED))
    if Status.FAILED in statuses:
        status = str(Status.FAILED)
    elif all_events and len(procs) >= process_count and all(s == done for s in statuses):
        status = done
    else:
        # Nothing recorded yet is running, not (as "all of none finished" would say) done.
        status = str(Status.RUNNING)
    times = [float(e["t"]) for e in all_events if "t" in e]
    name: str | None = None
    if kind == Kind.BARRIER:
        named = first.get("name")
        parsed = parse_op_id(op)
        name = str(named) if named else (parsed.name if parsed is not None else None)
        step = None  # a barrier's journal says 0: it works on no step
    notices = [e["preemption"] for e in all_events if isinstance(e.get("preemption"), dict)]
    return OperationRecord(
        op=op,
        kind=kind,
        step=int(step) if step is not None else None,
        status=status,
        start=min(times) if times else None,
        end=max(times) if times and status != Status.RUNNING else None,
        process_count=process_count,
        processes=procs,
        name=name,
        dead=dead,
        preemption=notices[0] if notices else None,
        tier=_tier(all_events),
    )


def _tier(events: list[dict[str, Any]]) -> str | None:
    """Where a save went, or a restore read from, with a local tier (see OperationRecord)."""
    for e in events:
        if e.get("event") == Event.TIER_CHOSEN:
            local = e.get("tier") == Tier.LOCAL
            return "from the hosts' local copies" if local else "from the root"
        tiers = e.get("tiers")
        if e.get("event") == Event.REQUESTED and isinstance(tiers, dict):
            return "local tier + root" if tiers.get("persistent") else "local tier only"
    return None
