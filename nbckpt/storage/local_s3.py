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

import os
import sys

from nbckpt.storage.local_server import HOST, LocalServer, closed_port

__all__ = ["HOST", "S3Server", "closed_port"]

#: The credentials and region the local store is reached with (moto checks no
#: signatures unless asked to, so any non-empty keys work).
_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
}


class S3Server(LocalServer):
    """moto's S3 server in a subprocess on 127.0.0.1, on a free port.

    The subprocess is stopped by :meth:`stop`, at interpreter exit, and on Linux when
    the thread that started it dies (see :class:`~nbckpt.storage.local_server.LocalServer`).

    Parameters
    ----------
    timeout
        Seconds to wait for the server to answer before giving up.
    check_credentials
        Check every request's credentials (moto's IAM authentication from the first
        request on): only keys moto issued are accepted, so any key a test makes up is
        refused with ``InvalidAccessKeyId``, as a real store refuses a wrong key.
    """

    title = "moto's S3 server"

    def __init__(self, timeout: float = 30.0, *, check_credentials: bool = False) -> None:
        self.check_credentials = check_credentials
        super().__init__(timeout)

    def argv(self, port: int) -> list[str]:
        """``python -m moto.server`` on 127.0.0.1:``port``."""
        return [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)]

    def child_env(self) -> dict[str, str] | None:
        """With credentials checked from the first request on, if asked."""
        if not self.check_credentials:
            return None
        return {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}

    def ready(self) -> bool:
        """Whether moto's own API answers."""
        status, _ = self.request("GET", "/moto-api/", timeout=1.0)
        return status == 200

    # -- use -------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """The environment that points nbckpt's ``s3://`` roots at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, **_CREDENTIALS}

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
