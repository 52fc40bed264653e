"""Which saves the journal of a root records, per step, and whether each committed.

Shared by :mod:`nbckpt.formats.inventory` (fsck, the sidebar) and the engine's ownership
checks. Nothing here needs jax, and nothing here writes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from nbckpt import storage
from nbckpt.errors import StorageError
from nbckpt.formats.layout import ops_dir, read_metadata, read_owner
from nbckpt.journal import OperationRecord, list_operations, read_operation
from nbckpt.protocol import Event, Kind, Status

__all__ = ["SaveOps", "find_save_op", "journal_committed", "own_op"]


def find_save_op(root: str | os.PathLike[str] | storage.Location, step: int) -> str | None:
    """Return the id of the newest journaled save of ``step`` under ``root``, if any."""
    return SaveOps(storage.location(root)).newest(step)


class SaveOps:
    """Lazily index the root's journal: which save operations touched which step."""

    def __init__(self, root: storage.Location) -> None:
        self.root = root
        self._by_step: dict[int, list[str]] | None = None
        self._records: dict[str, OperationRecord] = {}

    def newest(self, step: int) -> str | None:
        """The id of the newest journaled save of ``step``, or None."""
        if self._by_step is None:
            self._by_step = {}
            for op in list_operations(self.root):
                # Like entries, operation folders that are symlinks are not followed.
                if (ops_dir(self.root) / op).is_symlink():
                    continue
                header = _op_header(self.root, op)
                if header is not None and header[0] == Kind.SAVE:
                    self._by_step.setdefault(header[1], []).append(op)
        found = self._by_step.get(step)
        return found[-1] if found else None

    def exists(self, op: str) -> bool:
        """Whether operation ``op`` has a journal folder."""
        return (ops_dir(self.root) / op).is_dir()

    def record(self, op: str) -> OperationRecord:
        """The merged journal of ``op`` (read once)."""
        if op not in self._records:
            self._records[op] = read_operation(self.root, op)
        return self._records[op]


def _op_header(root: storage.Location, op: str) -> tuple[str, int] | None:
    """Return (kind, step) from the first readable event of an operation, cheaply.

    A failure of the store (:class:`~nbckpt.errors.StorageError`) is raised.
    """
    files: list[storage.Location] = sorted(
        (ops_dir(root) / op).glob("*.jsonl"), key=lambda f: f.name
    )
    for path in files:
        try:
            line = _first_line(path)
        except StorageError:
            raise
        except (OSError, UnicodeDecodeError):
            continue
        try:
            ev = json.loads(line)
            return str(ev["kind"]), int(ev["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def _first_line(path: storage.Location) -> str:
    """The first line of a text file (an object is read whole: there is no partial read)."""
    if isinstance(path, Path):
        with open(path, encoding="utf-8") as f:
            return f.readline()
    return path.read_bytes().split(b"\n", 1)[0].decode("utf-8")


def journal_committed(rec: OperationRecord) -> bool:
    """Whether a save's journal says it committed (finalized), whatever happened after.

    A peer may fail after the primary finalized: the operation's status is then
    ``failed``, but the step was committed all the same.
    """
    if rec.status == Status.COMMITTED:
        return True
    for proc in rec.processes.values():
        for ev in proc.events:
            if ev.get("event") == Event.FINALIZED:
                return True
            if ev.get("event") == Event.FAILED and ev.get("committed") is True:
                return True
    return False


def own_op(path: storage.Location, step: int, ops: SaveOps, *, newest: bool = True) -> str | None:
    """The save that wrote ``path``: its owner record's, its metadata's, or else one.

    Else, with ``newest``, the newest journaled save of ``step``; without, None.
    """
    for record in (read_owner(path), read_metadata(path)):
        op = record.get("op") if record else None
        if isinstance(op, str) and ops.exists(op):
            return op
    return ops.newest(step) if newest else None
