"""Make this Python process one JAX process of a job: the one way nbckpt does it.

Both launchers use :func:`initialize`: the ipyparallel cluster runs it on every engine
(``nbckpt.cluster`` sends it by name, so the notebook never imports this module), and
each worker of a local :class:`~nbckpt.procgroup.ProcessGroup` calls it at start.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from nbckpt.engine import health
from nbckpt.engine.sync import default_client

__all__ = ["info", "initialize", "pick_port", "shutdown"]

#: How this process was joined; empty until :func:`initialize` ran.
_joined: dict[str, Any] = {}


def pick_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that is free now (for the coordination service).

    Run it on the process that will host the service, so the port is free there.
    """
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
    """Configure JAX, join the job (``jax.distributed.initialize``), start heartbeats.

    Must run before any other JAX call in the process; a second call returns
    :func:`info` and changes nothing, since a JAX process cannot join twice.

    Parameters
    ----------
    process_id, num_processes
        This process's index and the size of the job. With one process no
        coordination service is started.
    coordinator
        ``host:port`` of process 0's coordination service, which every process dials.
    devices_per_process
        CPU devices of this process (``jax_num_cpu_devices``).
    bind_address
        Where process 0's service listens (default: JAX's choice, all interfaces).
    recoverable
        Keep survivors alive when a peer dies (``jax_enable_recoverability``); nbckpt's
        heartbeats then make their waits fail within seconds instead.
    timeout_s
        How long to wait for every process to join.

    Returns
    -------
    dict
        :func:`info` of this process.
    """
    import jax

    if _joined:
        return info()
    # Both must be set before any other JAX call (measured on jax 0.10).
    jax.config.update("jax_num_cpu_devices", devices_per_process)
    # Without this, shutdown waits about 5 s per process for the preemption service.
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
    _joined.update(coordinator=coordinator, num_processes=num_processes)
    # Heartbeats from the start, not from the first save: a peer that dies before
    # any save is still seen as dead by the health view.
    _joined["monitor"] = health.monitor_for(default_client())
    return info()


def info() -> dict[str, Any]:
    """Describe this process: index, count, devices, host, pid, and whether nbckpt joined it."""
    import jax

    return {
        "process": jax.process_index(),
        "process_count": jax.process_count(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "initialized": bool(_joined),
    }


def shutdown() -> None:
    """Stop the heartbeats, then leave the job (``jax.distributed.shutdown``)."""
    import jax

    monitor = _joined.get("monitor")
    if monitor is not None:
        # A beat must not reach for a coordination client that is being torn down.
        monitor.stop()
    jax.distributed.shutdown()
