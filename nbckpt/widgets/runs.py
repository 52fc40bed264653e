"""Every save of a root, one row each, newest first: what ``%ckpt_watch`` shows.

In real use the training loop saves through the engine API inside ``%%px --noblock``
and the notebook only watches. :class:`RunWatch` follows the root's journal folder:
it lists the operations (their ids begin with their start time and name their kind,
so no journal is read to pick the saves), follows each unfinished one with a
:class:`~nbckpt.views.monitor.JournalTailer`, and keeps finished ones as they ended.
:func:`run_row` sums one operation up; :func:`runs_text` and :func:`runs_html` draw
the rows. Nothing here needs jax or IPython.
"""

from __future__ import annotations

import html
import os
import time
from dataclasses import dataclass, field

from nbckpt import storage
from nbckpt.journal import OperationRecord, failure_of
from nbckpt.protocol import END_STATUSES, Kind, Phase, Status, parse_op_id
from nbckpt.session import reads
from nbckpt.storage import Location
from nbckpt.views.monitor import JournalTailer
from nbckpt.widgets.text import human_bytes

__all__ = [
    "RunRow",
    "RunWatch",
    "RunsView",
    "newest_ops",
    "run_row",
    "runs_html",
    "runs_text",
    "watch_runs",
]


@dataclass
class RunRow:
    """One operation, summed up over its processes.

    Attributes
    ----------
    op, kind, step, status
        As the merged journal says (:class:`~nbckpt.journal.OperationRecord`).
    start, end
        Wall times of its first and last event (``end`` None while it runs).
    process_count
        How many processes take part.
    by_status
        How many processes are in each status (``running``, ``committed``,
        ``failed``, ``dead``, ``not started``).
    bytes_written, bytes_total
        Over every process: bytes durable so far, of the bytes they own.
    blocking_s
        The longest snapshot, the part of ``save`` the training loop waits for (None
        before any process finished its snapshot).
    phase
        What the running processes are doing: the phase most of them are in.
    error
        The earliest failure, ``process N: ...`` (None if none): the cause, where the
        other processes' failures only say they gave up because of it.
    """

    op: str
    kind: str
    step: int | None
    status: str
    start: float | None
    end: float | None
    process_count: int
    by_status: dict[str, int] = field(default_factory=dict)
    bytes_written: int = 0
    bytes_total: int = 0
    blocking_s: float | None = None
    phase: str = ""
    error: str | None = None

    def duration_s(self, now: float | None = None) -> float | None:
        """Seconds from its start to its end, or to ``now`` while it runs."""
        if self.start is None:
            return None
        end = self.end if self.end is not None else (now if now is not None else time.time())
        return max(end - self.start, 0.0)

    @property
    def fraction(self) -> float:
        """Bytes written over bytes owned, 0 to 1 (1 for a save of nothing)."""
        if self.bytes_total <= 0:
            return 1.0 if self.status == Status.COMMITTED else 0.0
        return min(self.bytes_written / self.bytes_total, 1.0)


def run_row(record: OperationRecord) -> RunRow:
    """Sum up one operation from its merged journal."""
    row = RunRow(
        op=record.op,
        kind=record.kind,
        step=record.step,
        status=record.status,
        start=record.start,
        end=record.end if record.status != Status.RUNNING else None,
        process_count=record.process_count,
    )
    phases: dict[str, int] = {}
    for p in range(max(record.process_count, len(record.processes))):
        rec = record.processes.get(p)
        status = Status.NOT_STARTED if rec is None else rec.status
        if rec is None and p in record.dead:
            status = Status.DEAD
        row.by_status[status] = row.by_status.get(status, 0) + 1
        if rec is None:
            continue
        row.bytes_written += rec.bytes_written
        row.bytes_total += rec.bytes_total
        for span in rec.phases:
            if span.name == Phase.SNAPSHOT and span.end is not None:
                took = span.end - span.start
                row.blocking_s = took if row.blocking_s is None else max(row.blocking_s, took)
        open_spans = [s.name for s in rec.phases if s.status == Status.OPEN]
        if rec.status == Status.RUNNING and open_spans:
            phases[open_spans[-1]] = phases.get(open_spans[-1], 0) + 1
    account = failure_of(record)
    if account is not None:  # said once, the culprit first; who gave up follows
        row.error = account.sentence
    if phases:
        row.phase = max(phases, key=lambda k: phases[k])
    return row


def newest_ops(
    root: str | os.PathLike[str] | Location,
    n: int,
    kinds: tuple[str, ...] = (Kind.SAVE,),
    *,
    reader: reads.Reader = reads.LOCAL,
) -> list[str]:
    """The ids of the newest ``n`` operations of ``kinds`` journaled under ``root``, oldest first.

    Picked by id alone (ids begin with their start time and name their kind).
    """
    listed: list[str] = reader.run(reads.LIST_OPERATIONS, root)
    wanted = [op for op in listed if (p := parse_op_id(op)) is not None and p.kind in kinds]
    return wanted[-n:]


class RunWatch:
    """Follow every operation of one kind under a checkpoint root.

    Parameters
    ----------
    root
        The checkpoint root (a path or an object-store URL; read through the hosts
        when only they see it, as every view does).
    kinds
        Which operations to show (default: saves).
    limit
        How many of the newest to show.
    reader
        Where the journal is read (a cluster's ``reader`` when only its hosts see it).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Location,
        *,
        kinds: tuple[str, ...] = (Kind.SAVE,),
        limit: int = 20,
        reader: reads.Reader = reads.LOCAL,
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.root = storage.location(root)
        self.kinds = kinds
        self.limit = limit
        self.reader = reader
        self._tailers: dict[str, JournalTailer] = {}
        self._finished: dict[str, RunRow] = {}
        self._rows: list[RunRow] = []
        self.polled_at: float | None = None

    def _ops(self) -> list[str]:
        return newest_ops(self.root, self.limit, self.kinds, reader=self.reader)

    def poll(self) -> bool:
        """Read what changed since the last poll; tell whether there is anything to redraw.

        True while a shown operation runs, so that its duration keeps moving.
        """
        self.polled_at = time.time()
        ops = self._ops()
        changed = [op for op in self._rows_ops() if op not in ops]  # fell off the list
        rows = []
        for op in reversed(ops):  # newest first
            done = self._finished.get(op)
            if done is not None:
                rows.append(done)
                continue
            tailer = self._tailers.get(op)
            if tailer is None:
                tailer = self._tailers[op] = JournalTailer(self.root, op, reader=self.reader)
                changed.append(op)
            if tailer.poll():
                changed.append(op)
            row = run_row(tailer.record())
            if row.status in END_STATUSES and Status.RUNNING not in row.by_status:
                # Settled: over, and every process that took part has ended (or was
                # reported dead); the survivors of a failure journal theirs later.
                self._finished[op] = row
                del self._tailers[op]
            rows.append(row)
        for op in list(self._tailers):
            if op not in ops:
                del self._tailers[op]
        self._rows = rows
        return bool(changed) or self.running

    def _rows_ops(self) -> list[str]:
        return [r.op for r in self._rows]

    @property
    def running(self) -> bool:
        """Whether any shown operation is still in flight."""
        return any(r.status == Status.RUNNING for r in self._rows)

    def rows(self) -> list[RunRow]:
        """The rows as of the last :meth:`poll`, newest first."""
        return list(self._rows)

    view = rows  # what a :class:`~nbckpt.widgets.live.Follower` shows


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


def _processes(row: RunRow) -> str:
    order = [Status.COMMITTED, Status.RESTORED, Status.RUNNING, Status.FAILED, Status.DEAD]
    parts = [f"{row.by_status[s]} {s}" for s in order if row.by_status.get(s)]
    waiting = row.by_status.get(Status.NOT_STARTED, 0)
    if waiting:
        parts.append(f"{waiting} {Status.NOT_STARTED}")
    return ", ".join(parts)


def _cells(row: RunRow, now: float) -> list[str]:
    took = row.duration_s(now)
    blocking = "-" if row.blocking_s is None else f"{row.blocking_s * 1e3:.0f} ms"
    state = row.status if row.status != Status.RUNNING or not row.phase else row.phase
    return [
        "-" if row.step is None else str(row.step),
        _when(row.start),
        state,
        f"{human_bytes(row.bytes_written)} / {human_bytes(row.bytes_total)}",
        blocking,
        "-" if took is None else f"{took:.1f} s",
        _processes(row),
        row.op,
    ]


#: ``op``, last: the id ``%ckpt_show OP`` and ``%ckpt_timeline OP`` take.
HEADERS = ["step", "started", "state", "written", "blocking", "took", "processes", "op"]


def runs_text(rows: list[RunRow], now: float | None = None) -> str:
    """The rows as a plain-text table, newest first, each failure on a line of its own."""
    now = time.time() if now is None else now
    if not rows:
        return "no saves yet"
    table = [HEADERS] + [_cells(r, now) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]
    out = []
    for i, line in enumerate(table):
        out.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        if i and rows[i - 1].error:
            out.append(f"    {rows[i - 1].error}")
    return "\n".join(out)


#: The table's look, from JupyterLab's theme variables, so light and dark both read.
_STYLE = """<style>
.nbckpt-runs{border-collapse:collapse;font-size:var(--jp-ui-font-size1,13px);
color:var(--jp-ui-font-color1,#222)}
.nbckpt-runs th,.nbckpt-runs td{padding:2px 8px;text-align:left;vertical-align:top;
border-bottom:1px solid var(--jp-border-color2,#ddd);overflow-wrap:anywhere}
.nbckpt-runs .bar{display:inline-block;width:80px;height:8px;margin-right:6px;
background:var(--jp-layout-color3,#ddd);border-radius:2px;vertical-align:middle}
.nbckpt-runs .fill{display:block;height:100%;border-radius:2px;
background:var(--nbckpt-write,#1f77b4)}
.nbckpt-runs tr[data-status=committed] .state{color:var(--jp-success-color1,#2e7d32)}
.nbckpt-runs tr[data-status=failed] .state{color:var(--jp-error-color1,#c62828)}
.nbckpt-runs .error td{color:var(--jp-error-color1,#c62828);border-bottom-width:0}
</style>"""


def runs_html(rows: list[RunRow], root: str, now: float | None = None) -> str:
    """The rows as an HTML table (what the ``%ckpt_watch`` widget shows)."""
    now = time.time() if now is None else now
    esc = html.escape
    caption = f"saves under {esc(root)}, newest first"
    if not rows:
        return f'{_STYLE}<div class="nbckpt-runs-empty">{caption}: no saves yet</div>'
    parts = [_STYLE, f'<table class="nbckpt-runs"><caption>{caption}</caption><tr>']
    parts += [f"<th>{h}</th>" for h in HEADERS]
    parts.append("</tr>")
    for row in rows:
        cells = _cells(row, now)
        width = f"{row.fraction * 100:.0f}%"
        fill = f'<span class="bar"><span class="fill" style="width:{width}"></span></span>'
        parts.append(
            f'<tr class="run" data-op="{esc(row.op)}" data-status="{esc(row.status)}">'
            f"<td>{esc(cells[0])}</td><td>{esc(cells[1])}</td>"
            f'<td class="state">{esc(cells[2])}</td><td>{fill}{esc(cells[3])}</td>'
            + "".join(f"<td>{esc(c)}</td>" for c in cells[4:-1])
            + f'<td class="op"><code>{esc(cells[-1])}</code></td>'
            + "</tr>"
        )
        if row.error:
            parts.append(
                f'<tr class="error"><td colspan="{len(HEADERS)}">{esc(row.error)}</td></tr>'
            )
    parts.append("</table>")
    return "".join(parts)


class RunsView:
    """A live table of a root's saves: an HTML widget kept current by a polling thread.

    Made by :func:`watch_runs`. ``widget`` is the ``ipywidgets.HTML`` it draws into,
    ``live`` the :class:`~nbckpt.widgets.live.Follower` that polls (None once stopped).
    """

    def __init__(self, watch: RunWatch, *, interval_s: float, loop: object | None = ...) -> None:
        import ipywidgets

        from nbckpt.widgets.live import Follower

        self.watch = watch
        self.root = str(watch.root)
        watch.poll()
        self.widget = ipywidgets.HTML(runs_html(watch.rows(), self.root))
        # Never given up for silence: a training run may save once an hour.
        self.live: Follower[list[RunRow]] | None = Follower(
            watch, self._draw, interval_s=interval_s, loop=loop, idle_stop_s=float("inf")
        ).start()

    def _draw(self, rows: list[RunRow]) -> None:
        self.widget.value = runs_html(rows, self.root)

    def close(self) -> None:
        """Stop following; the table keeps its last state, marked as no longer live."""
        if self.live is not None:
            self.live.stop()
            self.live.join(5.0)
            self.live = None
            stopped = '<div class="nbckpt-runs-stopped">(no longer watching)</div>'
            self.widget.value = runs_html(self.watch.rows(), self.root) + stopped

    def _repr_mimebundle_(self, **kwargs: object) -> object:
        return self.widget._repr_mimebundle_(**kwargs)


def watch_runs(
    root: str | os.PathLike[str] | Location,
    *,
    limit: int = 20,
    interval_s: float = 0.5,
    display: bool = True,
    reader: reads.Reader = reads.LOCAL,
) -> RunsView:
    """Show every save under ``root``, one row each, newest first, live until closed.

    Parameters
    ----------
    root
        The checkpoint root the engines save to.
    limit
        How many of the newest saves to show.
    interval_s
        How often the journal is polled.
    display
        Display the table now (in a notebook).
    reader
        Where the journals are read (a cluster's reader when the storage is on its
        hosts).

    Returns
    -------
    RunsView
        Close it (``.close()``, or ``%ckpt_watch --stop``) to stop following.
    """
    view = RunsView(RunWatch(root, limit=limit, reader=reader), interval_s=interval_s)
    if display:
        from IPython.display import display as show

        show(view.widget)
    return view
