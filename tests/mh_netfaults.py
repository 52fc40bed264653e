"""Functions the network-fault tests run inside JAX processes spread over test hosts.

A save is held at a phase (every process waits there for a file the test creates), so
that the test can cut a host off while every process is at a known point.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import jax

from nbckpt.engine import AsyncCheckpointer, hooks
from nbckpt.engine.sync import health
from nbckpt.engine.sync.barriers import default_client
from nbckpt.errors import NbckptError
from tests import mh_hosts

_checkpointers: dict[str, AsyncCheckpointer] = {}


def _ckptr(root: str) -> AsyncCheckpointer:
    if root not in _checkpointers:
        _checkpointers[root] = AsyncCheckpointer(root)
    return _checkpointers[root]


def ready(timeout_s: float = 30.0) -> bool:
    """Wait until this process has read ahead where its peers run (a beat or two after start).

    A job cut off in its first second would name its processes without their hosts.
    """
    monitor = health.monitor_for(default_client())
    deadline = time.monotonic() + timeout_s
    while not monitor.hosts.ready() and time.monotonic() < deadline:
        time.sleep(0.05)
    return monitor.hosts.ready()


def hold_at(phase: str, folder: str, timeout_s: float = 60.0) -> None:
    """At ``phase``, write ``folder/at_<process>`` and wait for ``folder/go``."""
    hooks.clear_hooks()
    me = jax.process_index()

    def hold(_phase: str) -> None:
        Path(folder, f"at_{me}").write_text(str(time.time()))
        deadline = time.monotonic() + timeout_s
        while not Path(folder, "go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        hooks.clear_hooks()

    hooks.set_hook(phase, hold)


def kill_at(phase: str, process: int, marker: str) -> None:
    """On ``process``, write the time to ``marker`` and SIGKILL itself at ``phase``."""
    import signal

    hooks.clear_hooks()
    if jax.process_index() != process:
        return

    def die(_phase: str) -> None:
        Path(marker).write_text(str(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)

    hooks.set_hook(phase, die)


def save(root: str, step: int) -> dict[str, Any]:
    """Save ``mh_hosts``'s state of ``step`` and wait; never raise.

    Returns the error's text, type and op (None when it committed), and the wall time
    at which the call ended.
    """
    full = mh_hosts._full(step)
    w = jax.make_array_from_callback(full.shape, mh_hosts._sharding(), lambda idx: full[idx])
    ckptr = _ckptr(root)
    try:
        ckptr.save(step, {"w": w, "step": step})
        ckptr.wait_until_finished()
    except NbckptError as e:
        op = getattr(e, "op", ckptr.last_op)
        return {"error": str(e), "type": type(e).__name__, "op": op, "t": time.time()}
    return {"error": None, "type": None, "op": ckptr.last_op, "t": time.time()}


def settle(root: str, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for the save thread to end, and for a process that lost
    the coordination service to have told the others that it left; whether both did.
    """
    deadline = time.monotonic() + timeout_s
    thread = _ckptr(root)._thread
    if thread is not None:
        thread.join(timeout_s)
    monitor = health.monitor_for(default_client())
    while monitor._loss is not None and not monitor._left and time.monotonic() < deadline:
        time.sleep(0.05)
    done = thread is None or not thread.is_alive()
    return done and (monitor._loss is None or monitor._left)


def restore_check(root: str, step: int) -> bool:
    """Restore ``step``; whether every local shard is bit for bit what was saved."""
    return mh_hosts.restore_check(root, step)
