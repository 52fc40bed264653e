"""What the view-truth tests run inside real JAX processes (one call per process)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from nbckpt.engine import AsyncCheckpointer, faults


def _state(leaves: int) -> dict[str, Any]:
    """``leaves`` arrays of 2 MiB sharded over every device: a chunk per leaf per device."""
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    rows = 512 * len(jax.devices())
    return {
        f"w{i:02d}": jax.make_array_from_callback(
            (rows, 1024), sharding, lambda idx, i=i: np.full((rows, 1024), i, np.float32)[idx]
        )
        for i in range(leaves)
    }


def slow_save(root: str, step: int, slowed: int, factor: float, leaves: int = 16) -> str:
    """Save with ``%ckpt_fault slow-io x<factor>`` armed on process ``slowed``; return the op."""
    faults.clear()
    if jax.process_index() == slowed:
        faults.slow_io(factor)
    try:
        ckptr = AsyncCheckpointer(root)
        ckptr.save(step, _state(leaves))
        ckptr.wait_until_finished()
    finally:
        faults.clear()
    assert ckptr.last_op is not None
    return ckptr.last_op
