"""The per-host progress widget: synced traitlets plus an ES module (anywidget).

The ES module is built from ``labextension/src/widget/progress.ts`` into
``static/progress.js`` next to this file by the package's build hook (``pip install``
runs ``jlpm build:prod`` in ``labextension/``); its CSS is ``progress.css``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import anywidget
import traitlets

from nbckpt.monitor import OperationView, ProcessView
from nbckpt.protocol import Kind, Status
from nbckpt.widgets.text import human_bytes, render_text

if TYPE_CHECKING:
    from nbckpt.widgets.live import LiveUpdater

__all__ = ["ProgressWidget", "rows_from_view", "title_of"]

_HERE = Path(__file__).parent
#: The built front end; see ``labextension/src/widget/progress.ts``.
ESM_PATH = _HERE / "static" / "progress.js"
CSS_PATH = _HERE / "progress.css"


def _front_end() -> Path:
    if not ESM_PATH.is_file():
        raise FileNotFoundError(
            f"the progress widget's front end {ESM_PATH} is missing: it is built when the "
            "package is installed (pip install -e .), or by `jlpm build:widget` in labextension/"
        )
    return ESM_PATH


def _ms(t: float | None, t0: float | None) -> str:
    return "?" if t is None or t0 is None else f"+{(t - t0) * 1e3:.0f} ms"


def _who(processes: list[int]) -> str:
    return ", ".join(str(p) for p in processes)


def _barrier_cells(p: ProcessView, t0: float | None) -> list[dict[str, Any]]:
    cells = []
    for b in p.barriers:
        if b.released is not None:
            state = "released"
            text = f"{b.name} {_ms(b.arrived, t0)} → {_ms(b.released, t0)}"
            if b.waited_for:
                text += f" (waited for {_who(b.waited_for)})"
        elif p.status == Status.FAILED:
            state, text = Status.FAILED.value, f"{b.name} {_ms(b.arrived, t0)}, gave up"
        else:
            state = "waiting"
            text = f"{b.name} {_ms(b.arrived, t0)}, waiting for {_who(b.waiting_for) or '-'}"
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
    return ", ".join(parts)


def rows_from_view(view: OperationView) -> list[dict[str, Any]]:
    """The widget's ``rows``: one JSON-able dict per process of ``view``.

    Each row has ``process``, ``phase``, ``status``, ``bytes_written``,
    ``bytes_total``, ``fraction`` (0 to 1), ``bytes_text``, ``barriers`` (per barrier:
    ``name``, ``state`` waiting/released/failed, ``text``, ``waiting_for``),
    ``end_text`` (finalize and commit times), ``error`` and ``error_phase``.
    """
    rows = []
    for p in view.processes:
        if p.bytes_total:
            fraction = min(1.0, p.bytes_written / p.bytes_total)
        else:
            fraction = 1.0 if p.status in (Status.COMMITTED, Status.RESTORED) else 0.0
        rows.append(
            {
                "process": p.process,
                "phase": p.phase,
                "status": p.status,
                "bytes_written": p.bytes_written,
                "bytes_total": p.bytes_total,
                "fraction": round(fraction, 4),
                "show_bytes": view.kind in (Kind.SAVE, Kind.RESTORE),
                "bytes_text": f"{human_bytes(p.bytes_written)} / {human_bytes(p.bytes_total)}",
                "barriers": _barrier_cells(p, view.start),
                "end_text": _end_text(p, view.start),
                "error": p.error,
                "error_phase": p.error_phase,
            }
        )
    return rows


def title_of(view: OperationView) -> str:
    """A one-line title: what the operation is and its id."""
    if view.kind == Kind.BARRIER or view.step is None:
        what = view.kind if view.processes else "waiting for the journal of"
    else:
        what = f"{view.kind} of step {view.step}"
    return f"{what} {view.op}: {view.process_count} processes"


class ProgressWidget(anywidget.AnyWidget):
    """Per-process progress of one operation, drawn from its journal.

    Attributes
    ----------
    op
        The operation id.
    title
        What the operation is.
    status
        ``running``, ``committed``, ``restored`` or ``failed`` (the whole operation).
    rows
        One dict per process; see :func:`rows_from_view`.

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
    rows = traitlets.List(traitlets.Dict()).tag(sync=True)
    #: The updater that keeps this widget live (None once built from a finished journal).
    live: LiveUpdater | None = None

    def __init__(self, view: OperationView | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._view = view
        if view is not None:
            self.update_from(view)

    def update_from(self, view: OperationView) -> bool:
        """Show ``view``; send only the traits that changed, in one message.

        Returns
        -------
        bool
            Whether anything changed.
        """
        new = {
            "op": view.op,
            "title": title_of(view),
            "status": view.status,
            "rows": rows_from_view(view),
        }
        changed = {k: v for k, v in new.items() if getattr(self, k) != v}
        self._view = view
        if changed:
            with self.hold_sync():
                for k, v in changed.items():
                    setattr(self, k, v)
        return bool(changed)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        # Front ends without widgets (a terminal, a static export) get the text view.
        bundle = super()._repr_mimebundle_(**kwargs)
        if self._view is not None and isinstance(bundle, tuple):
            data, metadata = bundle
            return {**data, "text/plain": render_text(self._view)}, metadata
        return bundle
