"""Tasks the Orbax-reading tests run inside real JAX processes (one call per process).

Orbax (orbax-checkpoint, as installed) writes the checkpoints from four processes;
nbckpt reads them back, in two or four.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from nbckpt.engine import AsyncCheckpointer
from nbckpt.journal import read_operation
from nbckpt.protocol import Event

#: The array leaves Orbax saves, and the partition of each on the save's 4x2 mesh.
SPECS: dict[str, P] = {
    "w": P("data", "model"),  # a 2-D sharded leaf
    "b": P(),  # replicated on every device
    "z": P(None, None),  # written unsharded, spelled out
}


def full_values(step: int) -> dict[str, np.ndarray]:
    """The global value of every leaf at ``step`` (the same on every process)."""
    rng = np.random.default_rng(100 + step)
    return {
        "w": rng.standard_normal((64, 32)).astype(np.float32),
        "b": rng.standard_normal((48,)).astype(np.float32),
        "z": rng.integers(0, 1000, (16, 8)).astype(np.int32),
        "host": np.arange(10, dtype=np.int64) * step,
    }


def _save_mesh() -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(len(jax.devices()) // 2, 2), ("data", "model"))


def make_state(step: int) -> dict[str, Any]:
    """The tree Orbax saves: sharded, replicated and unsharded jax arrays, a NumPy
    array and a Python scalar."""
    full = full_values(step)
    mesh = _save_mesh()
    arrays = {
        k: jax.make_array_from_callback(
            full[k].shape, NamedSharding(mesh, spec), lambda idx, k=k: full[k][idx]
        )
        for k, spec in SPECS.items()
    }
    return {
        "params": {"w": arrays["w"], "b": arrays["b"]},
        "stats": {"z": arrays["z"], "host": full["host"]},
        "lr": 0.25,
    }


def orbax_save(root: str, how: str, step: int) -> str:
    """Save ``make_state(step)`` with Orbax, the way ``how`` names; return the step dir."""
    import orbax.checkpoint as ocp

    state = make_state(step)
    path = Path(root) / str(step)
    if how == "standard":  # StandardCheckpointer: OCDBT + zarr v2 (Orbax's default)
        ck = ocp.StandardCheckpointer()
        ck.save(path, state)
        ck.wait_until_finished()
    elif how == "no_ocdbt":  # one zarr v2 array directory per leaf
        ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)).save(path, state)
    elif how == "zarr3":
        ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_zarr3=True)).save(path, state)
    elif how == "manager":  # a CheckpointManager step with its single item "default"
        with ocp.CheckpointManager(root) as mgr:
            mgr.save(step, args=ocp.args.StandardSave(state))
            mgr.wait_until_finished()
    elif how == "manager_items":  # two pytree items and a JSON item
        other = {"params": {"w": state["params"]["w"]}, "extra": np.arange(5, dtype=np.int8)}
        with ocp.CheckpointManager(root, item_names=("state", "other", "meta")) as mgr:
            mgr.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state),
                    other=ocp.args.StandardSave(other),
                    meta=ocp.args.JsonSave({"note": "hello"}),
                ),
            )
            mgr.wait_until_finished()
    else:
        raise ValueError(how)
    return str(path)


def _restore_mesh() -> Mesh:
    return Mesh(np.array(jax.devices()), ("x",))


def target_for(kind: str) -> Any:
    """A restore target: ``"sharded"`` shards ``w`` and ``z`` over this job's devices
    (``z`` across its columns, which Orbax's chunks do not split), keeps ``b``
    replicated; ``"host"`` asks for host values everywhere."""
    full = full_values(0)
    mesh = _restore_mesh()
    if kind == "host":
        return {"params": {"w": ..., "b": ...}, "stats": {"z": ..., "host": ...}, "lr": ...}

    def sds(name: str, spec: P) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(
            full[name].shape, full[name].dtype, sharding=NamedSharding(mesh, spec)
        )

    return {
        "params": {"w": sds("w", P("x", None)), "b": sds("b", P())},
        "stats": {"z": sds("z", P(None, "x")), "host": ...},
        "lr": ...,
    }


def _boxes_bytes(arr_shape: tuple[int, ...], itemsize: int, sharding: Any) -> int:
    """The bytes this process needs of a leaf: the distinct boxes of its devices."""
    boxes = set()
    for index in sharding.addressable_devices_indices_map(arr_shape).values():
        boxes.add(tuple(sl.indices(d)[:2] for sl, d in zip(index, arr_shape, strict=True)))
    return sum(math.prod(b - a for a, b in box) * itemsize for box in boxes)


def _same(a: Any, b: np.ndarray) -> bool:
    a = np.asarray(a)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def check_state(state: Any, step: int) -> list[str]:
    """Mismatches between a restored tree and ``make_state(step)``; [] when bit-identical."""
    full = full_values(step)
    problems = []
    leaves = {"w": state["params"]["w"], "b": state["params"]["b"], "z": state["stats"]["z"]}
    for name, arr in leaves.items():
        if isinstance(arr, jax.Array):
            for shard in arr.addressable_shards:
                if not _same(shard.data, full[name][shard.index]):
                    problems.append(f"{name}: shard {shard.index} differs")
        elif not _same(arr, full[name]):
            problems.append(f"{name}: differs")
    if not isinstance(state["stats"]["host"], np.ndarray) or not _same(
        state["stats"]["host"], full["host"]
    ):
        problems.append(f"host differs: {state['stats']['host']!r}")
    if state["lr"] != 0.25 or type(state["lr"]) is not float:
        problems.append(f"lr differs: {state['lr']!r}")
    return problems


def nb_restore(
    root: str, step: int | None, expect_step: int, kind: str | None, item: str | None = None
) -> dict[str, Any]:
    """Restore with nbckpt; return mismatches, what the journal says was read, and
    what this process needed (the bytes of the boxes its devices hold)."""
    ckptr = AsyncCheckpointer(root)
    target = None if kind is None else target_for(kind)
    state = ckptr.restore(step, target, item=item)
    problems = check_state(state, expect_step)
    full = full_values(expect_step)
    needed = 0
    specs = {}
    for name, arr in (
        ("w", state["params"]["w"]),
        ("b", state["params"]["b"]),
        ("z", state["stats"]["z"]),
    ):
        if isinstance(arr, jax.Array):
            needed += _boxes_bytes(full[name].shape, full[name].itemsize, arr.sharding)
            spec = getattr(arr.sharding, "spec", None)
            specs[name] = None if spec is None else [str(p) for p in spec]
        else:
            needed += full[name].nbytes
    needed += full["host"].nbytes + 8  # host array, and lr: a 0-d float64
    assert ckptr.last_op is not None
    rec = read_operation(root, ckptr.last_op)
    done = [
        e for e in rec.processes[jax.process_index()].events if e.get("event") == Event.READ_DONE
    ]
    return {
        "problems": problems,
        "read": done[-1]["bytes"] if done else None,
        "verified": done[-1].get("verified") if done else None,
        "needed": needed,
        "whole": sum(v.nbytes for v in full.values()) + 8,
        "specs": specs,
        "types": {
            "w": type(state["params"]["w"]).__name__,
            "host": type(state["stats"]["host"]).__name__,
        },
    }


def nb_restore_error(
    root: str, step: int, target: dict[str, Any] | None, item: str | None = None
) -> str:
    """Restore into a target given as ``{"kind": ..., "change": ...}``; return the error."""
    full = full_values(0)
    mesh = _restore_mesh()
    tgt: Any = None
    if target is not None:
        shape, dtype = full["w"].shape, full["w"].dtype
        if target["change"] == "shape":
            shape = (32, 32)
        elif target["change"] == "dtype":
            dtype = np.dtype(np.float16)
        name = "w" if target["change"] != "missing" else "nope"
        sds = jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P()))
        tgt = {"params": {name: sds}}
    try:
        AsyncCheckpointer(root).restore(step, tgt, item=item)
    except (KeyError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def nb_restore_other(root: str, step: int) -> list[str]:
    """Restore item ``other`` of a ``manager_items`` step; return mismatches."""
    out = AsyncCheckpointer(root).restore(step, item="other")
    full = full_values(step)
    problems = []
    w = out["params"]["w"]
    if not isinstance(w, jax.Array) or not _same(np.asarray(w), full["w"]):
        problems.append("other/params.w differs")
    if not _same(out["extra"], np.arange(5, dtype=np.int8)):
        problems.append(f"other/extra differs: {out['extra']!r}")
    return problems
