"""Record one process's events of one operation: appended to a file, or put as an object.

A local journal file is appended to and flushed at every event. An object store has no
append, so there the whole record so far is written again as one object
(``process_<i>.jsonl``, the same name and contents as a file) each time it is flushed:
at most every :data:`FLUSH_INTERVAL_S` while events arrive, and at once for the events
that end an operation or a process's part in it. Each PUT replaces the object
atomically with a longer copy of the same lines, so a reader sees a file that only
grows, exactly as it does locally, and reads both the same way.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from nbckpt.formats.layout import Where, ops_dir
from nbckpt.protocol import Event
from nbckpt.storage import ObjectPath

#: The events a process records (:class:`nbckpt.protocol.Event`), in the order a
#: successful save emits them (DESIGN.md section 3).
EVENTS: tuple[str, ...] = tuple(Event)

#: On an object store, the longest an event waits before it is written (one PUT of the
#: whole record per interval at most, however many events arrive).
FLUSH_INTERVAL_S = 0.25

#: How many PUTs a second a whole job's journals may make: S3 takes 3,500 a second per
#: prefix, and every process of an operation writes under the same one.
JOB_PUTS_PER_S = 1000


def flush_interval(process_count: int) -> float:
    """How long a process's events wait on an object store, in a job of that many.

    :data:`FLUSH_INTERVAL_S` up to 250 processes; beyond, longer, so that the job's
    PUTs stay near :data:`JOB_PUTS_PER_S` (one a second each at 1,000 processes).
    """
    return max(FLUSH_INTERVAL_S, process_count / JOB_PUTS_PER_S)


#: Events written at once on an object store: the end of an operation or a failure,
#: which a process may not live long enough to flush later.
URGENT: frozenset[str] = frozenset(
    {
        Event.COMMITTED,
        Event.FAILED,
        Event.RESTORED,
        Event.FINALIZED,
        Event.READ_DONE,
        Event.PREEMPTION_SAVED,
    }
)


class _ObjectSink:
    """The growing record of one process, put as one object per flush."""

    def __init__(self, path: ObjectPath, interval_s: float = FLUSH_INTERVAL_S) -> None:
        self.path = path
        self.interval_s = interval_s
        self._lines: list[str] = []
        self._version = 0
        self._written = 0
        self._lock = threading.Lock()  # the lines
        self._put_lock = threading.Lock()  # one PUT at a time, newest last
        self._timer: threading.Timer | None = None
        #: The failure of the last PUT: a store that failed once is not asked again,
        #: so that a dead store does not hold up the save's own error with retries.
        self.error: OSError | None = None

    def add(self, line: str, urgent: bool) -> None:
        if self.error is not None:
            raise self.error
        with self._lock:
            self._lines.append(line)
            self._version += 1
            if not urgent and self._timer is None:
                self._timer = threading.Timer(self.interval_s, self._flush_quietly)
                self._timer.daemon = True
                self._timer.start()
        if urgent:
            self.flush()

    def _flush_quietly(self) -> None:
        # The next event raises it, and its writer warns once.
        with contextlib.suppress(OSError):
            self.flush()

    def flush(self) -> None:
        """Put the record if it grew; after one failure, fail at once (no new retries)."""
        if self.error is not None:
            raise self.error
        with self._put_lock:
            with self._lock:
                self._timer = None
                if self._version == self._written:
                    return
                version, data = self._version, "".join(self._lines)
            try:
                self.path.write_bytes(data.encode("utf-8"))
            except OSError as e:
                self.error = e
                raise
            self._written = version

    def close(self) -> None:
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        self.flush()


class JournalWriter:
    """Event log of one process in one operation (append-only, or rewritten as an object).

    Parameters
    ----------
    root
        The checkpoint root; the record is ``<root>/.nbckpt/ops/<op>/process_<i>.jsonl``.
    op
        The operation id, the same on every process.
    process
        This process's index.
    kind
        ``"save"`` or ``"restore"`` (any short word), recorded on every event.
    step
        The step the operation works on.
    process_count
        How many processes the operation has: on an object store, a large job's
        events wait longer before they are written (:func:`flush_interval`).

    Notes
    -----
    A journal is an observer: if its record cannot be written the operation goes on
    and one warning is issued, because losing the history must never lose the
    checkpoint. Locally each event is flushed as it is written, so that a reader
    tailing the file (the widgets, the server) sees it at once, and a process killed
    mid-save leaves every event it had reached. On an object store events reach the
    store within :data:`FLUSH_INTERVAL_S` (longer in a job of more than 250 processes),
    and the :data:`URGENT` ones at once; a process killed in between loses the events
    of its last interval.
    """

    def __init__(
        self, root: Where, op: str, process: int, kind: str, step: int, process_count: int = 1
    ) -> None:
        self.op = op
        self.process = process
        self.kind = kind
        self.step = step
        self.path = ops_dir(root) / op / f"process_{process}.jsonl"
        self._lock = threading.Lock()
        self._file: Any = None
        self._sink = (
            _ObjectSink(self.path, flush_interval(process_count))
            if isinstance(self.path, ObjectPath)
            else None
        )
        self._broken = False

    def emit(self, event: str, *, t: float | None = None, **fields: Any) -> None:
        """Record one event.

        Parameters
        ----------
        event
            One of :data:`EVENTS`.
        t
            Wall time of the event (``time.time()``); now if omitted.
        **fields
            JSON-able details, e.g. ``bytes=...``, ``name=...`` or ``error=...``.
        """
        if event not in EVENTS:
            raise ValueError(f"unknown journal event {event!r}; expected one of {EVENTS}")
        record = {
            "t": time.time() if t is None else t,
            "event": event,
            "op": self.op,
            "kind": self.kind,
            "step": self.step,
            "process": self.process,
            **fields,
        }
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            if self._broken:
                return
            try:
                if self._sink is not None:
                    self._sink.add(line, urgent=event in URGENT)
                    return
                if self._file is None:
                    assert isinstance(self.path, Path)
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
                self._file.write(line)
                self._file.flush()
            except OSError as e:
                self._give_up(e, "; the operation goes on without a history")

    def close(self) -> None:
        """Close the file (write what is pending to the store); later events reopen it."""
        with self._lock:
            if self._file is not None:
                file, self._file = self._file, None
                try:
                    # Flushes what a failed write left buffered; closes the file either way.
                    file.close()
                except OSError as e:
                    # A full disk fails the close too: the operation goes on, as for emit.
                    self._give_up(e)
            if self._sink is not None and not self._broken:
                try:
                    self._sink.close()
                except OSError as e:
                    self._give_up(e)

    def _give_up(self, e: OSError, after: str = "") -> None:
        """Write no more of this journal, and say so once (the caller holds the lock)."""
        if not self._broken:
            self._broken = True
            warnings.warn(
                f"nbckpt: cannot write journal {self.path} ({e}){after}",
                RuntimeWarning,
                stacklevel=3,  # the caller of emit or close
            )
