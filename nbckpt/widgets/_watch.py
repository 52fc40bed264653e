"""``watch``: a progress widget kept live from an operation's journal."""

from __future__ import annotations

import os

from nbckpt.monitor import JournalTailer
from nbckpt.protocol import Status
from nbckpt.widgets.live import LiveUpdater
from nbckpt.widgets.progress import ProgressWidget

__all__ = ["watch"]


def watch(
    root: str | os.PathLike[str],
    op: str,
    *,
    display: bool = True,
    interval_s: float = 0.25,
) -> ProgressWidget:
    """Show an operation's per-process progress, updated by itself until it ends.

    Parameters
    ----------
    root
        The checkpoint root.
    op
        The operation id (may contain ``*``; see :class:`~nbckpt.monitor.JournalTailer`).
    display
        Display the widget now (in a notebook).
    interval_s
        How often the journal is polled.

    Returns
    -------
    ProgressWidget
        Its ``live`` attribute is the :class:`~nbckpt.widgets.live.LiveUpdater`, or None
        if the operation had already ended.
    """
    tailer = JournalTailer(root, op)
    tailer.poll()
    widget = ProgressWidget(tailer.view())
    if display:
        from IPython.display import display as show

        show(widget)
    if tailer.record().status == Status.RUNNING or tailer.event_count == 0:
        widget.live = LiveUpdater(tailer, widget.update_from, interval_s=interval_s).start()
    return widget
