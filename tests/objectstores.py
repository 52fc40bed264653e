"""The object stores the storage tests run against: each a real server on 127.0.0.1.

- ``moto``: moto's S3 server, in memory (:mod:`nbckpt.storage.local_s3`);
- ``seaweedfs``: SeaweedFS, a real S3 server storing files, checking signatures
  (:mod:`nbckpt.storage.local_seaweed`);
- ``gcs``: fake-gcs-server, GCS's JSON API, reached through ``gs://`` roots
  (:mod:`nbckpt.storage.local_gcs`).

:class:`Store` hides which one a test got: its environment, a fresh bucket, its URL.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Literal

from nbckpt import storage
from nbckpt.storage import ObjectPath
from nbckpt.storage.local_gcs import GCSServer
from nbckpt.storage.local_s3 import S3Server
from nbckpt.storage.local_seaweed import SeaweedServer
from nbckpt.storage.local_server import LocalServer

__all__ = ["KINDS", "Store", "keys"]

Kind = Literal["moto", "seaweedfs", "gcs"]

#: Every store the object-store tests run against.
KINDS: tuple[Kind, ...] = ("moto", "seaweedfs", "gcs")


class Store:
    """One running object store under test, and how nbckpt reaches it.

    Parameters
    ----------
    kind
        Which server.
    folder
        Where a store that keeps its objects in files keeps them (SeaweedFS, GCS), so
        that a server started again on the same folder serves them again
        (:attr:`restartable`); moto keeps them in memory whatever this says.
    port
        The port to serve on (the one a killed server had); a free one if None.
    """

    def __init__(self, kind: Kind, folder: Path | None = None, port: int | None = None) -> None:
        self.kind = kind
        self.scheme = "gs" if kind == "gcs" else "s3"
        server: LocalServer
        if kind == "moto":
            server = S3Server()
        elif kind == "seaweedfs":
            server = SeaweedServer(folder=folder, port=port)
        else:
            server = GCSServer(folder=folder, port=port)
        self.server = server
        #: Whether a server started again on ``folder`` serves the same objects.
        self.restartable = folder is not None and kind != "moto"
        #: The variable without which a process has no credentials for this store.
        self.credential_var = (
            "GOOGLE_AUTH_TOKEN_FOR_TESTING" if kind == "gcs" else "AWS_ACCESS_KEY_ID"
        )

    def __repr__(self) -> str:
        return f"Store({self.kind!r})"

    def env(self) -> dict[str, str]:
        """The environment that points nbckpt at this store."""
        return self.server.env()

    def new_root(self, prefix: str = "runs/a") -> str:
        """A root in a new, empty bucket."""
        name = f"ck-{uuid.uuid4().hex[:10]}"
        self.server.create_bucket(name)
        return f"{self.scheme}://{name}/{prefix}"

    def stop(self) -> None:
        """Stop the server."""
        self.server.stop()


def keys(root: str) -> list[str]:
    """Every key under ``root``, relative to it."""
    loc = storage.location(root)
    assert isinstance(loc, ObjectPath)
    return loc.list_keys()
