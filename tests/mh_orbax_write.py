"""Functions the Orbax-interoperability tests run inside real JAX processes.

The state has one leaf of each kind Orbax restores differently: a leaf sharded on both
mesh axes, one replicated on every device, one with ``P(None, None)``, a NumPy array
and Python numbers. Values depend on nothing but their names, so any process group
(4 processes x 2 devices saving, 2 x 1 restoring) can check what it reads bit for bit.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from nbckpt.engine import AsyncCheckpointer

SCALARS: dict[str, Any] = {"lr": 0.001, "step": 7, "flag": True}


def _mesh() -> Mesh:
    devices = np.array(jax.devices())
    shape = (len(devices) // 2, 2) if len(devices) >= 2 else (1, 1)
    return Mesh(devices.reshape(shape), ("data", "model"))


def full_values() -> dict[str, np.ndarray]:
    """The global value of every array leaf (the same on every process)."""
    rng = np.random.default_rng(42)
    return {
        "w": rng.standard_normal((64, 32)).astype(np.float32),
        "b": rng.standard_normal((32,)).astype(np.float32),
        "z": rng.integers(-1000, 1000, (8, 6)).astype(np.int32),
        "host": np.arange(10, dtype=np.int64) * 3,
    }


def _specs() -> dict[str, P]:
    return {"w": P("data", "model"), "b": P(), "z": P(None, None)}


def make_state() -> dict[str, Any]:
    full = full_values()
    mesh = _mesh()
    arrays = {
        k: jax.make_array_from_callback(
            full[k].shape, NamedSharding(mesh, spec), lambda idx, k=k: full[k][idx]
        )
        for k, spec in _specs().items()
    }
    return {
        "params": {"w": arrays["w"], "b": arrays["b"]},
        "z": arrays["z"],
        "host": full["host"],
        **SCALARS,
    }


def save(
    root: str,
    step: int,
    *,
    mode: str = "rename",
    format: str | None = None,
    pack_bytes: int | None = None,
) -> str | None:
    """Save the state as ``step`` and wait for the commit; return the operation id."""
    ckptr = AsyncCheckpointer(root, mode=mode)  # type: ignore[arg-type]
    ckptr.save(step, make_state(), format=format, pack_bytes=pack_bytes)
    ckptr.wait_until_finished()
    return ckptr.last_op


def _target(replicated: bool = False) -> dict[str, Any]:
    mesh = _mesh()
    full = full_values()
    specs = {k: P() for k in _specs()} if replicated else _specs()
    sds = {
        k: jax.ShapeDtypeStruct(full[k].shape, full[k].dtype, sharding=NamedSharding(mesh, spec))
        for k, spec in specs.items()
    }
    return {
        "params": {"w": sds["w"], "b": sds["b"]},
        "z": sds["z"],
        "host": np.zeros_like(full["host"]),
        "lr": 0.0,
        "step": 0,
        "flag": False,
    }


def _same(a: Any, b: np.ndarray) -> bool:
    a = np.asarray(a)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def check(state: dict[str, Any]) -> list[str]:
    """Return every difference between a restored state and the saved values."""
    full = full_values()
    problems = []
    arrays = {"w": state["params"]["w"], "b": state["params"]["b"], "z": state["z"]}
    for name, arr in arrays.items():
        if not isinstance(arr, jax.Array):
            problems.append(f"{name}: {type(arr).__name__}, not a jax.Array")
            continue
        for shard in arr.addressable_shards:
            if not _same(shard.data, full[name][shard.index]):
                problems.append(f"{name}: shard {shard.index} differs")
    if not _same(state["host"], full["host"]):
        problems.append("host differs")
    for name, value in SCALARS.items():
        got = state[name]
        if got != value or type(got) is not type(value):
            problems.append(f"{name}: {got!r} ({type(got).__name__}), saved {value!r}")
    return problems


def orbax_restore_check(path: str) -> list[str]:
    """Restore a step with Orbax's StandardCheckpointer into this group's mesh."""
    import orbax.checkpoint as ocp

    return check(ocp.StandardCheckpointer().restore(path, _target()))


def orbax_restore_error(path: str) -> str:
    """Restore with Orbax, every leaf replicated (each process reads every chunk).

    Returns the error's type and text, or ``""`` if the restore succeeded (and then
    ``"zeros"`` appended if the values read back differ from those saved).
    """
    import orbax.checkpoint as ocp

    try:
        state = ocp.StandardCheckpointer().restore(path, _target(replicated=True))
    except Exception as e:
        chain: list[BaseException] = [e]
        while (cause := chain[-1].__cause__ or chain[-1].__context__) is not None:
            chain.append(cause)
        return " <- ".join(f"{type(c).__name__}: {c}" for c in chain)
    return "" if not check(state) else "restored other values (zeros?)"


def orbax_manager(root: str) -> dict[str, Any]:
    """What Orbax's CheckpointManager (read-only) makes of an nbckpt root."""
    import orbax.checkpoint as ocp

    mngr = ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(read_only=True))
    out: dict[str, Any] = {"all_steps": list(mngr.all_steps()), "latest": mngr.latest_step()}
    errors = {}
    attempts = {
        "bare": lambda: mngr.restore(out["latest"]),
        "standard": lambda: mngr.restore(out["latest"], args=ocp.args.StandardRestore(_target())),
        "default": lambda: mngr.restore(
            out["latest"], args=ocp.args.Composite(default=ocp.args.StandardRestore(_target()))
        ),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
            errors[name] = None
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {e}"
    out["errors"] = errors
    # What works: restore the step directory the manager lists, as a pytree.
    step_path = mngr.directory / str(out["latest"])
    out["via_directory"] = check(ocp.StandardCheckpointer().restore(step_path, _target()))
    mngr.close()
    return out


def nbckpt_restore_check(root: str, step: int) -> list[str]:
    """Restore a step with nbckpt (which checks every chunk's checksum)."""
    ckptr = AsyncCheckpointer(root)
    target = _target()
    state = ckptr.restore(step, target={**target, "lr": ..., "step": ..., "flag": ...})
    return check(state)


def nbckpt_restore_error(root: str, step: int) -> str:
    """Restore with nbckpt; return the error's type and text, or ``""``."""
    try:
        problems = nbckpt_restore_check(root, step)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "" if not problems else f"restored other values: {problems}"


def save_error(root: str, step: int, *, format: str | None = None) -> str | None:
    """Save; return the error's type and text, or None if it committed."""
    from nbckpt.errors import NbckptError

    try:
        save(root, step, format=format)
    except NbckptError as e:
        return f"{type(e).__name__}: {e}"
    return None
