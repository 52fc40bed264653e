"""A store's server in a subprocess on 127.0.0.1: what every local test store shares.

:class:`LocalServer` runs one program (moto's S3 server, fake-gcs-server, SeaweedFS)
bound to 127.0.0.1 on a free port, waits until it answers, keeps its output in a log
file, and stops it at :meth:`~LocalServer.stop`, at interpreter exit, or (on Linux)
when the process that started it dies (``PR_SET_PDEATHSIG``), so no server outlives a
test run, even one killed with SIGKILL. A subclass says which program to run
(:meth:`~LocalServer.argv`), how to tell it is ready and what environment points
nbckpt at it. These are places to learn and test, never to keep checkpoints.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["HOST", "LocalServer", "closed_port", "free_port"]

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (connections to it are refused)."""
    return free_port()


#: Asks Linux to SIGKILL this process when its parent (the thread that started it) dies,
#: then becomes the server (the signal survives exec). argv: the parent's pid, then the
#: server's command. A launcher rather than ``preexec_fn``, which is unsafe with threads.
_LAUNCHER = """
import ctypes, os, signal, sys
if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != int(sys.argv[1]):
        sys.exit("the process that started this server is gone already")
os.execv(sys.argv[2], sys.argv[2:])
"""


class LocalServer:
    """A server subprocess on 127.0.0.1, on a free port (see the module's docstring).

    The death signal follows the *thread* that started the server: start it from one
    that outlives it (pytest's fixtures run on the main thread).

    Parameters
    ----------
    timeout
        Seconds to wait for the server to answer before giving up.
    port
        Serve on this port (a server that comes back where it was); a free one if None.
    """

    #: What the server is, for messages ("moto's S3 server").
    title = "the server"

    def __init__(self, timeout: float = 30.0, *, port: int | None = None) -> None:
        self._wanted_port = port
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            prefix=f"{type(self).__name__.lower()}-", suffix=".log", delete=False
        )
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        atexit.register(self.stop)
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    # -- what a subclass says --------------------------------------------------------

    def argv(self, port: int) -> list[str]:
        """The command that serves on 127.0.0.1:``port``."""
        raise NotImplementedError

    def child_env(self) -> dict[str, str] | None:
        """The server's environment (None: this process's)."""
        return None

    def ready(self) -> bool:
        """Whether the server answers (called until it does)."""
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        """The environment that points nbckpt at this server."""
        raise NotImplementedError

    def create_bucket(self, name: str) -> None:
        """Create the bucket ``name`` (an error if the server refuses)."""
        raise NotImplementedError

    # -- lifecycle -------------------------------------------------------------------

    def _start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for _attempt in range(3):  # another process may grab the port before it binds
            self.port = self._wanted_port or free_port()
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *self.argv(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=self.child_env(),
            )
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    break  # exited: try another port
                if self._answers():
                    return
                time.sleep(0.05)
            else:
                raise TimeoutError(
                    f"{self.title} on {self.endpoint} did not answer within {timeout:g} s; "
                    f"its output ends with:\n{self.log_tail()}"
                )
        code = self._proc.returncode if self._proc else None
        raise RuntimeError(
            f"{self.title} exited (code {code}) before answering; "
            f"its output ends with:\n{self.log_tail()}"
        )

    def _answers(self) -> bool:
        try:
            return self.ready()
        except OSError:
            return False

    @property
    def log_path(self) -> Path:
        """The file the server writes its output to."""
        return Path(self._log.name)

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines the server wrote (stdout and stderr)."""
        try:
            text = Path(self._log.name).read_text(errors="replace")
        except OSError:
            return "(no output)"
        return "\n".join(text.splitlines()[-lines:]) or "(no output)"

    @property
    def alive(self) -> bool:
        """Whether the server process is running."""
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the server at once (a store that dies mid-save)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s) and remove its log."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if not self._log.closed:
            self._log.close()
            with contextlib.suppress(OSError):
                os.unlink(self._log.name)
        atexit.unregister(self.stop)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- use -------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The server's address, ``http://127.0.0.1:PORT``."""
        return f"http://{HOST}:{self.port}"

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        timeout: float = 10.0,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """Send one plain HTTP request to the server (no proxy); return status and body."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()
