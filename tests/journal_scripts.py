"""Scripted journals, written with the real JournalWriter at chosen times.

``SAVE`` is a 2-process save as the engine records it (process 0 is the primary);
``write_script`` writes it, optionally only the events up to a time, or with process 1
failing during its write. ``killed_save`` is a 3-process save whose process 2 is
killed; ``RESTORE`` and ``BARRIER`` are the journals of the other kinds.
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
        (
            1,
            0.40,
            "failed",
            {"error": "OSError: disk on fire", "phase": "write", "cause": "error", "culprit": 1},
        ),
        (
            0,
            0.41,
            "failed",
            {
                "error": "PeerFailedError: process 1 failed: OSError: disk on fire",
                "phase": "barrier:write_complete",
                "cause": "peer_failed",
                "culprit": 1,
            },
        ),
    ]


def killed_save(*, culprit_only: bool = False) -> list[tuple[int, float, str, dict[str, Any]]]:
    """Process 2 of 3 is killed during its write; 0 and 1 notice at write_complete.

    Survivors name the dead process in ``dead`` (and ``culprit``); with
    ``culprit_only``, as journals older than the ``dead`` field did.
    """
    script: list[tuple[int, float, str, dict[str, Any]]] = []
    for p in range(3):
        script += [
            (p, 0.00 + p / 100, "requested", {"process_count": 3, "primary": 0}),
            (p, 0.02 + p / 100, "snapshot_done", {"bytes": 4 * MB}),
            (p, 0.03 + p / 100, "barrier_enter", {"name": "tmp_ready"}),
            (p, 0.05, "barrier_exit", {"name": "tmp_ready"}),
            (p, 0.05, "tmp_ready", {}),
            (p, 0.06, "write_started", {"bytes": 4 * MB}),
        ]
    script += [
        (0, 0.10, "write_done", {"bytes": 4 * MB}),
        (0, 0.10, "barrier_enter", {"name": "write_complete"}),
        (1, 0.12, "write_done", {"bytes": 4 * MB}),
        (1, 0.12, "barrier_enter", {"name": "write_complete"}),
    ]
    for p, t in ((0, 3.10), (1, 3.50)):
        fields: dict[str, Any] = {
            "error": f"process 2 died (no heartbeat for 3.{p} s) during barrier:write_complete",
            "phase": "barrier:write_complete",
            "cause": "peer_dead",
            "culprit": 2,
        }
        if not culprit_only:
            fields.update(dead=[2], unreachable=[])
        script.append((p, t, "failed", fields))
    return sorted(script, key=lambda e: e[1])


def many_save(n: int = 1024, straggler: int = 17) -> list[tuple[int, float, str, dict[str, Any]]]:
    """A save of ``n`` processes in which ``straggler`` reaches tmp_ready 2 s late."""
    script: list[tuple[int, float, str, dict[str, Any]]] = []
    for p in range(n):
        late = 2.0 if p == straggler else 0.0
        spread = (p % 97) / 1000  # arrivals spread over about 0.1 s
        script += [
            (p, 0.00, "requested", {"process_count": n, "primary": 0}),
            (p, 0.02 + spread, "snapshot_done", {"bytes": 1 * MB}),
            (p, 0.03 + spread + late, "barrier_enter", {"name": "tmp_ready"}),
            (p, 2.13, "barrier_exit", {"name": "tmp_ready"}),
            (p, 2.13, "tmp_ready", {}),
            (p, 2.14, "write_started", {"bytes": 1 * MB}),
            (p, 2.20 + spread, "write_done", {"bytes": 1 * MB}),
            (p, 2.20 + spread, "barrier_enter", {"name": "write_complete"}),
            (p, 2.31, "barrier_exit", {"name": "write_complete"}),
            (p, 2.40, "barrier_enter", {"name": "commit_complete"}),
            (p, 2.42, "barrier_exit", {"name": "commit_complete"}),
            (p, 2.42, "committed", {}),
        ]
    script += [(0, 2.31, "finalize_started", {}), (0, 2.39, "finalized", {})]
    return sorted(script, key=lambda e: e[1])


RESTORE: list[tuple[int, float, str, dict[str, Any]]] = [
    (0, 0.00, "requested", {"process_count": 2}),
    (1, 0.01, "requested", {"process_count": 2}),
    (0, 0.02, "read_started", {}),
    (1, 0.02, "read_started", {}),
    (0, 0.03, "read_progress", {"bytes": 0, "total": 8 * MB}),
    (1, 0.03, "read_progress", {"bytes": 0, "total": 8 * MB}),
    (0, 0.10, "read_progress", {"bytes": 2 * MB, "total": 8 * MB}),
    (1, 0.12, "read_progress", {"bytes": 4 * MB, "total": 8 * MB}),
    (0, 0.20, "read_done", {"bytes": 8 * MB, "verified": True}),
    (1, 0.22, "read_done", {"bytes": 8 * MB, "verified": True}),
    (0, 0.20, "restored", {}),
    (1, 0.22, "restored", {}),
]

BARRIER: list[tuple[int, float, str, dict[str, Any]]] = [
    (0, 0.00, "requested", {"process_count": 2, "name": "after-save"}),
    (0, 0.00, "barrier_enter", {"name": "after-save"}),
    (1, 0.04, "requested", {"process_count": 2, "name": "after-save"}),
    (1, 0.04, "barrier_enter", {"name": "after-save"}),
    (0, 0.05, "barrier_exit", {"name": "after-save"}),
    (1, 0.05, "barrier_exit", {"name": "after-save"}),
    (0, 0.05, "committed", {}),
    (1, 0.05, "committed", {}),
]


def write_script(
    root: Path,
    op: str,
    script: list[tuple[int, float, str, dict[str, Any]]],
    upto: float | None = None,
    step: int = 7,
    kind: str = "save",
    after: float | None = None,
) -> None:
    """Write ``script``'s events (those after ``after`` and at or before ``upto``)."""
    writers: dict[int, JournalWriter] = {}
    for process, t, event, fields in script:
        if (upto is not None and t > upto) or (after is not None and t <= after):
            continue
        w = writers.setdefault(process, JournalWriter(root, op, process, kind, step))
        w.emit(event, t=T0 + t, **fields)
    for w in writers.values():
        w.close()
