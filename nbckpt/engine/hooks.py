"""Hooks at the engine's own phase boundaries, for tests and fault injection.

The checkpointer calls :func:`fire` with the name of each phase just before it starts
(:data:`nbckpt.protocol.PHASES`, from the snapshot to the commit barrier, and the
local tier's :data:`~nbckpt.protocol.TIER_PHASES`). A hook
may sleep (to stall a process), raise (to fail it) or exit the process. No hook is set
unless a test or the user sets one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from nbckpt.protocol import PHASES, TIER_PHASES

__all__ = ["PHASES", "clear_hooks", "fire", "io_slowdown", "set_hook", "set_io_slowdown"]


_hooks: dict[str, Callable[[str], None]] = {}
_lock = threading.Lock()
_io_slowdown = 1.0


def set_hook(phase: str, fn: Callable[[str], None]) -> None:
    """Run ``fn(phase)`` in this process each time ``phase`` is about to start."""
    if phase not in PHASES and phase not in TIER_PHASES:
        known = ", ".join((*PHASES, *TIER_PHASES))
        raise ValueError(f"unknown phase {phase!r}; phases are {known}")
    with _lock:
        _hooks[phase] = fn


def clear_hooks() -> None:
    """Remove every hook of this process, and any I/O slowdown."""
    global _io_slowdown
    with _lock:
        _hooks.clear()
        _io_slowdown = 1.0


def set_io_slowdown(factor: float) -> None:
    """Make the writer take ``factor`` times as long per chunk (1: full speed)."""
    global _io_slowdown
    _io_slowdown = max(1.0, float(factor))


def io_slowdown() -> float:
    """The writer's current slowdown factor."""
    return _io_slowdown


def fire(phase: str) -> None:
    """Run the hook set for ``phase``, if any."""
    with _lock:
        fn = _hooks.get(phase)
    if fn is not None:
        fn(phase)
