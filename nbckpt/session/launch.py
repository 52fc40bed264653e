"""How engines start: one launcher class per way, over ipyparallel's own launchers.

A launcher answers what differs between the ways engines start (:data:`LAUNCHERS
<nbckpt.session.options.LAUNCHERS>`): where the controller listens when not told, what
to check before anything starts (ssh asks every host at once), the settings ipyparallel
gets, and one line for a launch command that failed. The cluster
(:class:`~nbckpt.session.cluster.JaxCluster`) does the rest the same way for all.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shlex
import socket
import subprocess
import sys
import threading
from dataclasses import replace
from typing import Any

from nbckpt.errors import ClusterError
from nbckpt.netaddr import is_loopback, route_address
from nbckpt.session.options import ClusterOptions
from nbckpt.session.rpc import last_line

__all__ = [
    "SSH_OPTIONS",
    "Launcher",
    "LocalLauncher",
    "SSHLauncher",
    "SchedulerLauncher",
    "called_process_error",
    "launcher_for",
    "stop_processes",
]

#: ssh options nbckpt adds: a password prompt would hang the kernel, and a host that
#: does not answer should fail the start in seconds, not after TCP's two minutes.
SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]


class Launcher:
    """What every way of starting engines shares; subclasses say what differs.

    By default ipyparallel starts the engines with the command the profile gives them.

    Parameters
    ----------
    options
        The cluster's options.
    """

    def __init__(self, options: ClusterOptions) -> None:
        self.options = options

    def default_controller_ip(self) -> str:
        """Where the controller listens when not told: reachable, never every interface."""
        raise NotImplementedError

    def resolved(self) -> ClusterOptions:
        """The options with the controller's address filled in where they left it out."""
        if self.options.controller_ip is not None:
            return self.options
        return replace(self.options, controller_ip=self.default_controller_ip())

    def check(self) -> None:
        """Check, before anything starts, what would make the engines fail to start."""

    def job(self, cluster: Any) -> str | None:
        """The scheduler's job ``cluster``'s engines run in, in words; None if none."""
        return None

    def config(self) -> Any:
        """The settings (a traitlets ``Config``) ipyparallel gets for the engines, or None."""
        return None

    def make_cluster(self) -> Any:
        """The ipyparallel ``Cluster`` to start: its controller on ``controller_ip``.

        The controller's 0.5 s heartbeat lets engines register in about 3 s instead of
        about 7, and tells of a dead engine within about a second. No cluster file is
        written (``cluster_file=""``): ipyparallel's server extension would find it,
        adopt the cluster, and log every engine's and the controller's output into the
        Jupyter server's log when they stop (thousands of lines a session). Attaching
        needs only the controller's connection files, which are still written.
        """
        import ipyparallel as ipp

        o = self.options
        kwargs: dict[str, Any] = {
            "n": o.n,
            "controller_ip": o.controller_ip,
            "controller_args": ["--HeartMonitor.period=500"],
            "log_level": 40,
            "engines": o.engines,
            "cluster_file": "",
        }
        if o.profile:
            kwargs["profile"] = o.profile
        config = self.config()
        if config is not None:
            kwargs["config"] = config
        return ipp.Cluster(**kwargs)

    def engine_kwargs(self, cluster: Any, timeout_s: float, engine_code: str) -> dict[str, Any]:
        """Arguments of ``start_engines``: none, the profile's command stands.

        Such engines run ``python -m ipyparallel.engine`` by default, and import jax at
        the join.
        """
        return {}

    def start(self, cluster: Any, timeout_s: float, engine_code: str) -> Any:
        """Start the controller and the engines of ``cluster``; a client connected to it.

        ``engine_code`` is the ``python -c`` code the engines nbckpt starts run (see
        :mod:`nbckpt.session.bootstrap`).

        Raises
        ------
        ClusterError
            If a launch command failed (ssh, mpiexec, sbatch): :meth:`launch_failed`.
        """
        try:
            # Not start_cluster: it sleeps a second between the controller and the
            # engines, which wait for the controller's connection files anyway. Not
            # start_and_connect: its wait knows no hosts, and says nothing while it
            # waits; the cluster's names them.
            cluster.start_controller_sync()
            cluster.start_engines_sync(**self.engine_kwargs(cluster, timeout_s, engine_code))
            return cluster.connect_client_sync()
        except Exception as e:
            failed = called_process_error(e)
            if failed is None:
                raise
            raise self.launch_failed(failed) from None

    def launch_failed(self, e: subprocess.CalledProcessError) -> ClusterError:
        """One line for a launch command that failed (ssh, mpiexec, sbatch)."""
        return ClusterError(f"the {self.options.engines} launcher failed: {_detail(e)}")


class SchedulerLauncher(Launcher):
    """``"mpi"`` and ``"slurm"`` engines: placed by mpiexec or Slurm as the profile says."""

    def check(self) -> None:
        """MPI engines need mpi4py: ipyparallel takes their ids from their MPI ranks.

        Asked of this kernel's Python, which is the engines' too on this machine and
        wherever hosts share its environment.
        """
        if self.options.engines == "mpi" and importlib.util.find_spec("mpi4py") is None:
            raise ClusterError(
                "mpi engines need mpi4py (ipyparallel takes their ids from MPI ranks): "
                "pip install mpi4py, here and wherever the engines run; nothing was started"
            )

    def job(self, cluster: Any) -> str | None:
        """``Slurm job 42``: the id ``sbatch`` answered ipyparallel's launcher with."""
        if self.options.engines != "slurm":
            return None
        for engine_set in (getattr(cluster, "engines", None) or {}).values():
            job = getattr(engine_set, "job_id", None)
            if job:
                return f"Slurm job {job}"
        return None

    def default_controller_ip(self) -> str:
        """The address of this machine's name, which the scheduler's hosts resolve too."""
        with contextlib.suppress(OSError):
            address = socket.gethostbyname(socket.gethostname())
            if self.options.engines == "mpi" or not is_loopback(address):
                return address
        raise ClusterError(
            f"this machine's name {socket.gethostname()!r} does not resolve to an address "
            f"the {self.options.engines} hosts can reach; pass --controller-ip with this "
            "machine's address on the hosts' network"
        )


def _configured(cluster: Any, trait: str) -> bool:
    """Whether the profile's config sets ``trait`` of the cluster's engine launcher."""
    launcher = cluster.engine_launcher_class
    return any(f"{k.__name__}.{trait}" in cluster.config for k in launcher.mro())


class LocalLauncher(Launcher):
    """Engines on this machine, started with the controller and listening on loopback."""

    def default_controller_ip(self) -> str:
        """127.0.0.1: the engines are on this machine."""
        return "127.0.0.1"

    def engine_kwargs(self, cluster: Any, timeout_s: float, engine_code: str) -> dict[str, Any]:
        """Engines run ``engine_code``, unless the profile's config gives them a command.

        They also start with the controller, not after it: they wait for its
        connection file themselves, for up to ``timeout_s``.
        """
        if _configured(cluster, "engine_cmd"):
            return {}
        cluster.send_engines_connection_env = False
        wait = f"--IPEngine.wait_for_url_file={timeout_s:g}"
        kwargs: dict[str, Any] = {"engine_cmd": [sys.executable, "-c", engine_code, wait]}
        if not _configured(cluster, "delay"):
            # ipyparallel waits 0.1 s between local engines so that their ids come in
            # order; nbckpt orders them itself.
            kwargs["delay"] = 0.0
        return kwargs


class SSHLauncher(Launcher):
    """Engines on the ssh ``hosts``, one per entry, with nbckpt's ssh options."""

    @property
    def python(self) -> str:
        """The hosts' Python: as given, else this kernel's interpreter path."""
        return self.options.python or sys.executable

    def ssh_command(self, host: str | None = None) -> list[str]:
        """``ssh`` with nbckpt's options, and ``[user@]host[:port]`` as ssh takes it."""
        config = self.options.ssh_config
        argv = ["ssh", *(["-F", config] if config else []), *SSH_OPTIONS]
        if host is None:
            return argv
        user, at, rest = host.rpartition("@")
        name, colon, port = rest.partition(":")
        if colon and port.isdigit():  # ipyparallel's host:port, which ssh spells -p
            return [*argv, "-p", port, f"{user}{at}{name}"]
        return [*argv, host]

    def ssh_hostname(self, host: str) -> str:
        """The address ssh dials for ``host``, as its config resolves it (``ssh -G``)."""
        *options, target = self.ssh_command(host)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [*options, "-G", target],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
            for line in out.splitlines():
                key, _, value = line.partition(" ")
                if key == "hostname" and value:
                    return value
        return host.rpartition("@")[2].partition(":")[0]

    def default_controller_ip(self) -> str:
        """This machine's address on the route to the first host."""
        first = self.options.hosts[0]
        target = self.ssh_hostname(first)
        try:
            return route_address(target)
        except OSError as e:
            raise ClusterError(
                f"cannot tell which address of this machine {first} ({target}) "
                f"reaches ({e}); pass --controller-ip with this machine's address on "
                "the hosts' network"
            ) from None

    def check(self, timeout_s: float = 60.0) -> None:
        """Ask every host at once, over ssh, whether its Python has nbckpt and ipyparallel.

        ipyparallel's launcher asks one host after the other and lets ssh's own message
        go to the kernel's terminal; this names every failing host with ssh's line.
        """
        # ssh hands the remote shell one line, so the command is quoted as a shell would.
        probe = shlex.join([self.python, "-c", "import ipyparallel, nbckpt"])
        procs = {
            host: subprocess.Popen(
                [*self.ssh_command(host), probe],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for host in dict.fromkeys(self.options.hosts)
        }
        errors = []
        for host, proc in procs.items():
            try:
                _out, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                errors.append(f"{host}: no answer over ssh within {timeout_s:g} s")
                continue
            if proc.returncode == 255:  # ssh's own failure
                errors.append(f"{host}: ssh failed: {last_line(err)}")
            elif proc.returncode != 0:
                errors.append(f"{host}: {self.python} cannot run nbckpt there: {last_line(err)}")
        if errors:
            raise ClusterError(
                "could not start engines over ssh on " + "; ".join(errors) + "; check that "
                "`ssh HOST` works without a password prompt (keys, known_hosts; --ssh-config) "
                "and that --python names a Python with nbckpt installed on every host"
            )

    def config(self) -> Any:
        """Settings of ipyparallel's ssh launcher: engines per host, ssh options, Python."""
        from traitlets.config import Config

        counts: dict[str, int] = {}
        for host in self.options.hosts:
            counts[host] = counts.get(host, 0) + 1
        options = self.ssh_command()[1:]
        config = Config()
        launcher = config.SSHEngineSetLauncher
        # The engines get the connection info in $IPP_CONNECTION_INFO, so the files are
        # not copied: one scp fewer per host, and where the hosts share this home (NFS)
        # the copy would overwrite the controller's own file with itself.
        launcher.engines = {host: {"n": n, "to_send": []} for host, n in counts.items()}
        launcher.remote_python = self.python
        launcher.ssh_args = list(options)
        launcher.scp_args = list(options)
        return config

    def engine_kwargs(self, cluster: Any, timeout_s: float, engine_code: str) -> dict[str, Any]:
        """Engines run ``engine_code``, unless the profile's config gives them a command."""
        if _configured(cluster, "engine_cmd"):
            return {}
        return {"engine_cmd": [self.python, "-c", engine_code]}

    def launch_failed(self, e: subprocess.CalledProcessError) -> ClusterError:
        """One line naming the host whose ssh command failed, and what to check."""
        cmd = e.cmd if isinstance(e.cmd, list) else str(e.cmd).split()
        host = next((h for h in self.options.hosts if h in cmd), "a host")
        return ClusterError(
            f"could not start an engine on {host} over ssh: {_detail(e)}; check that "
            f"`ssh {host}` works without a password prompt and that "
            f"{self.python} exists there with nbckpt installed (--python)"
        )


def launcher_for(options: ClusterOptions) -> Launcher:
    """The launcher of ``options.engines``."""
    kinds: dict[str, type[Launcher]] = {"local": LocalLauncher, "ssh": SSHLauncher}
    return kinds.get(options.engines, SchedulerLauncher)(options)


def _detail(e: subprocess.CalledProcessError) -> str:
    out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else e.output
    err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
    return last_line(err or out or f"exit status {e.returncode}")


def called_process_error(exc: BaseException | None) -> subprocess.CalledProcessError | None:
    """The failed launch command behind a launcher's error, if there is one."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, subprocess.CalledProcessError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _shutdown_engines(client: Any, timeout_s: float) -> None:
    """Ask every engine of ``client`` to shut down; wait for their answers, a while.

    Waiting matters: the requests leave on the client's own thread, and a client closed
    at once may drop them unsent, leaving the engines (and an allocation of the
    user's that holds them) running. An engine that does not answer (dead, or hung)
    is not waited for past ``timeout_s``.
    """

    def ask() -> None:
        with contextlib.suppress(Exception):
            client.shutdown(targets="all", hub=False, block=True)

    asking = threading.Thread(target=ask, name="nbckpt-shutdown", daemon=True)
    asking.start()
    asking.join(timeout_s)


def stop_processes(cluster: Any, client: Any) -> None:
    """Stop the engines and controller, then close the client.

    All of a ``cluster`` this kernel started; else (attached) the engines of ``client``,
    not the controller, which is not ours. Best effort, whatever state they are in:
    each step goes on if one before failed.
    """
    if cluster is not None:
        with contextlib.suppress(Exception):
            cluster.stop_cluster_sync()
    elif client is not None:
        _shutdown_engines(client, timeout_s=5.0)
    if client is not None:
        with contextlib.suppress(Exception):
            client.close()
