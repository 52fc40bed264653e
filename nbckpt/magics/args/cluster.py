"""``%ckpt_cluster``'s arguments: start, attach, status, stop, restart."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from IPython.core.magic_arguments import argument

from nbckpt.magics.args.base import (
    MAX_PROCESSES,
    MagicArgs,
    directory,
    seconds,
    timeout_arg,
    whole,
)
from nbckpt.session.options import LAUNCHERS, ClusterOptions

# -- the magics' arguments -----------------------------------------------------------

CLUSTER: Final = MagicArgs(
    "ckpt_cluster",
    argument(
        "action",
        choices=["start", "stop", "status", "attach", "restart"],
        help="start a new cluster, attach to a running one, show it, stop it, or "
        "restart it with fresh engines",
    ),
    argument(
        "-n",
        default=None,
        help=f"number of engines / JAX processes, 1 to {MAX_PROCESSES} (start; default 4, "
        "or one per --hosts entry)",
    ),
    argument(
        "--devices-per-process",
        default="1",
        help=f"CPU devices per process, 1 to {MAX_PROCESSES} (default 1)",
    ),
    argument("--dir", help="default checkpoint directory for the other magics"),
    argument(
        "--engines",
        choices=list(LAUNCHERS),
        default="local",
        help="how engines start (start): on this machine, or with ipyparallel's ssh, "
        "mpi (mpiexec) or slurm (sbatch) launcher (default local)",
    ),
    argument(
        "--hosts",
        metavar="H0,H1,...",
        help="ssh hosts, one per engine in process order; process 0 runs on the first "
        "(start --engines ssh)",
    ),
    argument(
        "--controller-ip",
        metavar="ADDR",
        help="where the controller listens (start; default 127.0.0.1 for local "
        "engines, this machine's address toward the first host for ssh, the address "
        "of this machine's name for mpi and slurm)",
    ),
    argument(
        "--coordinator-host",
        metavar="ADDR",
        help="address of process 0's coordination service (default 127.0.0.1 for "
        "local engines, else process 0's address toward the controller)",
    ),
    argument("--ssh-config", metavar="FILE", help="ssh config file, as ssh -F (start)"),
    argument(
        "--python",
        metavar="PATH",
        help="Python with nbckpt on the ssh hosts (start; default this kernel's)",
    ),
    argument("--profile", help="ipyparallel profile (start, attach)"),
    timeout_arg(120.0, "deadline for engines to register and join (start, attach)"),
    argument(
        "--cluster-id",
        help="id of the cluster to attach to, as start prints it (required by attach)",
    ),
)


@dataclass(frozen=True, kw_only=True)
class ClusterArgs:
    """``%ckpt_cluster``: the action and, for start / attach, how to build the cluster.

    Attributes
    ----------
    options
        The cluster's options, the same object :class:`~nbckpt.session.JaxCluster`
        takes; ``attach`` reads its ``profile``, ``devices_per_process`` and
        ``coordinator_host``.
    """

    action: str
    options: ClusterOptions
    directory: str | None
    cluster_id: str | None
    timeout_s: float


#: What only ``start`` takes, by its flag and the name argparse gives it.
_START_ONLY = {
    "-n": "n",
    "--engines": "engines",
    "--hosts": "hosts",
    "--controller-ip": "controller_ip",
    "--ssh-config": "ssh_config",
    "--python": "python",
}


def _address(text: str | None, flag: str) -> str | None:
    if text is None:
        return None
    if not text.strip() or any(c.isspace() for c in text):
        raise ValueError(f"{flag} needs a host name or address, got {text!r}")
    return text


def _hosts(text: str | None, engines: str) -> list[str]:
    if text is None:
        if engines == "ssh":
            raise ValueError("--engines ssh needs --hosts H0,H1,... (one per engine)")
        return []
    if engines != "ssh":
        raise ValueError(f"--hosts is for --engines ssh; {engines} engines are placed otherwise")
    hosts = [h.strip() for h in text.split(",")]
    if not all(hosts) or any(any(c.isspace() for c in h) for h in hosts):
        raise ValueError(f"--hosts takes names separated by commas, got {text!r}")
    return hosts


def parse_cluster_args(line: str) -> ClusterArgs:
    """Parse and check ``%ckpt_cluster``'s line; raise UsageError if anything is wrong."""
    ns = CLUSTER.parse(line)
    with CLUSTER.checking():
        if ns.action != "start":
            given = [
                f for f, name in _START_ONLY.items() if getattr(ns, name) not in (None, "local")
            ]
            if given:
                raise ValueError(f"{', '.join(given)} only go with start, not {ns.action}")
        hosts = _hosts(ns.hosts, ns.engines)
        n = whole(ns.n, "-n", low=1, high=MAX_PROCESSES) if ns.n is not None else None
        if hosts and n is not None and n != len(hosts):
            raise ValueError(
                f"-n {n} but {len(hosts)} --hosts: with ssh every engine has its host "
                "(repeat a host to run several engines there)"
            )
        for path, flag in ((ns.ssh_config, "--ssh-config"), (ns.python, "--python")):
            if path is not None and (ns.engines != "ssh" or not path.strip()):
                raise ValueError(f"{flag} needs a path, and is for --engines ssh")
        # Checked in the order of the line's help, so a line with two mistakes names
        # the same one first as before.
        devices = whole(ns.devices_per_process, "--devices-per-process", low=1, high=MAX_PROCESSES)
        root = directory(ns.dir)
        controller_ip = _address(ns.controller_ip, "--controller-ip")
        coordinator_host = _address(ns.coordinator_host, "--coordinator-host")
        options = ClusterOptions(
            n=n if n is not None else len(hosts) or 4,
            devices_per_process=devices,
            coordinator_host=coordinator_host,
            profile=ns.profile,
            engines=ns.engines,
            hosts=hosts,
            controller_ip=controller_ip,
            ssh_config=None if ns.ssh_config is None else os.path.expanduser(ns.ssh_config),
            python=ns.python,
        )
        return ClusterArgs(
            action=ns.action,
            options=options,
            directory=root,
            cluster_id=ns.cluster_id,
            timeout_s=seconds(ns.timeout, "--timeout"),
        )
