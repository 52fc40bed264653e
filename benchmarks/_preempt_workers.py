"""What ``benchmarks/preemption.py`` runs in each of its JAX processes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import _workers


def build(nbytes: int) -> dict[str, int]:
    """Build an ``fsdp`` state of about ``nbytes`` random bytes (kept in this process)."""
    return _workers.build(nbytes, layout="fsdp")


def check_cost(root: str, calls: int) -> float:
    """Nanoseconds per ``reached_preemption`` call before any notice."""
    from nbckpt.engine import AsyncCheckpointer

    with AsyncCheckpointer(root) as ckptr:
        ckptr.reached_preemption(0)  # the first call installs the handler
        t0 = time.perf_counter_ns()
        for step in range(1, calls + 1):
            ckptr.reached_preemption(step)
        return (time.perf_counter_ns() - t0) / calls


def train(root: str, progress: str, grace_s: float) -> dict[str, Any]:
    """Train until the agreed step; save it; say when it was agreed and committed."""
    import jax
    import jax.numpy as jnp

    from nbckpt.engine import AsyncCheckpointer

    tree = _workers._state["tree"]
    update = jax.jit(lambda t: jax.tree.map(lambda a: a * 0.5 + 1.0, t), donate_argnums=0)
    loss = jax.jit(lambda t: sum(jnp.sum(a) for a in jax.tree.leaves(t)))
    mark = Path(progress) / str(jax.process_index())
    # Steps start past the cost measurement's, which this process's watch has passed.
    start = 10**9
    with AsyncCheckpointer(root, preemption_grace_s=grace_s, timeout_s=grace_s) as ckptr:
        for step in range(start, start + 10**6):
            tree = update(tree)
            float(loss(tree))  # the all-reduce keeps the processes in step
            mark.write_text(str(step - start))
            if ckptr.reached_preemption(step):
                t_agreed = time.time()
                ckptr.save(step, tree)
                ckptr.wait_until_finished()
                return {"step": step, "t_agreed": t_agreed, "t_committed": time.time()}
            time.sleep(0.01)
    raise RuntimeError("no preemption came")
