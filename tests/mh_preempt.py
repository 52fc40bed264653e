"""Process-side training loops of the preemption tests (one call per process)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from nbckpt.engine import AsyncCheckpointer, default_client
from nbckpt.engine.sync import preemption


def initial_state() -> dict[str, Any]:
    """A small sharded state: its update and loss need every process (an all-reduce)."""
    mesh = Mesh(np.array(jax.devices()), ("d",))
    full = np.arange(8 * jax.device_count(), dtype=np.float32)
    w = jax.make_array_from_callback(full.shape, NamedSharding(mesh, P("d")), lambda idx: full[idx])
    return {"w": w, "step": np.int64(0)}


@jax.jit
def _train_step(w: jax.Array) -> tuple[jax.Array, jax.Array]:
    w = w * 0.5 + 1.0
    return w, jnp.sum(w)


def train(
    root: str,
    progress: str,
    *,
    grace_s: float = 30.0,
    max_seconds: float = 120.0,
    save_on_notice: bool = True,
    pause_s: float = 0.02,
) -> dict[str, Any]:
    """Train until preempted; save the agreed step; report what each process saw.

    ``<progress>/<process>`` holds the last step done, for the test to time its notice.
    Without ``save_on_notice`` the loop ignores the notice (a loop that never stops).
    """
    me = jax.process_index()
    state = initial_state()
    ckptr = AsyncCheckpointer(root, preemption_grace_s=grace_s, timeout_s=60)
    mark = Path(progress) / str(me)
    losses = []
    end = time.monotonic() + max_seconds
    step = 0
    while time.monotonic() < end:
        w, loss = _train_step(state["w"])
        state = {"w": w, "step": np.int64(step)}
        losses.append(float(loss))  # waits for the all-reduce: processes keep in step
        mark.write_text(str(step))
        if save_on_notice and ckptr.reached_preemption(step):
            ckptr.save(step, state)
            ckptr.wait_until_finished()
            ckptr.close()
            notice = preemption.watch_for(default_client()).notice
            return {"process": me, "step": step, "losses": losses, "notice": notice}
        if not save_on_notice:
            ckptr.reached_preemption(step)  # installs the handler, then ignores it
        step += 1
        time.sleep(pause_s)
    ckptr.close()
    return {"process": me, "step": None, "losses": losses, "notice": None}


def sigterm_self() -> int:
    """Send this process SIGTERM (what ``%ckpt_fault preempt`` does), return its pid."""
    os.kill(os.getpid(), signal.SIGTERM)
    return os.getpid()
