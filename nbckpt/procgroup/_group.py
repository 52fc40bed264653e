"""The parent side of a local process group."""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

__all__ = ["ProcessGroup", "RemoteError", "free_port"]


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RemoteError(RuntimeError):
    """A function raised in one or more workers.

    Attributes
    ----------
    errors
        For each failing process index, the worker's formatted traceback.
    partial
        The results of the processes that did not fail.
    """

    def __init__(
        self, fn: str, errors: Mapping[int, str], partial: Mapping[int, Any] | None = None
    ) -> None:
        self.errors = dict(errors)
        self.partial = dict(partial or {})
        first = min(self.errors)
        last_line = self.errors[first].strip().splitlines()[-1] if self.errors[first] else ""
        procs = ", ".join(str(p) for p in sorted(self.errors))
        super().__init__(
            f"{fn} failed on process(es) {procs}: {last_line}\n"
            + "\n".join(f"--- process {p} ---\n{tb}" for p, tb in sorted(self.errors.items()))
        )


class ProcessGroup:
    """N Python processes joined by ``jax.distributed``, on 127.0.0.1 or on test hosts.

    Parameters
    ----------
    n
        The number of processes. With 1, no coordination service is started.
    devices_per_process
        CPU devices per process (``jax_num_cpu_devices``).
    start_timeout_s
        How long to wait for every worker to initialize.
    env
        Extra environment variables for the workers.
    recoverable
        Set ``jax_enable_recoverability`` so that survivors are not aborted when a
        peer dies.
    launcher
        Per process, a command prefix that starts it elsewhere (on a test host: a
        network namespace, see ``tests/testhosts.py``); by default here.
    coordinator_host
        The address process 0's coordination service listens on and the others dial
        (with ``launcher``, the address of process 0's host).

    Examples
    --------
    >>> with ProcessGroup(4) as group:                      # doctest: +SKIP
    ...     counts = group.run("mypkg.tasks:device_count")  # one result per process
    """

    def __init__(
        self,
        n: int,
        *,
        devices_per_process: int = 1,
        start_timeout_s: float = 120.0,
        env: Mapping[str, str] | None = None,
        recoverable: bool = False,
        launcher: Sequence[Sequence[str]] | None = None,
        coordinator_host: str = "127.0.0.1",
    ) -> None:
        if n < 1:
            raise ValueError(f"a process group needs at least one process, got {n}")
        if launcher is not None and len(launcher) != n:
            raise ValueError(f"launcher needs one prefix per process ({n}), got {len(launcher)}")
        self.n = n
        self.devices_per_process = devices_per_process
        self.port = free_port() if n > 1 else 0
        self._procs: list[subprocess.Popen[bytes]] = []
        self._conns: list[Connection] = []
        child_env = dict(os.environ)
        child_env.update(env or {})
        try:
            for i in range(n):
                parent, child = socket.socketpair()
                cmd = [
                    *(launcher[i] if launcher is not None else ()),
                    sys.executable,
                    "-m",
                    "nbckpt.procgroup._worker",
                    "--process-id",
                    str(i),
                    "--num-processes",
                    str(n),
                    "--port",
                    str(self.port),
                    "--coordinator-host",
                    coordinator_host,
                    "--devices",
                    str(devices_per_process),
                    "--fd",
                    str(child.fileno()),
                ]
                if recoverable:
                    cmd.append("--recoverable")
                proc = subprocess.Popen(cmd, pass_fds=(child.fileno(),), env=child_env)
                child.close()
                self._procs.append(proc)
                self._conns.append(Connection(parent.detach()))
            self._collect("start", start_timeout_s)
        except BaseException:
            self.close(timeout_s=2)
            raise

    @property
    def pids(self) -> list[int]:
        """The operating-system pids of the workers."""
        return [p.pid for p in self._procs]

    @property
    def returncodes(self) -> list[int | None]:
        """Per process, its exit code once it has exited; None while it runs."""
        return [p.poll() for p in self._procs]

    def alive(self) -> list[bool]:
        """Tell, per process, whether its worker is still running."""
        return [p.poll() is None for p in self._procs]

    def run(
        self,
        fn: str,
        *args: Any,
        per_process: Sequence[tuple[Any, ...]] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        timeout_s: float = 600.0,
    ) -> list[Any]:
        """Run ``fn`` on every process at once and return their results in order.

        Parameters
        ----------
        fn
            ``"module:function"``, importable by the workers.
        *args
            Positional arguments of every call (pickled).
        per_process
            Optional extra positional arguments per process, appended to ``args``.
        kwargs
            Keyword arguments of every call.
        timeout_s
            How long to wait for all results.

        Raises
        ------
        RemoteError
            If the function raised on any process (every process's error is given).
        """
        self.submit(fn, *args, per_process=per_process, kwargs=kwargs)
        return self.collect(fn, timeout_s)

    def submit(
        self,
        fn: str,
        *args: Any,
        per_process: Sequence[tuple[Any, ...]] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """Send ``fn`` to every process without waiting; pair with :meth:`collect`."""
        for i, conn in enumerate(self._conns):
            extra = tuple(per_process[i]) if per_process is not None else ()
            conn.send_bytes(pickle.dumps((fn, args + extra, dict(kwargs or {}))))

    def collect(self, fn: str = "task", timeout_s: float = 600.0) -> list[Any]:
        """Wait for the results of the last :meth:`submit`."""
        return self._collect(fn, timeout_s)

    def outcomes(self, timeout_s: float = 600.0) -> list[tuple[bool, Any]]:
        """Wait for the last :meth:`submit` like :meth:`collect`, without raising.

        Returns
        -------
        list
            Per process, ``(True, result)``, or ``(False, error text)`` for a process
            whose call raised or whose worker died (failure tests expect some to).
        """
        try:
            return [(True, r) for r in self._collect("task", timeout_s)]
        except RemoteError as e:
            results = e.partial
            return [
                (False, e.errors[i]) if i in e.errors else (True, results.get(i))
                for i in range(self.n)
            ]

    def _collect(self, what: str, timeout_s: float) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        waiting = dict(enumerate(self._conns))
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"{what}: no answer from process(es) {sorted(waiting)} within {timeout_s:g} s"
                )
            ready = wait(list(waiting.values()), timeout=min(remaining, 0.5))
            for i, conn in list(waiting.items()):
                if conn in ready:
                    try:
                        status, payload = pickle.loads(conn.recv_bytes())
                    except (EOFError, OSError):
                        status, payload = "err", (f"worker exited (code {self._procs[i].wait()})")
                    del waiting[i]
                    if status == "ok":
                        results[i] = payload
                    else:
                        errors[i] = payload
                elif self._procs[i].poll() is not None:
                    del waiting[i]
                    errors[i] = f"worker exited (code {self._procs[i].returncode})"
        if errors:
            raise RemoteError(what, errors, results)
        return [results[i] for i in range(self.n)]

    def kill(self, process: int) -> None:
        """Kill one worker with SIGKILL (for failure tests)."""
        self._procs[process].kill()
        self._procs[process].wait()

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask every worker to shut down, then kill whatever is left."""
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send_bytes(pickle.dumps(None))
        deadline = time.monotonic() + timeout_s
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for conn in self._conns:
            conn.close()
        self._conns = []

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
