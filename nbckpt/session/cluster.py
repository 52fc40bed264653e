"""Start, attach to and stop an ipyparallel cluster whose engines form one JAX job.

:class:`JaxCluster` is the cluster's life: start, attach, run on every engine, watch
health, restart, stop. What it does at each step lives beside it, one module per
concern, as ipyparallel keeps its cluster apart from its launchers:

- :mod:`~nbckpt.session.options`: :class:`ClusterOptions`, how a cluster is built;
- :mod:`~nbckpt.session.launch`: how engines start (local, ssh, mpi, slurm), ssh checks;
- :mod:`~nbckpt.session.arrivals`: waiting for engines, and why some never register;
- :mod:`~nbckpt.session.join`: process order, the coordinator, the JAX join, the relays;
- :mod:`~nbckpt.session.rpc`: calling engines by name, their errors by process;
- :mod:`~nbckpt.session.engines`: calls to the engines, ``%px``, which are alive;
- :mod:`~nbckpt.session.registry`: the record of this cluster's root for the lab;
- :mod:`~nbckpt.session.profiles`: the clusters an ipyparallel profile holds;
- :mod:`~nbckpt.session.bootstrap`: the engine side: early imports, probe, join.

The notebook never imports jax, nor any of ``nbckpt.engine``: engine functions are sent
by name (:func:`~nbckpt.session.rpc.remote`). The names this module exported before the
split are exported from here still.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from nbckpt.errors import ClusterError, ClusterGoneError
from nbckpt.session.arrivals import Arrivals
from nbckpt.session.bootstrap import (
    ENGINE_MAIN,
    PRELOAD,
    SAFE_INFO,
    engine_main,
    preload_report,
)
from nbckpt.session.engines import Engines
from nbckpt.session.join import (
    Placement,
    ask_relays,
    await_join,
    coordinator,
    place,
    send_join,
    use_relays,
)
from nbckpt.session.launch import SSH_OPTIONS, Launcher, SSHLauncher, launcher_for, stop_processes
from nbckpt.session.options import LAUNCHERS, ClusterOptions
from nbckpt.session.profiles import connection_files, which_cluster
from nbckpt.session.reads import LOCAL, Reader, Relay
from nbckpt.session.registry import Registration, clusters_dir
from nbckpt.session.rpc import (
    AGENT,
    ENGINE_DIED,
    HOST_INFO,
    PROCESS,
    RELAY,
    call,
    engine_errors,
    errors_by_process,
    remote,
)

__all__ = [
    "AGENT",
    "ENGINE_DIED",
    "ENGINE_MAIN",
    "HOST_INFO",
    "LAUNCHERS",
    "PRELOAD",
    "PROCESS",
    "RELAY",
    "SSH_OPTIONS",
    "ClusterError",
    "ClusterGoneError",
    "ClusterOptions",
    "JaxCluster",
    "call",
    "clusters_dir",
    "connection_files",
    "engine_errors",
    "engine_main",
    "errors_by_process",
    "preload_report",
    "remote",
    "which_cluster",
]

T = TypeVar("T")


class _Option(Generic[T]):
    """One field of the cluster's :class:`ClusterOptions`: ``cluster.n`` is ``options.n``.

    Setting it replaces the options with one field changed, as setting the field of
    the dataclass the cluster was before did.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> _Option[T]: ...
    @overload
    def __get__(self, obj: _Settings, owner: type) -> T: ...
    def __get__(self, obj: _Settings | None, owner: type) -> _Option[T] | T:
        if obj is None:
            return self
        value: T = getattr(obj.options, self.name)
        return value

    def __set__(self, obj: _Settings, value: T) -> None:
        changed: dict[str, Any] = {self.name: value}
        obj.options = replace(obj.options, **changed)


class _Settings:
    """A cluster's :class:`ClusterOptions`, each field an attribute, and what they decide."""

    options: ClusterOptions
    n = _Option[int]()
    devices_per_process = _Option[int]()
    coordinator_host: _Option[str | None] = _Option()
    recoverable = _Option[bool]()
    profile: _Option[str | None] = _Option()
    engines = _Option[str]()
    hosts: _Option[Sequence[str]] = _Option()
    controller_ip: _Option[str | None] = _Option()
    ssh_config: _Option[str | None] = _Option()
    python: _Option[str | None] = _Option()

    @property
    def launcher(self) -> Launcher:
        """How this cluster's engines start (:func:`~nbckpt.session.launch.launcher_for`)."""
        return launcher_for(self.options)


class JaxCluster(_Settings, Engines):
    """An ipyparallel cluster whose engines are joined by ``jax.distributed``.

    Every engine is one JAX process: its rank is its position in :attr:`engine_ids`,
    and process 0 hosts the coordination service. Calls to the engines, ``%px`` and
    health are :class:`~nbckpt.session.engines.Engines`'; this class adds the life of
    the job: start, attach, restart, stop, and the root it registers for the lab.

    Parameters
    ----------
    options
        How to build the cluster (:class:`ClusterOptions`; default: its defaults).
    **settings
        Fields of :class:`ClusterOptions` by name (``n=2, engines="ssh", hosts=[...]``),
        over those of ``options``. Each is also an attribute: ``cluster.n`` reads
        ``cluster.options.n``.
    cluster_id, client, cluster
        Of a running cluster: its id, an ipyparallel client, and the ipyparallel
        ``Cluster`` if this kernel started it (:meth:`attach` passes the first two).
    """

    def __init__(
        self,
        *,
        options: ClusterOptions | None = None,
        cluster_id: str | None = None,
        client: Any = None,
        cluster: Any = None,
        **settings: Any,
    ) -> None:
        super().__init__(client)
        options = options or ClusterOptions()
        self.options = replace(options, **settings) if settings else options
        self.cluster = cluster  # ipyparallel's Cluster, if this kernel started it
        self.cluster_id = cluster_id
        self.coordinator: str | None = None
        self.relay: Relay | None = None
        self.timings: dict[str, float] = {}
        self._registration = Registration()

    @property
    def reader(self) -> Reader:
        """Where this cluster's reads of checkpoint records run.

        :data:`~nbckpt.session.reads.LOCAL` for engines on this machine; one sending
        reads to the hosts' services (``relay``) for engines elsewhere. (Every engine
        runs one; on this machine only faults and status go there.)
        """
        here = socket.gethostname()
        if self.relay is None or all(host == here for host in self.engine_hosts):
            return LOCAL
        return Reader(self.relay)

    def __repr__(self) -> str:
        return f"JaxCluster(id={self.cluster_id!r}, engines={self.engine_ids}, {self.options})"

    @property
    def scheduler_job(self) -> str | None:
        """The scheduler's job the engines run in (``"Slurm job 42"``), if one does.

        Known when this kernel submitted it (``engines="slurm"``); None otherwise.
        """
        return None if self.cluster is None else self.launcher.job(self.cluster)

    def start(
        self, timeout_s: float = 120.0, report: Callable[[str], None] | None = None
    ) -> JaxCluster:
        """Start the controller and ``n`` engines, then join them into one JAX job.

        The controller listens on :attr:`controller_ip` (127.0.0.1 for local engines)
        with a 0.5 s heartbeat. The cluster gets a fresh id (:attr:`cluster_id`), which
        ``attach`` asks for. Local and ssh engines import jax and nbckpt's engine before
        they register (:mod:`~nbckpt.session.bootstrap`). :attr:`timings` records
        ``engines_s`` (until every engine registered), ``jax_init_s`` and ``ready_s``.

        Parameters
        ----------
        timeout_s
            How long engines may take to register, and then to join the JAX job.
        report
            Called with a line every 10 s while engines are still missing, naming the
            hosts heard from and those still awaited.

        Raises
        ------
        ValueError
            If the options do not go together (:meth:`ClusterOptions.check`).
        ClusterError
            If an engine could not be launched, exited, or did not register in time;
            the message names the hosts.
        """
        self.options.check()
        t0 = time.perf_counter()
        self.options = self.launcher.resolved()
        launcher = self.launcher
        launcher.check()
        self.cluster = launcher.make_cluster()
        self.cluster_id = self.cluster.cluster_id
        try:
            # ENGINE_MAIN is read here, at each start: a test may set another.
            self.client = launcher.start(self.cluster, timeout_s, ENGINE_MAIN)
            Arrivals(self.cluster, self.client, self.options).wait(timeout_s, report)
            self.timings["engines_s"] = time.perf_counter() - t0
            self.join_engines(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.timings["ready_s"] = time.perf_counter() - t0
        return self

    @classmethod
    def attach(
        cls,
        *,
        cluster_id: str | None = None,
        profile: str | None = None,
        devices_per_process: int = 1,
        coordinator_host: str | None = None,
        timeout_s: float = 120.0,
    ) -> JaxCluster:
        """Connect to a running ipyparallel cluster; join its engines if not done yet.

        See :func:`nbckpt.session.attach.attach`, which this calls.
        """
        from nbckpt.session.attach import attach

        return attach(
            cls,
            cluster_id=cluster_id,
            profile=profile,
            devices_per_process=devices_per_process,
            coordinator_host=coordinator_host,
            timeout_s=timeout_s,
        )

    def join_engines(self, timeout_s: float, *, probe: bool = False) -> None:
        """Put the engines in process order, join them into one JAX job, start services.

        With ``probe`` (attaching to engines that may run a job already), engines that
        were joined before are left in their job: only their services are new.
        """
        placement = self._place(timeout_s)
        if probe:
            states = self.apply(SAFE_INFO, what="probe", timeout_s=timeout_s)
            if any(s is not None and s.get("initialized") for s in states):
                asked = ask_relays(self.client, placement, self.controller_ip or "127.0.0.1")
                self.relay = use_relays(asked, self.engine_hosts, timeout_s)
                return
        self._join(placement, timeout_s)

    def _place(self, timeout_s: float) -> Placement:
        """Put the engines in process order and pick the coordinator's address."""
        dial = SSHLauncher(self.options).ssh_hostname
        placed = place(
            self.client, self.options, timeout_s, started_here=self.cluster is not None, dial=dial
        )
        self.engine_ids, self.engine_hosts = placed.engine_ids, placed.engine_hosts
        self.options = replace(self.options, coordinator_host=placed.coordinator_host)
        return placed

    def _join(self, placed: Placement, timeout_s: float) -> None:
        """Join every engine into the JAX job at once, and start the read services.

        The read services are asked for in the same breath as the join: each engine
        starts its own right after its join, with no round trip of its own.
        """
        t0 = time.perf_counter()
        self.coordinator = coordinator(placed)
        joining = send_join(self.client, self.engine_ids, self.coordinator, self.options, timeout_s)
        asked = ask_relays(self.client, placed, self.controller_ip or "127.0.0.1")
        await_join(joining, timeout_s)
        self.timings["jax_init_s"] = time.perf_counter() - t0
        if self.relay is not None:  # a restart's engines serve reads afresh
            self.relay.close_connection()
        self.relay = use_relays(asked, self.engine_hosts, timeout_s)

    def restart(self, timeout_s: float = 120.0) -> JaxCluster:
        """Stop this cluster and start a fresh one with the same options.

        A JAX process cannot rejoin a job, so every engine is new. If ``%px`` was
        activated (:meth:`activate_px`), it is activated on the new engines the same
        way, and the root registered (:meth:`register_root`) is registered again.

        Raises
        ------
        ClusterError
            For an attached cluster, before anything is stopped: nbckpt did not start
            its engines, so it cannot start them again.
        """
        if self.cluster is None and self.client is not None:
            raise ClusterError(
                "this cluster was attached, so nbckpt cannot start its engines again: stop "
                "it (%ckpt_cluster stop), start engines as you did before, then attach"
            )
        px = self._px_active
        root = self._registration.root
        self.stop()
        self.start(timeout_s)
        if px:
            self.activate_px()
        self.register_root(root)  # the new cluster has a new id, and a new record
        return self

    def register_root(self, root: str | None) -> Path | None:
        """Note ``root`` as this cluster's checkpoint root, for the Jupyter server's sidebar.

        Writes a :class:`~nbckpt.session.registry.ClusterRecord` into
        :func:`clusters_dir`, replacing this cluster's previous one; :meth:`stop`
        removes it (:class:`~nbckpt.session.registry.Registration`).

        Parameters
        ----------
        root
            The root as the client resolved it (an absolute path or a URL); None
            registers nothing.

        Returns
        -------
        Path or None
            The record written, if any.
        """
        return self._registration.write(root, profile=self.profile, cluster_id=self.cluster_id)

    def unregister_root(self) -> None:
        """Remove the record :meth:`register_root` wrote, if there is one."""
        self._registration.remove()

    def stop(self, timeout_s: float = 10.0) -> float:
        """Leave the JAX job on every engine, then stop engines and controller.

        Returns
        -------
        float
            Seconds it took.
        """
        t0 = time.perf_counter()
        self.unregister_root()
        # Teardown goes on whatever state the engines are in: each step is best effort.
        # A running cell (a --noblock training loop) is interrupted first: the request to
        # leave the job would wait behind it, and a busy engine dies slowly.
        self.interrupt_busy(min(1.0, timeout_s))
        self.leave_job(min(3.0, timeout_s))
        stop_processes(self.cluster, self.client)
        self.cluster = None
        self.forget_engines()
        if self.relay is not None:
            self.relay.close_connection()
        self.relay = None
        self.timings["stop_s"] = time.perf_counter() - t0
        return self.timings["stop_s"]
