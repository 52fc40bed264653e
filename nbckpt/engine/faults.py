"""Fault injection for teaching and tests, through the engine's own phase hooks.

Each function acts on the process that calls it; the notebook client sends it to the
process it targets. Nothing here patches jax: a fault fires at one of the phase
boundaries listed in :data:`nbckpt.engine.hooks.PHASES`, or inside the writer.
"""

from __future__ import annotations

import errno
import math
import os
import signal
import time

from nbckpt.engine import hooks
from nbckpt.protocol import FAULT_ACTIONS, FAULTS, Phase, check_timeout

__all__ = [
    "ACTIONS",
    "KINDS",
    "arm",
    "clear",
    "fail_io",
    "kill",
    "list_faults",
    "preempt",
    "slow_io",
    "stall",
]

#: The faults that can be injected.
KINDS = FAULTS
#: What ``%ckpt_fault`` takes: a fault, or ``list`` / ``clear``.
ACTIONS = FAULT_ACTIONS

_active: dict[str, str] = {}


def _die(_phase: str) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill(at: str | None = None) -> str:
    """Kill this process with SIGKILL, now or when phase ``at`` starts."""
    if at is None:
        _die("now")
        return "killed"  # not reached: SIGKILL cannot be caught
    hooks.set_hook(at, _die)
    _active[at] = f"kill at {at}"
    return _active[at]


def stall(at: str, seconds: float) -> str:
    """Sleep ``seconds`` each time phase ``at`` starts (the heartbeat keeps beating)."""
    seconds = check_timeout(seconds, "seconds")
    hooks.set_hook(at, lambda _p: time.sleep(seconds))
    _active[at] = f"stall {seconds:g} s at {at}"
    return _active[at]


def fail_io(at: str = Phase.WRITE) -> str:
    """Raise an ``OSError`` (EIO) when phase ``at`` starts, as a failing disk would."""

    def fail(phase: str) -> None:
        raise OSError(errno.EIO, f"injected I/O error at {phase} (%ckpt_fault fail-io)")

    hooks.set_hook(at, fail)
    _active[at] = f"fail-io at {at}"
    return _active[at]


def slow_io(factor: float) -> str:
    """Make this process's writes ``factor`` times slower (1 restores full speed).

    The writer then writes its chunks one at a time and, after each, sleeps ``factor
    - 1`` times as long as the chunk took (:func:`nbckpt.engine.save.writer.write_shards`);
    the save's ``write_started`` event records ``fault: "slow-io x<factor>"``.
    """
    if not math.isfinite(factor) or factor < 1:
        raise ValueError(f"factor must be a finite number of at least 1, got {factor!r}")
    hooks.set_io_slowdown(factor)
    if factor == 1:
        _active.pop("io", None)
        return "slow-io off"
    _active["io"] = f"slow-io x{factor:g}"
    return _active["io"]


def preempt() -> str:
    """Send this process the preemption notice a spot machine gets: SIGTERM.

    A process whose loop checks ``reached_preemption`` saves the agreed step with the
    others (see :mod:`nbckpt.engine.sync.preemption`); any other process dies of it,
    as it would on a real preemption. The notebook sends it through the engine's
    nanny instead, so that it reaches an engine busy running a training loop.
    """
    os.kill(os.getpid(), signal.SIGTERM)
    return "preempt notice sent (SIGTERM)"


def list_faults() -> list[str]:
    """Describe the faults armed in this process."""
    return sorted(_active.values())


def clear() -> None:
    """Disarm every fault of this process."""
    hooks.clear_hooks()
    _active.clear()


def arm(
    kind: str, *, at: str | None = None, seconds: float | None = None, factor: float | None = None
) -> list[str]:
    """Do one of :data:`ACTIONS` in this process; return the faults armed after it."""
    if kind == "kill":
        kill(at)
    elif kind == "stall":
        stall(at or Phase.WRITE, seconds if seconds is not None else 1.0)
    elif kind == "slow-io":
        slow_io(factor if factor is not None else 1.0)
    elif kind == "fail-io":
        fail_io(at or Phase.WRITE)
    elif kind == "preempt":
        return [preempt()]
    elif kind == "clear":
        clear()
    elif kind != "list":
        raise ValueError(f"unknown fault {kind!r}; one of {', '.join(ACTIONS)}")
    return list_faults()
