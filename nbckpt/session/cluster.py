"""Start, attach to and stop an ipyparallel cluster whose engines form one JAX job.

Every engine is one JAX process. Its rank is its position among the engine ids, and
process 0 hosts the coordination service. The notebook never imports jax, nor any of
``nbckpt.engine``: engine functions are sent by name (:func:`remote`) and imported on
the engines, as :mod:`nbckpt.procgroup` does for its workers.

The engines nbckpt starts locally or over ssh run :func:`engine_main`, which imports
:data:`PRELOAD` (jax, tensorstore, nbckpt's engine) before the engine starts (a local
engine, while the controller starts), so that joining the JAX job does not begin with
a second of imports on every engine.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import importlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbckpt.errors import ClusterError, ClusterGoneError, by_process, who
from nbckpt.netaddr import is_loopback, route_address

__all__ = [
    "AGENT",
    "ENGINE_DIED",
    "ENGINE_MAIN",
    "LAUNCHERS",
    "PRELOAD",
    "PROCESS",
    "ClusterError",
    "ClusterGoneError",
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

#: The engine-side modules the notebook calls into, by name only.
AGENT = "nbckpt.engine.remote.agent"
PROCESS = "nbckpt.engine.sync.process"
HOST_INFO = "nbckpt.netaddr:host_info"
RELAY = "nbckpt.engine.remote.relay"
#: Engine-side functions of this module, which the engines have imported already.
_PROBE = "nbckpt.session.cluster:_probe_engine"
_JOIN = "nbckpt.session.cluster:_join_engine"

#: What the engines nbckpt starts import before they register (:func:`engine_main`):
#: all that joining the JAX job and the first save need. Imports only: none of them
#: touches a device, since JAX's backends must not exist before
#: ``jax.distributed.initialize``.
PRELOAD = ("jax", "tensorstore", PROCESS, AGENT, RELAY)

#: ``python -c`` code of the engines nbckpt starts locally and over ssh, in place of
#: ipyparallel's ``python -m ipyparallel.engine``.
ENGINE_MAIN = "from nbckpt.session.cluster import engine_main; engine_main()"

#: How engines can be started: ipyparallel's engine launchers, by the names it uses.
LAUNCHERS = ("local", "ssh", "mpi", "slurm")

#: ssh options nbckpt adds: a password prompt would hang the kernel, and a host that
#: does not answer should fail the start in seconds, not after TCP's two minutes.
SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]


def call(ref: str, *args: Any, **kwargs: Any) -> Any:
    """Import ``module:function`` here and call it; meant to run on an engine.

    Parameters
    ----------
    ref
        ``"package.module:function"``, importable where this runs.
    """
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)(*args, **kwargs)


def remote(ref: str) -> Callable[..., Any]:
    """Return a callable to send to engines that runs ``module:function`` there.

    Sending the function object itself would import its module, and with it jax and
    tensorstore, into the notebook's kernel; this sends only its name. ipyparallel
    pickles :func:`call` by reference to this module, which needs no jax.
    """
    return functools.partial(call, ref)


# -- engine side: the early imports, the probe and the join -----------------------------

#: What the early import of this engine did (see :func:`preload_report`).
_preload: dict[str, Any] = {}


def _run_preload() -> None:
    began = time.perf_counter()
    _preload.update(started=True, jax_before="jax" in sys.modules, error=None)
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    except BaseException as e:  # the join imports them again, and reports what fails
        _preload["error"] = f"{type(e).__name__}: {_short(str(e))}"
    finally:
        _preload["seconds"] = time.perf_counter() - began


def engine_main() -> None:
    """Run an ipyparallel engine that has imported :data:`PRELOAD` before it starts.

    Engine-side: what the engines nbckpt starts locally and over ssh run (``python -c``
    :data:`ENGINE_MAIN`, with ipyparallel's engine arguments after it). A local engine
    starts beside the controller, and imports while the controller writes its
    connection file. The imports run in the engine's only thread: in a background
    thread, beside the engine's registration, they raced with code that walks
    ``sys.modules`` (debugpy, imported while the engine registers, failed with
    "dictionary changed size during iteration"), and the engine exited unregistered.
    """
    if hasattr(signal, "SIGUSR1"):
        # An engine that never registers is asked for its stacks (_missing_text): the
        # dump lands in its output file, which the error quotes.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    _run_preload()
    _await_url_file(sys.argv)
    from ipyparallel.engine.app import main

    main()


def _await_url_file(argv: list[str]) -> None:
    """Wait until the controller's engine connection file exists and parses.

    A local engine starts beside the controller and reads that file once it exists;
    the controller creates it before it writes it, so an engine that read it in between
    would die on half a file. Engines given ``$IPP_CONNECTION_INFO`` (ssh) read no file.
    """
    if os.environ.get("IPP_CONNECTION_INFO") or not os.environ.get("IPP_PROFILE_DIR"):
        return
    wait = [a.split("=", 1)[1] for a in argv if a.startswith("--IPEngine.wait_for_url_file=")]
    deadline = time.monotonic() + (float(wait[-1]) if wait else 30.0)
    cluster_id = os.environ.get("IPP_CLUSTER_ID")
    name = f"ipcontroller-{cluster_id}-engine.json" if cluster_id else "ipcontroller-engine.json"
    path = Path(os.environ["IPP_PROFILE_DIR"]) / "security" / name
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            json.loads(path.read_text())
            return
        time.sleep(0.02)
    # Past the deadline the engine itself says which file never came.


def preload_report() -> dict[str, Any]:
    """Engine-side: what this engine's early import of :data:`PRELOAD` did.

    Returns
    -------
    dict
        ``started``: whether the imports ran here, False for an engine that did not
        start with :func:`engine_main` (one you started yourself). If they did,
        ``jax_before`` (whether jax was imported before they began, which would leave
        them nothing to do), ``error`` (None, or the import's error) and ``seconds``
        (how long they took). After the join, ``jax_at_join`` (whether jax was in
        ``sys.modules`` when the join began).
    """
    return {"started": False, **_preload}


def _free_port(host: str) -> int:
    """A TCP port free now on ``host``: where process 0's coordination service will bind."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _probe_engine(toward: str, bind: str | None) -> dict[str, Any]:
    """Engine-side: :func:`~nbckpt.netaddr.host_info`, plus a port free on this host.

    The port is for the coordination service in case this engine becomes process 0:
    picked on ``bind``, or (None) on this host's address toward ``toward``. It needs no
    jax, so it answers at once from an engine that was not started with
    :func:`engine_main` either.
    """
    from nbckpt.netaddr import host_info

    info = host_info(toward)
    with contextlib.suppress(OSError):
        info["port"] = _free_port(bind or info["address"] or "127.0.0.1")
    return info


def _join_engine(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """Engine-side: :func:`nbckpt.engine.sync.process.initialize`, noting what was imported."""
    _preload["jax_at_join"] = "jax" in sys.modules
    from nbckpt.engine.sync.process import initialize

    return initialize(*args, **kwargs)


def _short(text: str) -> str:
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else str(text)


#: How an engine's death reads in an error.
ENGINE_DIED = "EngineError: the engine died (its process exited)"


def _error_text(exc: BaseException) -> str:
    """One line for one engine's error (a RemoteError, or an EngineError on death)."""
    ename = getattr(exc, "ename", None)
    text = (
        f"{ename}: {_short(getattr(exc, 'evalue', ''))}"
        if ename
        else (f"{type(exc).__name__}: {_short(str(exc))}")
    )
    return ENGINE_DIED if "died while running" in text or ename == "EngineError" else text


def errors_by_process(what: str, errors: dict[int, str]) -> ClusterError:
    """One :class:`ClusterError` for per-process error texts, grouping equal texts.

    ``-1`` stands for an engine that could not be matched to a process.
    """
    procs = sorted(r for r in errors if r >= 0)
    return ClusterError(f"{what} failed on {by_process(errors)}", procs, causes=errors)


def engine_errors(exc: BaseException, ranks: dict[int, int], what: str) -> ClusterError:
    """Turn an ipyparallel error into one :class:`ClusterError` that names processes.

    Parameters
    ----------
    exc
        A ``CompositeError``, ``RemoteError`` or ``EngineError`` from ipyparallel.
    ranks
        Engine id -> JAX process index.
    what
        What was being done, for the message (``"save"``, ``"barrier"``, ...).
    """
    import ipyparallel as ipp

    if isinstance(exc, ipp.error.CompositeError):
        items = [(e[3].get("engine_id"), f"{e[0]}: {_short(e[1])}") for e in exc.elist]
        items = [(eid, ENGINE_DIED if "died while running" in t else t) for eid, t in items]
    else:
        eid = (getattr(exc, "engine_info", None) or {}).get("engine_id")
        items = [(eid, _error_text(exc))]
    errors: dict[int, str] = {}
    for n, (eid, text) in enumerate(items):
        rank = ranks.get(eid, -1) if eid is not None else -1
        errors[rank if rank >= 0 else -1 - n] = text
    return errors_by_process(what, errors)


@dataclass
class JaxCluster:
    """An ipyparallel cluster whose engines are joined by ``jax.distributed``.

    Parameters
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
    hosts: list[str] = field(default_factory=list)
    controller_ip: str | None = None
    ssh_config: str | None = None
    python: str | None = None
    cluster: Any = None
    client: Any = None
    cluster_id: str | None = None
    engine_ids: list[int] = field(default_factory=list)
    engine_hosts: list[str] = field(default_factory=list)
    coordinator: str | None = None
    relay: Any = None
    timings: dict[str, float] = field(default_factory=dict)
    _view: Any = field(default=None, init=False, repr=False)
    _px_active: bool = field(default=False, init=False, repr=False)
    _registered: tuple[Path, str] | None = field(default=None, init=False, repr=False)

    @property
    def ranks(self) -> dict[int, int]:
        """Engine id -> JAX process index."""
        return {eid: i for i, eid in enumerate(self.engine_ids)}

    @property
    def view(self) -> Any:
        """The DirectView on every engine, in rank order; the one ``%px`` uses.

        It is one object for as long as the engines stay the same: settings made on
        it (``block``) hold for the next use, which a fresh view per access would lose.
        """
        view = self._view
        if view is None or view.client is not self.client or view.targets != self.engine_ids:
            view = self._view = self.client.direct_view(targets=list(self.engine_ids))
        return view

    def activate_px(self) -> Any:
        """Make ``%px`` / ``%%px`` run on every engine, blocking; return that view.

        Blocking matters: the cell then waits for the engines, shows their output and
        raises their errors. A non-blocking ``%px`` returns at once, so an error on the
        engines goes unseen and the next cell runs on state that is not there.
        :meth:`restart` does it again on the new engines if it was done before.
        """
        view = self.view
        view.block = True
        view.activate()
        self._px_active = True
        return view

    def _check_settings(self) -> None:
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

    def start(
        self, timeout_s: float = 120.0, report: Callable[[str], None] | None = None
    ) -> JaxCluster:
        """Start the controller and ``n`` engines, then join them into one JAX job.

        The controller listens on :attr:`controller_ip` (127.0.0.1 for local engines)
        with a 0.5 s heartbeat, so engines register in about 3 s instead of about 7.
        The cluster gets a fresh id (:attr:`cluster_id`), which ``attach`` asks for.
        Local and ssh engines import jax and nbckpt's engine before they register
        (:func:`engine_main`). :attr:`timings` records ``engines_s`` (until every
        engine registered), ``jax_init_s`` (the join) and ``ready_s``.

        Parameters
        ----------
        timeout_s
            How long engines may take to register, and then to join the JAX job.
        report
            Called with a line every 10 s while engines are still missing, naming the
            hosts heard from and those still awaited.

        Raises
        ------
        ClusterError
            If an engine could not be launched, exited, or did not register in time;
            the message names the hosts.
        """
        import ipyparallel as ipp

        self._check_settings()
        t0 = time.perf_counter()
        if self.controller_ip is None:
            self.controller_ip = self._default_controller_ip()
        kwargs: dict[str, Any] = {
            "n": self.n,
            "controller_ip": self.controller_ip,
            "controller_args": ["--HeartMonitor.period=500"],
            "log_level": 40,
            "engines": self.engines,
        }
        if self.profile:
            kwargs["profile"] = self.profile
        if self.engines == "ssh":
            self._check_ssh_hosts()
            kwargs["config"] = self._ssh_config()
        self.cluster = ipp.Cluster(**kwargs)
        self.cluster_id = self.cluster.cluster_id
        try:
            try:
                # Not start_cluster: it sleeps a second between the controller and the
                # engines, which wait for the controller's connection files anyway. Not
                # start_and_connect: its wait knows no hosts, and says nothing while it
                # waits; ours names them.
                self.cluster.start_controller_sync()
                self.cluster.start_engines_sync(**self._engine_kwargs(timeout_s))
                self.client = self.cluster.connect_client_sync()
            except Exception as e:
                failed = _called_process_error(e)
                if failed is None:
                    raise
                raise self._launch_failed(failed) from None
            self._wait_for_engines(timeout_s, report)
            self.timings["engines_s"] = time.perf_counter() - t0
            port = self._place_engines(timeout_s)
            self._join(timeout_s, port, relays=True)
        except BaseException:
            self.stop()
            raise
        self.timings["ready_s"] = time.perf_counter() - t0
        return self

    # -- where things listen ------------------------------------------------------------

    def _default_controller_ip(self) -> str:
        """Where the controller listens when not told: reachable, never every interface."""
        if self.engines == "local":
            return "127.0.0.1"
        if self.engines == "ssh":
            target = self._ssh_hostname(self.hosts[0])
            try:
                return route_address(target)
            except OSError as e:
                raise ClusterError(
                    f"cannot tell which address of this machine {self.hosts[0]} ({target}) "
                    f"reaches ({e}); pass --controller-ip with this machine's address on "
                    "the hosts' network"
                ) from None
        with contextlib.suppress(OSError):
            address = socket.gethostbyname(socket.gethostname())
            if self.engines == "mpi" or not is_loopback(address):
                return address
        raise ClusterError(
            f"this machine's name {socket.gethostname()!r} does not resolve to an address "
            f"the {self.engines} hosts can reach; pass --controller-ip with this machine's "
            "address on the hosts' network"
        )

    def _ssh_command(self, host: str | None = None) -> list[str]:
        """``ssh`` with nbckpt's options, and ``[user@]host[:port]`` as ssh takes it."""
        argv = ["ssh", *(["-F", self.ssh_config] if self.ssh_config else []), *SSH_OPTIONS]
        if host is None:
            return argv
        user, at, rest = host.rpartition("@")
        name, colon, port = rest.partition(":")
        if colon and port.isdigit():  # ipyparallel's host:port, which ssh spells -p
            return [*argv, "-p", port, f"{user}{at}{name}"]
        return [*argv, host]

    def _ssh_hostname(self, host: str) -> str:
        """The address ssh dials for ``host``, as its config resolves it (``ssh -G``)."""
        *options, target = self._ssh_command(host)
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

    def _check_ssh_hosts(self, timeout_s: float = 60.0) -> None:
        """Ask every host at once, over ssh, whether its Python has nbckpt and ipyparallel.

        ipyparallel's launcher asks one host after the other and lets ssh's own message
        go to the kernel's terminal; this names every failing host with ssh's line.
        """
        python = self.python or sys.executable
        # ssh hands the remote shell one line, so the command is quoted as a shell would.
        probe = shlex.join([python, "-c", "import ipyparallel, nbckpt"])
        procs = {
            host: subprocess.Popen(
                [*self._ssh_command(host), probe],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for host in dict.fromkeys(self.hosts)
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
                errors.append(f"{host}: ssh failed: {_short(err)}")
            elif proc.returncode != 0:
                errors.append(f"{host}: {python} cannot run nbckpt there: {_short(err)}")
        if errors:
            raise ClusterError(
                "could not start engines over ssh on " + "; ".join(errors) + "; check that "
                "`ssh HOST` works without a password prompt (keys, known_hosts; --ssh-config) "
                "and that --python names a Python with nbckpt installed on every host"
            )

    def _ssh_config(self) -> Any:
        from traitlets.config import Config

        counts: dict[str, int] = {}
        for host in self.hosts:
            counts[host] = counts.get(host, 0) + 1
        options = [*(["-F", self.ssh_config] if self.ssh_config else []), *SSH_OPTIONS]
        config = Config()
        launcher = config.SSHEngineSetLauncher
        # The engines get the connection info in $IPP_CONNECTION_INFO, so the files are
        # not copied: one scp fewer per host, and where the hosts share this home (NFS)
        # the copy would overwrite the controller's own file with itself.
        launcher.engines = {host: {"n": n, "to_send": []} for host, n in counts.items()}
        launcher.remote_python = self.python or sys.executable
        launcher.ssh_args = list(options)
        launcher.scp_args = list(options)
        return config

    def _engine_kwargs(self, timeout_s: float) -> dict[str, Any]:
        """How ipyparallel starts the engines: local and ssh ones with :func:`engine_main`.

        Unless the profile's config gives those engines a command of its own; mpi and
        slurm engines keep the command the profile gives them (``python -m
        ipyparallel.engine`` by default) and import jax at the join. Local engines
        also start with the controller, not after it: they wait for its connection
        file themselves, for up to ``timeout_s``.
        """
        launcher = self.cluster.engine_launcher_class
        config = self.cluster.config

        def configured(trait: str) -> bool:
            return any(f"{k.__name__}.{trait}" in config for k in launcher.mro())

        if self.engines not in ("local", "ssh") or configured("engine_cmd"):
            return {}
        if self.engines == "ssh":
            return {"engine_cmd": [self.python or sys.executable, "-c", ENGINE_MAIN]}
        self.cluster.send_engines_connection_env = False
        wait = f"--IPEngine.wait_for_url_file={timeout_s:g}"
        kwargs: dict[str, Any] = {"engine_cmd": [sys.executable, "-c", ENGINE_MAIN, wait]}
        if not configured("delay"):
            # ipyparallel waits 0.1 s between local engines so that their ids come in
            # order; nbckpt orders them itself.
            kwargs["delay"] = 0.0
        return kwargs

    def _launch_failed(self, e: subprocess.CalledProcessError) -> ClusterError:
        """One line for a launch command that failed (ssh, mpiexec, sbatch)."""
        out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else e.output
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        detail = _short(err or out or f"exit status {e.returncode}")
        cmd = e.cmd if isinstance(e.cmd, list) else str(e.cmd).split()
        if self.engines == "ssh":
            host = next((h for h in self.hosts if h in cmd), "a host")
            return ClusterError(
                f"could not start an engine on {host} over ssh: {detail}; check that "
                f"`ssh {host}` works without a password prompt and that "
                f"{self.python or sys.executable} exists there with nbckpt installed "
                "(--python)"
            )
        return ClusterError(f"the {self.engines} launcher failed: {detail}")

    # -- engines that come late, or never -------------------------------------------------

    def _launchers(self) -> dict[str, Any]:
        """The per-engine launchers of ipyparallel, by its key (``host/i`` for ssh)."""
        found: dict[str, Any] = {}
        for engine_set in (getattr(self.cluster, "engines", None) or {}).values():
            found.update(getattr(engine_set, "launchers", None) or {})
        return found

    def _exited(self) -> dict[str, str]:
        """Engines whose process exited during the start: key -> the last line it wrote."""
        exited: dict[str, str] = {}
        for key, launcher in self._launchers().items():
            if _launcher_exited(launcher):
                text = ""
                with contextlib.suppress(Exception):
                    text = _short(launcher.get_output() or "")
                exited[key] = text or "no output"
        return exited

    def _stuck(self, pids: set[int]) -> list[str]:
        """Local engines alive but not among ``pids`` (those registered): where each is.

        Each is asked for its threads' stacks (``SIGUSR1``, see :func:`engine_main`),
        which it writes to its output file; ipyparallel deletes that file when the
        cluster stops, so the line quotes it: the engine's last log line and the
        innermost frame of its main thread.
        """
        import psutil

        stuck = {
            key: launcher
            for key, launcher in self._launchers().items()
            if isinstance(getattr(launcher, "process", None), psutil.Process)
            and launcher.process.pid not in pids
            and not _launcher_exited(launcher)
        }
        for launcher in stuck.values():
            with contextlib.suppress(OSError, psutil.Error):
                launcher.process.send_signal(signal.SIGUSR1)
        if stuck:
            time.sleep(0.5)
        lines = []
        for key, launcher in stuck.items():
            text = ""
            with contextlib.suppress(OSError):
                text = Path(launcher.output_file).read_text(errors="replace")
            lines.append(
                f"engine {_which_engine(key)} (pid {launcher.process.pid}) {_where_stuck(text)}"
            )
        return lines

    def _registered_hosts(self) -> list[str]:
        """Host names of the engines that registered (asked of them, 5 s at most)."""
        return [str(info["host"]) for info in self._registered_infos()]

    def _registered_infos(self) -> list[dict[str, Any]]:
        """:func:`~nbckpt.netaddr.host_info` of each registered engine that answered."""
        answers = self._ask(list(self.client.ids), HOST_INFO, "127.0.0.1", timeout_s=5)
        return [info for ok, info in answers if ok]

    def _awaited(self, heard: list[str]) -> list[str]:
        """The ssh hosts no engine has registered from yet (all of them for others)."""
        left = list(heard)
        missing = []
        for host in self.hosts:
            match = next((h for h in left if _same_host(h, host)), None)
            if match is None:
                missing.append(host)
            else:
                left.remove(match)
        return missing

    def _wait_for_engines(self, timeout_s: float, report: Callable[[str], None] | None) -> None:
        deadline = time.monotonic() + timeout_s
        next_report = time.monotonic() + 10.0
        while len(self.client.ids) < self.n:
            exited = self._exited()
            if exited or time.monotonic() > deadline:
                raise ClusterError(self._missing_text(timeout_s, exited))
            if report is not None and time.monotonic() > next_report:
                next_report += 10.0
                report(self._waiting_text())
            time.sleep(0.1)

    def _waiting_text(self) -> str:
        heard = self._registered_hosts()
        awaited = self._awaited(heard) if self.hosts else []
        return (
            f"{len(heard)} of {self.n} engines registered"
            + (f" (from {', '.join(sorted(heard))})" if heard else "")
            + (f"; still waiting for {', '.join(awaited)}" if awaited else "")
        )

    def _missing_text(self, timeout_s: float, exited: dict[str, str]) -> str:
        infos = self._registered_infos()
        heard = [str(info["host"]) for info in infos]
        parts = [
            f"engine {_which_engine(key)} exited before it registered: {text}"
            for key, text in exited.items()
        ]
        if not exited:
            awaited = self._awaited(heard) if self.hosts else []
            where = f" (none from {', '.join(awaited)})" if awaited else ""
            parts.append(
                f"only {len(heard)} of {self.n} engines registered within {timeout_s:g} s{where}"
            )
            parts += self._stuck({int(info["pid"]) for info in infos if "pid" in info})
        return (
            "; ".join(parts) + f"; the hosts must reach the controller at {self.controller_ip} "
            "(--controller-ip) and have nbckpt installed; the cluster was stopped"
        )

    def _place_engines(self, timeout_s: float) -> int | None:
        """Put the engines in process order (with ssh, the order of ``hosts``).

        Returns a port free now on process 0's host, at :attr:`coordinator_host`, for
        the coordination service (None if there is none). Local engines that this
        cluster started run on this machine, so they are not asked: their order is
        their ids', and the port is picked here.
        """
        ids = sorted(self.client.ids)[: self.n]
        if self.engines == "local" and self.cluster is not None:
            self.engine_ids = ids
            self.engine_hosts = [socket.gethostname()] * len(ids)
            self.coordinator_host = self.coordinator_host or "127.0.0.1"
            with contextlib.suppress(OSError):
                return _free_port(self.coordinator_host)
            return None
        # Every engine picks a port, where it would bind as process 0: the order, and
        # with it process 0, is known only from the answers.
        bind = self.coordinator_host or ("127.0.0.1" if self.engines == "local" else None)
        toward = self.controller_ip or "127.0.0.1"
        answers = self._ask(ids, _PROBE, toward, bind, timeout_s=timeout_s)
        infos = {}
        for eid, (ok, info) in zip(ids, answers, strict=True):
            if not ok:  # an engine that does not answer now will not join
                raise ClusterError(f"engine {eid} did not answer: {info}")
            infos[eid] = info
        if self.hosts:
            free = list(ids)
            order = []
            for host in self.hosts:
                eid = self._engine_on(host, free, infos)
                free.remove(eid)
                order.append(eid)
            ids = order
        self.engine_ids = ids
        self.engine_hosts = [str(infos[e]["host"]) for e in ids]
        first = infos[ids[0]]
        if self.coordinator_host is None:
            local = self.engines == "local" or first.get("address") is None
            self.coordinator_host = "127.0.0.1" if local else str(first["address"])
        port = first.get("port")
        return None if port is None else int(port)

    def _engine_on(self, host: str, free: list[int], infos: dict[int, Any]) -> int:
        """The engine of ``free`` on ``host``: by its own name, else the address ssh dials.

        The first free engine if none matches (a name or address seen differently).
        """
        named = next((e for e in free if _same_host(infos[e]["host"], host)), None)
        if named is not None:
            return named
        dialled = _resolve(self._ssh_hostname(host))
        return next((e for e in free if infos[e]["address"] == dialled), free[0])

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

        Engines that already run JAX must have been joined by nbckpt (or by your own
        ``jax.distributed.initialize`` with ranks in engine-id order).

        Parameters
        ----------
        cluster_id
            The cluster's id, as ``%ckpt_cluster start`` prints it (``""`` for one
            started without an id, as plain ``ipcontroller`` does). Required: on a
            shared machine the profile may hold other people's clusters, so none is
            picked by default; the error lists the ids found.
        coordinator_host
            As for :class:`JaxCluster`; None: 127.0.0.1 when the controller listens on
            loopback, else process 0's address on the route to the controller.

        Raises
        ------
        ClusterError
            Without ``cluster_id``, or if no cluster of that id runs in the profile.
        """
        import ipyparallel as ipp

        found = connection_files(profile)
        if cluster_id is None:
            raise ClusterError(which_cluster(profile))
        if cluster_id not in found:
            raise ClusterError(
                f"no cluster with id {cluster_id!r} in profile {profile or 'default'!r}; "
                + _listing(found)
            )
        controller = _controller_address(found[cluster_id])
        client = ipp.Client(profile=profile, cluster_id=cluster_id or None, timeout=timeout_s)
        self = cls(
            n=len(client.ids),
            devices_per_process=devices_per_process,
            coordinator_host=coordinator_host,
            profile=profile,
            client=client,
            cluster_id=cluster_id,
            controller_ip=controller,
            engines="local" if controller is None or is_loopback(controller) else "ssh",
        )
        if self.n == 0:
            raise ClusterError("the ipyparallel cluster has no engines; start some first")
        port = self._place_engines(timeout_s)
        states = self.apply(_safe_info, what="probe", timeout_s=timeout_s)
        if not any(s is not None and s.get("initialized") for s in states):
            self._join(timeout_s, port, relays=True)
        else:
            self._use_relays(self._ask_relays(), timeout_s)
        return self

    def _ask_relays(self) -> tuple[bytes, list[Any]] | None:
        """Ask engines of other hosts to start the read services the notebook reads through.

        The hosts see the checkpoint storage; this machine may not (see
        :mod:`nbckpt.session.reads`). Engines on this machine need none (None). Returns the key
        and the requests, for :meth:`_use_relays`.
        """
        import os

        if all(host == socket.gethostname() for host in self.engine_hosts):
            return None
        key = os.urandom(32)
        toward = self.controller_ip or "127.0.0.1"
        return key, self._send(self.engine_ids, f"{RELAY}:serve", key, toward)

    def _use_relays(self, asked: tuple[bytes, list[Any]] | None, timeout_s: float) -> None:
        """Wait for the read services :meth:`_ask_relays` asked for; read through them."""
        if asked is None:
            return
        from nbckpt.session import reads

        key, pending = asked
        outcomes = self._collect(pending, timeout_s)
        errors = {rank: res for rank, (ok, res) in enumerate(outcomes) if not ok}
        if errors:
            raise errors_by_process("starting the read service", errors)
        self.relay = reads.Relay([res for _ok, res in outcomes], key, self.engine_hosts)
        reads.use(self.relay)  # the notebook's reads go there until this cluster stops

    def apply_each(
        self,
        fn: str | Callable[..., Any],
        *args: Any,
        timeout_s: float | None = 120.0,
        **kwargs: Any,
    ) -> list[tuple[bool, Any]]:
        """Run ``fn`` on every engine; per process, ``(True, result)`` or ``(False, text)``.

        ``fn`` is a function, or ``"module:function"`` to import on the engines (see
        :func:`remote`). Unlike :meth:`apply` it never raises for an engine's error, so
        a caller can keep what the other engines returned (a save goes on when one
        engine died).
        """
        self.check_alive()
        return self._ask(self.engine_ids, fn, *args, timeout_s=timeout_s, **kwargs)

    def _ask(
        self,
        ids: list[int],
        fn: str | Callable[..., Any],
        *args: Any,
        timeout_s: float | None,
        **kwargs: Any,
    ) -> list[tuple[bool, Any]]:
        """Run ``fn`` on the engines ``ids`` at once; per engine, as :meth:`apply_each`."""
        return self._collect(self._send(ids, fn, *args, **kwargs), timeout_s)

    def _send(
        self, ids: list[int], fn: str | Callable[..., Any], *args: Any, **kwargs: Any
    ) -> list[Any]:
        """Send ``fn`` to the engines ``ids`` without waiting; their AsyncResults."""
        if isinstance(fn, str):
            fn = remote(fn)
        return [self.client[eid].apply_async(fn, *args, **kwargs) for eid in ids]

    @staticmethod
    def _collect(pending: list[Any], timeout_s: float | None) -> list[tuple[bool, Any]]:
        """Wait for AsyncResults; per engine, ``(True, result)`` or ``(False, text)``."""
        import ipyparallel as ipp

        out: list[tuple[bool, Any]] = []
        for ar in pending:
            try:
                out.append((True, ar.get(timeout=timeout_s)))
            except (ipp.error.RemoteError, ipp.error.EngineError) as e:
                out.append((False, _error_text(e)))
            except ipp.error.TimeoutError:
                out.append((False, f"no answer within {timeout_s:g} s"))
        return out

    def apply(
        self,
        fn: str | Callable[..., Any],
        *args: Any,
        what: str,
        timeout_s: float | None = 120.0,
        **kwargs: Any,
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every engine and return results in rank order.

        ``fn`` is as for :meth:`apply_each`.

        Raises
        ------
        ClusterError
            If it raised on any engine (the message names the processes), or an engine
            did not answer within ``timeout_s``.
        """
        outcomes = self.apply_each(fn, *args, timeout_s=timeout_s, **kwargs)
        errors = {rank: res for rank, (ok, res) in enumerate(outcomes) if not ok}
        if errors:
            raise errors_by_process(what, errors)
        return [res for _ok, res in outcomes]

    def _join(self, timeout_s: float, port: int | None, relays: bool = False) -> None:
        """Prepare every engine as one JAX process of the job, all at once.

        Each runs :func:`nbckpt.engine.sync.process.initialize`, the same setup a
        :class:`~nbckpt.procgroup.ProcessGroup` worker runs, with its imports done
        before the engine registered (:func:`engine_main`); process 0's coordination
        service binds ``port``. With ``relays``, the read services are asked for in
        the same breath (:meth:`_ask_relays`): each engine starts its own right after
        its join, with no round trip of its own.
        """
        t0 = time.perf_counter()
        if port is None:
            raise ClusterError(
                f"process 0 (on {self.engine_hosts[0]}) cannot bind the coordination "
                f"service to {self.coordinator_host}: not an address of that host, or no "
                f"port free there; pass --coordinator-host with an address of "
                f"{self.engine_hosts[0]}"
            )
        self.coordinator = f"{self.coordinator_host}:{port}"
        joining = [
            self.client[eid].apply_async(
                remote(_JOIN),
                rank,
                len(self.engine_ids),
                self.coordinator,
                devices_per_process=self.devices_per_process,
                bind_address=self.coordinator,
                recoverable=self.recoverable,
                timeout_s=int(timeout_s),
            )
            for rank, eid in enumerate(self.engine_ids)
        ]
        asked = self._ask_relays() if relays else None
        outcomes = self._collect(joining, timeout_s)
        errors = {rank: res for rank, (ok, res) in enumerate(outcomes) if not ok}
        if errors:
            raise ClusterError(
                f"jax.distributed.initialize failed on {by_process(errors)}; a JAX process "
                "cannot be joined twice, so stop this cluster and start a fresh one",
                sorted(errors),
            )
        self.timings["jax_init_s"] = time.perf_counter() - t0
        self._use_relays(asked, timeout_s)

    def dead_processes(self) -> list[int]:
        """The processes whose engine is gone, as the ipyparallel controller sees it.

        The controller drops an engine within about a second of its death (0.5 s
        heartbeat), so this is cheap enough to poll.
        """
        if self.client is None:
            return list(range(len(self.engine_ids)))
        alive = set(self.client.ids)
        return [rank for rank, eid in enumerate(self.engine_ids) if eid not in alive]

    def check_alive(self) -> None:
        """Raise if any process is dead.

        Raises
        ------
        ClusterGoneError
            Process 0 died: the whole JAX job is gone.
        ClusterError
            Some other process died; it names them.
        """
        dead = self.dead_processes()
        if 0 in dead:
            raise ClusterGoneError()
        if dead:
            raise ClusterError(
                f"{who(dead)} died; the others are alive but a JAX job cannot take a process "
                "back: run %ckpt_cluster restart, then %ckpt_restore VAR",
                dead,
            )

    def health(self) -> dict[int, str]:
        """``{process: "alive" | "dead"}`` from the controller and the engines' heartbeats."""
        dead = set(self.dead_processes())
        view = {p: "dead" if p in dead else "alive" for p in range(len(self.engine_ids))}
        if 0 in dead or len(dead) == len(view):
            return {p: "dead" for p in view}
        first = next(p for p in view if p not in dead)
        try:
            engine = self.client[self.engine_ids[first]]
            beats = engine.apply_async(remote(f"{AGENT}:health_view"))
            for p, state in beats.get(timeout=5).items():
                if state == "dead":
                    view[int(p)] = "dead"
        except Exception:  # the engines' view is extra; the controller's stands alone
            pass
        return view

    def restart(self, timeout_s: float = 120.0) -> JaxCluster:
        """Stop this cluster and start a fresh one with the same settings.

        A JAX process cannot rejoin a job, so every engine is new. If ``%px`` was
        activated (:meth:`activate_px`), it is activated on the new engines the same
        way, so ``%px`` after a restart behaves as after a start.

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
        root = self._registered[1] if self._registered else None
        self.stop()
        self.start(timeout_s)
        if px:
            self.activate_px()
        self.register_root(root)  # the new cluster has a new id, and a new record
        return self

    def register_root(self, root: str | None) -> Path | None:
        """Note ``root`` as this cluster's checkpoint root, for the Jupyter server's sidebar.

        Writes a small JSON record (``root``, ``pid``, ``host``, ``profile``,
        ``cluster_id``, ``time``) into :func:`clusters_dir`, replacing this cluster's
        previous one; :meth:`stop` removes it, and the server ignores a record whose
        process is gone. Best effort: a runtime folder that cannot be written only
        leaves the sidebar without this root.

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
        self.unregister_root()
        if root is None:
            return None
        pid = os.getpid()
        record = {
            "root": root,
            "pid": pid,
            "host": socket.gethostname(),
            "profile": self.profile,
            "cluster_id": self.cluster_id,
            "time": time.time(),
        }
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{pid}-{self.cluster_id or ''}")
        try:
            folder = clusters_dir()
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{name}.json"
            # Written aside and renamed, so the server never reads half a record.
            tmp = folder / f".{name}.tmp"
            tmp.write_text(json.dumps(record))
            os.replace(tmp, path)
        except OSError:
            return None
        self._registered = (path, root)
        return path

    def unregister_root(self) -> None:
        """Remove the record :meth:`register_root` wrote, if there is one."""
        if self._registered is not None:
            with contextlib.suppress(OSError):
                self._registered[0].unlink()
            self._registered = None

    def status(self) -> list[dict[str, Any]]:
        """Each engine's report (process, devices, host, checkpointers), in rank order."""
        return self.apply(f"{AGENT}:status", what="status", timeout_s=30)

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
        if self.client is not None and self.engine_ids:
            # Engines may exit as the coordination service goes away; that is the end
            # we want, so their answers are not awaited past a short grace.
            with contextlib.suppress(Exception):
                self.view.apply_async(remote(f"{PROCESS}:shutdown")).wait(
                    timeout=min(3.0, timeout_s)
                )
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.stop_cluster_sync()
        elif self.client is not None:
            with contextlib.suppress(Exception):
                self.client.shutdown(targets="all", hub=False, block=False)
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
        self.client = None
        self.cluster = None
        from nbckpt.session import reads

        reads.release(self.relay)
        self.relay = None
        self.engine_ids = []
        self.engine_hosts = []
        self._view = None
        self._px_active = False
        self.timings["stop_s"] = time.perf_counter() - t0
        return self.timings["stop_s"]


def clusters_dir() -> Path:
    """Where notebooks note the checkpoint roots of their running clusters.

    ``<Jupyter runtime dir>/nbckpt/clusters``, one JSON record per running cluster
    (:meth:`JaxCluster.register_root`). The Jupyter server that runs the kernel shares
    that runtime folder, and its sidebar offers those roots (:mod:`nbckpt.server.roots`).
    """
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / "nbckpt" / "clusters"


def _which_engine(key: str) -> str:
    """An engine by its launcher's key: ``on h1`` for ssh's ``h1/0``, the number else."""
    host = key.rpartition("/")[0]
    return f"on {host}" if host else str(key)


def _launcher_exited(launcher: Any) -> bool:
    """Whether an engine's process has exited, asked of the process where it is local.

    ipyparallel learns of an exit on its event loop, which runs only while one of its
    calls does when the notebook has no loop of its own; the process itself knows.
    """
    if getattr(launcher, "state", "") == "after":
        return True
    import psutil

    process = getattr(launcher, "process", None)
    if not isinstance(process, psutil.Process):
        return False
    try:
        return bool(process.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _where_stuck(output: str) -> str:
    """Where an engine that dumped its stacks (faulthandler) stands, in one line."""
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    dump = next(
        (i for i, ln in enumerate(lines) if ln.startswith(("Current thread", "Thread 0x"))),
        len(lines),
    )
    logged = lines[:dump]
    said = f'last logged "{_short(logged[-1])}"' if logged else "logged nothing"
    current = next((i for i in range(dump, len(lines)) if lines[i].startswith("Current")), None)
    frame = lines[current + 1].strip() if current is not None and current + 1 < len(lines) else ""
    return f"is running but never registered; it {said}" + (f", and is at {frame}" if frame else "")


def _called_process_error(exc: BaseException | None) -> subprocess.CalledProcessError | None:
    """The failed launch command behind a launcher's error, if there is one."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, subprocess.CalledProcessError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _same_host(reported: str, entry: str) -> bool:
    """Whether an engine reporting host name ``reported`` runs on ``[user@]host[:port]``."""
    name = entry.rpartition("@")[2].partition(":")[0]
    return reported == name or reported.split(".")[0] == name.split(".")[0]


_CONNECTION_FILE = re.compile(r"^ipcontroller-(?:(.+)-)?client\.json$")


def connection_files(profile: str | None = None) -> dict[str, Path]:
    """The clusters whose client connection files are in ``profile``: id -> file.

    ``""`` is the id of a cluster started without one (plain ``ipcontroller``).
    """
    from IPython.paths import locate_profile

    try:
        security = Path(locate_profile(profile or "default")) / "security"
    except OSError:
        return {}
    found: dict[str, Path] = {}
    for path in sorted(security.glob("ipcontroller-*client.json")):
        match = _CONNECTION_FILE.match(path.name)
        if match is not None:
            found[match.group(1) or ""] = path
    return found


def _listing(found: dict[str, Path]) -> str:
    if not found:
        return "none runs there (no connection file); start one with %ckpt_cluster start"
    items = []
    for cid, path in sorted(found.items(), key=lambda kv: kv[1].stat().st_mtime):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
        items.append(f"{cid!r} (started {when})" if cid else f'"" (no id, started {when})')
    return "clusters there: " + ", ".join(items)


def which_cluster(profile: str | None = None) -> str:
    """Why ``attach`` needs a cluster id, with the ids of the clusters in ``profile``."""
    return (
        "attach needs --cluster-id, so that it never joins engines another notebook or "
        f"user started in profile {profile or 'default'!r}; "
        f"{_listing(connection_files(profile))} (%ckpt_cluster start prints its id)"
    )


def _controller_address(path: Path) -> str | None:
    """The address the controller of a connection file listens on.

    Its ``interface`` when that is one address, else its ``location`` (by default the
    controller machine's name, which the hosts may not resolve).
    """
    with contextlib.suppress(OSError, ValueError):
        info = json.loads(path.read_text())
        interface = str(info.get("interface", "")).rpartition("/")[2]
        if interface and interface not in ("*", "0.0.0.0", "::"):
            return interface
        return str(info.get("location") or "") or None
    return None


def _resolve(name: str) -> str | None:
    """The IPv4 address ``name`` resolves to here, or None."""
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def _safe_info() -> dict[str, Any] | None:
    """Engine-side: report nbckpt's view of this engine without starting JAX."""
    import sys

    if "jax" not in sys.modules:
        return {"initialized": False}
    from nbckpt.engine.sync import process

    return process.info()
