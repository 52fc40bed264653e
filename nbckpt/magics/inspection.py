"""The magics that look at a root and its operations: status, ls, fsck, show, watch, timeline.

They read through the session's reader (:meth:`MagicsBase._reader`), so they work where
the notebook cannot see the storage. :class:`~nbckpt.magics.commands.NbckptMagics`
registers them (:data:`LINE_MAGICS`) with its own.
"""

from __future__ import annotations

import os
from typing import Any

from IPython.core.error import UsageError

from nbckpt.errors import StorageError
from nbckpt.magics import args as a
from nbckpt.magics.base import MagicsBase, usage_errors
from nbckpt.magics.cluster import status_text
from nbckpt.session import reads
from nbckpt.session.operations import resolve_operation

__all__ = ["LINE_MAGICS", "InspectionMagics"]

#: The magics defined here, registered by the class that IPython loads.
LINE_MAGICS = ("ckpt_status", "ckpt_ls", "ckpt_fsck", "ckpt_show", "ckpt_watch", "ckpt_timeline")


class InspectionMagics(MagicsBase):
    """The ``%ckpt_*`` magics that show what a root holds and what its operations did."""

    @a.STATUS
    def ckpt_status(self, line: str) -> None:
        """Show the cluster's processes and the saves this notebook started.

        A dead process is named, with how to go on (``%ckpt_cluster restart``). With OP
        or --dir, shows one operation instead, as ``%ckpt_show`` does.
        """
        args = a.parse_status_args(line)
        if args is not None:
            self._show(args.op, args.directory)
            return
        print(status_text(self._client().status()))

    @a.LS
    def ckpt_ls(self, line: str) -> None:
        """List the steps in DIR (default: the cluster's --dir): state, format, path, why.

        The format says who wrote a step: ``nbckpt``, or ``orbax`` (an Orbax
        checkpoint, which nbckpt reads and restores but never changes or deletes).
        """
        root = self._root(a.parse_ls_args(line).directory, "ckpt_ls")
        try:
            rows = self._reader().run(reads.LIST_STEPS, root)
        except (FileNotFoundError, StorageError) as e:  # one line, no traceback
            raise UsageError(str(e)) from None
        if not rows:
            print(f"no steps in {root}")
        for r in rows:
            kind = r.get("format") or "-"
            print(f"{r['step']:>8}  {r['state']:<11}  {kind:<6}  {r['path']}  ({r['reason']})")

    @a.FSCK
    def ckpt_fsck(self, line: str) -> None:
        """Check a checkpoint directory: complete, in progress, abandoned, corrupt.

        ``--clean`` removes abandoned entries and never a complete step; ``--verify``
        recomputes every chunk's checksum recorded at save time. An unfinished save is
        abandoned once silent for ``--stale-after`` seconds (600); give 0 to clear the
        claim of a job you know is dead.
        """
        args = a.parse_fsck_args(line)
        root = self._root(args.directory, "ckpt_fsck")
        try:
            stale = {} if args.stale_after_s is None else {"stale_after_s": args.stale_after_s}
            report = self._reader().run(
                reads.FSCK, root, clean=args.clean, verify=args.verify, **stale
            )
        except (FileNotFoundError, StorageError) as e:  # one line, no traceback
            raise UsageError(str(e)) from None
        print(report.table())

    # -- one operation, from its journal -----------------------------------------------

    def _operation(self, op: str | None, directory: str | None) -> tuple[str, str]:
        with usage_errors():
            return resolve_operation(op, directory, self.client)

    def _show(self, op: str | None, directory: str | None) -> None:
        text = self.views.show(*self._operation(op, directory))
        if text is not None:
            print(text)

    @a.SHOW
    def ckpt_show(self, line: str) -> None:
        """Show one operation's per-process progress, rebuilt from its journal.

        The journal is the source of truth, so this works after a kernel restart
        (pass --dir then). A running operation keeps updating by itself. Without
        widgets, prints one text progress line per process. Above 16 processes, both
        show the job as a whole and only the processes that matter.
        """
        args = a.parse_show_args(line)
        self._show(args.op, args.directory)

    @a.WATCH
    def ckpt_watch(self, line: str) -> None:
        """Watch every save the engines make under a root: one row per save, newest first.

        For a training loop that saves through the engine API inside ``%%px
        --noblock``: the table follows the journal by itself until ``%ckpt_watch
        --stop`` (a new ``%ckpt_watch`` replaces the one before). Each row: step, start,
        state (the phase while it runs), bytes written, the blocking snapshot, how long
        it took, its processes by status, and the failure that caused a failed save.
        Without widgets, prints the table once.
        """
        args = a.parse_watch_args(line)
        if args.stop:
            if self.views.stop_watching():
                print("stopped watching")
            else:
                print("nothing is being watched; %ckpt_watch [DIR] starts")
            return
        root = self._root(args.directory, "ckpt_watch")
        text = self.views.watch_runs(root, args.last)
        if text is not None:
            print(text)

    @a.TIMELINE
    def ckpt_timeline(self, line: str) -> Any:
        """Draw one operation as a matplotlib figure: a row per process, its phases.

        Above 16 processes, rows for the processes that matter only (the culprits, the
        missing, the slowest), with the job summed up under the title.

        Barrier waits are hatched with a line where each barrier released; the blocking
        snapshot is shaded apart from the background write; a failed process's last
        phase is outlined in red with its error. ``--last N`` draws the newest N saves
        of the directory on one time axis instead, so what overlapped training shows.
        Returns the figure.
        """
        from nbckpt.widgets.timeline import plot_timeline, plot_timelines

        args = a.parse_timeline_args(line)
        save = None if args.save is None else os.path.expanduser(args.save)
        if args.last is not None:
            root = self._root(args.directory, "ckpt_timeline")
            from nbckpt.widgets.runs import newest_ops

            ops = newest_ops(root, args.last, reader=self._reader())
            if not ops:
                raise UsageError(f"no save is journaled under {root}")
            fig = plot_timelines(root, ops, save=save, reader=self._reader())
            what = f"the last {len(ops)} saves"
        else:
            root, op = self._operation(args.op, args.directory)
            fig = plot_timeline(root, op, save=save, reader=self._reader())
            what = op
        if save is not None:
            print(f"timeline of {what} written to {os.path.abspath(save)}")
        _show_figures_as_png(self.shell)
        return fig


def _show_figures_as_png(shell: Any) -> None:
    """Let the shell display a returned matplotlib Figure (pyplot may never be imported)."""
    from IPython.core.pylabtools import print_figure
    from matplotlib.figure import Figure

    formatter = shell.display_formatter.formatters["image/png"]
    try:
        formatter.lookup_by_type(Figure)
    except KeyError:
        formatter.for_type(Figure, lambda fig: print_figure(fig, "png", bbox_inches="tight"))
