"""``watch``: a progress widget kept live from an operation's journal."""

from __future__ import annotations

import os

from nbckpt.session.reads import LOCAL, Reader
from nbckpt.views.monitor import JournalTailer, OperationView, settled
from nbckpt.widgets.live import LiveUpdater
from nbckpt.widgets.progress import ProgressWidget

__all__ = ["watch"]


def watch(
    root: str | os.PathLike[str],
    op: str,
    *,
    display: bool = True,
    interval_s: float = 0.25,
    reader: Reader = LOCAL,
) -> ProgressWidget:
    """Show an operation's per-process progress, updated by itself until it ends.

    Parameters
    ----------
    root
        The checkpoint root.
    op
        The operation id (may contain ``*``; see :class:`~nbckpt.views.monitor.JournalTailer`).
    display
        Display the widget now (in a notebook).
    interval_s
        How often the journal is polled.
    reader
        Where the journal is read (a cluster's ``reader`` when only its hosts see it).

    Returns
    -------
    ProgressWidget
        Its ``live`` attribute is the :class:`~nbckpt.widgets.live.LiveUpdater`, or None
        if the operation's view was already settled (:func:`nbckpt.views.monitor.settled`).
    """
    tailer = JournalTailer(root, op, reader=reader)
    tailer.poll()
    view = tailer.view()
    widget = ProgressWidget(view, tailer.record())
    if display:
        from IPython.display import display as show

        show(widget)
    # A failed operation is followed on until its survivors have recorded their end.
    if not settled(view) or tailer.event_count == 0:
        # The timeline draws the merged journal the view was made from (or one poll newer).
        def apply(latest: OperationView) -> None:
            widget.update_from(latest, tailer.record())

        widget.live = LiveUpdater(tailer, apply, interval_s=interval_s).start()
    return widget
