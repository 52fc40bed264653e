"""Waiting for the engines to register, and saying why some never do.

While engines are missing, a line every 10 s names the hosts heard from and those still
awaited. A start that gives up names, for each missing engine, what is known: that it
exited (with the last line it wrote), or, for a local one still running, where it
stands (its stacks, which :func:`~nbckpt.session.bootstrap.engine_main` dumps on
``SIGUSR1``).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nbckpt.errors import ClusterError
from nbckpt.session.options import ClusterOptions
from nbckpt.session.rpc import HOST_INFO, ask, last_line

__all__ = ["Arrivals", "same_host", "where_stuck"]


class Arrivals:
    """The engines of a starting cluster, as they register or fail to.

    Parameters
    ----------
    cluster
        The ipyparallel ``Cluster`` that started them.
    client
        A client connected to its controller.
    options
        The cluster's options (``n``, ``hosts``, ``controller_ip``).
    """

    def __init__(self, cluster: Any, client: Any, options: ClusterOptions) -> None:
        self.cluster = cluster
        self.client = client
        self.options = options

    def wait(self, timeout_s: float, report: Callable[[str], None] | None) -> None:
        """Return once ``n`` engines registered; ``report`` a line every 10 s until then.

        Raises
        ------
        ClusterError
            If an engine exited before it registered, or ``timeout_s`` ran out; the
            message names the hosts and engines.
        """
        deadline = time.monotonic() + timeout_s
        next_report = time.monotonic() + 10.0
        while len(self.client.ids) < self.options.n:
            exited = self.exited()
            if exited or time.monotonic() > deadline:
                raise ClusterError(self.missing_text(timeout_s, exited))
            if report is not None and time.monotonic() > next_report:
                next_report += 10.0
                report(self.waiting_text())
            time.sleep(0.1)

    def launchers(self) -> dict[str, Any]:
        """The per-engine launchers of ipyparallel, by its key (``host/i`` for ssh).

        An engine set started by one command for all its engines (``mpiexec``) has no
        per-engine launchers: it is its own, under the command's name.
        """
        found: dict[str, Any] = {}
        for engine_set in (getattr(self.cluster, "engines", None) or {}).values():
            each = getattr(engine_set, "launchers", None)
            if each is None and hasattr(engine_set, "get_output"):
                found[str(getattr(engine_set, "mpi_cmd", ["the engine launcher"])[0])] = engine_set
            found.update(each or {})
        return found

    def exited(self) -> dict[str, str]:
        """Engines whose process exited during the start: key -> why, in one line."""
        exited: dict[str, str] = {}
        for key, launcher in self.launchers().items():
            if launcher_exited(launcher):
                text = ""
                with contextlib.suppress(Exception):
                    text = exit_reason(launcher.get_output() or "")
                exited[key] = text or "no output"
        return exited

    def stuck(self, pids: set[int]) -> list[str]:
        """Local engines alive but not among ``pids`` (those registered): where each is.

        Each is asked for its threads' stacks (``SIGUSR1``), which it writes to its
        output file; ipyparallel deletes that file when the cluster stops, so the line
        quotes it: the engine's last log line and the innermost frame of its main thread.
        """
        import psutil

        stuck = {
            key: launcher
            for key, launcher in self.launchers().items()
            if isinstance(getattr(launcher, "process", None), psutil.Process)
            and launcher.process.pid not in pids
            and not launcher_exited(launcher)
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
                f"engine {which_engine(key)} (pid {launcher.process.pid}) {where_stuck(text)}"
            )
        return lines

    def registered_infos(self) -> list[dict[str, Any]]:
        """:func:`~nbckpt.netaddr.host_info` of each registered engine that answered (5 s)."""
        answers = ask(self.client, list(self.client.ids), HOST_INFO, "127.0.0.1", timeout_s=5)
        return [info for ok, info in answers if ok]

    def awaited(self, heard: list[str]) -> list[str]:
        """The ssh hosts no engine has registered from yet (all of them for others)."""
        left = list(heard)
        missing = []
        for host in self.options.hosts:
            match = next((h for h in left if same_host(h, host)), None)
            if match is None:
                missing.append(host)
            else:
                left.remove(match)
        return missing

    def waiting_text(self) -> str:
        """How many engines registered, from which hosts, and which are still awaited."""
        heard = [str(info["host"]) for info in self.registered_infos()]
        awaited = self.awaited(heard) if self.options.hosts else []
        return (
            f"{len(heard)} of {self.options.n} engines registered"
            + (f" (from {', '.join(sorted(heard))})" if heard else "")
            + (f"; still waiting for {', '.join(awaited)}" if awaited else "")
        )

    def missing_text(self, timeout_s: float, exited: dict[str, str]) -> str:
        """Why the start gave up: the engines that exited, else those not heard from."""
        infos = self.registered_infos()
        heard = [str(info["host"]) for info in infos]
        parts = [
            f"engine {which_engine(key)} exited before it registered: {text}"
            if key.isdigit() or "/" in key
            else f"{key} exited before the engines registered: {text}"
            for key, text in exited.items()
        ]
        if not exited:
            awaited = self.awaited(heard) if self.options.hosts else []
            where = f" (none from {', '.join(awaited)})" if awaited else ""
            parts.append(
                f"only {len(heard)} of {self.options.n} engines registered within "
                f"{timeout_s:g} s{where}"
            )
            parts += self.stuck({int(info["pid"]) for info in infos if "pid" in info})
        return (
            "; ".join(parts) + f"; the hosts must reach the controller at "
            f"{self.options.controller_ip} (--controller-ip) and have nbckpt installed; "
            "the cluster was stopped"
        )


def which_engine(key: str) -> str:
    """An engine by its launcher's key: ``on h1`` for ssh's ``h1/0``, the number else."""
    host = key.rpartition("/")[0]
    return f"on {host}" if host else str(key)


#: What Open MPI's ``mpiexec`` says in a box when it refuses to start, and what to do.
_MPIEXEC_REFUSALS = (
    (
        "attempt to run as root",
        "mpiexec refuses to run as root: run the notebook as another user, or set "
        "OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in its environment",
    ),
    (
        "not enough slots available",
        "mpiexec has fewer slots (cores, or the hostfile's slots) than engines: give it "
        "a hostfile (MPILauncher.mpi_args in the profile) or set "
        "OMPI_MCA_rmaps_base_oversubscribe=1",
    ),
    (
        "No module named 'mpi4py'",
        "the engines need mpi4py (ipyparallel takes their ids from MPI ranks): "
        "pip install mpi4py where they run",
    ),
)


def exit_reason(output: str) -> str:
    """Why a launch command exited, in one line: mpiexec's refusals said plainly."""
    for said, meaning in _MPIEXEC_REFUSALS:
        if said in output:
            return meaning
    return last_line(output)


def launcher_exited(launcher: Any) -> bool:
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


def where_stuck(output: str) -> str:
    """Where an engine that dumped its stacks (faulthandler) stands, in one line."""
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    dump = next(
        (i for i, ln in enumerate(lines) if ln.startswith(("Current thread", "Thread 0x"))),
        len(lines),
    )
    logged = lines[:dump]
    said = f'last logged "{last_line(logged[-1])}"' if logged else "logged nothing"
    current = next((i for i in range(dump, len(lines)) if lines[i].startswith("Current")), None)
    frame = lines[current + 1].strip() if current is not None and current + 1 < len(lines) else ""
    return f"is running but never registered; it {said}" + (f", and is at {frame}" if frame else "")


def same_host(reported: str, entry: str) -> bool:
    """Whether an engine reporting host name ``reported`` runs on ``[user@]host[:port]``."""
    name = entry.rpartition("@")[2].partition(":")[0]
    return reported == name or reported.split(".")[0] == name.split(".")[0]
