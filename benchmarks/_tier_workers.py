"""Functions that ``benchmarks/tiers.py`` runs in the workers (one call per process).

Each runs on every process of a :class:`nbckpt.procgroup.ProcessGroup` at once, on the
state :func:`_workers.build` made. ``local`` is a local directory pattern with
``{process}`` (each process its own host) or None (no local tier); ``env`` points an
``s3://`` root at the benchmark's server.
"""

from __future__ import annotations

import os
import time
from typing import Any

import _workers


def _checkpointer(root: str, local: str | None, persistent_every: int, env: dict[str, str]) -> Any:
    import jax

    from nbckpt.engine import AsyncCheckpointer

    os.environ.update(env)
    local_dir = None if local is None else local.format(process=jax.process_index())
    return AsyncCheckpointer(root, local_dir=local_dir, persistent_every=persistent_every)


def save(
    root: str,
    local: str | None,
    step: int,
    persistent_every: int = 1,
    env: dict[str, str] | None = None,
) -> dict[str, float]:
    """Save the state as ``step``: seconds until ``save`` returned, and until durable."""
    ckptr = _checkpointer(root, local, persistent_every, env or {})
    try:
        t0 = time.perf_counter()
        ckptr.save(step, _workers._state["tree"])
        blocked = time.perf_counter() - t0
        ckptr.wait_until_finished()
        return {"blocked": blocked, "durable": time.perf_counter() - t0}
    finally:
        ckptr.close()


def restore(root: str, local: str | None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Restore the newest step into the same shardings (checked); seconds, and from where."""
    import jax

    from nbckpt.journal import read_operation

    ckptr = _checkpointer(root, local, 1, env or {})  # made before the clock starts
    try:
        t0 = time.perf_counter()
        out = ckptr.restore(None, target=_workers._abstract())
        jax.block_until_ready(out)
        elapsed = time.perf_counter() - t0
    finally:
        ckptr.close()
    _workers._check(out)
    assert ckptr.last_op is not None
    events = read_operation(root, ckptr.last_op).processes[jax.process_index()].events
    fetched = sum(int(e.get("bytes", 0)) for e in events if e["event"] == "fetched")
    tier = next((e["tier"] for e in events if e["event"] == "tier_chosen"), "persistent")
    return {"seconds": elapsed, "tier": tier, "fetched": fetched}


def read_step(directory: str) -> float:
    """Probe: restore_step of one step directory, seconds (no agreement)."""
    import jax

    from nbckpt.engine.restore.step import restore_step
    from nbckpt.storage import location

    t0 = time.perf_counter()
    out = restore_step(location(directory), _workers._abstract())
    jax.block_until_ready(out)
    return time.perf_counter() - t0
