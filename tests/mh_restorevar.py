"""Process-side functions of tests/test_restore_var.py (one call per real JAX process)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from nbckpt.engine.remote import agent
from nbckpt.engine.sync.barriers import next_sequence


def _sharding() -> NamedSharding:
    return NamedSharding(Mesh(np.array(jax.devices()), ("x",)), P("x"))


def save_then_restore_into(root: str, existing: str) -> dict[str, Any]:
    """Save ``{"w": float32[8], "n": int32[4]}``; restore into a variable holding ``existing``."""
    w = jax.device_put(np.arange(8, dtype=np.float32), _sharding())
    ns: dict[str, Any] = {"state": {"w": w, "n": np.arange(4, dtype=np.int32)}}
    agent.save_var(ns, "state", 1, root, key=f"rv-save-{existing}")
    agent._checkpointer(root).wait_until_finished()
    if existing == "structs":
        ns["var"] = {
            "w": jax.ShapeDtypeStruct((8,), np.float32, sharding=_sharding()),
            "n": np.zeros(4, np.int32),
        }
    elif existing == "other_dtype":
        ns["var"] = {
            "w": jax.device_put(np.zeros(8, np.int32), _sharding()),
            "n": np.zeros(4, np.int32),
        }
    elif existing == "host_other_dtype":
        ns["var"] = {"w": jax.device_put(np.zeros(8, np.float32), _sharding()), "n": np.zeros(4)}
    before = ns.get("var")
    try:
        agent.restore_var(ns, "var", root, 1, key=f"rv-restore-{existing}")
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "unchanged": ns.get("var") is before}
    w_out = ns["var"]["w"]
    return {
        "error": None,
        "w_type": type(w_out).__name__,
        "w_sharding": str(getattr(w_out, "sharding", None)),
        "w": np.asarray(w_out).tolist(),
        "n_dtype": str(np.asarray(ns["var"]["n"]).dtype),
    }


def out_of_step(root: str) -> dict[str, Any]:
    """A keyed restore and rollback while process 0 made one collective call more.

    As after a call that reached process 0 alone (``%px --targets 0``, say): calls
    matched by their order would pair process 0's call with the others' next one and
    wait out the deadline. The notebook's calls carry a key, and are matched by it.
    """
    w = jax.device_put(np.arange(8, dtype=np.float32), _sharding())
    ns: dict[str, Any] = {"state": {"w": w}}
    for step in (1, 2):
        agent.save_var(ns, "state", step, root, key=f"oos-save{step}")
    agent._checkpointer(root).wait_until_finished()
    ns["out"] = {"w": jax.ShapeDtypeStruct((8,), np.float32, sharding=_sharding())}
    me = jax.process_index()
    if me == 0:
        next_sequence()
    try:
        agent.restore_var(ns, "out", root, 1, key="oos-restore", timeout_s=20)
        removed = agent.rollback(root, 1, key="oos-rollback", timeout_s=20)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        if me != 0:
            next_sequence()  # in step again, for the session's later calls
    shard = ns["out"]["w"].addressable_shards[0]
    return {
        "error": None,
        "index": shard.index[0].start,
        "w": np.asarray(shard.data).tolist(),
        "removed": removed,
    }
