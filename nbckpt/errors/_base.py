"""The root of nbckpt's errors, its five groups, and the one way messages name processes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar

__all__ = [
    "CallError",
    "CheckpointDataError",
    "JobError",
    "NbckptError",
    "PeerError",
    "StorageAccessError",
    "by_process",
    "outcome",
    "who",
]


def who(processes: Iterable[int]) -> str:
    """Name processes in a message: ``process 2``, ``processes 0, 3``, or ``an engine``.

    Negative indices stand for engines that could not be matched to a process.
    """
    procs = sorted(p for p in processes if p >= 0)
    if not procs:
        return "an engine"
    if len(procs) == 1:
        return f"process {procs[0]}"
    return "processes " + ", ".join(str(p) for p in procs)


def by_process(errors: dict[int, str]) -> str:
    """Join per-process error texts into one line, grouping processes with equal texts.

    ``{0: "A", 1: "A", 3: "B"}`` reads ``processes 0, 1: A; process 3: B``.
    """
    grouped: dict[str, list[int]] = {}
    for p, text in sorted(errors.items()):
        grouped.setdefault(text, []).append(p)
    return "; ".join(f"{who(ps)}: {text}" for text, ps in grouped.items())


def outcome(step: int | None, committed: bool, previous_kept: bool, unknown: bool = False) -> str:
    """Say what a failed save left on disk, in the words every message uses."""
    if unknown:
        return (
            f"the store could not be asked whether step {step} was committed: list the "
            "steps once it answers again (a step is listed only if it is complete)"
        )
    if committed:
        return f"step {step} had been committed before the failure and is complete on disk"
    if previous_kept:
        return f"the previously committed step {step} is untouched and still restorable"
    return "nothing was committed for this step, earlier steps are untouched"


class NbckptError(Exception):
    """Base class of every error nbckpt raises on purpose.

    Each group below says, in ``what_to_do``, what the user does about its errors (the
    troubleshooting page of the documentation is generated from it).
    """

    #: What the user does about an error of this group, in one sentence.
    what_to_do: ClassVar[str] = ""


# -- the groups: what the user does about an error ------------------------------------


class CallError(NbckptError):
    """The call asked for something nbckpt refuses: change the call and make it again.

    A step already committed, a save older than the newest step, processes that asked
    for different things, a root URL or mode the store cannot serve. Nothing was
    written. Its subclasses keep the standard base a caller may already catch
    (``FileExistsError``, ``ValueError``).
    """

    what_to_do = "change the call as the message says and make it again; nothing was written"


class PeerError(NbckptError):
    """Another process of the job failed, died or timed out, so this one gave up.

    Attributes
    ----------
    failures
        Per process, what happened to it (its own error text, ``"died"``, ``"did not
        arrive at ..."``), as data: callers never parse the message.
    """

    what_to_do = (
        "look at the process the message names first (its own error, or why it died: "
        "%ckpt_status, its host); the others only gave up because of it"
    )

    def __init__(self, *args: object, failures: Mapping[int, str] | None = None) -> None:
        super().__init__(*args)
        self.failures: dict[int, str] = dict(failures or {})


class StorageAccessError(NbckptError):
    """The storage holding the root refused or failed a request: check the store.

    Its permissions, its credentials, whether it is up; the checkpoint's contents are
    not in question. Its subclasses are ``OSError`` s too.
    """

    what_to_do = (
        "check the store the message names: permissions, credentials, free space, whether "
        "it answers; committed steps are untouched"
    )


class CheckpointDataError(NbckptError):
    """What the root holds is not what the call needs: corrupt, missing or foreign data.

    Or a step another save still owns. Look at the root (``%ckpt_fsck``, ``nbckpt
    fsck``), or pick another step.
    """

    what_to_do = "look at the root (%ckpt_fsck, or nbckpt fsck ROOT), or pick another step"


class JobError(NbckptError):
    """An operation of the job (the cluster) failed on one or more processes.

    The message says what is on disk; restart or inspect the processes it names.

    Attributes
    ----------
    failures
        Per process, its own error text, as data (torch DCP's
        ``CheckpointException.failures`` is the model); empty when the error is not
        one per process.
    """

    what_to_do = (
        "read what the message says is on disk, then %ckpt_cluster restart (a JAX "
        "process cannot rejoin) and %ckpt_restore, or inspect the processes it names"
    )

    def __init__(self, *args: object, failures: Mapping[int, str] | None = None) -> None:
        super().__init__(*args)
        self.failures: dict[int, str] = dict(failures or {})
