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
from dataclasses import asdict, dataclass, field
from typing import Any

from nbckpt import reads, storage
from nbckpt.journal import JournalReader, OperationRecord, ProcessRecord, merge_events
from nbckpt.layout import ops_dir
from nbckpt.protocol import BARRIER_PREFIX, END_EVENT, Event, Kind, Phase, Status
from nbckpt.storage import Location

__all__ = [
    "BarrierView",
    "barrier_report_view",
    "JournalTailer",
    "OperationView",
    "ProcessView",
    "view_state",
]

# The label of the state a process is in right after each event, when no phase is open.
_AFTER: dict[str, str] = {
    Event.SNAPSHOT_DONE: Phase.PREPARE,
    Event.TMP_READY: Event.TMP_READY,
    Event.WRITE_DONE: "written",
    Event.FINALIZED: Event.FINALIZED,
    Event.READ_DONE: "read done",
}


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
        While it waits: the processes that have not arrived yet.
    waited_for
        The processes that arrived after this one (whom it waited for).
    """

    name: str
    arrived: float
    released: float | None
    waiting_for: list[int] = field(default_factory=list)
    waited_for: list[int] = field(default_factory=list)


@dataclass
class ProcessView:
    """Where one process is in an operation.

    Attributes
    ----------
    process
        The process index.
    phase
        What it is doing now: ``not started``, ``snapshot``, ``prepare``,
        ``barrier:<name>``, ``write``, ``finalize``, ..., or ``committed`` / ``failed``.
    status
        ``running``, ``committed`` (or ``restored``), ``failed``, or ``not started``
        when it has recorded nothing yet.
    bytes_written, bytes_total
        Bytes of its own shards written so far, of the total it snapshotted.
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

    @property
    def barrier(self) -> BarrierView | None:
        """The barrier it waits at now, if any."""
        if self.barriers and self.barriers[-1].released is None and self.status == Status.RUNNING:
            return self.barriers[-1]
        return None


@dataclass
class OperationView:
    """Every process of one operation, as the journal stands now."""

    op: str
    kind: str
    step: int | None
    status: str
    start: float | None
    end: float | None
    process_count: int
    processes: list[ProcessView]

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict."""
        return asdict(self)


def _events_at(rec: ProcessRecord, name: str) -> list[dict[str, Any]]:
    return [e for e in rec.events if e.get("event") == name]


def _process_view(
    rec: ProcessRecord, kind: str, entered: dict[str, dict[int, float]], everyone: list[int]
) -> ProcessView:
    view = ProcessView(process=rec.process, phase=Status.NOT_STARTED, status=rec.status)
    view.bytes_total, view.bytes_written = rec.bytes_total, rec.bytes_written
    if rec.events:
        view.last_event = max(float(e.get("t", 0.0)) for e in rec.events)
    exits = {str(e.get("name")): float(e["t"]) for e in _events_at(rec, Event.BARRIER_EXIT)}
    for ev in _events_at(rec, Event.BARRIER_ENTER):
        name, t = str(ev.get("name")), float(ev["t"])
        arrivals = entered.get(name, {})
        released = exits.get(name)
        waiting = [] if released is not None else [p for p in everyone if p not in arrivals]
        later = sorted(p for p, tp in arrivals.items() if tp > t and p != rec.process)
        view.barriers.append(BarrierView(name, t, released, waiting, later))
    for span in rec.phases:
        if span.name == Phase.FINALIZE:
            view.finalize = (span.start, span.end)
    for ev in rec.events:
        if ev.get("event") in (Event.COMMITTED, Event.RESTORED):
            view.committed = float(ev["t"])
        elif ev.get("event") == Event.FAILED:
            view.error = str(ev.get("error", "")) or Status.FAILED
            view.error_phase = str(ev.get("phase", "")) or None
    if rec.status != Status.RUNNING:
        view.phase = rec.status
    elif any(s.status == Status.OPEN for s in rec.phases):
        view.phase = [s for s in rec.phases if s.status == Status.OPEN][-1].name
    elif rec.events:
        last = rec.events[-1]
        name = str(last.get("event"))
        if name == Event.BARRIER_EXIT:
            view.phase = f"{BARRIER_PREFIX}{last.get('name')} released"
        else:
            view.phase = _AFTER.get(name, name)
    # A save's write bar has a total from the snapshot; a restore's from read_done.
    if kind != Kind.SAVE and view.bytes_total == 0:
        view.bytes_total = view.bytes_written
    return view


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
        nothing yet (phase ``not started``), so that a barrier can name them.
    """
    everyone = sorted(set(range(record.process_count)) | set(record.processes))
    entered: dict[str, dict[int, float]] = {}
    for p, rec in record.processes.items():
        for ev in _events_at(rec, Event.BARRIER_ENTER):
            entered.setdefault(str(ev.get("name")), {})[p] = float(ev["t"])
    views = []
    for p in everyone:
        found = record.processes.get(p)
        if found is None:
            views.append(
                ProcessView(process=p, phase=Status.NOT_STARTED, status=Status.NOT_STARTED)
            )
        else:
            views.append(_process_view(found, record.kind, entered, everyone))
    return OperationView(
        op=record.op,
        kind=record.kind,
        step=record.step,
        status=record.status,
        start=record.start,
        end=record.end,
        process_count=record.process_count,
        processes=views,
    )


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
            {"t": t, "event": Event.REQUESTED, "kind": Kind.BARRIER, "process_count": n},
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
    """

    def __init__(self, root: str | os.PathLike[str] | Location, op: str) -> None:
        self.root = storage.location(root)
        self.op = op
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
        if reads.remote():  # only the hosts see the journal: they read it whole
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
        record = reads.run(reads.READ_MATCHING, self.root, self.op)
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
