"""A real Slurm cluster on the test hosts: slurmctld on h0, one slurmd on every other host.

:class:`SlurmHosts` turns :class:`~tests.testhosts.TestHosts` (network namespaces, each
with its own address and host name) into a Slurm cluster of Debian's ``slurm-wlm``:
``slurmctld`` runs on host 0, ``slurmd`` on hosts 1..N-1 (the compute nodes, one
partition), and one ``munged`` with a key of the test's own authenticates them all
(its socket is a file, which every namespace reaches). The daemons bind inside their
hosts' namespaces, so only the test hosts' addresses are ever used; ``sbatch`` and
``squeue`` from this machine (the notebook's, the network's gateway) find the
controller through :attr:`SlurmHosts.env` (``SLURM_CONF``). Nothing of the machine's own
Slurm or munge configuration is read or written.

Jobs run as root (CI runs as root), without cgroups: ``proctrack/linuxproc`` and
``task/none``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.testhosts import TestHosts

__all__ = ["SlurmHosts", "unavailable"]

PARTITION = "nbckpt"


def unavailable() -> str | None:
    """Why a Slurm cluster cannot run here, or None if it can."""
    for tool in ("slurmctld", "slurmd", "sbatch", "munged"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} is not installed (make host-deps installs slurm-wlm and munge)"
    return None


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmHosts:
    """slurmctld on host 0 and slurmd on the others, with their own munge and config.

    Parameters
    ----------
    hosts
        Test hosts made with ``gateway=True`` (this machine submits the jobs).
    workdir
        A directory of the test's for the key, the config, state and logs.
    """

    __test__ = False  # a fixture, not a test class

    def __init__(self, hosts: TestHosts, workdir: Path) -> None:
        why = unavailable()
        if why is not None:
            raise RuntimeError(why)
        if hosts.gateway is None or len(hosts) < 2:
            raise ValueError("SlurmHosts needs TestHosts(n >= 2, gateway=True)")
        self.hosts = hosts
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf = self.dir / "slurm.conf"
        self.socket = self.dir / "munge" / "munge.socket"
        self.nodes = [h.name for h in hosts.hosts[1:]]
        self._procs: list[subprocess.Popen[bytes]] = []
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    @property
    def env(self) -> dict[str, str]:
        """The environment in which Slurm's commands reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def _start(self) -> None:
        munge = self.socket.parent
        munge.mkdir(mode=0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn(
            [
                _tool("munged"),
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={self.socket}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
            self.dir / "munged.out",
        )
        self._wait(lambda: self.socket.exists(), "munged's socket", self.dir / "munged.out")
        self.conf.write_text(self._config())
        # slurmd loads its cgroup plugin whatever tracks the jobs, and `ip netns exec`
        # gives each host a /sys of its own, without cgroups: slurmd mounts them there.
        (self.dir / "cgroup.conf").write_text("CgroupAutomount=yes\nCgroupPlugin=cgroup/v1\n")
        (self.dir / "state").mkdir()
        head = self.hosts.hosts[0]
        self._spawn(
            self.hosts.command(0, [_tool("slurmctld"), "-D", "-f", str(self.conf)]),
            self.dir / "slurmctld.out",
        )
        for h in self.hosts.hosts[1:]:
            (self.dir / f"spool-{h.name}").mkdir()
            self._spawn(
                self.hosts.command(
                    h.index, [_tool("slurmd"), "-D", "-N", h.name, "-f", str(self.conf)]
                ),
                self.dir / f"slurmd-{h.name}.out",
            )
        self._wait(self._nodes_idle, f"slurmctld on {head.name} and idle nodes", self.dir)

    def _config(self) -> str:
        head = self.hosts.hosts[0]
        # One CPU a node: a job of n tasks then spans n hosts, as one engine per host.
        nodes = "".join(
            f"NodeName={h.name} NodeAddr={h.address} CPUs=1 State=UNKNOWN\n"
            for h in self.hosts.hosts[1:]
        )
        d = self.dir
        return (
            "ClusterName=nbckpt-test\n"
            f"SlurmctldHost={head.name}({head.address})\n"
            "SlurmUser=root\n"
            "SlurmdUser=root\n"
            "AuthType=auth/munge\n"
            "CredType=cred/munge\n"
            f"AuthInfo=socket={self.socket}\n"
            "SlurmctldPort=6817\n"
            "SlurmdPort=6818\n"
            f"StateSaveLocation={d / 'state'}\n"
            f"SlurmdSpoolDir={d}/spool-%n\n"
            f"SlurmctldPidFile={d / 'slurmctld.pid'}\n"
            f"SlurmdPidFile={d}/slurmd-%n.pid\n"
            f"SlurmctldLogFile={d / 'slurmctld.log'}\n"
            f"SlurmdLogFile={d}/slurmd-%n.log\n"
            "ProctrackType=proctrack/linuxproc\n"
            "TaskPlugin=task/none\n"
            "MpiDefault=none\n"
            "ReturnToService=2\n"
            "SchedulerType=sched/builtin\n"
            "SelectType=select/cons_tres\n"
            "SelectTypeParameters=CR_Core\n"
            "AccountingStorageType=accounting_storage/none\n"
            "JobCompType=jobcomp/none\n"
            "JobAcctGatherType=jobacct_gather/none\n"
            "SlurmctldTimeout=30\n"
            "SlurmdTimeout=30\n"
            "InactiveLimit=0\n"
            "KillWait=5\n"
            "MinJobAge=30\n"
            f"{nodes}"
            f"PartitionName={PARTITION} Nodes={','.join(self.nodes)} Default=YES "
            "MaxTime=INFINITE State=UP OverSubscribe=YES\n"
        )

    def _spawn(self, argv: list[str], log: Path) -> None:
        out = log.open("wb")
        self._procs.append(subprocess.Popen(argv, stdout=out, stderr=out))

    def run(self, *argv: str, check: bool = True) -> str:
        """A Slurm command run from this machine against this cluster; its output."""
        done = subprocess.run(
            list(argv), capture_output=True, text=True, env={**os.environ, **self.env}
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
        return done.stdout

    def _nodes_idle(self) -> bool:
        states = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).split()
        return len(states) == 2 * len(self.nodes) and all(
            s.rstrip("*") == "idle" for s in states[1::2]
        )

    def _wait(self, ready: object, what: str, logs: Path, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():  # type: ignore[operator]
            if time.monotonic() > deadline:
                tails = []
                for log in sorted(logs.glob("*.out")) + sorted(logs.glob("*.log")):
                    text = log.read_text(errors="replace").strip().splitlines()[-5:]
                    tails.append(f"{log.name}: " + " | ".join(text))
                raise RuntimeError(f"{what} not ready within {timeout_s:g} s; " + "; ".join(tails))
            time.sleep(0.3)

    def jobs(self) -> list[str]:
        """The ids of the jobs Slurm still holds (pending, running or completing)."""
        return self.run("squeue", "-h", "-o", "%i", check=False).split()

    def close(self) -> None:
        """Stop every daemon and every process left on the hosts (engines included)."""
        for h in self.hosts.hosts:
            self.hosts.kill(h.index)
        for proc in self._procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=10)
        self._procs.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
