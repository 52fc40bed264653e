"""Process-side loops of the training-checkpointer tests (one call per process)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from nbckpt.engine import SavePolicy, TrainingCheckpointer
from tests.mh_preempt import _train_step, initial_state


def loop(
    root: str,
    steps: int,
    *,
    every_steps: int | None = None,
    every_seconds: float | None = None,
    pauses: tuple[float, ...] = (0.0,),
    progress: str | None = None,
    max_to_keep: int | None = None,
    local: list[str] | None = None,
    persistent_every: int = 1,
) -> dict[str, Any]:
    """Train ``steps`` steps from where the root left off; report what was saved.

    Each process pauses ``pauses[process % len(pauses)]`` per step, so that processes
    run at different speeds between their all-reduces. ``local``: each process's
    local directory (a local tier), with ``persistent_every``.
    """
    me = jax.process_index()
    pause = pauses[me % len(pauses)]
    policy = SavePolicy(every_steps=every_steps, every_seconds=every_seconds)
    saved = []
    tiers: dict[str, Any] = {}
    if local is not None:
        tiers = {"local_dir": local[me], "persistent_every": persistent_every}
    with TrainingCheckpointer(
        root, save=policy, max_to_keep=max_to_keep, timeout_s=60, preemption_grace_s=60, **tiers
    ) as tc:
        state = tc.restore_or(initial_state)
        start = tc.next_step
        for step in range(start, start + steps):
            w, loss = _train_step(state["w"])
            float(loss)  # the all-reduce: processes keep in step
            state = {"w": w, "step": np.int64(step)}
            if progress is not None:
                (Path(progress) / str(me)).write_text(str(step))
            if tc.save(step, state, metrics={"loss": float(loss)}):
                saved.append(step)
            if tc.stopping:
                break
            time.sleep(pause)
        return {"start": start, "saved": saved, "stopped": tc.stopping, "last": step}
