"""Start a simulated job of many processes, and run its control plane's operations.

:class:`Simulation` spreads ``processes`` simulated JAX processes over a few OS
processes (:mod:`nbckpt.sim.worker`), ``per_worker`` each: one Python process holds
64 coordination-service clients easily, while 1,024 in one did not even connect. It
needs no jax here: the workers import it, as the engines do.

Each worker's output (the service's and gRPC's logs) goes to a log file, whose end is
shown when the worker fails; ``NBCKPT_SIM_KEEP_LOGS=1`` keeps the files after
:meth:`Simulation.close`, and ``kill -USR1`` on a worker writes every thread's stack to
its log, to see where a simulation stalls.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from nbckpt.protocol import HOST_BARRIER_ENV

__all__ = ["BarrierTiming", "SaveOutcome", "Simulation"]

#: Seconds between sending a timed command and its start: every thread is waiting by then.
_LEAD_S = 0.5


@dataclass(frozen=True)
class BarrierTiming:
    """One barrier among all simulated processes.

    Attributes
    ----------
    spread_ms
        From the first arrival to the last.
    release_ms
        From the last arrival to the last release: the barrier's own cost.
    """

    spread_ms: float
    release_ms: float


@dataclass(frozen=True)
class SaveOutcome:
    """One simulated save.

    Attributes
    ----------
    op
        Its operation id (the journal's folder name), or None if no process started it.
    agree_ms
        From the last process's start to the last one's agreement (the preflight).
    total_ms
        From the first start to the last end.
    errors
        Each surviving process's error, by process; empty when the save committed.
    detect_s
        With a victim: from its death to the last survivor's error.
    named
        With a victim: whether every survivor's error named it.
    """

    op: str | None
    agree_ms: float
    total_ms: float
    errors: dict[int, str]
    detect_s: float | None = None
    named: bool | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Simulation:
    """``processes`` simulated JAX processes against one real coordination service.

    Use it as a context manager; :meth:`close` stops every worker.

    Parameters
    ----------
    processes
        How many simulated processes.
    root
        The checkpoint root the simulated saves write to (steps and journals).
    per_worker
        Simulated processes per OS process.
    """

    def __init__(self, processes: int, root: str | Path, *, per_worker: int = 64) -> None:
        if processes < 1 or per_worker < 1:
            raise ValueError("processes and per_worker must be at least 1")
        self.processes = processes
        self.root = Path(root)
        self.per_worker = per_worker
        self.address = f"127.0.0.1:{_free_port()}"
        self._conns: list[Connection] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._authkey = secrets.token_bytes(16)
        self._listener: Listener | None = None
        #: The workers' stderr (the service's and gRPC's logs), shown when one fails.
        self._logs = Path(tempfile.mkdtemp(prefix="nbckpt-sim-"))

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the workers ----------------------------------------------------------------

    def _spawn(self, first: int) -> None:
        """Start the worker of processes ``first..``, which dials back.

        ``python -m``, not multiprocessing: a notebook's or a script's ``__main__`` is
        not run again in it.
        """
        assert self._listener is not None
        count = min(self.per_worker, self.processes - first)
        spec = {
            "listener": list(self._listener.address),
            "address": self.address,
            "first": first,
            "count": count,
            "total": self.processes,
            "host_service": first == 0,
        }
        env = {**os.environ, "NBCKPT_SIM_AUTHKEY": self._authkey.hex()}
        # The simulated processes stand for processes on many hosts: their barriers
        # meet at the service, as a job's across hosts do, not at one host's hub.
        env[HOST_BARRIER_ENV] = "0"
        with open(self._logs / f"worker_{first}.log", "wb") as log:
            self._procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "nbckpt.sim.worker", json.dumps(spec)],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        self._conns.append(self._listener.accept())

    def _log_tail(self, conn: Connection) -> str:
        first = self._conns.index(conn) * self.per_worker
        try:
            text = (self._logs / f"worker_{first}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-20:])

    def _answer(self, conn: Connection, timeout_s: float) -> Any:
        if not conn.poll(timeout_s):
            raise TimeoutError(
                f"a simulation worker did not answer within {timeout_s:g} s; its log ends:\n"
                + self._log_tail(conn)
            )
        try:
            status, value = conn.recv()
        except EOFError:
            raise RuntimeError(
                "a simulation worker exited; its log ends:\n" + self._log_tail(conn)
            ) from None
        if status != "ok" and status != "ready":
            raise RuntimeError(f"a simulation worker failed:\n{value}")
        return value

    def _all(self, command: tuple[Any, ...], timeout_s: float = 600) -> list[Any]:
        """Send ``command`` to every worker; every simulated process's answer, in order."""
        for conn in self._conns:
            conn.send(command)
        out: list[Any] = []
        for conn in self._conns:
            answer = self._answer(conn, timeout_s)
            out.extend(answer if isinstance(answer, list) else [answer])
        return out

    def start(self) -> None:
        """Start the workers (worker 0 hosts the service), connect, start heartbeats.

        If any of it fails, every worker started is stopped before the error is raised.
        """
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._listener = Listener(("127.0.0.1", 0), authkey=self._authkey)
        self._spawn(0)  # the service first: the other clients dial it
        self._answer(self._conns[0], 120)
        for first in range(self.per_worker, self.processes, self.per_worker):
            self._spawn(first)
        for conn in self._conns[1:]:
            self._answer(conn, 120)
        failed = [a for a in self._all(("connect",), 300) if a is not None]
        if failed:
            raise RuntimeError(f"simulated processes did not connect: {failed[0]}")
        failed = [a for a in self._all(("join", str(self.root))) if a is not None]
        if failed:
            raise RuntimeError(f"simulated processes did not join: {failed[0]}")

    def close(self) -> None:
        """Stop every worker (the service last)."""
        for conn in reversed(self._conns):
            try:
                conn.send(("stop",))
                self._answer(conn, 30)
            except (OSError, EOFError, TimeoutError, RuntimeError):
                pass
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for conn in self._conns:
            conn.close()
        self._conns.clear()
        self._procs.clear()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if not os.environ.get("NBCKPT_SIM_KEEP_LOGS"):
            shutil.rmtree(self._logs, ignore_errors=True)

    # -- what is measured -------------------------------------------------------------

    def barrier(self, name: str, *, kind: str = "nbckpt", timeout_s: float = 120) -> BarrierTiming:
        """Meet at one barrier (``kind`` ``"nbckpt"`` or ``"service"``); time it.

        Every simulated process's thread is started before the common start time, so
        the figure is the protocol's: from the last arrival to the last release.
        """
        t_go = time.time() + _LEAD_S
        got = self._all(("barrier", kind, name, t_go, timeout_s))
        bad = [g for g in got if "error" in g]
        if bad:
            raise RuntimeError(f"barrier {name} failed: {bad[0]['error']}")
        arrive = [g["arrive"] for g in got]
        release = [g["release"] for g in got]
        return BarrierTiming(
            spread_ms=(max(arrive) - min(arrive)) * 1e3,
            release_ms=(max(release) - max(arrive)) * 1e3,
        )

    def save(
        self,
        step: int,
        *,
        victim: int | None = None,
        die_after_s: float = 0.5,
        timeout_s: float = 120,
        straggler: int | None = None,
        late_s: float = 0.0,
    ) -> SaveOutcome:
        """Run one save on every simulated process.

        With ``victim``, that process dies ``die_after_s`` after the preflight; with
        ``straggler``, that process starts writing ``late_s`` late, and the others wait
        for it.
        """
        t_go = time.time() + _LEAD_S
        command = ("save", step, t_go, victim, die_after_s, timeout_s, straggler, late_s)
        got = self._all(command)
        bad = [g for g in got if "p" not in g]
        if bad:
            raise RuntimeError(f"save of step {step} failed to start: {bad[0]['error']}")
        survivors = [g for g in got if g["p"] != victim]
        errors = {g["p"]: g["error"] for g in survivors if g["error"]}
        detect = named = None
        if victim is not None:
            died = next(g["died"] for g in got if g["p"] == victim)
            detect = max(g["end"] for g in survivors) - died
            named = all(g["names"] for g in survivors)
        return SaveOutcome(
            op=str(got[0]["op"]),
            agree_ms=(max(g["agreed"] for g in got) - max(g["start"] for g in got)) * 1e3,
            total_ms=(max(g.get("end", 0.0) for g in got) - min(g["start"] for g in got)) * 1e3,
            errors=errors,
            detect_s=detect,
            named=named,
        )

    def worker_rss(self) -> list[int]:
        """Resident bytes of each worker process."""
        return [int(x) for x in self._all(("rss",))]
