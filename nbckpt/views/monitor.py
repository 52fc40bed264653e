"""Follow one operation's journal as it grows, and describe where each process is.

:class:`JournalTailer` re-reads ``<root>/.nbckpt/ops/<op>/process_*.jsonl``
incrementally: it remembers each file's offset and parses only the complete lines
written since the last poll. :func:`view_state` turns a merged journal record into a
per-process :class:`OperationView` (phase, bytes, barrier arrivals and who is still
missing, finalize, commit, error). The widget, the terminal progress and
``%ckpt_status OP`` all draw that one view. Nothing here needs jax or IPython.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from nbckpt import storage
from nbckpt.formats.layout import ops_dir
from nbckpt.journal import (
    JournalReader,
    OperationRecord,
    ProcessRecord,
    failure_of,
    gave_up_note,
    merge_events,
)
from nbckpt.protocol import (
    END_EVENT,
    END_STATUSES,
    Event,
    Kind,
    Phase,
    Status,
    barrier_phase,
)
from nbckpt.protocol.views import PreemptionNotice
from nbckpt.session import reads
from nbckpt.storage import Location
from nbckpt.views.naming import NAMED, who
from nbckpt.views.phases import phase_after
from nbckpt.views.timeline import LOCAL_READ, BarrierEntries, everyone_of, local_read_note

__all__ = [
    "BarrierView",
    "barrier_report_view",
    "JournalTailer",
    "OperationView",
    "ProcessView",
    "settled",
    "view_state",
]


@dataclass
class BarrierView:
    """One process at one barrier.

    Attributes
    ----------
    name
        The barrier name (``tmp_ready``, ``write_complete``, ``commit_complete``, or a
        user barrier's name).
    arrived, released
        Wall times this process entered and left it; ``released`` is None while it waits.
    waiting_for
        While it waits: the processes that have not arrived yet (the first
        :data:`~nbckpt.views.naming.NAMED` of them).
    waited_for
        The processes that arrived after this one (whom it waited for): the last
        :data:`~nbckpt.views.naming.NAMED` to arrive.
    waiting_count, waited_count
        How many there are in all.
    """

    name: str
    arrived: float
    released: float | None
    waiting_for: list[int] = field(default_factory=list)
    waited_for: list[int] = field(default_factory=list)
    waiting_count: int = 0
    waited_count: int = 0


@dataclass
class ProcessView:
    """Where one process is in an operation.

    Attributes
    ----------
    process
        The process index.
    phase
        What it is doing now, in the protocol's words: ``not started``, a
        :class:`~nbckpt.protocol.Phase` (``snapshot``, ``prepare``, ``write``,
        ``finalize``, ``read``, ...), ``barrier:<name>``, or its end status.
    status
        ``running``, ``committed`` (or ``restored``), ``failed``, ``dead`` (it
        recorded no end, and others report it died), or ``not started`` when it has
        recorded nothing yet.
    bytes_written, bytes_total
        A save: bytes of its own shards written so far, of the total it snapshotted.
        A restore: ``bytes_total`` is what it reads.
    bytes_read
        A restore: bytes read and checked so far.
    own_data
        A save: False once its snapshot shows it has nothing of its own to write (its
        arrays are replicas that other processes write).
    barriers
        The barriers it reached, in order.
    finalize
        ``(start, end)`` of the finalize phase (primary only; ``end`` None while running).
    committed
        Wall time of its ``committed`` (or ``restored``) event.
    error, error_phase
        The failure text and the phase it failed in.
    last_event
        Wall time of its latest event.
    dead_reported_by
        For a dead process: the processes that report it died.
    note
        Why a row looks as it does, in words, when its numbers alone would mislead:
        the evidence that it is dead, or that it has nothing of its own to write.
    fault
        The fault injected into its write, as journaled (``slow-io x4``).
    """

    process: int
    phase: str
    status: str
    bytes_written: int = 0
    bytes_total: int = 0
    barriers: list[BarrierView] = field(default_factory=list)
    finalize: tuple[float, float | None] | None = None
    committed: float | None = None
    error: str | None = None
    error_phase: str | None = None
    last_event: float | None = None
    bytes_read: int = 0
    own_data: bool = True
    dead_reported_by: list[int] = field(default_factory=list)
    note: str | None = None
    fault: str | None = None

    @property
    def barrier(self) -> BarrierView | None:
        """The barrier it waits at now, if any."""
        if self.barriers and self.barriers[-1].released is None and self.status == Status.RUNNING:
            return self.barriers[-1]
        return None


@dataclass
class OperationView:
    """Every process of one operation, as the journal stands now.

    ``name`` is a user barrier's name (None for saves and restores).
    """

    op: str
    kind: str
    step: int | None
    status: str
    start: float | None
    end: float | None
    process_count: int
    processes: list[ProcessView]
    name: str | None = None
    #: Set for the save of the step agreed after a preemption notice: who was told.
    preemption: PreemptionNotice | None = None
    #: With a local tier: where a save went, or where a restore read from.
    tier: str | None = None
    #: The failure, said once, its culprit first (:func:`~nbckpt.journal.failure_of`):
    #: ``failed: process 2 died (...) (then processes 0, 1 gave up)``; None before one.
    failure: str | None = None

    @property
    def settled(self) -> bool:
        """Whether nothing more will change: see :func:`settled`."""
        return settled(self)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict."""
        return asdict(self)


def _events_at(rec: ProcessRecord, name: str) -> list[dict[str, Any]]:
    return [e for e in rec.events if e.get("event") == name]


def _ms(t: float, t0: float | None) -> str:
    return f"+{(t - (t0 if t0 is not None else t)) * 1e3:.0f} ms"


def _process_view(
    rec: ProcessRecord,
    kind: str,
    entries: Callable[[str], BarrierEntries],
    primary: int | None,
) -> ProcessView:
    view = ProcessView(process=rec.process, phase=Status.NOT_STARTED, status=rec.status)
    view.bytes_total, view.bytes_written = rec.bytes_total, rec.bytes_written
    view.bytes_read, view.fault = rec.bytes_read, rec.fault
    if rec.events:
        view.last_event = max(float(e.get("t", 0.0)) for e in rec.events)
    exits = {str(e.get("name")): float(e["t"]) for e in _events_at(rec, Event.BARRIER_EXIT)}
    for ev in _events_at(rec, Event.BARRIER_ENTER):
        name, t = str(ev.get("name")), float(ev["t"])
        released = exits.get(name)
        at = entries(name)
        waiting = [] if released is not None else at.missing
        later, n_later = at.late(t, missing=False)
        view.barriers.append(
            BarrierView(name, t, released, waiting[:NAMED], later, len(waiting), n_later)
        )
    for span in rec.phases:
        if span.name == Phase.FINALIZE:
            view.finalize = (span.start, span.end)
    for ev in rec.events:
        if ev.get("event") in (Event.COMMITTED, Event.RESTORED):
            view.committed = float(ev["t"])
        elif ev.get("event") == Event.FAILED:
            view.error = str(ev.get("error", "")) or Status.FAILED
            view.error_phase = str(ev.get("phase", "")) or None
    if kind == Kind.SAVE and view.bytes_total == 0:
        view.own_data = not _events_at(rec, Event.SNAPSHOT_DONE)
    if rec.status != Status.RUNNING:
        view.phase = rec.status
    elif any(s.status == Status.OPEN for s in rec.phases):
        view.phase = [s for s in rec.phases if s.status == Status.OPEN][-1].name
    elif rec.events:
        last = rec.events[-1]
        named = last.get("name")
        view.phase = phase_after(
            kind,
            str(last.get("event")),
            None if named is None else str(named),
            rec.process == primary,
        )
    if rec.status == Status.DEAD:
        view.dead_reported_by = list(rec.dead_reported_by)
    return view


def _dead_note(p: ProcessView, t0: float | None, unreachable: bool) -> str:
    verb = "became unreachable" if unreachable else "died"
    since = "no event at all" if p.last_event is None else f"no event since {_ms(p.last_event, t0)}"
    said = "reports" if len(p.dead_reported_by) == 1 else "report"
    return f"{since}; {who(p.dead_reported_by)} {said} it {verb}"


def _replica_note(writers: list[int], status: str) -> str:
    if not writers:
        return "holds replicas only: nothing of its own to write"
    verbs: dict[str, str] = {Status.COMMITTED: "wrote", Status.RUNNING: "writes"}
    verb = verbs.get(status, "was to write")
    return f"holds replicas only; {who(writers)} {verb} its data"


def view_state(record: OperationRecord) -> OperationView:
    """Describe each process of an operation from its merged journal.

    Parameters
    ----------
    record
        The merged journal (:func:`nbckpt.journal.read_operation`, or
        :meth:`JournalTailer.record`).

    Returns
    -------
    OperationView
        One :class:`ProcessView` per process, including those that have recorded
        nothing yet (phase ``not started``), so that a barrier can name them. A
        process the others report dead is ``dead``, with the evidence in its
        ``note``; a save's process with nothing of its own to write says so there.
    """
    everyone = everyone_of(record)
    primary: int | None = None
    for rec in record.processes.values():
        for ev in _events_at(rec, Event.REQUESTED):
            if isinstance(ev.get("primary"), int):
                primary = int(ev["primary"])
    # Each barrier's entries are sorted once, then looked up per process: one pass over
    # every process per process made a view of a thousand processes take seconds.
    found_entries: dict[str, BarrierEntries] = {}

    def entries(name: str) -> BarrierEntries:
        if name not in found_entries:
            found_entries[name] = BarrierEntries(record, barrier_phase(name), everyone)
        return found_entries[name]

    views = []
    for p in everyone:
        found = record.processes.get(p)
        if found is None:
            view = ProcessView(process=p, phase=Status.NOT_STARTED, status=Status.NOT_STARTED)
            if p in record.dead:
                view.phase = view.status = Status.DEAD
                view.dead_reported_by = _reporters_of(record, p)
            views.append(view)
        else:
            views.append(_process_view(found, record.kind, entries, primary))
    _end_with_the_service(record, views)
    writers = [v.process for v in views if v.bytes_total > 0]
    account = failure_of(record)
    for v in views:
        found = record.processes.get(v.process)
        gave_up = gave_up_note(record, v.process) if v.status == Status.FAILED else None
        if gave_up is not None:
            # The cause is said once (the operation's ``failure``), not in every survivor.
            v.error = gave_up
        if v.status == Status.DEAD:
            v.note = _dead_note(v, record.start, found is not None and found.unreachable)
        elif not v.own_data:
            v.note = _replica_note([w for w in writers if w != v.process], record.status)
        elif found is not None and _events_at(found, Event.PREEMPTION_SAVED):
            v.note = "the agreed preemption step is committed: this process stops"
        elif found is not None and record.tier == LOCAL_READ:
            v.note = local_read_note(_events_at(found, Event.FETCHED))
    return OperationView(
        op=record.op,
        kind=record.kind,
        step=record.step,
        status=record.status,
        start=record.start,
        end=record.end,
        process_count=record.process_count,
        processes=views,
        name=record.name,
        preemption=record.preemption,
        tier=record.tier,
        failure=None if account is None else f"failed{account.clause}",
    )


#: What a process still running when process 0 was reported dead shows as its error.
SERVICE_GONE = "the JAX job ended with process 0, which hosted the coordination service"


def _end_with_the_service(record: OperationRecord, views: list[ProcessView]) -> None:
    """End the rows of processes that went down with process 0.

    Process 0 hosts the coordination service: once others report it dead, no process
    of the job can go on, and those that recorded nothing since (their own end
    included) never will. Left running, their rows, and the operation, would say
    ``running`` forever.
    """
    if 0 not in record.dead or record.status != Status.FAILED:
        return
    found = record.processes.get(0)
    noticed = found.dead_reported_at if found is not None else None
    for v in views:
        if v.status != Status.RUNNING:
            continue
        if noticed is not None and v.last_event is not None and v.last_event > noticed:
            continue  # it wrote after the report: it may still record its own end
        v.status = v.phase = str(Status.FAILED)
        v.error = SERVICE_GONE
        v.note = "recorded nothing since process 0 was reported dead"


def _reporters_of(record: OperationRecord, process: int) -> list[int]:
    """The processes whose ``failed`` event names ``process`` dead (it recorded nothing)."""
    found = set()
    for p, rec in record.processes.items():
        for ev in _events_at(rec, Event.FAILED):
            named = ev.get("dead")
            if process in (named if isinstance(named, list) else [ev.get("culprit")]):
                found.add(p)
    return sorted(found)


def settled(view: OperationView) -> bool:
    """Whether an operation's view is final: its journal will not grow any more.

    True once the operation is not running and every process that recorded anything
    has reached an end of its own (``committed``, ``restored``, ``failed``) or is
    ``dead`` (others report that it died). After the first failure the survivors are
    still to record how they gave up: a view that stopped there would show them
    waiting forever. A process that recorded nothing does not hold a failed operation
    open: it may never start.
    """
    if view.status == Status.RUNNING:
        return False
    return all(p.status in END_STATUSES or p.status == Status.NOT_STARTED for p in view.processes)


def barrier_report_view(
    name: str, key: str, entered: dict[int, float], left: dict[int, float]
) -> OperationView:
    """The view of a finished barrier that kept no journal.

    Built from the arrival and release times each process sent back, as if it had
    journaled them.
    """
    n = len(entered)
    events = {
        p: [
            {
                "t": t,
                "event": Event.REQUESTED,
                "kind": Kind.BARRIER,
                "process_count": n,
                "name": name,
            },
            {"t": t, "event": Event.BARRIER_ENTER, "name": name},
            {"t": left[p], "event": Event.BARRIER_EXIT, "name": name},
            {"t": left[p], "event": END_EVENT[Kind.BARRIER]},
        ]
        for p, t in entered.items()
    }
    return view_state(merge_events(key, events))


class JournalTailer:
    """Follow one operation's journal as it grows (:class:`~nbckpt.journal.JournalReader`).

    Parameters
    ----------
    root
        The checkpoint root.
    op
        The operation id. It may contain ``*`` (a glob over the operation folders):
        the first folder that matches, once one exists, is followed. The folder need
        not exist yet; :meth:`poll` finds nothing until it does.
    reader
        Where the journal is read (a cluster's ``reader`` when only its hosts see it).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Location,
        op: str,
        *,
        reader: reads.Reader = reads.LOCAL,
    ) -> None:
        self.root = storage.location(root)
        self.op = op
        self.reads = reader  # where the journal is read whole when only the hosts see it
        self._reader: JournalReader | None = None
        self._record: OperationRecord | None = None
        self._remote_count = 0
        self.polled_at: float | None = None

    def _folder(self) -> Location | None:
        base = ops_dir(self.root)
        if "*" not in self.op:
            return base / self.op
        matches = storage.glob(base, self.op)
        if not matches:
            return None
        self.op = matches[0].name  # resolved: follow this one from now on
        return matches[0]

    def poll(self) -> bool:
        """Read what was appended since the last poll; tell whether there was anything."""
        self.polled_at = time.time()
        if self.reads.remote:  # only the hosts see the journal: they read it whole
            return self._poll_remote()
        if self._reader is None:
            folder = self._folder()
            if folder is not None:
                self._reader = JournalReader(folder)
        grew = self._reader.read() if self._reader is not None else False
        if grew or self._record is None:
            self._record = merge_events(self.op, self._reader.events if self._reader else {})
        return grew

    def _poll_remote(self) -> bool:
        record = self.reads.run(reads.READ_MATCHING, self.root, self.op)
        if record is None:
            grew = False
            record = merge_events(self.op, {})
        else:
            self.op = record.op
            count = sum(len(p.events) for p in record.processes.values())
            grew, self._remote_count = count > self._remote_count, count
        self._record = record
        return grew

    @property
    def event_count(self) -> int:
        """How many events have been read so far, over all processes."""
        if self._reader is None:
            return self._remote_count
        return self._reader.event_count

    def record(self) -> OperationRecord:
        """The merged journal as of the last :meth:`poll` (polls once if never polled)."""
        if self._record is None:
            self.poll()
        assert self._record is not None
        return self._record

    def view(self) -> OperationView:
        """:func:`view_state` of :meth:`record`."""
        return view_state(self.record())
