"""Functions the multihost tests run inside real JAX processes (one call per process)."""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from nbckpt.engine import AsyncCheckpointer, Synchronizer, default_client, hooks
from nbckpt.errors import NbckptError

_checkpointers: dict[tuple[str, str], AsyncCheckpointer] = {}


def info() -> dict[str, Any]:
    return {
        "process": jax.process_index(),
        "count": jax.process_count(),
        "devices": jax.device_count(),
        "local": jax.local_device_count(),
        "pid": os.getpid(),
    }


def _mesh() -> Mesh:
    devices = np.array(jax.devices())
    shape = (len(devices) // 2, 2) if len(devices) >= 2 else (1, 1)
    return Mesh(devices.reshape(shape), ("data", "model"))


def full_values(step: int) -> dict[str, np.ndarray]:
    """The global value of every array leaf at ``step`` (the same on every process)."""
    rng = np.random.default_rng(step)
    return {
        "w": rng.standard_normal((64, 32)).astype(np.float32),
        "b": rng.standard_normal((32,)).astype(np.float32),
        "mu": rng.standard_normal((64, 32)).astype(jax.numpy.bfloat16),
        "count": np.arange(16, dtype=np.int32) + step,
        "host": np.arange(10, dtype=np.int64) * step,
    }


def _specs() -> dict[str, P]:
    return {
        "w": P("data", "model"),  # sharded on both axes
        "b": P(),  # replicated on every device
        "mu": P("data", None),  # mixed: sharded on data, replicated on model
        "count": P(("data", "model")),
    }


def shardings() -> dict[str, NamedSharding]:
    mesh = _mesh()
    return {k: NamedSharding(mesh, spec) for k, spec in _specs().items()}


def make_state(step: int) -> dict[str, Any]:
    full = full_values(step)
    sh = shardings()
    arrays = {
        k: jax.make_array_from_callback(full[k].shape, sh[k], lambda idx, k=k: full[k][idx])
        for k in sh
    }
    return {
        "params": {"w": arrays["w"], "b": arrays["b"]},
        "opt": {"mu": arrays["mu"], "count": arrays["count"]},
        "host": full["host"],
        "lr": 0.001,
        "step": step,
        "flag": True,
    }


def target() -> dict[str, Any]:
    sh = shardings()
    full = full_values(0)
    sds = {k: jax.ShapeDtypeStruct(full[k].shape, full[k].dtype, sharding=sh[k]) for k in sh}
    return {
        "params": {"w": sds["w"], "b": sds["b"]},
        "opt": {"mu": sds["mu"], "count": sds["count"]},
        # Any leaf that is not a sharding asks for the saved host value back.
        "host": ...,
        "lr": ...,
        "step": ...,
        "flag": ...,
    }


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def check_state(state: dict[str, Any], step: int, *, subset: bool = False) -> list[str]:
    """Return the mismatches between a restored state and the values saved at ``step``."""
    full = full_values(step)
    problems = []
    leaves = {
        "w": state["params"]["w"],
        "b": state["params"].get("b"),
    }
    if not subset:
        leaves.update({"mu": state["opt"]["mu"], "count": state["opt"]["count"]})
    for name, arr in leaves.items():
        if arr is None:
            problems.append(f"{name}: missing")
            continue
        if not isinstance(arr, jax.Array):
            problems.append(f"{name}: {type(arr).__name__}, not a jax.Array")
            continue
        for shard in arr.addressable_shards:
            if not _same(np.asarray(shard.data), full[name][shard.index]):
                problems.append(f"{name}: shard {shard.index} differs")
    if not subset:
        if not _same(np.asarray(state["host"]), full["host"]):
            problems.append("host differs")
        if state["lr"] != 0.001 or state["step"] != step or state["flag"] is not True:
            problems.append(f"scalars differ: {state['lr']!r} {state['step']!r} {state['flag']!r}")
        if type(state["step"]) is not int or type(state["flag"]) is not bool:
            problems.append("scalar types differ")
    return problems


def checkpointer(root: str, **options: Any) -> AsyncCheckpointer:
    key = (root, repr(sorted(options.items())))
    if key not in _checkpointers:
        _checkpointers[key] = AsyncCheckpointer(root, **options)
    return _checkpointers[key]


def save(root: str, step: int, *, wait: bool = True, **options: Any) -> dict[str, Any]:
    state = make_state(step)
    ckptr = checkpointer(root, **options)
    t0 = time.perf_counter()
    ckptr.save(step, state)
    blocked = time.perf_counter() - t0
    if wait:
        ckptr.wait_until_finished()
    return {"blocked_s": blocked, "op": ckptr.last_op}


def wait(root: str, **options: Any) -> str | None:
    """Wait for the save in flight; return its error text, or None."""
    try:
        checkpointer(root, **options).wait_until_finished()
    except NbckptError as e:
        return str(e)
    return None


def restore_check(
    root: str, step: int | None, expect_step: int, *, use_target: bool = True, subset: bool = False
) -> list[str]:
    ckptr = AsyncCheckpointer(root)
    t = {"params": {"w": target()["params"]["w"]}} if subset else target() if use_target else None
    state = ckptr.restore(step, target=t, partial=subset)
    if subset:
        extra = set(state) - {"params"}
        if extra or set(state["params"]) != {"w"}:
            return [f"partial restore returned more than asked: {sorted(state)}"]
        state["params"]["b"] = None
        problems = check_state(state, expect_step, subset=True)
        return [p for p in problems if not p.startswith("b:")]
    return check_state(state, expect_step)


def barrier_skip(op: str, skip: int, timeout_s: float) -> str:
    """Every process but ``skip`` waits at one barrier; return what each saw."""
    sync = Synchronizer(default_client())
    if jax.process_index() == skip:
        time.sleep(timeout_s + 1.0)
        return "skipped"
    try:
        sync.barrier(op, "skip_test", timeout_s=timeout_s)
    except NbckptError as e:
        return f"{type(e).__name__}: {e}"
    return "passed"


def barrier_subset(op: str, processes: list[int]) -> str:
    if jax.process_index() not in processes:
        return "not a participant"
    Synchronizer(default_client()).barrier(op, "subset", timeout_s=30, process_ids=processes)
    return "passed"


def barrier_paths(op: str, late: int, late_s: float) -> list[str]:
    """Meet at a barrier all at once, then at one where ``late`` comes ``late_s`` late.

    Return, for each, the key-value count it left: none when the service's own barrier
    let everyone through.
    """
    client = default_client()
    sync = Synchronizer(client)
    sync.barrier(op, "together", timeout_s=30)
    if jax.process_index() == late:
        time.sleep(late_s)
    sync.barrier(op, "late", timeout_s=30)
    return [str(client.key_value_try_get(f"nbckpt/{op}/{b}/count")) for b in ("together", "late")]


def barrier_round_trips(op: str, count: int) -> float:
    """Median seconds of ``count`` barriers in a row."""
    sync = Synchronizer(default_client())
    times = []
    for i in range(count):
        t0 = time.perf_counter()
        sync.barrier(op, f"rt{i}", timeout_s=30)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def stall_at(phase: str, process: int, seconds: float) -> None:
    """Make ``process`` sleep for ``seconds`` each time ``phase`` starts."""
    hooks.clear_hooks()
    if jax.process_index() == process:
        hooks.set_hook(phase, lambda _p: time.sleep(seconds))


def stall_everywhere(phase: str, seconds: float) -> None:
    hooks.clear_hooks()
    hooks.set_hook(phase, lambda _p: time.sleep(seconds))


def clear_hooks() -> None:
    hooks.clear_hooks()


def arm_fault(process: int, kind: str, **kwargs: Any) -> str | None:
    """Arm a fault on ``process`` only."""
    from nbckpt.engine import faults

    faults.clear()
    if jax.process_index() != process:
        return None
    if kind == "kill":
        return faults.kill(kwargs.get("at"))
    if kind == "stall":
        return faults.stall(kwargs["at"], kwargs["seconds"])
    if kind == "fail-io":
        return faults.fail_io(kwargs.get("at", "write"))
    return faults.slow_io(kwargs["factor"])


def save_and_time_failure(root: str, step: int, **options: Any) -> dict[str, Any]:
    """Save and wait; return how it ended and when (wall time), never raise."""
    state = make_state(step)
    ckptr = checkpointer(root, **options)
    try:
        ckptr.save(step, state)
        ckptr.wait_until_finished()
    except NbckptError as e:
        return {"error": str(e), "t": time.time(), "type": type(e).__name__}
    return {"error": None, "t": time.time()}


def arm_kill_with_marker(process: int, phase: str, marker: str) -> None:
    """On ``process``, record the time and SIGKILL itself when ``phase`` starts."""
    import signal

    hooks.clear_hooks()
    if jax.process_index() != process:
        return

    def die(_phase: str) -> None:
        with open(marker, "w") as f:
            f.write(str(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)

    hooks.set_hook(phase, die)


def slow_writes(factor: float) -> None:
    hooks.set_io_slowdown(factor)


def resave_with_fault(
    root: str, mode: str, phase: str, victim: int, values_of: int = 7
) -> dict[str, Any]:
    """Force a re-save of step 1 (with another step's values); ``victim`` fails at ``phase``."""
    from nbckpt.engine import faults

    faults.clear()
    if jax.process_index() == victim:
        faults.fail_io(phase)
    ckptr = checkpointer(root)
    try:
        ckptr.save(1, make_state(values_of), force=True, mode=mode)  # type: ignore[arg-type]
        ckptr.wait_until_finished()
    except NbckptError as e:
        return {"error": str(e), "type": type(e).__name__}
    finally:
        faults.clear()
    return {"error": None, "type": None}


def agent_save_missing_on(root: str, step: int, missing_on: int) -> dict[str, Any]:
    """Save through the notebook's engine entry point; ``state`` is absent on one process."""
    from nbckpt.engine.remote import agent

    ns = {} if jax.process_index() == missing_on else {"state": make_state(step)}
    t0 = time.time()
    try:
        agent.save_var(ns, "state", step, root, timeout_s=120, key=f"miss{step}")
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.time() - t0}
    return {"error": None, "seconds": time.time() - t0}


def agent_reused_key(root: str) -> dict[str, Any]:
    """A save under a key that an earlier save used, then one under a fresh key."""
    from nbckpt.engine.remote import agent

    ns = {"state": make_state(1)}
    agent.save_var(ns, "state", 1, root, timeout_s=30, key="reused")
    agent._checkpointer(root).wait_until_finished()
    out: dict[str, Any] = {}
    try:
        agent.save_var(ns, "state", 2, root, timeout_s=30, key="reused")
        agent._checkpointer(root).wait_until_finished()
        out["again"] = None
    except Exception as e:
        out["again"] = f"{type(e).__name__}: {e}"
    agent.save_var(ns, "state", 3, root, timeout_s=30, key="fresh")
    agent._checkpointer(root).wait_until_finished()
    return out


def agent_two_saves(root: str, step: int) -> list[str | None]:
    """Two saves of one step back to back with different options, as two cells would."""
    from nbckpt.engine.remote import agent

    ns = {"a": make_state(step), "b": make_state(step + 100)}
    errors: list[str | None] = []
    for var, options in (("a", {"timeout_s": 60}), ("b", {"timeout_s": 30, "force": True})):
        try:
            agent.save_var(ns, var, step, root, key=f"two-{var}{step}", **options)
            errors.append(None)
        except NbckptError as e:
            errors.append(type(e).__name__)
    agent._checkpointer(root).wait_until_finished()
    return errors


# -- replicated leaves, read once per job -----------------------------------------------


def _big_state() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Leaves large enough to be split among their replicas (1 MiB a replica at least)."""
    mesh = _mesh()
    rng = np.random.default_rng(7)
    full = {
        "rep": rng.random((2048, 1024), dtype=np.float32),  # 8 MiB, on every device
        "half": rng.random((2048, 2048), dtype=np.float32),  # 16 MiB, replicated over data
        "tiny": np.arange(8, dtype=np.float32),  # too small to split
    }
    specs = {"rep": P(), "half": P(None, "model"), "tiny": P()}
    state = {
        k: jax.make_array_from_callback(
            full[k].shape, NamedSharding(mesh, specs[k]), lambda idx, k=k: full[k][idx]
        )
        for k in full
    }
    return state, full


def _journal_bytes(root: str, op: str) -> dict[str, int]:
    import json

    found: dict[str, int] = {}
    path = f"{root}/.nbckpt/ops/{op}/process_{jax.process_index()}.jsonl"
    with open(path, encoding="utf-8") as f:
        for line in f:
            event = json.loads(line)
            if event["event"] in ("write_done", "read_done"):
                found[event["event"]] = int(event["bytes"])
                if "verified" in event:
                    found["verified"] = int(bool(event["verified"]))
    return found


def replicated_round_trip(root: str, plan: str) -> dict[str, Any]:
    """Save the big state, restore it with ``plan`` ("share", "apart" or "split"); report.

    ``share`` is what a local root on one host gets; ``apart`` is the same with every
    process given a shared-memory folder of its own, as processes that share a host
    name but not its memory would be; ``split`` (read in pieces, then gathered) is
    what an object store or several hosts get, forced here.
    """
    from pathlib import Path

    from nbckpt.engine.restore import hostshare
    from nbckpt.engine.restore import step as _restore
    from nbckpt.engine.restore.exchange import JobReads
    from nbckpt.formats.layout import step_dir

    if plan == "apart":
        hostshare.SCRATCH_DIR = Path(root) / f"shm-{jax.process_index()}"
        hostshare.SCRATCH_DIR.mkdir()

    state, full = _big_state()
    ckptr = checkpointer(root)
    ckptr.save(1, state)
    ckptr.wait_until_finished()
    out: dict[str, Any] = {"save": _journal_bytes(root, str(ckptr.last_op))}
    target = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in state.items()
    }
    if plan in ("share", "apart"):
        restored = ckptr.restore(1, target=target)
        out["restore"] = _journal_bytes(root, str(ckptr.last_op))
    else:
        sync = Synchronizer(default_client())
        job = JobReads(lambda: sync.barrier("split-test", "read", timeout_s=60), local_root=False)
        restored = _restore.restore_step(step_dir(Path(root), 1), target, None, job=job)
    problems = []
    for k, value in full.items():
        got = restored[k]
        if got.sharding != state[k].sharding:
            problems.append(f"{k}: sharding {got.sharding} != {state[k].sharding}")
        for shard in got.addressable_shards:
            if not np.array_equal(np.asarray(shard.data), value[shard.index]):
                problems.append(f"{k}: shard {shard.index} differs")
    out["problems"] = problems
    return out


def restore_error(root: str, step: int) -> str:
    """Restore the big state; return the error's class and text ("" if none)."""
    state, _ = _big_state()
    target = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in state.items()
    }
    try:
        AsyncCheckpointer(root).restore(step, target=target)
    except NbckptError as e:
        return f"{type(e).__name__}: {e}"
    return ""
