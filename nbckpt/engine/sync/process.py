"""Make this Python process one JAX process of a job: the one way nbckpt does it.

Both launchers use :func:`initialize`: the ipyparallel cluster runs it on every engine
(``nbckpt.session.cluster`` sends it by name, so the notebook never imports this module), and
each worker of a local :class:`~nbckpt.procgroup.ProcessGroup` calls it at start.
"""

from __future__ import annotations

import math
import os
import socket
import time
from typing import Any

from nbckpt.engine.sync import health, preemption
from nbckpt.engine.sync.barriers import default_client
from nbckpt.netaddr import loopback_name, route_address

__all__ = ["info", "initialize", "loopback_name", "pick_port", "route_address", "shutdown"]

#: How this process was joined; empty until :func:`initialize` ran.
_joined: dict[str, Any] = {}
#: How long process 0 waits at shutdown for the others to leave the job first.
_LEAVE_TIMEOUT_S = 10.0


def _advertise_collectives_at(address: str) -> None:
    """Make JAX's CPU collectives (gloo) listen on and advertise ``address``.

    JAX builds its gloo collectives without a host name, so gloo resolves this host's
    name, which may be loopback (see :func:`loopback_name`). The CPU backend is
    registered again, before anything creates it, with collectives bound to the
    address that reaches the coordinator. Uses JAX's backend registry, which is not
    public API: if it changed, the error says what to set instead.
    """
    try:
        from jax._src import distributed, xla_bridge
        from jax._src.lib import _jax  # type: ignore[attr-defined]

        collectives = _jax.make_gloo_tcp_collectives(
            distributed_client=distributed.global_state.client, hostname=address
        )
        xla_bridge.register_backend_factory(
            "cpu",
            lambda: xla_bridge.make_cpu_client(collectives=collectives),
            priority=0,
            fail_quietly=False,
        )
    except (ImportError, AttributeError, TypeError) as e:
        raise RuntimeError(
            f"this host's name {socket.gethostname()!r} resolves to a loopback address, "
            "so JAX's CPU collectives would advertise it to the other hosts, and nbckpt "
            f"cannot choose {address} with this JAX ({e}); map the name to {address} in "
            "/etc/hosts"
        ) from e


def pick_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that is free now (for the coordination service).

    Run it on the process that will host the service, so the port is free there.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _await_service(coordinator: str, deadline: float) -> None:
    """Wait until ``coordinator`` accepts TCP connections, or until ``deadline``.

    A process that dials the coordination service before process 0 listens waits out
    gRPC's reconnect backoff, about a second, before it dials again: the join then
    takes over a second instead of a tenth. A dial that opens and closes costs the
    service nothing. Past the deadline JAX's own wait reports what is wrong.
    """
    host, _, port = coordinator.rpartition(":")
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.01)


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
        deadline = time.monotonic() + timeout_s
        if process_id != 0:
            _await_service(coordinator, deadline)
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            coordinator_bind_address=bind_address,
            initialization_timeout=max(1, math.ceil(deadline - time.monotonic())),
        )
        if loopback_name(coordinator) is not None:
            # Before jax.devices(): the CPU backend must not exist yet.
            _advertise_collectives_at(route_address(coordinator))
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

    preemption.stop_all()
    monitor = _joined.get("monitor")
    if monitor is not None:
        # A beat must not reach for a coordination client that is being torn down.
        monitor.stop()
    if jax.process_index() == 0 and jax.process_count() > 1:
        _await_others_leaving(jax.process_count())
    jax.distributed.shutdown()


def _await_others_leaving(n: int, timeout_s: float = _LEAVE_TIMEOUT_S) -> None:
    """On process 0, wait (a while at most) until the other processes have left.

    Under recoverability the service does not hold its own shutdown for the others;
    a process still leaving when process 0 takes the service down aborts (SIGABRT)
    instead of exiting 0. Processes that died are not live: no wait for them.
    """
    from jax._src.distributed import global_state

    client = global_state.client
    if client is None:
        return
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            live = client.get_live_nodes(list(range(n)))
        except Exception:  # the service is already failing: nothing to wait for
            return
        if set(live) <= {0}:
            return
        time.sleep(0.02)
