"""Saves the browser test runs inside real JAX processes: one that commits, one killed."""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from nbckpt.engine import AsyncCheckpointer, hooks
from nbckpt.errors import NbckptError


def _state(step: int) -> dict[str, Any]:
    mesh = Mesh(np.array(jax.devices()), ("data",))
    full = np.arange(64 * 16, dtype=np.float32).reshape(64, 16) + step
    sharding = NamedSharding(mesh, P("data"))
    w = jax.make_array_from_callback(full.shape, sharding, lambda idx: full[idx])
    return {"params": {"w": w}, "host": np.arange(8) * step, "step": step}


def save(
    root: str,
    step: int,
    *,
    kill_at: str | None = None,
    victim: int = 1,
    stall_at: str | None = None,
    stall_s: float = 0.0,
) -> str | None:
    """Save ``step`` on every process; return this process's error text, or None.

    With ``kill_at``, process ``victim`` exits abruptly (as if killed) when that phase
    starts, so the save is abandoned halfway and its temporary directory stays. With
    ``stall_at``, every process sleeps ``stall_s`` when that phase starts, so the save
    stays in progress for a while and then commits.
    """
    hooks.clear_hooks()
    if kill_at is not None and jax.process_index() == victim:
        hooks.set_hook(kill_at, lambda _phase: os._exit(1))
    if stall_at is not None:
        hooks.set_hook(stall_at, lambda _phase: time.sleep(stall_s))
    ckptr = AsyncCheckpointer(root, timeout_s=3.0 + stall_s)
    try:
        ckptr.save(step, _state(step))
        ckptr.wait_until_finished()
    except NbckptError as e:
        return str(e)
    finally:
        hooks.clear_hooks()
    return None
