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


#: nbckpt's errors about a value the user typed, raised here before anything is sent: a
#: root URL nbckpt cannot store at, a mode its store cannot do. They read as usage.
#: Every other nbckpt error (an existing step, a refused rollback, processes that
#: disagree) is about the job's state, not the typing: it keeps its class, so a notebook
#: can catch it, and still shows as one line (:mod:`nbckpt.magics.errors`).
TYPED_VALUE_ERRORS = (StorageURLError, RenameUnavailableError)


@contextmanager
def usage_errors() -> Iterator[None]:
    """Turn a one-line ValueError about a typed value into a UsageError.

    nbckpt's own errors that are ValueErrors too (a corrupt checkpoint) raise as they
    are, except :data:`TYPED_VALUE_ERRORS`.
    """
    try:
        yield
    except ValueError as e:
        if isinstance(e, TYPED_VALUE_ERRORS) or not isinstance(e, NbckptError):
            raise UsageError(str(e)) from None
        raise


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
