"""The server's answers as view models: built here, drawn by the lab extension as they are.

:class:`nbckpt.server.manager.CheckpointManager` decides what may be read; this module
decides what is said about it: each inventory entry with the label to show beside
it, the counts per state, each operation's summary, the merged journal with its
timeline's decisions (:func:`nbckpt.views.timeline.timeline_view`), and which of a
running cluster's operations are in flight or failed (:class:`RecentOperations`).
Shapes: :mod:`nbckpt.protocol.views`, and :class:`Checkpoints` here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TypedDict, cast

from nbckpt.formats.inventory import STATES, Entry, State
from nbckpt.journal import OperationRecord, list_operations, read_operation
from nbckpt.protocol import ORBAX_FORMAT, Kind, Status, parse_op_id
from nbckpt.protocol.views import (
    ActivityOp,
    EntryAnswer,
    JobSummaryView,
    OperationSummary,
    PreemptionNotice,
)
from nbckpt.storage import Location
from nbckpt.views.aggregate import AGGREGATE_ABOVE, summarize, summary_view
from nbckpt.views.monitor import view_state
from nbckpt.views.timeline import drawing, everyone_of, preempted, tiered

__all__ = [
    "Checkpoints",
    "RecentOperations",
    "checkpoints_answer",
    "entry_answer",
    "op_label",
    "operation_answer",
    "operation_summary",
]

#: The name shown beside a step another program wrote (nbckpt's own show none).
FORMAT_LABELS: dict[str, str] = {ORBAX_FORMAT: "Orbax"}


class Checkpoints(TypedDict):
    """The answer of ``GET nbckpt/api/checkpoints``."""

    #: Relative to the server's root, or a URL.
    root: str
    time: float
    entries: list[EntryAnswer]
    counts: dict[State, int]
    #: Every state an entry can be in, in the inventory's order (for the column's key).
    states: list[State]


def entry_answer(entry: Entry) -> EntryAnswer:
    """One entry as the sidebar lists it: :meth:`Entry.to_dict` plus its format's label."""
    label = FORMAT_LABELS.get(entry.format) if entry.format is not None else None
    return cast(EntryAnswer, {**entry.to_dict(), "format_label": label})


def checkpoints_answer(root: str, now: float, found: Iterable[Entry]) -> Checkpoints:
    """Every entry of a root, and how many there are in each state."""
    entries = list(found)
    listed = [entry_answer(e) for e in entries]
    counts: dict[State, int] = {}
    for e in entries:
        counts[e.state] = counts.get(e.state, 0) + 1
    return {
        "root": root,
        "time": now,
        "entries": listed,
        "counts": counts,
        "states": list(STATES),
    }


def op_label(
    kind: str,
    step: int | None,
    name: str | None,
    preemption: PreemptionNotice | None = None,
    tier: str | None = None,
) -> str:
    """How a list names an operation: its kind, then a barrier's name or the step.

    The save of a step agreed after a preemption notice says who was told; with a
    local tier, a save says where it went and a restore where it read from.
    """
    what = name if name is not None else ("" if step is None else str(step))
    label = f"{kind} {what}" if what else kind
    return label + preempted(preemption) + tiered(tier)


def operation_summary(rec: OperationRecord) -> OperationSummary:
    """One operation as ``GET nbckpt/api/operations`` lists it, without its events."""
    return {
        "op": rec.op,
        "kind": rec.kind,
        "step": rec.step,
        "name": rec.name,
        "status": rec.status,
        "start": rec.start,
        "end": rec.end,
        "process_count": rec.process_count,
        "processes_seen": len(rec.processes),
        "label": op_label(rec.kind, rec.step, rec.name, rec.preemption, rec.tier),
    }


def operation_answer(
    rec: OperationRecord, root: str, now: float, process: int | None = None
) -> dict[str, Any]:
    """The merged journal with its timeline's decisions (``OperationAnswer``).

    Above :data:`~nbckpt.views.aggregate.AGGREGATE_ABOVE` processes, ``summary`` is
    the job as a whole, and the journal and the timeline's decisions are those of the
    processes that matter only (the summary's ``notable``), with ``process`` added
    when asked for: a sidebar opens one process's lanes that way.
    """
    summary: JobSummaryView | None = None
    keep: set[int] | None = None
    if len(everyone_of(rec)) > AGGREGATE_ABOVE:
        summary = summary_view(summarize(view_state(rec)))
        keep = {*summary["notable"], *([process] if process is not None else [])}
    data = drawing(rec, keep)
    data.update(
        root=root,
        time=now,
        label=op_label(rec.kind, rec.step, rec.name, rec.preemption, rec.tier),
        summary=summary,
    )
    return data


#: Operations of a running cluster's root that started this long before the cluster
#: registered it still count as its own (clocks of one machine, rounding of op ids).
SINCE_SLACK_S = 2.0
#: How many finished operations' summaries :class:`RecentOperations` keeps.
FINISHED_CACHE = 4096


def op_time(stamp: str) -> float:
    """The Unix time of an operation id's UTC stamp (``20260101T000000[.000001]``)."""
    fmt = "%Y%m%dT%H%M%S.%f" if "." in stamp else "%Y%m%dT%H%M%S"
    return datetime.strptime(stamp, fmt).replace(tzinfo=UTC).timestamp()


class RecentOperations:
    """Which operations of a root, begun since some time, run and which failed.

    Finished operations never change: their summaries are read once and kept (at
    most :data:`FINISHED_CACHE` of them).
    """

    def __init__(self) -> None:
        self._finished: dict[tuple[str, str], ActivityOp] = {}

    def __call__(
        self, real: Location, since: float, readable: Callable[[str], bool]
    ) -> tuple[list[ActivityOp], list[ActivityOp]]:
        """The saves and restores still running, and the operations that failed.

        Parameters
        ----------
        real
            The root.
        since
            When its cluster registered it: older operations are not its own.
        readable
            Whether the journal folder of an operation may be read (not linked out
            of the server's root).
        """
        in_flight, failed = [], []
        for op in list_operations(real):
            parsed = parse_op_id(op)
            if parsed is None or op_time(parsed.time) < since - SINCE_SLACK_S:
                continue
            key = (str(real), op)
            summary = self._finished.get(key)
            if summary is None:
                if not readable(op):
                    continue
                rec = read_operation(real, op)
                summary = {
                    "op": rec.op,
                    "kind": rec.kind,
                    "step": rec.step,
                    "name": parsed.name,
                    "status": rec.status,
                    "start": rec.start,
                    "label": op_label(rec.kind, rec.step, parsed.name, rec.preemption, rec.tier),
                }
                if rec.status not in (Status.RUNNING, Status.NOT_STARTED):
                    if len(self._finished) >= FINISHED_CACHE:
                        self._finished.clear()
                    self._finished[key] = summary
            if summary["status"] == Status.FAILED:
                failed.append(summary)
            elif summary["status"] == Status.RUNNING and summary["kind"] != Kind.BARRIER:
                in_flight.append(summary)
        return in_flight, failed
