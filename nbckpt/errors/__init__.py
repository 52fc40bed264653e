"""Every error nbckpt raises on purpose: one hierarchy under :class:`NbckptError`.

The errors are grouped by what the user does about them. Every message is one line
that says what happened and what to do next. None of these classes needs jax, so
notebook-side code can catch them without importing it::

    NbckptError
    ├── CallError                             usage: fix the call; nothing was written
    │   ├── StepExistsError (FileExistsError) the step is already committed
    │   ├── CommitRefusedError (FileExistsError)  commit-file mode cannot replace safely
    │   ├── RollbackRefusedError (ValueError) a save older than the newest step
    │   ├── DisagreementError (ValueError)    the processes of a save asked for different things
    │   ├── StorageURLError (ValueError)      a root URL nbckpt cannot store at
    │   ├── RenameUnavailableError (ValueError)  rename mode asked of a store without rename
    │   └── NoRootError (ValueError)          a checkpointer without a root, and none set
    ├── PeerError                             another process failed, died or timed out
    │   ├── BarrierTimeoutError (TimeoutError)
    │   ├── PeerFailedError                   a peer failed (its error is the reason)
    │   ├── PeerDeadError                     a peer died or became unreachable
    │   └── PeerTransferError                 a peer did not send the files asked of it
    ├── StorageAccessError                    the store refused or failed a request
    │   ├── StorageError (OSError)            the store failed a request (object stores)
    │   └── RootNotWritableError (PermissionError)
    ├── CheckpointDataError                   what the root holds: corrupt, missing, foreign
    │   ├── CorruptCheckpointError (ValueError)  a chunk failed its checksum on restore
    │   ├── StepNotFoundError (FileNotFoundError)
    │   ├── ForeignEntryError (FileExistsError)  a path nbckpt did not create
    │   └── StepBusyError (FileExistsError)   another save owns the step being written
    └── JobError                              cluster: an operation failed on some processes
        ├── CheckpointError                   a background save failed (engine side)
        └── ClusterError                      engines failed a call (notebook side)
            ├── ClusterGoneError              process 0 died
            └── SaveFailedError               a save failed on some processes

Each class keeps the standard base shown, so ``except FileExistsError`` still works.
The errors about several processes (:class:`PeerError` and :class:`JobError`, so
:class:`PeerFailedError`, :class:`CheckpointError`, :class:`ClusterError` ...) carry
``failures``: process -> its cause, as text, besides the message.

:func:`who` and :func:`by_process` are the one way a message names processes.
"""

from __future__ import annotations

from nbckpt.errors._base import (
    CallError,
    CheckpointDataError,
    JobError,
    NbckptError,
    PeerError,
    StorageAccessError,
    by_process,
    outcome,
    who,
)
from nbckpt.errors._cluster import CheckpointError, ClusterError, ClusterGoneError, SaveFailedError
from nbckpt.errors._data import (
    CorruptCheckpointError,
    ForeignEntryError,
    StepBusyError,
    StepNotFoundError,
)
from nbckpt.errors._peer import (
    BarrierTimeoutError,
    PeerDeadError,
    PeerFailedError,
    PeerTransferError,
)
from nbckpt.errors._storage import RootNotWritableError, StorageError
from nbckpt.errors._usage import (
    CommitRefusedError,
    DisagreementError,
    NoRootError,
    RenameUnavailableError,
    RollbackRefusedError,
    StepExistsError,
    StorageURLError,
)

#: The group bases, by what the user does about an error (see the module docstring).
GROUPS = (CallError, PeerError, StorageAccessError, CheckpointDataError, JobError)

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
    "PeerDeadError",
    "PeerFailedError",
    "PeerTransferError",
    "RollbackRefusedError",
    "RootNotWritableError",
    "SaveFailedError",
    "StepBusyError",
    "StepExistsError",
    "StepNotFoundError",
    "StorageError",
    "StorageURLError",
    "NoRootError",
    "RenameUnavailableError",
    "by_process",
    "outcome",
    "who",
]


# Every class is known by its public path: reprs, pickles and the magics' table of
# engine error names (built from this module's namespace) all read ``__module__``.
def _public(module: str) -> None:
    for obj in list(globals().values()):
        if isinstance(obj, type) and issubclass(obj, NbckptError):
            obj.__module__ = module


_public(__name__)
