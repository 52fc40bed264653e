"""One journal object per operation on an object store: a summary of every record.

On an object store each process's record of an operation is an object of its own
(:mod:`nbckpt.journal._writer`): a save of N processes leaves N objects, and every
reader lists and reads them all (1,024 requests to show one save of 1,024 processes).
Once a save has committed, its primary gathers the records into one object,
:data:`SUMMARY_FILE` (the same lines, record after record in process order), then deletes
the process objects it copied, before ``wait_until_finished`` returns. A reader reads
the summary as it reads the records it holds (:class:`~nbckpt.journal.JournalReader`);
where a process's own object is there too, that object wins: it is never older than
its copy.

A restore is summarized the same way by process 0, once every process has recorded
that it restored. Only a successful operation is summarized. A failed one keeps each
process's evidence where that process wrote it, and so does a save asked for by a
preemption notice: after the commit, its processes record that they may stop. Local
journals are files appended to, read at no cost per process, and are never summarized.
"""

from __future__ import annotations

import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor

from nbckpt.protocol import Event
from nbckpt.storage import ObjectPath

__all__ = ["SUMMARY_FILE", "WAIT_S", "summarize", "summarize_quietly"]

#: The summary's name in the operation's folder.
SUMMARY_FILE = "summary.jsonl"
#: How long the primary waits for every process's record to end (the others record
#: their end right after the last barrier: a process missing so long is gone).
WAIT_S = 10.0
#: How often it looks again meanwhile, at most. The first looks come sooner (from
#: FIRST_POLL_S, doubling): the others' records usually land within milliseconds of the
#: primary's, and the operation returns only once the summary is written.
POLL_S = 0.2
FIRST_POLL_S = 0.01
#: Requests in flight at once.
_THREADS = 16
#: How the wait sleeps between looks (a test makes it refuse to).
_sleep = time.sleep


def summarize(
    folder: ObjectPath,
    process_count: int,
    end: str = Event.COMMITTED,
    wait_s: float = WAIT_S,
    poll_s: float = POLL_S,
) -> bool:
    """Gather an operation's records into one object once each ends with ``end``.

    ``end`` is the event that ends the operation's kind successfully
    (:data:`~nbckpt.protocol.END_EVENT`). Waits until every process's record ends so
    (at most ``wait_s``; not at all once one has failed). Returns whether the summary
    was written; if not, or if the store fails on the way, every record is left where
    it is (a reader merges what it finds either way).
    """
    deadline = time.monotonic() + wait_s
    delay = min(FIRST_POLL_S, poll_s)
    records: dict[int, bytes] = {}
    with ThreadPoolExecutor(min(_THREADS, process_count)) as pool:
        while True:
            missing = [p for p in range(process_count) if p not in records]
            for p, data in zip(missing, pool.map(lambda p: _read(folder, p), missing), strict=True):
                last = None if data is None else _last_event(data)
                if last == Event.FAILED:
                    return False  # its evidence stays where it was written
                if data is not None and last == end:
                    records[p] = data
            if len(records) == process_count:
                break
            if time.monotonic() + delay > deadline:
                return False
            _sleep(delay)
            delay = min(delay * 2, poll_s)
        if any(b'"preemption"' in data for data in records.values()):
            return False  # its processes write again once they may stop
        try:
            (folder / SUMMARY_FILE).write_bytes(b"".join(records[p] for p in sorted(records)))
            list(pool.map(lambda p: _record(folder, p).unlink(missing_ok=True), sorted(records)))
        except OSError:
            return False
    return True


def summarize_quietly(folder: ObjectPath, process_count: int, end: str = Event.COMMITTED) -> bool:
    """:func:`summarize`, on the operation's own thread, never raising.

    The operation returns (a save's ``wait_until_finished``, a restore) only once the
    summary is written or given up: a summary written later, in the background, could
    land after the caller deleted the root, and leave an object there.
    """
    # A journal is an observer: a store that fails here leaves the records as they are.
    with contextlib.suppress(Exception):
        return summarize(folder, process_count, end)
    return False


def _record(folder: ObjectPath, process: int) -> ObjectPath:
    return folder / f"process_{process}.jsonl"


def _read(folder: ObjectPath, process: int) -> bytes | None:
    try:
        return _record(folder, process).read_bytes()
    except FileNotFoundError:
        return None


def _last_event(data: bytes) -> str | None:
    """The event of a record's last whole line."""
    lines = data.rstrip(b"\n").rsplit(b"\n", 1)
    if not data.endswith(b"\n"):
        return None  # not a whole record: every line the writer puts ends with one
    try:
        event = json.loads(lines[-1]).get("event")
    except (ValueError, AttributeError):
        return None
    return event if isinstance(event, str) else None
