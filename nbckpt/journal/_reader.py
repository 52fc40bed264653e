"""Read the per-process journal files of an operation, and merge them into one record.

:class:`JournalReader` is the one reader: it re-reads ``process_*.jsonl`` files
incrementally (remembering each file's offset, keeping a torn last line for the next
read), and :func:`read_operation` is a single read with it. On an object store a
committed save's records end up in one summary object
(:mod:`nbckpt.journal._summary`), which it reads in their place.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from nbckpt import storage
from nbckpt.formats.layout import Where, ops_dir
from nbckpt.gcpause import paused_gc
from nbckpt.journal._summary import SUMMARY_FILE
from nbckpt.protocol import (
    BARRIER_PREFIX,
    END_EVENT,
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
from nbckpt.storage import Location


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
            rec.status = str(done)
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
    done = str(END_EVENT.get(kind, Event.COMMITTED))
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


class JournalReader:
    """Read one operation's journal files, incrementally.

    Parameters
    ----------
    folder
        ``<root>/.nbckpt/ops/<op>``; it need not exist yet (nothing is read until it
        does, as each process's file appears with its first event).

    Notes
    -----
    Each :meth:`read` reads from the last offset of each file and keeps an incomplete
    last line for the next read, so a line a writer is flushing, or one torn by a
    killed writer, is never parsed half-written.
    """

    def __init__(self, folder: Location) -> None:
        self.folder = folder
        self._offsets: dict[int, int] = {}
        self._partial: dict[int, bytes] = {}
        #: Every event read so far, by process, in the order written.
        self.events: dict[int, list[dict[str, Any]]] = {}
        #: The processes whose events came from the operation's summary, and whether
        #: it was read (it is written once, whole: see nbckpt.journal._summary).
        self._summarized: set[int] = set()
        self._summary_read = False

    def read(self) -> bool:
        """Read what was appended since the last read; tell whether there was anything."""
        grew = False
        paths = storage.glob(self.folder, "*.jsonl")
        if not self._summary_read and any(p.name == SUMMARY_FILE for p in paths):
            grew = self._read_summary(self.folder / SUMMARY_FILE)
        for path in paths:
            try:
                process = int(path.stem.removeprefix("process_"))
            except ValueError:
                continue
            offset = self._offsets.get(process, 0)
            try:
                chunk = _read_from(path, offset)
            except FileNotFoundError:
                continue
            if process in self._summarized:
                # Its own record is there too: it is never older than its copy.
                self._summarized.discard(process)
                self.events[process] = []
            if not chunk:
                continue
            self._offsets[process] = offset + len(chunk)
            lines = (self._partial.pop(process, b"") + chunk).split(b"\n")
            if lines[-1]:
                self._partial[process] = lines[-1]
            events = self.events.setdefault(process, [])
            for line in lines[:-1]:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue  # a torn line from a killed writer
                if isinstance(ev, dict):
                    events.append(ev)
                    grew = True
        return grew

    def _read_summary(self, path: Location) -> bool:
        """Take the events of the processes whose own records were not read."""
        try:
            data = _read_from(path, 0)
        except FileNotFoundError:
            return False
        self._summary_read = True
        found: dict[int, list[dict[str, Any]]] = {}
        for line in data.split(b"\n"):
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and isinstance(ev.get("process"), int):
                found.setdefault(ev["process"], []).append(ev)
        grew = False
        for process, events in found.items():
            # A record read before its object was deleted may lack its last flush.
            if len(events) > len(self.events.get(process, [])):
                self.events[process] = events
                self._offsets.pop(process, None)
                self._partial.pop(process, None)
                self._summarized.add(process)
                grew = True
        return grew

    @property
    def event_count(self) -> int:
        """How many events have been read so far, over all processes."""
        return sum(len(v) for v in self.events.values())

    def merge(self, op: str) -> OperationRecord:
        """The merged record of what was read so far."""
        return merge_events(op, self.events)


def _read_from(path: Location, offset: int) -> bytes:
    """What a journal record holds past ``offset``.

    An object is put whole each time (see :mod:`nbckpt.journal._writer`) and only ever
    grows, so reading it whole and skipping what was read gives the same as a seek.
    """
    if not isinstance(path, Path):
        return path.read_bytes()[offset:]
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read()


def read_operation(root: Where, op: str) -> OperationRecord:
    """Read and merge the journal of one operation.

    Parameters
    ----------
    root
        The checkpoint root.
    op
        The operation id (a folder name under ``<root>/.nbckpt/ops``).

    Raises
    ------
    FileNotFoundError
        If the root has no journal for ``op``.
    """
    folder = ops_dir(root) / op
    if not folder.is_dir():
        known = ", ".join(list_operations(root)[-5:]) or "none"
        raise FileNotFoundError(f"no journal for operation {op!r} in {root}; latest: {known}")
    # One event object per line of every process's journal: without the pause, the
    # collector's scans of a notebook's heap were a third of reading a thousand.
    with paused_gc():
        reader = JournalReader(folder)
        reader.read()
        # A last line without its newline is whole once the writer is done with it.
        for process, tail in reader._partial.items():
            try:
                ev = json.loads(tail)
            except ValueError:
                continue
            if isinstance(ev, dict):
                reader.events.setdefault(process, []).append(ev)
        return reader.merge(op)


def read_matching(root: Where, op: str) -> OperationRecord | None:
    """The journal of ``op``, or of the first operation matching it; None while absent.

    ``op`` may contain ``*`` (a glob over the operation folders), as a barrier's op
    does before the notebook knows its full name; the record's ``op`` is the match.
    """
    if "*" in op:
        matches = storage.glob(ops_dir(root), op)
        if not matches:
            return None
        op = matches[0].name
    try:
        return read_operation(root, op)
    except FileNotFoundError:
        return None


def list_operations(root: Where) -> list[str]:
    """List the operation ids journaled under ``root``, oldest first.

    Operation ids begin with their UTC start time, so name order is time order.
    """
    folder = ops_dir(root)
    try:
        if isinstance(folder, Path):
            return sorted(e.name for e in folder.iterdir() if e.is_dir())
        # Every key below is a journal record, so every name one level down is an op.
        return sorted({key.split("/", 1)[0] for key in folder.list_keys() if "/" in key})
    except (FileNotFoundError, NotADirectoryError):
        return []
