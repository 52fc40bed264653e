"""Append events to one process's journal file of one operation."""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from nbckpt.layout import ops_dir
from nbckpt.protocol import Event

#: The events a process records (:class:`nbckpt.protocol.Event`), in the order a
#: successful save emits them (DESIGN.md section 3).
EVENTS: tuple[str, ...] = tuple(Event)


class JournalWriter:
    """Append-only event log of one process in one operation.

    Parameters
    ----------
    root
        The checkpoint root; the file is ``<root>/.nbckpt/ops/<op>/process_<i>.jsonl``.
    op
        The operation id, the same on every process.
    process
        This process's index.
    kind
        ``"save"`` or ``"restore"`` (any short word), recorded on every event.
    step
        The step the operation works on.

    Notes
    -----
    A journal is an observer: if its file cannot be written the operation goes on and
    one warning is issued, because losing the history must never lose the checkpoint.
    Each event is flushed as it is written so that a reader tailing the file (the
    widgets, the server) sees it at once, and a process killed mid-save leaves every
    event it had reached.
    """

    def __init__(
        self, root: str | os.PathLike[str], op: str, process: int, kind: str, step: int
    ) -> None:
        self.op = op
        self.process = process
        self.kind = kind
        self.step = step
        self.path = ops_dir(root) / op / f"process_{process}.jsonl"
        self._lock = threading.Lock()
        self._file: Any = None
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
                if self._file is None:
                    Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                    self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
                self._file.write(line)
                self._file.flush()
            except OSError as e:
                self._broken = True
                warnings.warn(
                    f"nbckpt: cannot write journal {self.path} ({e}); the operation goes "
                    "on without a history",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def close(self) -> None:
        """Close the file; later events reopen it."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
