"""How a cluster is built: :class:`ClusterOptions`, the one declaration of its options.

The cluster (:class:`~nbckpt.session.cluster.JaxCluster`) keeps one as
``cluster.options``, and ``%ckpt_cluster start`` can build one from its line; the
launchers (:mod:`nbckpt.session.launch`) read it. What must hold for a start is checked
here too (:meth:`ClusterOptions.check`), so no caller lists the rules again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LAUNCHERS", "ClusterOptions"]

#: How engines start: processes on this machine, or one of ipyparallel's launchers.
LAUNCHERS = ("local", "ssh", "mpi", "slurm")


@dataclass(frozen=True, kw_only=True)
class ClusterOptions:
    """How to start the JAX processes of a cluster.

    Attributes
    ----------
    n
        Number of engines (JAX processes) to start. With ``engines="ssh"`` it must be
        the number of entries of ``hosts`` (the magic's ``-n`` defaults to that).
    devices_per_process
        CPU devices per process (``jax_num_cpu_devices``).
    coordinator_host
        Address process 0's coordination service binds to and every engine dials.
        None: 127.0.0.1 for local engines, else the address of process 0's host on the
        route to the controller (the private network the hosts share).
    recoverable
        Keep survivors alive when a process dies (``jax_enable_recoverability``).
    profile
        ipyparallel profile (where its connection files live).
    engines
        How engines start, one of :data:`LAUNCHERS`: ``"local"`` processes on this
        machine, or ipyparallel's ``"ssh"``, ``"mpi"`` (``mpiexec``) and ``"slurm"``
        (``sbatch``) launchers, configured further in the profile's
        ``ipcluster_config.py`` as ipyparallel documents.
    hosts
        For ``"ssh"``: one entry per engine, in process order (``[user@]host[:port]``;
        repeat a host to run several engines there). Process 0, and with it the
        coordination service, runs on the first.
    controller_ip
        Where the controller listens. None: 127.0.0.1 for local engines, else this
        machine's address on the route to the first host. Never every interface.
    ssh_config
        An ssh config file for ``"ssh"`` (``ssh -F``); None uses ``~/.ssh/config``.
    python
        The Python on the hosts that has nbckpt installed (``"ssh"``); None: this
        kernel's interpreter path, right where hosts share an image or a virtualenv.
    """

    n: int = 4
    devices_per_process: int = 1
    coordinator_host: str | None = None
    recoverable: bool = True
    profile: str | None = None
    engines: str = "local"
    hosts: Sequence[str] = ()
    controller_ip: str | None = None
    ssh_config: str | None = None
    python: str | None = None

    def __post_init__(self) -> None:
        # A list of hosts (what a parser or a caller hands over) is kept as a tuple, so
        # the options stay hashable and nothing shares a list with the caller.
        object.__setattr__(self, "hosts", tuple(self.hosts))

    def check(self) -> None:
        """Check that the options go together; done by a start, not at construction.

        Raises
        ------
        ValueError
            An unknown launcher, ssh without one host per engine, hosts for another
            launcher, or fewer than one engine.
        """
        if self.engines not in LAUNCHERS:
            raise ValueError(f"engines must be one of {', '.join(LAUNCHERS)}, got {self.engines!r}")
        if self.engines == "ssh":
            if not self.hosts:
                raise ValueError("engines='ssh' needs hosts: the hosts to start engines on")
            if self.n != len(self.hosts):
                raise ValueError(
                    f"n={self.n} but {len(self.hosts)} hosts: with ssh, every engine has "
                    "its host (repeat a host to run several engines there)"
                )
        elif self.hosts:
            placer = {"mpi": "mpiexec", "slurm": "Slurm"}.get(self.engines, "this machine")
            raise ValueError(
                f"hosts are for engines='ssh'; {self.engines} engines are placed by {placer}"
            )
        if self.n < 1:
            raise ValueError(f"a cluster needs at least one engine, got n={self.n}")
