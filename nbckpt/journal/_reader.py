"""Merge the per-process journal files of an operation into one record."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nbckpt.layout import ops_dir

# (start event, end event, phase name); barriers are paired by their ``name`` field.
_SPANS = (
    ("requested", "snapshot_done", "snapshot"),
    ("write_started", "write_done", "write"),
    ("finalize_started", "finalized", "finalize"),
    ("read_started", "read_done", "read"),
)
_END_EVENTS = {"save": "committed", "restore": "restored"}


@dataclass
class PhaseSpan:
    """One phase of one process: ``name`` from ``start`` to ``end`` (wall times).

    ``status`` is ``"done"``, ``"open"`` (still running, ``end`` is None) or
    ``"failed"`` (the process failed inside it; ``end`` is the failure time).
    """

    name: str
    start: float
    end: float | None
    status: str


@dataclass
class ProcessRecord:
    """Everything one process recorded for an operation."""

    process: int
    events: list[dict[str, Any]] = field(default_factory=list)
    phases: list[PhaseSpan] = field(default_factory=list)
    status: str = "running"
    error: str | None = None
    bytes_total: int = 0
    bytes_written: int = 0


@dataclass
class OperationRecord:
    """The merged journal of one operation across its processes.

    ``status`` is ``"committed"`` (a save every process finished), ``"restored"``,
    ``"failed"`` (some process recorded a failure) or ``"running"``.
    """

    op: str
    kind: str
    step: int | None
    status: str
    start: float | None
    end: float | None
    process_count: int
    processes: dict[int, ProcessRecord]

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict (process keys become strings)."""
        d = asdict(self)
        d["processes"] = {str(k): v for k, v in d["processes"].items()}
        return d


def _process_record(process: int, events: list[dict[str, Any]], kind: str) -> ProcessRecord:
    rec = ProcessRecord(process=process, events=events)
    open_spans: dict[str, tuple[str, float]] = {}  # end event key -> (phase, start)
    failed_at: float | None = None
    for ev in events:
        name, t = ev.get("event"), float(ev.get("t", 0.0))
        for start_ev, end_ev, phase in _SPANS:
            if name == start_ev:
                open_spans[end_ev] = (phase, t)
            elif name == end_ev and end_ev in open_spans:
                phase, t0 = open_spans.pop(end_ev)
                rec.phases.append(PhaseSpan(phase, t0, t, "done"))
        if name == "barrier_enter":
            open_spans[f"barrier_exit:{ev.get('name')}"] = (f"barrier:{ev.get('name')}", t)
        elif name == "barrier_exit":
            key = f"barrier_exit:{ev.get('name')}"
            if key in open_spans:
                phase, t0 = open_spans.pop(key)
                rec.phases.append(PhaseSpan(phase, t0, t, "done"))
        if name == "snapshot_done":
            rec.bytes_total = int(ev.get("bytes", rec.bytes_total))
        elif name in ("write_progress", "write_done", "read_done"):
            rec.bytes_written = max(rec.bytes_written, int(ev.get("bytes", 0)))
        elif name == "failed":
            failed_at = t
            rec.status = "failed"
            rec.error = str(ev.get("error", ""))
        elif name == _END_EVENTS.get(kind, "committed"):
            rec.status = name
    for phase, t0 in open_spans.values():
        if failed_at is not None:
            rec.phases.append(PhaseSpan(phase, t0, failed_at, "failed"))
        else:
            rec.phases.append(PhaseSpan(phase, t0, None, "open"))
    rec.phases.sort(key=lambda s: s.start)
    return rec


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
        Phases per process, and the operation's overall status and time span.
    """
    all_events = [dict(e) for evs in events_by_process.values() for e in evs]
    first = min(all_events, key=lambda e: e.get("t", 0.0)) if all_events else {}
    kind = str(first.get("kind", "save"))
    step = first.get("step")
    counts = [int(e["process_count"]) for e in all_events if "process_count" in e]
    process_count = max(counts) if counts else len(events_by_process)
    procs = {
        p: _process_record(p, [dict(e) for e in evs], kind)
        for p, evs in sorted(events_by_process.items())
    }
    statuses = [r.status for r in procs.values()]
    done = _END_EVENTS.get(kind, "committed")
    if "failed" in statuses:
        status = "failed"
    elif len(procs) >= process_count and all(s == done for s in statuses):
        status = done
    else:
        status = "running"
    times = [float(e["t"]) for e in all_events if "t" in e]
    return OperationRecord(
        op=op,
        kind=kind,
        step=int(step) if step is not None else None,
        status=status,
        start=min(times) if times else None,
        end=max(times) if times and status != "running" else None,
        process_count=process_count,
        processes=procs,
    )


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    events = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            # A process killed mid-write can leave a torn last line; skip it.
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict):
                events.append(ev)
    return events


def read_operation(root: str | os.PathLike[str], op: str) -> OperationRecord:
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
    by_process: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("process_*.jsonl")):
        try:
            process = int(path.stem.removeprefix("process_"))
        except ValueError:
            continue
        by_process[process] = _read_jsonl(path)
    return merge_events(op, by_process)


def list_operations(root: str | os.PathLike[str]) -> list[str]:
    """List the operation ids journaled under ``root``, oldest first.

    Operation ids begin with their UTC start time, so name order is time order.
    """
    try:
        return sorted(e.name for e in os.scandir(ops_dir(root)) if e.is_dir())
    except FileNotFoundError:
        return []
