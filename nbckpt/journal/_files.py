"""Read an operation's journal files: incrementally, or once, from a root.

:class:`JournalReader` is the one reader: it re-reads ``process_*.jsonl`` files
incrementally (remembering each file's offset, keeping a torn last line for the next
read), and :func:`read_operation` is a single read with it. On an object store a
finished operation's records end up in one summary object
(:mod:`nbckpt.journal._summary`), which it reads in their place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nbckpt import storage
from nbckpt.formats.layout import Where, ops_dir
from nbckpt.gcpause import paused_gc
from nbckpt.journal._reader import OperationRecord, merge_events
from nbckpt.journal._summary import SUMMARY_FILE
from nbckpt.storage import Location


class JournalReader:
    """Read one operation's journal files, incrementally.

    Parameters
    ----------
    folder
        ``<root>/.nbckpt/ops/<op>``; it need not exist yet (nothing is read until it
        does, as each process's file appears with its first event).

    Notes
    -----
    Each :meth:`read` reads from the last offset of each file and keeps an incomplete
    last line for the next read, so a line a writer is flushing, or one torn by a
    killed writer, is never parsed half-written.
    """

    def __init__(self, folder: Location) -> None:
        self.folder = folder
        self._offsets: dict[int, int] = {}
        self._partial: dict[int, bytes] = {}
        #: Every event read so far, by process, in the order written.
        self.events: dict[int, list[dict[str, Any]]] = {}
        #: The processes whose events came from the operation's summary, and whether
        #: it was read (it is written once, whole: see nbckpt.journal._summary).
        self._summarized: set[int] = set()
        self._summary_read = False

    def read(self) -> bool:
        """Read what was appended since the last read; tell whether there was anything."""
        grew = False
        paths = storage.glob(self.folder, "*.jsonl")
        if not self._summary_read and any(p.name == SUMMARY_FILE for p in paths):
            grew = self._read_summary(self.folder / SUMMARY_FILE)
        for path in paths:
            try:
                process = int(path.stem.removeprefix("process_"))
            except ValueError:
                continue
            offset = self._offsets.get(process, 0)
            try:
                chunk = _read_from(path, offset)
            except FileNotFoundError:
                # Gathered into the summary since it was listed (the summary is written
                # before the records are deleted), or deleted with the operation.
                if not self._summary_read:
                    grew = self._read_summary(self.folder / SUMMARY_FILE) or grew
                continue
            if process in self._summarized:
                # Its own record is there too: it is never older than its copy.
                self._summarized.discard(process)
                self.events[process] = []
            if not chunk:
                continue
            self._offsets[process] = offset + len(chunk)
            lines = (self._partial.pop(process, b"") + chunk).split(b"\n")
            if lines[-1]:
                self._partial[process] = lines[-1]
            events = self.events.setdefault(process, [])
            for line in lines[:-1]:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue  # a torn line from a killed writer
                if isinstance(ev, dict):
                    events.append(ev)
                    grew = True
        return grew

    def _read_summary(self, path: Location) -> bool:
        """Take the events of the processes whose own records were not read."""
        try:
            data = _read_from(path, 0)
        except FileNotFoundError:
            return False
        self._summary_read = True
        found: dict[int, list[dict[str, Any]]] = {}
        for line in data.split(b"\n"):
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and isinstance(ev.get("process"), int):
                found.setdefault(ev["process"], []).append(ev)
        grew = False
        for process, events in found.items():
            # A record read before its object was deleted may lack its last flush.
            if len(events) > len(self.events.get(process, [])):
                self.events[process] = events
                self._offsets.pop(process, None)
                self._partial.pop(process, None)
                self._summarized.add(process)
                grew = True
        return grew

    @property
    def event_count(self) -> int:
        """How many events have been read so far, over all processes."""
        return sum(len(v) for v in self.events.values())

    def merge(self, op: str) -> OperationRecord:
        """The merged record of what was read so far."""
        return merge_events(op, self.events)


def _read_from(path: Location, offset: int) -> bytes:
    """What a journal record holds past ``offset``.

    An object is put whole each time (see :mod:`nbckpt.journal._writer`) and only ever
    grows, so reading it whole and skipping what was read gives the same as a seek.
    """
    if not isinstance(path, Path):
        return path.read_bytes()[offset:]
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read()


def read_operation(root: Where, op: str) -> OperationRecord:
    """Read and merge the journal of one operation.

    Parameters
    ----------
    root
        The checkpoint root.
    op
        The operation id (a folder name under ``<root>/.nbckpt/ops``).

    Raises
    ------
    FileNotFoundError
        If the root has no journal for ``op``.
    """
    folder = ops_dir(root) / op
    if not folder.is_dir():
        known = ", ".join(list_operations(root)[-5:]) or "none"
        raise FileNotFoundError(f"no journal for operation {op!r} in {root}; latest: {known}")
    # One event object per line of every process's journal: without the pause, the
    # collector's scans of a notebook's heap were a third of reading a thousand.
    with paused_gc():
        reader = JournalReader(folder)
        reader.read()
        # A last line without its newline is whole once the writer is done with it.
        for process, tail in reader._partial.items():
            try:
                ev = json.loads(tail)
            except ValueError:
                continue
            if isinstance(ev, dict):
                reader.events.setdefault(process, []).append(ev)
        return reader.merge(op)


def read_matching(root: Where, op: str) -> OperationRecord | None:
    """The journal of ``op``, or of the first operation matching it; None while absent.

    ``op`` may contain ``*`` (a glob over the operation folders), as a barrier's op
    does before the notebook knows its full name; the record's ``op`` is the match.
    """
    if "*" in op:
        matches = storage.glob(ops_dir(root), op)
        if not matches:
            return None
        op = matches[0].name
    try:
        return read_operation(root, op)
    except FileNotFoundError:
        return None


def list_operations(root: Where) -> list[str]:
    """List the operation ids journaled under ``root``, oldest first.

    Operation ids begin with their UTC start time, so name order is time order.
    """
    folder = ops_dir(root)
    try:
        if isinstance(folder, Path):
            return sorted(e.name for e in folder.iterdir() if e.is_dir())
        # Every key below is a journal record, so every name one level down is an op.
        return sorted({key.split("/", 1)[0] for key in folder.list_keys() if "/" in key})
    except (FileNotFoundError, NotADirectoryError):
        return []
