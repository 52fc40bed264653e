"""One OS process of a simulation: many simulated JAX processes, one client each.

Each simulated process owns a real coordination-service client (``jaxlib``'s
``DistributedRuntimeClient``) and runs nbckpt's own engine code over it: the heartbeat
monitor, the synchronizer's barriers, the preflight agreement, a save's background job
with its journal and its commit. What it does not have is devices: it saves a tree of
a few tiny NumPy arrays, which the primary writes, so every process's part of a save is
its control plane.

The driver (:mod:`nbckpt.sim.cluster`) sends one command at a time over a pipe; the
worker runs it on all its simulated processes at once, one thread each, and answers
with what each measured. Worker 0 also hosts the coordination service, as process 0 of
a real job does.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TREE", "serve"]

#: What every simulated process saves: tiny leaves, written by the primary alone.
TREE: dict[str, Any] = {"step": np.array(0, np.int64), "scale": np.ones(4, np.float32)}

#: Milliseconds the service waits for every client to connect.
_REGISTER_MS = 300_000


class _Sim:
    """One simulated process: its client, and the checkpointer context built on it."""

    def __init__(self, address: str, index: int, count: int) -> None:
        from jax._src.lib import _jax  # type: ignore[attr-defined]

        self.index = index
        self.count = count
        self.raw: Any = _jax.get_distributed_runtime_client(
            address,
            index,
            init_timeout=_REGISTER_MS // 1000,
            heartbeat_timeout=600,
            shutdown_on_destruction=False,
        )
        self.ctx: Any = None

    def connect(self) -> None:
        self.raw.connect()

    def join(self, root: str) -> None:
        """Start the heartbeats and the synchronizer, as a checkpointer's context does."""
        from nbckpt.engine.context import Context
        from nbckpt.engine.sync.barriers import CoordinationServiceClient

        kv = CoordinationServiceClient(self.raw, process_index=self.index, process_count=self.count)
        self.ctx = Context.connect(Path(root), 0, kv)


def _each(sims: list[_Sim], fn: Callable[[_Sim], Any]) -> list[Any]:
    """Run ``fn`` on every simulated process at once, one thread each; their answers."""
    out: list[Any] = [None] * len(sims)

    def run(i: int) -> None:
        try:
            out[i] = fn(sims[i])
        except BaseException as e:  # reported, not raised: the others go on
            out[i] = {"error": f"{type(e).__name__}: {e}"}

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(sims))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _until(t_go: float) -> None:
    delay = t_go - time.time()
    if delay > 0:
        time.sleep(delay)


def _barrier(sim: _Sim, kind: str, name: str, t_go: float, timeout_s: float) -> dict[str, Any]:
    """Meet the others at one barrier: nbckpt's, or the service's ``wait_at_barrier``."""
    _until(t_go)
    arrive = time.time()
    if kind == "service":
        sim.raw.wait_at_barrier(name, int(timeout_s * 1000))
    else:
        sim.ctx.sync.barrier(name, "sim", timeout_s=timeout_s)
    return {"p": sim.index, "arrive": arrive, "release": time.time()}


def _save(
    sim: _Sim,
    step: int,
    t_go: float,
    victim: int | None,
    die_after_s: float,
    timeout_s: float,
    straggler: int | None = None,
    late_s: float = 0.0,
) -> dict[str, Any]:
    """Run one save of :data:`TREE` through nbckpt's own save path.

    The ``victim`` joins the preflight, then dies ``die_after_s`` later: it stops
    beating and its port refuses, as a killed process's does, and it never writes. The
    ``straggler`` starts its write ``late_s`` late: the others wait for it at
    ``tmp_ready``.
    """
    from nbckpt.engine.options import CheckpointerOptions
    from nbckpt.engine.save.start import start_save

    _until(t_go)
    t0 = time.time()
    options = CheckpointerOptions(timeout_s=timeout_s)
    job = start_save(sim.ctx, options, lambda: TREE, step, key=f"sim-{step}")
    t_agreed = time.time()
    if sim.index == victim:
        time.sleep(die_after_s)
        died = time.time()
        sim.ctx.health.stop()
        job.journal.close()
        return {"p": sim.index, "op": job.op, "start": t0, "agreed": t_agreed, "died": died}
    if sim.index == straggler:
        time.sleep(late_s)
    error = job.run()
    return {
        "p": sim.index,
        "op": job.op,
        "start": t0,
        "agreed": t_agreed,
        "end": time.time(),
        "error": None if error is None else str(error),
        "names": None if error is None or victim is None else f"process {victim}" in str(error),
    }


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _run(sims: list[_Sim], verb: str, args: tuple[Any, ...]) -> Any:
    """One command on every simulated process of this worker; their answers."""
    if verb == "connect":
        return _each(sims, lambda s: s.connect())
    if verb == "join":
        return _each(sims, lambda s: s.join(args[0]))
    if verb == "barrier":
        return _each(sims, lambda s: _barrier(s, *args))
    if verb == "save":
        return _each(sims, lambda s: _save(s, *args))
    if verb == "rss":
        return _rss_bytes()
    raise ValueError(f"unknown command {verb!r}")


def serve(
    conn: Connection, address: str, first: int, count: int, total: int, host_service: bool
) -> None:
    """Run simulated processes ``first .. first+count-1`` of ``total`` until told to stop.

    Commands (tuples) and answers (lists, one entry per simulated process):
    ``("connect",)``, ``("join", root)``, ``("barrier", kind, name, t_go, timeout_s)``,
    ``("save", step, t_go, victim, die_after_s, timeout_s, straggler, late_s)``,
    ``("rss",)``, ``("stop",)``.
    """
    services = []  # referenced until the process ends: dropping it stops the service
    try:
        if host_service:
            from jax._src.lib import _jax  # type: ignore[attr-defined]

            # Its own liveness (gRPC heartbeats) never fires in a simulation: nbckpt's
            # heartbeats are what is measured.
            services.append(
                _jax.get_distributed_runtime_service(
                    address, total, heartbeat_timeout=600, cluster_register_timeout=300
                )
            )
        sims = [_Sim(address, p, total) for p in range(first, first + count)]
        conn.send(("ready", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        command = conn.recv()
        verb, args = command[0], command[1:]
        try:
            if verb == "stop":
                for sim in sims:
                    if sim.ctx is not None:
                        sim.ctx.health.stop()
                conn.send(("ok", None))
                break
            conn.send(("ok", _run(sims, verb, args)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
    conn.close()
    # The clients would run the service's shutdown barrier, which the other workers'
    # clients may no longer join: leave without it (and without stopping the service).
    os._exit(0)


def main(argv: list[str]) -> None:
    """Dial the driver back (see :class:`nbckpt.sim.cluster.Simulation`) and serve it."""
    spec = json.loads(argv[0])
    # ``kill -USR1 <pid>`` prints every thread's stack to the worker's log: where a
    # simulation stalls.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    authkey = bytes.fromhex(os.environ["NBCKPT_SIM_AUTHKEY"])
    conn = Client(tuple(spec["listener"]), authkey=authkey)
    serve(conn, spec["address"], spec["first"], spec["count"], spec["total"], spec["host_service"])


if __name__ == "__main__":
    main(sys.argv[1:])
