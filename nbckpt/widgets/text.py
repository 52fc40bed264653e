"""Text progress per process, with tqdm: the demo and front ends without widgets."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import IO, Any

from tqdm import tqdm

from nbckpt.protocol import Kind, Status
from nbckpt.session import reads
from nbckpt.views.aggregate import AGGREGATE_ABOVE, summarize, summary_lines
from nbckpt.views.monitor import JournalTailer, OperationView, ProcessView, settled
from nbckpt.views.naming import listing
from nbckpt.views.timeline import human_bytes, preempted, tiered

__all__ = [
    "FollowNew",
    "TextProgress",
    "bytes_done",
    "follow_text",
    "human_bytes",
    "render_text",
    "what_of",
]


def what_of(view: OperationView) -> str:
    """What an operation is, in words: ``save of step 3``, ``barrier 'sync'``."""
    if view.kind == Kind.BARRIER:
        return f"barrier {view.name!r}" if view.name else str(Kind.BARRIER)
    if view.step is None:
        return str(view.kind) if view.processes else "waiting for the journal of"
    return f"{view.kind} of step {view.step}{preempted(view.preemption)}{tiered(view.tier)}"


def bytes_done(view: OperationView, p: ProcessView) -> int:
    """The bytes ``p`` has done: read (a restore) or written (a save)."""
    return p.bytes_read if view.kind == Kind.RESTORE else p.bytes_written


def _where(p: ProcessView, dead: set[int] | None = None) -> str:
    """What a process does now, in a few words (its barrier names whom it waits for).

    A failure is named here by its phase only: :func:`render_text` prints the whole
    error on a line of its own, as a meter's width would cut it.
    """
    b = p.barrier
    if b is not None:
        marks = {q: "dead" for q in b.waiting_for if q in (dead or set())}
        missing = listing(b.waiting_for, b.waiting_count, marks)
        return f"{p.phase} (waiting for {missing})" if missing else p.phase
    if p.status == Status.FAILED:
        return f"failed during {p.error_phase or '?'}"
    if p.note:
        return f"{p.phase}: {p.note}"
    return p.phase


def _meter(view: OperationView, p: ProcessView, elapsed: float, ncols: int) -> str:
    total = p.bytes_total or None
    dead = {q.process for q in view.processes if q.status == Status.DEAD}
    return str(
        tqdm.format_meter(
            bytes_done(view, p),
            total,
            elapsed,
            ncols=ncols,
            prefix=f"process {p.process}",
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            postfix=_where(p, dead),
        )
    )


def render_text(view: OperationView, ncols: int = 100) -> str:
    """A static text picture of ``view``: a title line and one tqdm meter per process.

    Then the failure, whole and once, its culprit first (a meter's width would cut
    it), and each process's note (why it is dead, or has nothing of its own to write).
    """
    lines = [f"{what_of(view)} ({view.op}): {view.status}"]
    if len(view.processes) > AGGREGATE_ABOVE:
        return "\n".join(lines + _summary_text(view, ncols))
    for p in view.processes:
        end = p.committed or p.last_event
        elapsed = 0.0 if view.start is None or end is None else max(0.0, end - view.start)
        lines.append(_meter(view, p, elapsed, ncols))
    if view.failure is not None:
        lines.append(view.failure)
    for p in view.processes:
        if p.note:
            lines.append(f"process {p.process}: {p.phase}: {p.note}")
    return "\n".join(lines)


def _summary_text(view: OperationView, ncols: int) -> list[str]:
    """The job as a whole (:mod:`nbckpt.views.aggregate`), the failure said once.

    Then a meter for each process that matters: the dead, the failed, the slowest.
    """
    summary = summarize(view)
    lines = summary_lines(summary)
    by_index = {p.process: p for p in view.processes}
    for q in summary.notable:
        p = by_index[q]
        end = p.committed or p.last_event
        elapsed = 0.0 if view.start is None or end is None else max(0.0, end - view.start)
        lines.append(_meter(view, p, elapsed, ncols))
    return lines


class TextProgress:
    """Live tqdm bars, one per process, fed from :class:`~nbckpt.views.monitor.OperationView`.

    Parameters
    ----------
    file
        Where to draw (default ``sys.stderr``).
    leave
        Keep the bars on screen once closed.
    """

    def __init__(self, file: IO[str] | None = None, *, leave: bool = True) -> None:
        self.file = file if file is not None else sys.stderr
        self.leave = leave
        self._bars: dict[int, tqdm[Any]] = {}

    def update(self, view: OperationView) -> None:
        """Move each process's bar to the bytes it has written and show its phase."""
        for i, p in enumerate(view.processes):
            bar = self._bars.get(p.process)
            if bar is None:
                bar = self._bars[p.process] = tqdm(
                    total=p.bytes_total or None,
                    desc=f"{view.kind} {view.step} process {p.process}",
                    position=i,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    file=self.file,
                    leave=self.leave,
                    dynamic_ncols=True,
                    mininterval=0.1,
                )
            if p.bytes_total and bar.total != p.bytes_total:
                bar.total = p.bytes_total
            bar.n = bytes_done(view, p)
            dead = {q.process for q in view.processes if q.status == Status.DEAD}
            bar.set_postfix_str(_where(p, dead), refresh=False)
            bar.refresh()

    def close(self) -> None:
        """Close every bar."""
        for bar in self._bars.values():
            bar.close()
        self._bars.clear()


class _Following:
    """tqdm bars kept up to date from a journal by a polling thread, until closed."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        op: str,
        file: IO[str] | None,
        *,
        reader: reads.Reader = reads.LOCAL,
    ) -> None:
        from nbckpt.widgets.live import LiveUpdater

        self._bars = TextProgress(file)
        self._tailer = JournalTailer(root, op, reader=reader)
        self._updater = LiveUpdater(self._tailer, self._bars.update, loop=None).start()

    def close(self) -> None:
        """Stop following; draw the last state once more and close the bars."""
        self._updater.stop()
        self._updater.join(5)
        self._tailer.poll()
        self._bars.update(self._tailer.view())
        self._bars.close()


def follow_text(
    root: str | os.PathLike[str],
    op: str,
    *,
    file: IO[str] | None = None,
    reader: reads.Reader = reads.LOCAL,
) -> _Following:
    """Draw tqdm bars per process of ``op`` from a thread until ``close()`` is called."""
    return _Following(root, op, file, reader=reader)


class FollowNew:
    """Draw tqdm bars for each new operation of one kind that appears under a root.

    A context manager: operations already journaled when it starts are ignored; each
    new one is followed until its view is settled (:func:`nbckpt.views.monitor.settled`:
    after a failure, until the others have recorded how they gave up, or have been
    silent for ``settle_s``), then the next. On exit it first draws what is left to
    draw.

    Parameters
    ----------
    root
        The checkpoint root to watch.
    kind
        The operation kind to follow (default: saves, :attr:`~nbckpt.protocol.Kind.SAVE`).
    file
        Where to draw (default ``sys.stderr``).
    interval_s
        How often to read the journal.
    settle_s
        After a failure, how long the journal may stay silent before the operation is
        left as it is (see :class:`~nbckpt.widgets.live.LiveUpdater`).
    reader
        Where the journal is read (a cluster's ``reader`` when only its hosts see it).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        kind: str = Kind.SAVE,
        *,
        file: IO[str] | None = None,
        interval_s: float = 0.25,
        settle_s: float = 60.0,
        reader: reads.Reader = reads.LOCAL,
    ) -> None:
        self.root, self.kind, self.file, self.interval_s = root, kind, file, interval_s
        self.settle_s = settle_s
        self.reader = reader
        self.followed: list[str] = []
        self._seen = set(reader.run(reads.LIST_OPERATIONS, root))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbckpt-follow", daemon=True)

    def __enter__(self) -> FollowNew:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _next(self) -> JournalTailer | None:
        for op in self.reader.run(reads.LIST_OPERATIONS, self.root):
            if op not in self._seen:
                self._seen.add(op)
                tailer = JournalTailer(self.root, op, reader=self.reader)
                tailer.poll()
                if tailer.record().kind == self.kind:
                    return tailer
        return None

    def _run(self) -> None:
        current: tuple[JournalTailer, TextProgress] | None = None
        grew_at = time.monotonic()
        while True:
            stopping = self._stop.is_set()
            if current is None:
                tailer = self._next()
                if tailer is not None:
                    self.followed.append(tailer.op)
                    current = (tailer, TextProgress(self.file))
                    grew_at = time.monotonic()
            if current is not None:
                tailer, bars = current
                if tailer.poll():
                    grew_at = time.monotonic()
                view = tailer.view()
                bars.update(view)
                quiet = time.monotonic() - grew_at > self.settle_s
                over = settled(view) or (view.status != Status.RUNNING and quiet)
                if over or stopping:
                    bars.close()
                    current = None
                    continue  # look for the next one at once
            elif stopping:
                return
            self._stop.wait(self.interval_s)
