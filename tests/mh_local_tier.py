"""Process-side tasks of the local tier's tests (one call per process)."""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from nbckpt.engine import AsyncCheckpointer, faults
from nbckpt.errors import CheckpointError
from nbckpt.journal import read_operation


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()), ("x",))


#: Rows of the sharded matrix: any process count up to 4 splits them evenly.
ROWS = 256


def state(step: int) -> dict[str, Any]:
    """A state whose values depend on ``step``: a sharded matrix, a replicated vector."""
    mesh = _mesh()
    w = np.arange(ROWS * 8, dtype=np.float32).reshape(ROWS, 8) + step
    b = np.full((5,), step, dtype=np.int32)
    return {
        "w": jax.device_put(w, NamedSharding(mesh, PartitionSpec("x"))),
        "b": jax.device_put(b, NamedSharding(mesh, PartitionSpec())),
        "step": step,
    }


def target() -> dict[str, Any]:
    """Where :func:`state` goes back: the same shardings, over this job's devices."""
    rows = NamedSharding(_mesh(), PartitionSpec("x"))
    whole = NamedSharding(_mesh(), PartitionSpec())
    return {
        "w": jax.ShapeDtypeStruct((ROWS, 8), jnp.float32, sharding=rows),
        "b": jax.ShapeDtypeStruct((5,), jnp.int32, sharding=whole),
        "step": 0,
    }


def save(
    root: str,
    dirs: list[str],
    steps: list[int],
    fault: tuple[int, str, int] | None = None,
    env: dict[str, str] | None = None,
    **tiers: Any,
) -> dict[str, Any]:
    """Save ``steps`` with this process's local directory ``dirs[i]``.

    ``fault``: (process, phase, step): that process is killed when the save of that
    step reaches that phase. Returns the ops, and the error a failed save raised.
    ``env`` points the store at a test server.
    """
    os.environ.update(env or {})
    me = jax.process_index()
    ops: list[str | None] = []
    with AsyncCheckpointer(root, local_dir=dirs[me], timeout_s=30, **tiers) as ckptr:
        for step in steps:
            if fault is not None and fault[0] == me and fault[2] == step:
                faults.kill(at=fault[1])
            ckptr.save(step, state(step))
            try:
                ckptr.wait_until_finished()
            except CheckpointError as e:
                return {"ops": ops, "error": str(e)}
            ops.append(ckptr.last_op)
    return {"ops": ops, "error": None}


def restore(
    root: str,
    dirs: list[str],
    step: int | None = None,
    env: dict[str, str] | None = None,
    **tiers: Any,
) -> dict[str, Any]:
    """Restore (the newest step, or ``step``) and say which, from where, and if it is right."""
    os.environ.update(env or {})
    me = jax.process_index()
    with AsyncCheckpointer(root, local_dir=dirs[me], timeout_s=60, **tiers) as ckptr:
        got = ckptr.restore(step, target())
        op = ckptr.last_op
    chosen = int(got["step"])
    want = state(chosen)
    same = all(
        np.array_equal(np.asarray(s.data), np.asarray(w.data))
        for key in ("w", "b")
        for s, w in zip(got[key].addressable_shards, want[key].addressable_shards, strict=True)
    )
    assert op is not None
    record = read_operation(root, op)
    events = [e for e in record.processes[me].events if e["event"] in ("tier_chosen", "fetched")]
    return {"step": chosen, "same": same, "events": events, "op": op}
