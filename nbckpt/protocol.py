"""Names of the save protocol, shared by the engine and the notebook side (no jax)."""

from __future__ import annotations

__all__ = ["PHASES"]

#: The phases of a save, in order; fault hooks fire as each one starts.
PHASES = (
    "snapshot",
    "prepare",
    "barrier:tmp_ready",
    "write",
    "barrier:write_complete",
    "finalize",
    "barrier:commit_complete",
)
