"""Functions the test-host tests run inside JAX processes spread over test hosts.

The state is sharded over a 1-D mesh of every device, with a first axis of 48 so that
jobs of 1, 2, 3, 4 or 6 devices all split it evenly; values depend only on the step.
"""

from __future__ import annotations

import socket
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from nbckpt.engine import AsyncCheckpointer


def _sharding() -> NamedSharding:
    return NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))


def _full(step: int) -> np.ndarray:
    return np.arange(48 * 8, dtype=np.float32).reshape(48, 8) * step


def save(root: str, step: int) -> dict[str, Any]:
    """Save ``{"w": ...}`` of ``step``; return this process's host and op."""
    full = _full(step)
    w = jax.make_array_from_callback(full.shape, _sharding(), lambda idx: full[idx])
    ckptr = AsyncCheckpointer(root)
    ckptr.save(step, {"w": w, "step": step})
    ckptr.wait_until_finished()
    return {"host": socket.gethostname(), "op": ckptr.last_op}


def restore_check(root: str, step: int) -> bool:
    """Restore ``step`` onto this job's mesh; whether every local shard is right."""
    state = AsyncCheckpointer(root).restore(step, target={"w": _sharding(), "step": ...})
    full = _full(step)
    ok = all(
        np.array_equal(np.asarray(s.data), full[s.index]) for s in state["w"].addressable_shards
    )
    return ok and state["step"] == step


def allgather() -> list[int]:
    """A cross-process collective (gloo on CPU): every process's index, gathered."""
    from jax.experimental import multihost_utils

    got = multihost_utils.process_allgather(np.array([jax.process_index()]))
    return [int(x) for x in np.asarray(got).ravel()]
