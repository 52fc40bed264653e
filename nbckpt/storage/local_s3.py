"""A local S3-compatible server (moto) on 127.0.0.1, for lessons, tests and benchmarks.

nbckpt's ``s3://`` roots work with any S3-compatible store. To try them on one machine
without an account, :class:`S3Server` runs moto's standalone server (``python -m
moto.server``, from the ``s3-lesson`` extra) in a subprocess bound to 127.0.0.1 only,
and hands out the environment that points nbckpt at it::

    with S3Server() as server:
        server.create_bucket("lesson")
        os.environ.update(server.env())
        AsyncCheckpointer("s3://lesson/run").save(1, state)

It keeps everything in memory and is gone when it stops: a place to learn and test,
not to keep checkpoints.
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

__all__ = ["HOST", "S3Server", "closed_port"]

HOST = "127.0.0.1"

#: The credentials and region the local store is reached with (moto checks no
#: signatures unless asked to, so any non-empty keys work).
_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
}


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (connections to it are refused)."""
    return _free_port()


#: Runs moto's server in the child process, after asking Linux to SIGKILL that process
#: when its parent (the thread that started it) dies: then no server outlives a test
#: run, even one killed with SIGKILL. argv: the parent's pid, then moto's arguments.
_LAUNCHER = """
import ctypes, os, runpy, signal, sys
if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != int(sys.argv[1]):
        sys.exit("the test process is gone already")
sys.argv = ["moto.server", *sys.argv[2:]]
runpy.run_module("moto.server", run_name="__main__", alter_sys=True)
"""


class S3Server:
    """moto's S3 server in a subprocess on 127.0.0.1, on a free port.

    The subprocess stays in pytest's session and process group, is stopped by
    :meth:`stop` (and at interpreter exit), and on Linux is also killed by the kernel
    if the test process dies without stopping it (``PR_SET_PDEATHSIG``). That signal
    follows the *thread* that started the server: start it from one that outlives it
    (pytest's fixtures run on the main thread).

    Parameters
    ----------
    timeout
        Seconds to wait for the server to answer before giving up.
    check_credentials
        Check every request's credentials (moto's IAM authentication from the first
        request on): only keys moto issued are accepted, so any key a test makes up is
        refused with ``InvalidAccessKeyId``, as a real store refuses a wrong key.
    """

    def __init__(self, timeout: float = 30.0, *, check_credentials: bool = False) -> None:
        self.check_credentials = check_credentials
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            prefix="moto-", suffix=".log", delete=False
        )
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        atexit.register(self.stop)
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    # -- lifecycle -------------------------------------------------------------------

    def _start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for _attempt in range(3):  # another process may grab the port before moto binds it
            self.port = _free_port()
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _LAUNCHER,
                    str(os.getpid()),
                    "-H",
                    HOST,
                    "-p",
                    str(self.port),
                ],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=False,
                env=(
                    {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}
                    if self.check_credentials
                    else None
                ),
            )
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    break  # exited: try another port
                if self._ready():
                    return
                time.sleep(0.05)
            else:
                raise TimeoutError(
                    f"moto's S3 server on {self.endpoint} did not answer within {timeout:g} s; "
                    f"its output ends with:\n{self.log_tail()}"
                )
        code = self._proc.returncode if self._proc else None
        raise RuntimeError(
            f"moto's S3 server exited (code {code}) before answering; "
            f"its output ends with:\n{self.log_tail()}"
        )

    def _ready(self) -> bool:
        try:
            status, _ = self.request("GET", "/moto-api/", timeout=1.0)
        except OSError:
            return False
        return status == 200

    @property
    def log_path(self) -> Path:
        """The file moto writes its output to: one line per request it answered."""
        return Path(self._log.name)

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines moto wrote (stdout and stderr)."""
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

    def env(self) -> dict[str, str]:
        """The environment that points nbckpt's ``s3://`` roots at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, **_CREDENTIALS}

    def request(
        self, method: str, path: str, body: bytes | None = None, timeout: float = 10.0
    ) -> tuple[int, bytes]:
        """Send one plain HTTP request to the server (no proxy); return status and body."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def create_bucket(self, name: str) -> None:
        """Create the bucket ``name`` (``RuntimeError`` if the server refuses)."""
        status, body = self.request("PUT", f"/{name}")
        if status != 200:
            raise RuntimeError(f"creating bucket {name!r} failed: HTTP {status}: {body!r}")

    def reset(self) -> None:
        """Forget every bucket and object."""
        status, body = self.request("POST", "/moto-api/reset")
        if status != 200:
            raise RuntimeError(f"resetting moto failed: HTTP {status}: {body!r}")
