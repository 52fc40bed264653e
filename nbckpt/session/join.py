"""Making registered engines one JAX job: their order, the coordinator, the join, the relays.

Every engine is one JAX process. Its rank is its position in the order placed here
(with ssh, the order of ``hosts``), and process 0 hosts the coordination service. Each
engine then runs :func:`nbckpt.engine.sync.process.initialize`, the same setup a
:class:`~nbckpt.procgroup.ProcessGroup` worker runs. Where the engines run on other
hosts, each also starts a read service that the notebook reads storage through (see
:mod:`nbckpt.session.reads`).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nbckpt.errors import ClusterError, by_process
from nbckpt.netaddr import free_port, resolve
from nbckpt.session.arrivals import same_host
from nbckpt.session.bootstrap import JOIN, PROBE
from nbckpt.session.options import ClusterOptions
from nbckpt.session.rpc import (
    RELAY,
    ask,
    collect,
    errors_by_process,
    failures,
    remote,
    send,
)

__all__ = [
    "Placement",
    "RelayRequest",
    "ask_relays",
    "await_join",
    "coordinator",
    "place",
    "send_join",
    "use_relays",
]


@dataclass(frozen=True)
class Placement:
    """Where the engines stand in the job.

    Attributes
    ----------
    engine_ids
        Engine ids in process order.
    engine_hosts
        Each process's host name, in process order.
    coordinator_host
        The address process 0's coordination service binds to and every engine dials.
    port
        A port free on process 0's host at ``coordinator_host``, or None if none is.
    """

    engine_ids: list[int]
    engine_hosts: list[str]
    coordinator_host: str
    port: int | None


def place(
    client: Any,
    options: ClusterOptions,
    timeout_s: float,
    *,
    started_here: bool,
    dial: Callable[[str], str],
) -> Placement:
    """Put the engines in process order (with ssh, the order of ``options.hosts``).

    Local engines that this kernel started (``started_here``) run on this machine, so
    they are not asked: their order is their ids', and the port is picked here. Others
    each pick a port, where they would bind as process 0: the order, and with it
    process 0, is known only from their answers. ``dial`` gives the address ssh dials
    for a host entry, for engines whose own name does not match it.
    """
    ids = sorted(client.ids)[: options.n]
    if options.engines == "local" and started_here:
        bind = options.coordinator_host or "127.0.0.1"
        port = None
        with contextlib.suppress(OSError):
            port = free_port(bind)
        return Placement(ids, [socket.gethostname()] * len(ids), bind, port)
    bind_at = options.coordinator_host or ("127.0.0.1" if options.engines == "local" else None)
    toward = options.controller_ip or "127.0.0.1"
    answers = ask(client, ids, PROBE, toward, bind_at, timeout_s=timeout_s)
    infos = {}
    for eid, (ok, info) in zip(ids, answers, strict=True):
        if not ok:  # an engine that does not answer now will not join
            raise ClusterError(f"engine {eid} did not answer: {info}")
        infos[eid] = info
    if options.hosts:
        free = list(ids)
        order = []
        for host in options.hosts:
            eid = _engine_on(host, free, infos, dial)
            free.remove(eid)
            order.append(eid)
        ids = order
    first = infos[ids[0]]
    coordinator_host = options.coordinator_host
    if coordinator_host is None:
        here = options.engines == "local" or first.get("address") is None
        coordinator_host = "127.0.0.1" if here else str(first["address"])
    port = first.get("port")
    hosts = [str(infos[e]["host"]) for e in ids]
    return Placement(ids, hosts, coordinator_host, None if port is None else int(port))


def _engine_on(
    host: str, free: list[int], infos: dict[int, Any], dial: Callable[[str], str]
) -> int:
    """The engine of ``free`` on ``host``: by its own name, else the address ssh dials.

    The first free engine if none matches (a name or address seen differently).
    """
    named = next((e for e in free if same_host(infos[e]["host"], host)), None)
    if named is not None:
        return named
    dialled = resolve(dial(host))
    return next((e for e in free if infos[e]["address"] == dialled), free[0])


def coordinator(placement: Placement) -> str:
    """``host:port`` of the coordination service process 0 will run.

    Raises
    ------
    ClusterError
        If process 0's host has no free port at ``coordinator_host``.
    """
    if placement.port is None:
        host0, at = placement.engine_hosts[0], placement.coordinator_host
        raise ClusterError(
            f"process 0 (on {host0}) cannot bind the coordination service to {at}: not "
            f"an address of that host, or no port free there; pass --coordinator-host "
            f"with an address of {host0}"
        )
    return f"{placement.coordinator_host}:{placement.port}"


def send_join(
    client: Any, engine_ids: list[int], address: str, options: ClusterOptions, timeout_s: float
) -> list[Any]:
    """Send every engine the join, as process ``rank`` of the job at ``address``.

    Returns the pending results, for :func:`await_join`: the caller may send more in the
    same breath (:func:`ask_relays`) before it waits. The engines nbckpt started have
    imported what the join needs already (:func:`~nbckpt.session.bootstrap.engine_main`).
    """
    return [
        client[eid].apply_async(
            remote(JOIN),
            rank,
            len(engine_ids),
            address,
            devices_per_process=options.devices_per_process,
            bind_address=address,
            recoverable=options.recoverable,
            timeout_s=int(timeout_s),
        )
        for rank, eid in enumerate(engine_ids)
    ]


def await_join(pending: list[Any], timeout_s: float) -> None:
    """Wait for the joins :func:`send_join` sent.

    Raises
    ------
    ClusterError
        Naming the processes whose join failed.
    """
    errors = failures(collect(pending, timeout_s))
    if errors:
        raise ClusterError(
            f"jax.distributed.initialize failed on {by_process(errors)}; a JAX process "
            "cannot be joined twice, so stop this cluster and start a fresh one",
            sorted(errors),
        )


#: Read services asked for: their key, and each engine's pending answer.
RelayRequest = tuple[bytes, list[Any]]


def ask_relays(client: Any, placement: Placement, toward: str) -> RelayRequest | None:
    """Ask every engine to start its service (:mod:`nbckpt.engine.remote.relay`).

    Through it a busy engine answers ``%ckpt_fault`` and ``%ckpt_status`` at once; on
    other hosts, whose storage this machine may not see (:mod:`nbckpt.session.reads`),
    the notebook's reads go there too. Returns the key and the requests, for
    :func:`use_relays`.
    """
    key = os.urandom(32)
    return key, send(client, placement.engine_ids, f"{RELAY}:serve", key, toward)


def use_relays(asked: RelayRequest | None, hosts: list[str], timeout_s: float) -> Any:
    """Wait for the read services :func:`ask_relays` asked for; the ``Relay`` over them.

    None if none was asked for. The cluster keeps it, and its reader
    (:attr:`JaxCluster.reader`) sends the notebook's reads there.
    """
    if asked is None:
        return None
    from nbckpt.session import reads

    key, pending = asked
    outcomes = collect(pending, timeout_s)
    errors = failures(outcomes)
    if errors:
        raise errors_by_process("starting the read service", errors)
    return reads.Relay([res for _ok, res in outcomes], key, hosts)
