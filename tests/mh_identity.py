"""Process-side tasks of ``tests/test_identity.py``: what a save gives back, exactly."""

from __future__ import annotations

import threading
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from nbckpt.engine import AsyncCheckpointer, hooks


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()), ("x",))


def save_then_donate(root: str, step: int) -> list[float]:
    """Save a sharded state, donate it to a jitted step at once; return the step's sums."""
    sharding = NamedSharding(_mesh(), P("x"))
    n = 8 * jax.device_count()
    w = jax.make_array_from_callback(
        (n, 4), sharding, lambda idx: np.arange(n * 4, dtype=np.float32).reshape(n, 4)[idx]
    )
    state = {"w": w, "b": jax.device_put(np.ones(4, np.float32), NamedSharding(_mesh(), P()))}
    train = jax.jit(lambda s: jax.tree.map(lambda a: a * 3.0 + 1.0, s), donate_argnums=0)
    donated = threading.Event()
    # The background save waits until the donating step ran, as a slow disk would.
    hooks.set_hook("prepare", lambda _: donated.wait(30))
    try:
        ckptr = AsyncCheckpointer(root)
        ckptr.save(step, state)
        state = train(state)  # donates the saved arrays (on CPU the save holds their buffers)
        state = train(state)
        donated.set()
        ckptr.wait_until_finished()
    finally:
        hooks.clear_hooks()
    out = ckptr.restore(step, target={"w": sharding, "b": ...})
    ok = all(
        np.array_equal(
            np.asarray(s.data), np.arange(n * 4, dtype=np.float32).reshape(n, 4)[s.index]
        )
        for s in out["w"].addressable_shards
    )
    return [float(ok), float(np.asarray(out["b"]).sum())]


def resharded_restore(root: str) -> dict[str, Any]:
    """Save on one layout, restore onto another and onto an indivisible one."""
    mesh = _mesh()
    full = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    rows = NamedSharding(mesh, P("x", None))
    cols = NamedSharding(mesh, P(None, "x"))
    w = jax.make_array_from_callback(full.shape, rows, lambda idx: full[idx])
    odd = jax.device_put(np.arange(5, dtype=np.int32), NamedSharding(mesh, P()))
    ckptr = AsyncCheckpointer(root)
    ckptr.save(1, {"w": w, "odd": odd})
    ckptr.wait_until_finished()
    want = jax.ShapeDtypeStruct(full.shape, np.float32, sharding=cols)
    out = ckptr.restore(1, target={"w": want, "odd": ...})
    result: dict[str, Any] = {
        "is_array": isinstance(out["w"], jax.Array),
        "same_sharding": out["w"].sharding == cols,
        "values": all(
            np.array_equal(np.asarray(s.data), full[s.index]) for s in out["w"].addressable_shards
        ),
    }
    split = jax.ShapeDtypeStruct((5,), np.int32, sharding=NamedSharding(mesh, P("x")))
    try:
        ckptr.restore(1, target={"w": want, "odd": split})
        result["indivisible"] = None
    except ValueError as e:
        result["indivisible"] = str(e)
    return result
