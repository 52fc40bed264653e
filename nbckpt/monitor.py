"""Follow one operation's journal as it grows, and describe where each process is.

:class:`JournalTailer` re-reads ``<root>/.nbckpt/ops/<op>/process_*.jsonl``
incrementally: it remembers each file's offset and parses only the complete lines
written since the last poll. :func:`view_state` turns a merged journal record into a
per-process :class:`OperationView` (phase, bytes, barrier arrivals and who is still
missing, finalize, commit, error). The widget, the terminal progress and
``%ckpt_status OP`` all draw that one view. Nothing here needs jax or IPython.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nbckpt.journal import OperationRecord, ProcessRecord, merge_events
from nbckpt.layout import ops_dir

__all__ = [
    "BarrierView",
    "JournalTailer",
    "OperationView",
    "ProcessView",
    "view_state",
]

# The label of the state a process is in right after each event, when no phase is open.
_AFTER = {
    "snapshot_done": "prepare",
    "tmp_ready": "tmp_ready",
    "write_done": "written",
    "finalized": "finalized",
    "read_done": "read done",
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
        if self.barriers and self.barriers[-1].released is None and self.status == "running":
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
    view = ProcessView(process=rec.process, phase="not started", status=rec.status)
    view.bytes_total, view.bytes_written = rec.bytes_total, rec.bytes_written
    if rec.events:
        view.last_event = max(float(e.get("t", 0.0)) for e in rec.events)
    exits = {str(e.get("name")): float(e["t"]) for e in _events_at(rec, "barrier_exit")}
    for ev in _events_at(rec, "barrier_enter"):
        name, t = str(ev.get("name")), float(ev["t"])
        arrivals = entered.get(name, {})
        released = exits.get(name)
        waiting = [] if released is not None else [p for p in everyone if p not in arrivals]
        later = sorted(p for p, tp in arrivals.items() if tp > t and p != rec.process)
        view.barriers.append(BarrierView(name, t, released, waiting, later))
    for span in rec.phases:
        if span.name == "finalize":
            view.finalize = (span.start, span.end)
    for ev in rec.events:
        if ev.get("event") in ("committed", "restored"):
            view.committed = float(ev["t"])
        elif ev.get("event") == "failed":
            view.error = str(ev.get("error", "")) or "failed"
            view.error_phase = str(ev.get("phase", "")) or None
    if rec.status != "running":
        view.phase = rec.status
    elif any(s.status == "open" for s in rec.phases):
        view.phase = [s for s in rec.phases if s.status == "open"][-1].name
    elif rec.events:
        last = rec.events[-1]
        name = str(last.get("event"))
        if name == "barrier_exit":
            view.phase = f"barrier:{last.get('name')} released"
        else:
            view.phase = _AFTER.get(name, name)
    # A save's write bar has a total from the snapshot; a restore's from read_done.
    if kind != "save" and view.bytes_total == 0:
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
        for ev in _events_at(rec, "barrier_enter"):
            entered.setdefault(str(ev.get("name")), {})[p] = float(ev["t"])
    views = []
    for p in everyone:
        found = record.processes.get(p)
        if found is None:
            views.append(ProcessView(process=p, phase="not started", status="not started"))
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


class JournalTailer:
    """Read one operation's journal incrementally.

    Parameters
    ----------
    root
        The checkpoint root.
    op
        The operation id. It may contain ``*`` (a glob over the operation folders):
        the first folder that matches, once one exists, is followed. The folder need
        not exist yet; :meth:`poll` finds nothing until it does.

    Notes
    -----
    Each :meth:`poll` lists the folder (a process's file appears when it records its
    first event), reads from the last offset of each file, and keeps an incomplete
    last line for the next poll, so a line torn by a writer mid-flush is never parsed
    half-written.
    """

    def __init__(self, root: str | os.PathLike[str], op: str) -> None:
        self.root = Path(root)
        self.op = op
        self._offsets: dict[int, int] = {}
        self._partial: dict[int, bytes] = {}
        self._events: dict[int, list[dict[str, Any]]] = {}
        self._record: OperationRecord | None = None
        self.polled_at: float | None = None

    def _folder(self) -> Path | None:
        base = ops_dir(self.root)
        if "*" not in self.op:
            return base / self.op
        matches = sorted(base.glob(self.op))
        if not matches:
            return None
        self.op = matches[0].name  # resolved: follow this one from now on
        return matches[0]

    def poll(self) -> bool:
        """Read what was appended since the last poll; tell whether there was anything."""
        self.polled_at = time.time()
        folder = self._folder()
        if folder is None or not folder.is_dir():
            if self._record is None:
                self._record = self._merge()
            return False
        grew = False
        for path in folder.glob("process_*.jsonl"):
            try:
                process = int(path.stem.removeprefix("process_"))
            except ValueError:
                continue
            offset = self._offsets.get(process, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                continue
            if not chunk:
                continue
            self._offsets[process] = offset + len(chunk)
            data = self._partial.pop(process, b"") + chunk
            lines = data.split(b"\n")
            if lines[-1]:
                self._partial[process] = lines[-1]
            events = self._events.setdefault(process, [])
            for line in lines[:-1]:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue  # a torn line from a killed writer
                if isinstance(ev, dict):
                    events.append(ev)
                    grew = True
        if grew or self._record is None:
            self._record = self._merge()
        return grew

    def _merge(self) -> OperationRecord:
        if not self._events:
            # Nothing recorded yet: running, not (as an empty merge would say) done.
            return OperationRecord(self.op, "save", None, "running", None, None, 0, {})
        return merge_events(self.op, self._events)

    @property
    def event_count(self) -> int:
        """How many events have been read so far, over all processes."""
        return sum(len(v) for v in self._events.values())

    def record(self) -> OperationRecord:
        """The merged journal as of the last :meth:`poll` (polls once if never polled)."""
        if self._record is None:
            self.poll()
        assert self._record is not None
        return self._record

    def view(self) -> OperationView:
        """:func:`view_state` of :meth:`record`."""
        return view_state(self.record())
