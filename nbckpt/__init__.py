"""nbckpt: asynchronous multihost JAX checkpointing you can run, watch and teach.

The engine (``nbckpt.engine``) runs in every JAX process; importing this top-level
package needs neither jax nor IPython.
"""

from typing import Any as _Any

from nbckpt.errors import (
    BarrierTimeoutError,
    CallError,
    CheckpointDataError,
    CheckpointError,
    ClusterError,
    ClusterGoneError,
    CommitRefusedError,
    CorruptCheckpointError,
    DisagreementError,
    ForeignEntryError,
    JobError,
    NbckptError,
    NoRootError,
    PeerDeadError,
    PeerError,
    PeerFailedError,
    PeerTransferError,
    RenameUnavailableError,
    RollbackRefusedError,
    RootNotWritableError,
    SaveFailedError,
    StepBusyError,
    StepExistsError,
    StepNotFoundError,
    StorageAccessError,
    StorageError,
    StorageURLError,
)
from nbckpt.formats.layout import all_steps, latest_step

__version__ = "0.1.0"


def load_ipython_extension(ipython: object) -> None:
    """Register the ``%ckpt_*`` magics: ``%load_ext nbckpt``."""
    from nbckpt.magics.commands import load_ipython_extension as load

    load(ipython)


__all__ = [
    "BarrierTimeoutError",
    "CallError",
    "CheckpointDataError",
    "JobError",
    "PeerError",
    "StorageAccessError",
    "CheckpointError",
    "ClusterError",
    "ClusterGoneError",
    "CommitRefusedError",
    "CorruptCheckpointError",
    "DisagreementError",
    "ForeignEntryError",
    "NbckptError",
    "NoRootError",
    "PeerDeadError",
    "PeerFailedError",
    "PeerTransferError",
    "RenameUnavailableError",
    "RollbackRefusedError",
    "RootNotWritableError",
    "SaveFailedError",
    "StepBusyError",
    "StepExistsError",
    "StepNotFoundError",
    "StorageError",
    "StorageURLError",
    "__version__",
    "all_steps",
    "latest_step",
]


# jupyter-server and JupyterLab look these up on the top-level package. They import the
# server extension lazily, so ``import nbckpt`` stays cheap and Tornado-free.
def _jupyter_server_extension_points() -> list[dict[str, str]]:
    from nbckpt.server import _jupyter_server_extension_points as points

    return points()


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    from nbckpt.server import _jupyter_labextension_paths as paths

    return paths()


def _load_jupyter_server_extension(server_app: _Any) -> None:
    from nbckpt.server import _load_jupyter_server_extension as load

    load(server_app)
