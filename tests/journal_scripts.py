"""Scripted journals, written with the real JournalWriter at chosen times.

``SAVE`` is a 2-process save as the engine records it (process 0 is the primary);
``write_script`` writes it, optionally only the events up to a time, or with process 1
failing during its write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nbckpt.journal import JournalWriter

T0 = 1_700_000_000.0
MB = 1_000_000

# (process, seconds after T0, event, fields)
SAVE: list[tuple[int, float, str, dict[str, Any]]] = [
    (0, 0.00, "requested", {"process_count": 2}),
    (1, 0.01, "requested", {"process_count": 2}),
    (0, 0.05, "snapshot_done", {"bytes": 10 * MB}),
    (0, 0.06, "barrier_enter", {"name": "tmp_ready"}),
    (1, 0.08, "snapshot_done", {"bytes": 8 * MB}),
    (1, 0.10, "barrier_enter", {"name": "tmp_ready"}),
    (0, 0.10, "barrier_exit", {"name": "tmp_ready"}),
    (1, 0.10, "barrier_exit", {"name": "tmp_ready"}),
    (0, 0.10, "tmp_ready", {}),
    (1, 0.10, "tmp_ready", {}),
    (0, 0.10, "write_started", {"bytes": 10 * MB}),
    (1, 0.10, "write_started", {"bytes": 8 * MB}),
    (0, 0.20, "write_progress", {"bytes": 5 * MB}),
    (1, 0.30, "write_progress", {"bytes": 3 * MB}),
    (0, 0.30, "write_done", {"bytes": 10 * MB}),
    (0, 0.30, "barrier_enter", {"name": "write_complete"}),
    (1, 0.45, "write_progress", {"bytes": 6 * MB}),
    (1, 0.50, "write_done", {"bytes": 8 * MB}),
    (1, 0.50, "barrier_enter", {"name": "write_complete"}),
    (0, 0.50, "barrier_exit", {"name": "write_complete"}),
    (1, 0.50, "barrier_exit", {"name": "write_complete"}),
    (0, 0.50, "finalize_started", {}),
    (1, 0.50, "barrier_enter", {"name": "commit_complete"}),
    (0, 0.55, "finalized", {}),
    (0, 0.55, "barrier_enter", {"name": "commit_complete"}),
    (0, 0.56, "barrier_exit", {"name": "commit_complete"}),
    (1, 0.56, "barrier_exit", {"name": "commit_complete"}),
    (0, 0.56, "committed", {}),
    (1, 0.56, "committed", {}),
]


def failing_save() -> list[tuple[int, float, str, dict[str, Any]]]:
    """Process 1's disk fails mid-write; process 0 gives up at write_complete."""
    kept = [e for e in SAVE if e[1] <= 0.30]
    return [
        *kept,
        (1, 0.40, "failed", {"error": "OSError: disk on fire", "phase": "write"}),
        (
            0,
            0.41,
            "failed",
            {
                "error": "PeerFailedError: process 1 failed: OSError: disk on fire",
                "phase": "barrier:write_complete",
            },
        ),
    ]


def write_script(
    root: Path,
    op: str,
    script: list[tuple[int, float, str, dict[str, Any]]],
    upto: float | None = None,
    step: int = 7,
) -> None:
    """Write ``script``'s events (those at or before ``upto``) into ``root``'s journal."""
    writers: dict[int, JournalWriter] = {}
    for process, t, event, fields in script:
        if upto is not None and t > upto:
            continue
        w = writers.setdefault(process, JournalWriter(root, op, process, "save", step))
        w.emit(event, t=T0 + t, **fields)
    for w in writers.values():
        w.close()
