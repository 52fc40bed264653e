"""Process-side functions of tests/test_restore_var.py (one call per real JAX process)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from nbckpt.engine.remote import agent


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
