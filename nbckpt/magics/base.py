"""What every group of ``%ckpt_*`` magics shares: the session's cluster, client and views.

:class:`MagicsBase` holds them; the magic groups (:mod:`nbckpt.magics.inspection`,
:class:`~nbckpt.magics.commands.NbckptMagics`) build on it. :func:`usage_errors` turns a
client's one-line ValueError about a value into a UsageError.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics

from nbckpt.errors import NbckptError, RenameUnavailableError, StorageURLError
from nbckpt.session import location, reads
from nbckpt.session.client import CheckpointClient
from nbckpt.session.cluster import JaxCluster
from nbckpt.widgets._registry import LiveViews

__all__ = ["NO_CLUSTER", "MagicsBase", "usage_errors"]

NO_CLUSTER = "no nbckpt cluster yet: start one with %ckpt_cluster start -n 4 --dir DIR"


@contextmanager
def usage_errors() -> Iterator[None]:
    """Turn the client's one-line ValueError about a value into a UsageError.

    nbckpt's own errors that are ValueErrors too (a corrupt checkpoint) are not the
    user's typing and raise as they are.
    """
    try:
        yield
    except ValueError as e:
        # A root URL nbckpt cannot use is the user's typing too.
        if isinstance(e, StorageURLError | RenameUnavailableError):
            raise UsageError(str(e)) from None
        if isinstance(e, NbckptError):
            raise
        raise UsageError(str(e)) from None


class MagicsBase(Magics):
    """The state of the magics of one IPython session: one cluster, one client.

    Attributes
    ----------
    cluster, client
        The cluster ``%ckpt_cluster`` started or attached, and its client (or None).
    views
        The live views the magics showed, by operation id or barrier key.
    """

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.cluster: JaxCluster | None = None
        self.client: CheckpointClient | None = None
        self.views = LiveViews(shell, reader=self._reader)

    def _client(self) -> CheckpointClient:
        if self.client is None:
            raise UsageError(NO_CLUSTER)
        return self.client

    def _root(self, directory: str | None, magic: str) -> str:
        """The root a magic reads: DIR, else the cluster's --dir (no cluster needed)."""
        if self.client is not None:
            with usage_errors():
                return self.client.root(directory)
        if directory is None:
            raise UsageError(
                f"%{magic} needs a directory: %{magic} DIR, or start the cluster with --dir"
            )
        with usage_errors():
            return str(location(directory))

    def _reader(self) -> reads.Reader:
        """Where the magics read a root: through the client's hosts, else here."""
        return self.client.reader if self.client is not None else reads.LOCAL
