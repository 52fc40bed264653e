"""The per-host progress widget: synced traitlets plus an ES module (anywidget).

The ES module is built from ``labextension/src/widget/progress.ts`` (bundled with the
lab sidebar's timeline, ``labextension/src/timeline.ts``) into ``static/progress.js``
next to this file by the package's build hook (``pip install`` runs ``jlpm build:prod``
in ``labextension/``); its CSS, ``static/progress.css``, is built from
``labextension/style/widget.css`` with the shared palette and timeline rules.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anywidget
import traitlets

from nbckpt.journal import OperationRecord
from nbckpt.protocol import BarrierState, Kind, Phase, Status, as_json
from nbckpt.protocol.views import BarrierCell, Column, Row
from nbckpt.views.aggregate import AGGREGATE_ABOVE, summarize, summary_view
from nbckpt.views.monitor import OperationView, ProcessView
from nbckpt.views.naming import listing
from nbckpt.views.timeline import drawing
from nbckpt.widgets.text import bytes_done, human_bytes, render_text, what_of

if TYPE_CHECKING:
    from nbckpt.widgets.live import LiveUpdater

__all__ = ["ProgressWidget", "columns_of", "rows_from_view", "timeline_of", "title_of"]

_HERE = Path(__file__).parent
#: The built front end; see ``labextension/src/widget/progress.ts``.
ESM_PATH = _HERE / "static" / "progress.js"
CSS_PATH = _HERE / "static" / "progress.css"


def _front_end(path: Path = ESM_PATH) -> Path:
    if not path.is_file():
        raise FileNotFoundError(
            f"the progress widget's front end {path} is missing: it is built when the "
            "package is installed (pip install -e .), or by `jlpm build:widget` in labextension/"
        )
    return path


def _ms(t: float | None, t0: float | None) -> str:
    return "?" if t is None or t0 is None else f"+{(t - t0) * 1e3:.0f} ms"


def _who(processes: list[int], dead: set[int] | None = None, total: int | None = None) -> str:
    return listing(processes, total, {p: "dead" for p in processes if p in (dead or set())})


def _barrier_cells(p: ProcessView, t0: float | None, dead: set[int]) -> list[BarrierCell]:
    cells: list[BarrierCell] = []
    for b in p.barriers:
        if b.released is not None:
            state = BarrierState.RELEASED
            text = f"{b.name} {_ms(b.arrived, t0)} → {_ms(b.released, t0)}"
            if b.waited_for:
                text += f" (waited for {_who(b.waited_for, total=b.waited_count)})"
        elif p.status == Status.FAILED:
            state, text = BarrierState.FAILED, f"{b.name} {_ms(b.arrived, t0)}, gave up"
        elif p.status == Status.DEAD:
            state, text = BarrierState.FAILED, f"{b.name} {_ms(b.arrived, t0)}, died waiting"
        else:
            state = BarrierState.WAITING
            waiting = _who(b.waiting_for, dead, b.waiting_count) or "-"
            text = f"{b.name} {_ms(b.arrived, t0)}, waiting for {waiting}"
        cells.append(
            {
                "name": b.name,
                "state": state,
                "text": text,
                "waiting_for": list(b.waiting_for),
                "arrived_ms": None if t0 is None else (b.arrived - t0) * 1e3,
            }
        )
    return cells


def _end_text(p: ProcessView, t0: float | None) -> str:
    parts = []
    if p.finalize is not None:
        start, end = p.finalize
        took = "…" if end is None else f"{(end - start) * 1e3:.0f} ms"
        parts.append(f"finalize {_ms(start, t0)} ({took})")
    if p.committed is not None:
        parts.append(f"{p.status} {_ms(p.committed, t0)}")
    if p.error_phase:
        parts.append(f"during {p.error_phase}")
    if p.status == Status.DEAD and p.note:
        parts.append(p.note)  # the evidence: since when it is silent, and who says so
    return ", ".join(parts)


def _bytes_cell(view: OperationView, p: ProcessView) -> dict[str, Any]:
    """The bytes part of a row: its bar's fraction, whether to draw the bar, its text."""
    done, total = bytes_done(view, p), p.bytes_total
    text = f"{human_bytes(done)} / {human_bytes(total)}"
    if p.fault:
        text += f" ({p.fault})"
    if view.kind == Kind.SAVE and not p.own_data:
        # Nothing of its own to write: a full bar of "0 B / 0 B" would claim work done.
        return {"fraction": 0.0, "show_bar": False, "bytes_text": p.note or text}
    if total:
        return {"fraction": round(min(1.0, done / total), 4), "show_bar": True, "bytes_text": text}
    return {"fraction": 0.0, "show_bar": True, "bytes_text": text}


def _phase_note(note: str | None, bytes_text: str, end_text: str) -> str | None:
    """The note shown under a row's phase: None where another cell already says it."""
    if not note or note == bytes_text or note in end_text:
        return None
    return note


def rows_from_view(view: OperationView) -> list[Row]:
    """The widget's ``rows``: one JSON-able dict per process of ``view``.

    Each row has ``process``, ``phase`` (in the protocol's words), ``status``
    (``dead`` for a process others report dead), ``bytes_written``, ``bytes_read``,
    ``bytes_total``, ``bytes_done`` (read for a restore, written for a save) and
    ``bytes_verb`` (``read`` or ``written``), ``fraction`` (0 to 1), ``show_bytes``,
    ``show_bar`` (False where a bar would mislead: a process with nothing of its own
    to write), ``bytes_text`` (then the reason, in words), ``barriers`` (per barrier:
    ``name``, ``state`` waiting/released/failed, ``text``, ``waiting_for``),
    ``end_text`` (finalize and commit times; for a dead process, the evidence),
    ``fill_kind`` (the colour role of the bar: ``read`` for a restore, else ``write``),
    ``note`` (why the row looks as it does, when it needs saying), ``phase_note``
    (the note, unless the bytes or the end cell says it already), ``fault`` (an
    injected fault, e.g. ``slow-io x4``), ``dead_reported_by``, and ``error`` (whole:
    the front end wraps it) and ``error_phase``.
    """
    dead = {p.process for p in view.processes if p.status == Status.DEAD}
    reads = view.kind == Kind.RESTORE
    rows: list[Row] = []
    for p in view.processes:
        cell = _bytes_cell(view, p)
        end_text = _end_text(p, view.start)
        rows.append(
            {
                "process": p.process,
                "phase": p.phase,
                "status": p.status,
                "bytes_written": p.bytes_written,
                "bytes_read": p.bytes_read,
                "bytes_total": p.bytes_total,
                "bytes_done": bytes_done(view, p),
                "bytes_verb": "read" if reads else "written",
                "show_bytes": view.kind in (Kind.SAVE, Kind.RESTORE),
                "fraction": cell["fraction"],
                "show_bar": cell["show_bar"],
                "bytes_text": cell["bytes_text"],
                "fill_kind": Phase.READ if reads else Phase.WRITE,
                "barriers": _barrier_cells(p, view.start, dead),
                "end_text": end_text,
                "note": p.note,
                "phase_note": _phase_note(p.note, cell["bytes_text"], end_text),
                "fault": p.fault,
                "dead_reported_by": list(p.dead_reported_by),
                "error": p.error,
                "error_phase": p.error_phase,
            }
        )
    return rows


def timeline_of(record: OperationRecord, only: list[int] | None = None) -> dict[str, Any]:
    """The widget's ``timeline`` without ``now``: the merged journal, minus raw events.

    It is ``record.to_dict()`` (what the lab sidebar's timeline draws) without each
    process's ``events``, which the drawing does not need and which grow with every
    progress event, plus ``view``: the decisions the drawing shows
    (:func:`nbckpt.views.timeline.timeline_view`), as the server sends them. With
    ``only``, only those processes' lanes.
    """
    return drawing(record, only, events=False)


def widget_model(view: OperationView, asked: int | None = None) -> dict[str, Any]:
    """The widget's traits but its timeline, and whose lanes the timeline draws.

    ``op``, ``title``, ``status``, ``columns``, ``rows``, ``summary``; and ``only``, the processes
    whose lanes the timeline draws (None: all). Above
    :data:`~nbckpt.views.aggregate.AGGREGATE_ABOVE` processes, the summary and the
    rows and lanes of the processes that matter, and of process ``asked`` (the
    widget's field); else every row and no summary.
    """
    rows = rows_from_view(view)
    only: list[int] | None = None
    summary: dict[str, Any] = {}
    if len(view.processes) > AGGREGATE_ABOVE:
        job = summary_view(summarize(view))
        summary, only = dict(job), list(job["notable"])
        if (
            asked is not None
            and asked not in only
            and any(p.process == asked for p in view.processes)
        ):
            only.append(asked)
        rows = [r for r in rows if r["process"] in only]
    return {
        "op": view.op,
        "title": title_of(view),
        "status": view.status,
        "columns": columns_of(view),
        "rows": rows,
        "summary": summary,
        "only": only,
    }


def columns_of(view: OperationView) -> list[Column]:
    """The table's columns for ``view``'s kind: a barrier moves no bytes and is released.

    A save's end is its finalize and commit, a restore's the moment it restored, a
    barrier's its release; only saves and restores have a bytes column.
    """
    end: dict[str, str] = {Kind.SAVE: "finalize / commit", Kind.RESTORE: Status.RESTORED}
    columns: list[Column] = [{"key": "process", "label": "process"}]
    columns.append({"key": "phase", "label": "phase"})
    if view.kind in (Kind.SAVE, Kind.RESTORE):
        verb = "read" if view.kind == Kind.RESTORE else "written"
        columns.append({"key": "bytes", "label": verb})
    columns.append({"key": "barriers", "label": "barriers"})
    columns.append({"key": "end", "label": end.get(view.kind, str(Status.RELEASED))})
    return columns


def title_of(view: OperationView) -> str:
    """A one-line title: what the operation is (a barrier by its name) and its id."""
    return f"{what_of(view)} {view.op}: {view.process_count} processes"


class ProgressWidget(anywidget.AnyWidget):
    """Per-process progress of one operation, drawn from its journal.

    Attributes
    ----------
    op
        The operation id.
    title
        What the operation is.
    status
        ``running``, ``committed``, ``restored``, ``released`` (a barrier) or
        ``failed`` (the whole operation).
    columns
        The table's columns for the operation's kind (:func:`columns_of`): a barrier
        has no bytes column, and its end column is its release.
    rows
        One dict per process; see :func:`rows_from_view`. Above
        :data:`~nbckpt.views.aggregate.AGGREGATE_ABOVE` processes, only those of
        ``summary["notable"]`` and ``asked``.
    summary
        ``{}`` for a job of a few processes; above
        :data:`~nbckpt.views.aggregate.AGGREGATE_ABOVE`, the job as a whole
        (:func:`~nbckpt.views.aggregate.summary_view`), drawn above the rows.
    timeline
        The merged journal the front end draws as a timeline (:func:`timeline_of`),
        plus ``now``: the kernel's clock when it was sent, which open spans reach (and
        grow from, in the browser, until the next update). ``{}`` until a record is
        given.
    protocol
        The protocol's names the front end draws with (:func:`nbckpt.protocol.as_json`):
        the widget runs in any Jupyter front end, so it never asks a server for them.
    asked
        A process whose row and lane to show too, in a job shown as a whole: the field
        under the summary sets it (None: none).

    Notes
    -----
    Build one with :func:`nbckpt.widgets.watch`, which also keeps it live. The widget
    only shows state; it never talks to the engines.
    """

    _esm = _front_end()
    _css = CSS_PATH
    op = traitlets.Unicode("").tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    status = traitlets.Unicode(Status.RUNNING.value).tag(sync=True)
    columns = traitlets.List(traitlets.Dict()).tag(sync=True)
    rows = traitlets.List(traitlets.Dict()).tag(sync=True)
    summary = traitlets.Dict().tag(sync=True)
    timeline = traitlets.Dict().tag(sync=True)
    protocol = traitlets.Dict().tag(sync=True)
    #: The process whose row and lane the field under the summary asked for.
    asked = traitlets.Int(None, allow_none=True).tag(sync=True)
    #: The updater that keeps this widget live (None once built from a finished journal).
    live: LiveUpdater | None = None

    def __init__(
        self,
        view: OperationView | None = None,
        record: OperationRecord | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("protocol", as_json())
        super().__init__(**kwargs)
        self._view = view
        self._record = record
        if view is not None:
            self.update_from(view, record)

    def update_from(self, view: OperationView, record: OperationRecord | None = None) -> bool:
        """Show ``view``; send only the traits that changed, in one message.

        Parameters
        ----------
        view
            What the table shows.
        record
            The merged journal ``view`` was made from, for the timeline; None keeps the
            timeline as it is.

        Returns
        -------
        bool
            Whether anything changed.
        """
        new = widget_model(view, self.asked)
        only = new.pop("only")
        changed: dict[str, Any] = {k: v for k, v in new.items() if getattr(self, k) != v}
        if record is not None:
            self._record = record
            timeline = timeline_of(record, only)
            if {k: v for k, v in self.timeline.items() if k != "now"} != timeline:
                changed["timeline"] = {**timeline, "now": time.time()}
        self._view = view
        if changed:
            with self.hold_sync():
                for k, v in changed.items():
                    setattr(self, k, v)
        return bool(changed)

    @traitlets.observe("asked")
    def _show_asked(self, _change: Any) -> None:
        """Add the asked process's row and lane (the front end's field set it)."""
        if self._view is not None:
            self.update_from(self._view, self._record)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        # Front ends without widgets (a terminal, a static export) get the text view.
        bundle = super()._repr_mimebundle_(**kwargs)
        if self._view is not None and isinstance(bundle, tuple):
            data, metadata = bundle
            return {**data, "text/plain": render_text(self._view)}, metadata
        return bundle
