"""The engine-side end of the notebook client: plain functions run on each engine.

``nbckpt.client`` calls these through ipyparallel; each one works on this process's
own checkpointers and returns small JSON-able dicts. This module knows nothing of
IPython or ipyparallel: the client resolves names in the engine's namespace and
passes the values in.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from nbckpt.engine import faults, health
from nbckpt.engine.checkpointer import AsyncCheckpointer
from nbckpt.engine.sync import Synchronizer, default_client, next_sequence
from nbckpt.errors import CheckpointError
from nbckpt.journal import JournalWriter
from nbckpt.layout import Mode

__all__ = [
    "barrier",
    "fault",
    "health_view",
    "info",
    "initialize",
    "pick_port",
    "restore",
    "save",
    "shutdown",
    "status",
    "wait",
]

_checkpointers: dict[tuple[str, str, float], AsyncCheckpointer] = {}
_initialized: dict[str, Any] = {}


def pick_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that is free now (for the coordination service)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def initialize(
    process_id: int,
    num_processes: int,
    coordinator: str,
    *,
    devices_per_process: int = 1,
    bind_address: str | None = None,
    recoverable: bool = True,
    timeout_s: int = 120,
) -> dict[str, Any]:
    """Join this process to the JAX cluster (``jax.distributed.initialize``).

    Must run before any other JAX call in the process. Preemption sync is turned off
    (otherwise shutdown waits about 5 s per process) and, if ``recoverable``, so is the
    rule that aborts every survivor when one process dies.
    """
    import jax

    if _initialized:
        return info()
    jax.config.update("jax_num_cpu_devices", devices_per_process)
    jax.config.update("jax_enable_preemption_service", False)
    if recoverable:
        jax.config.update("jax_enable_recoverability", True)
    if num_processes > 1:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            coordinator_bind_address=bind_address,
            initialization_timeout=timeout_s,
        )
    jax.devices()  # settles the backend on every process at the same point
    _initialized.update(coordinator=coordinator, num_processes=num_processes)
    health.monitor_for(default_client())  # heartbeats from the start, not the first save
    return info()


def info() -> dict[str, Any]:
    """Describe this process: index, count, devices, host and pid."""
    import jax

    return {
        "process": jax.process_index(),
        "process_count": jax.process_count(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "initialized": bool(_initialized),
    }


def _checkpointer(root: str, mode: Mode, timeout_s: float) -> AsyncCheckpointer:
    key = (os.path.abspath(root), mode, timeout_s)
    ckptr = _checkpointers.get(key)
    if ckptr is None:
        ckptr = _checkpointers[key] = AsyncCheckpointer(root, mode=mode, timeout_s=timeout_s)
    return ckptr


def _settle(ckptr: AsyncCheckpointer, acknowledged: tuple[str, ...]) -> None:
    """Wait for the previous save; drop its error if the notebook already showed it."""
    try:
        ckptr.wait_until_finished()
    except CheckpointError as e:
        if e.op not in acknowledged:
            raise


def save(
    tree: Any,
    step: int,
    root: str,
    *,
    mode: Mode = "rename",
    force: bool = False,
    timeout_s: float = 300.0,
    acknowledged: tuple[str, ...] = (),
    key: str | None = None,
) -> dict[str, Any]:
    """Start saving ``tree``; return once the snapshot is safe.

    ``acknowledged`` lists failed operations whose error the notebook has shown
    already, so they are not raised a second time here. ``key`` is the caller's
    unique id of this call (see ``AsyncCheckpointer.save``).
    """
    ckptr = _checkpointer(root, mode, timeout_s)
    _settle(ckptr, acknowledged)
    t0 = time.perf_counter()
    ckptr.save(step, tree, force=force, key=key)
    return {
        "process": ckptr.process_index,
        "op": ckptr.last_op,
        "blocked_s": time.perf_counter() - t0,
        "root": str(ckptr.root),
        "step": step,
    }


def wait(root: str | None = None, acknowledged: tuple[str, ...] = ()) -> list[str]:
    """Wait for the saves in flight (under ``root``, or all); return their op ids."""
    done = []
    for (path, _mode, _t), ckptr in list(_checkpointers.items()):
        if root is None or path == os.path.abspath(root):
            if ckptr.last_op is not None:
                done.append(ckptr.last_op)
            _settle(ckptr, acknowledged)
    return done


def restore(
    root: str, step: int | None, like: Any = None, key: str | None = None
) -> tuple[Any, dict[str, Any]]:
    """Restore ``step`` (None: the latest) shaped and sharded like ``like``.

    ``like`` is the value the variable holds now, if any: its jax arrays lend their
    shardings (the engines' current mesh), other leaves come back as saved. Without
    it the saved layout is used.
    """
    import jax

    target = None
    if like is not None:
        target = jax.tree.map(lambda x: x.sharding if isinstance(x, jax.Array) else ..., like)
    ckptr = AsyncCheckpointer(root)
    t0 = time.perf_counter()
    tree = ckptr.restore(step, target=target, key=key)
    jax.block_until_ready(tree)
    return tree, {
        "process": ckptr.process_index,
        "op": ckptr.last_op,
        "seconds": time.perf_counter() - t0,
        "step": int(ckptr.last_op.rsplit("-", 1)[1]) if ckptr.last_op else step,
    }


def barrier(
    name: str,
    *,
    timeout_s: float = 60.0,
    processes: list[int] | None = None,
    root: str | None = None,
    key: str | None = None,
) -> dict[str, Any]:
    """Wait at a user barrier across the processes; report when this one arrived and left.

    The key is ``nbckpt/barrier-<id>/<name>``, where ``<id>`` is the caller's ``key``
    or else a sequence number: unique per use, so the same name can be used again.
    With ``root`` the barrier is journaled like a save, as operation kind ``barrier``.
    """
    sync = Synchronizer(default_client())
    if key is not None:
        op = f"barrier-{key}"
    else:
        seq = next_sequence(processes)
        subset = "" if processes is None else "-p" + ".".join(map(str, processes))
        op = f"barrier-{seq}{subset}"
    journal = None
    if root is not None:
        # The journal folder needs one name on every process: the first participant
        # stamps it and the others read it.
        source = min(processes) if processes else 0
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        proposed = f"{stamp}-{op}-{name}" if sync.process_index == source else None
        journal_op = sync.broadcast(op, "journal", proposed, source=source, timeout_s=timeout_s)
        journal = JournalWriter(root, journal_op, sync.process_index, "barrier", 0)
        count = len(processes) if processes else sync.process_count
        journal.emit("requested", process_count=count, name=name)
        journal.emit("barrier_enter", name=name)
    entered = time.time()
    try:
        sync.barrier(op, name, timeout_s=timeout_s, process_ids=processes)
    except BaseException as e:
        if journal is not None:
            journal.emit("failed", error=str(e), phase=f"barrier:{name}")
        raise
    left = time.time()
    if journal is not None:
        journal.emit("barrier_exit", name=name)
        journal.emit("committed")
        journal.close()
    return {"process": sync.process_index, "entered": entered, "left": left, "key": f"{op}/{name}"}


def health_view() -> dict[int, str]:
    """This process's view of who is alive, from the key-value heartbeats."""
    return health.monitor_for(default_client()).view()


def status() -> dict[str, Any]:
    """Report this process's checkpointers: root, last operation, whether in flight."""
    out = info()
    out["health"] = health_view()
    out["checkpointers"] = [
        {"root": path, "mode": mode, "last_op": c.last_op, "in_flight": c.in_flight()}
        for (path, mode, _t), c in _checkpointers.items()
    ]
    return out


def fault(
    kind: str, *, at: str | None = None, seconds: float | None = None, factor: float | None = None
) -> list[str]:
    """Arm a fault in this process (see :mod:`nbckpt.engine.faults`); return all armed.

    ``kind`` is ``kill``, ``stall``, ``slow-io``, ``fail-io``, ``clear`` or ``list``.
    """
    if kind == "kill":
        faults.kill(at)
    elif kind == "stall":
        faults.stall(at or "write", seconds or 1.0)
    elif kind == "slow-io":
        faults.slow_io(factor or 1.0)
    elif kind == "fail-io":
        faults.fail_io(at or "write")
    elif kind == "clear":
        faults.clear()
    elif kind != "list":
        raise ValueError(f"unknown fault {kind!r}; one of kill, stall, slow-io, fail-io")
    return faults.list_faults()


def shutdown() -> None:
    """Leave the JAX cluster (``jax.distributed.shutdown``)."""
    import jax

    jax.distributed.shutdown()
