"""The live views one IPython session keeps: by operation id, or by barrier key.

The magics ask for a view and forget it; the registry keeps each one (so its live
updater and its place in the notebook stay reachable, e.g. ``get_client`` users and
tests look a view up by op id) and decides, from the shell, whether a view is a widget
(a kernel whose front end can show one) or text.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from nbckpt.protocol import barrier_op_glob
from nbckpt.session.reads import LOCAL, Reader

if TYPE_CHECKING:
    from nbckpt.widgets.progress import ProgressWidget
    from nbckpt.widgets.runs import RunsView

__all__ = ["Closable", "LiveViews"]


class Closable(Protocol):
    """What a caller must close once it stops waiting (text bars drawn by a thread)."""

    def close(self) -> None:
        """Stop following; draw the last state."""


class LiveViews:
    """The progress widgets a session made, by operation id or barrier key (newest last).

    Parameters
    ----------
    shell
        The IPython shell. Widgets are shown only when it runs in a kernel; otherwise
        views are text.
    """

    def __init__(self, shell: Any, reader: Callable[[], Reader] = lambda: LOCAL) -> None:
        self._shell = shell
        # Asked at each view: the session's cluster (and so its reader) comes and goes.
        self._reader = reader
        self._views: dict[str, ProgressWidget] = {}
        #: The ``%ckpt_watch`` table, while it follows a root.
        self.runs: RunsView | None = None

    @property
    def in_kernel(self) -> bool:
        """Whether the shell runs in a kernel whose front end can show widgets."""
        return getattr(self._shell, "kernel", None) is not None

    def __getitem__(self, key: str) -> ProgressWidget:
        return self._views[key]

    def __contains__(self, key: object) -> bool:
        return key in self._views

    def __len__(self) -> int:
        return len(self._views)

    def follow(self, root: str | os.PathLike[str], op: str, *, text: bool) -> Closable | None:
        """Keep a live view of ``op``; with ``text`` and no widgets, draw tqdm bars too.

        Returns
        -------
        Closable or None
            The text bars, which the caller closes once it stops waiting.
        """
        from nbckpt.widgets import watch
        from nbckpt.widgets.text import follow_text

        in_kernel = self.in_kernel
        reader = self._reader()
        self._views[op] = watch(root, op, display=in_kernel, reader=reader)
        return follow_text(root, op, reader=reader) if text and not in_kernel else None

    def follow_barrier(self, root: str | None, name: str, key: str) -> bool:
        """In a notebook, follow a barrier's journal while it waits; tell whether it does.

        A barrier is journaled only under a default root, as
        :func:`~nbckpt.protocol.barrier_op_glob` finds it before its time is known.
        """
        if not self.in_kernel or root is None:
            return False
        from nbckpt.widgets import watch

        self._views[key] = watch(root, barrier_op_glob(key, name), reader=self._reader())
        return True

    def drop_unjournaled(self, key: str) -> None:
        """Stop following a barrier that failed before any engine journaled it."""
        widget = self._views.get(key)
        if widget is not None and widget.live is not None and widget.live.tailer.event_count == 0:
            widget.live.stop()

    def show_finished_barrier(
        self, name: str, key: str, entered: dict[int, float], left: dict[int, float]
    ) -> None:
        """In a notebook, show a barrier that had no journal, from the engines' times."""
        if not self.in_kernel:
            return
        from IPython.display import display

        from nbckpt.views.monitor import barrier_report_view
        from nbckpt.widgets.progress import ProgressWidget

        display(ProgressWidget(barrier_report_view(name, key, entered, left)))

    def show(self, root: str | os.PathLike[str], op: str) -> str | None:
        """Show ``op`` rebuilt from its journal: a live widget, or (no widgets) its text."""
        if self.in_kernel:
            from nbckpt.widgets import watch

            self._views[op] = watch(root, op, reader=self._reader())
            return None
        from nbckpt.views.monitor import JournalTailer
        from nbckpt.widgets.text import render_text

        return render_text(JournalTailer(root, op, reader=self._reader()).view())

    def watch_runs(self, root: str | os.PathLike[str], limit: int) -> str | None:
        """Show every save under ``root`` live (replacing the watch before), or its text.

        Returns the table's text when there are no widgets (a plain shell): printed
        once, since a terminal cannot redraw it in place between prompts.
        """
        if not self.in_kernel:
            from nbckpt.widgets.runs import RunWatch, runs_text

            watch = RunWatch(root, limit=limit, reader=self._reader())
            watch.poll()
            return f"saves under {root}, newest first\n{runs_text(watch.rows())}"
        from nbckpt.widgets.runs import watch_runs

        self.stop_watching()
        self.runs = watch_runs(root, limit=limit, reader=self._reader())
        return None

    def stop_watching(self) -> bool:
        """Stop the ``%ckpt_watch`` table; tell whether one was following."""
        runs, self.runs = self.runs, None
        if runs is None or runs.live is None:
            return False
        runs.close()
        return True
