"""Errors raised by nbckpt.

Every message is one line that says what happened and what to do next. None of these
classes needs jax, so notebook-side code can catch them without importing it.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "BarrierTimeoutError",
    "CheckpointError",
    "NbckptError",
    "PeerDeadError",
    "PeerFailedError",
    "RootNotWritableError",
    "StepExistsError",
    "StepNotFoundError",
]


def _names(processes: Iterable[int]) -> str:
    procs = sorted(processes)
    if len(procs) == 1:
        return f"process {procs[0]}"
    return "processes " + ", ".join(str(p) for p in procs)


class NbckptError(Exception):
    """Base class of every error nbckpt raises on purpose."""


class BarrierTimeoutError(NbckptError, TimeoutError):
    """Not every process reached a barrier before its deadline.

    Parameters
    ----------
    barrier
        The barrier's key, ``nbckpt/<op>/<name>``.
    missing
        The processes that had not arrived.
    timeout_s
        The deadline that passed, in seconds.
    """

    def __init__(self, barrier: str, missing: Iterable[int], timeout_s: float) -> None:
        self.barrier = barrier
        self.missing = sorted(missing)
        self.timeout_s = timeout_s
        super().__init__(
            f"barrier {barrier!r} timed out after {timeout_s:g} s: "
            f"{_names(self.missing)} did not arrive; check that "
            f"{'it is' if len(self.missing) == 1 else 'they are'} alive and running the "
            "same operation, or raise timeout_s"
        )


class PeerFailedError(NbckptError):
    """Another process of the same operation failed, so this one gave up too.

    Parameters
    ----------
    process
        The index of the process that failed first.
    reason
        That process's own error text.
    """

    def __init__(self, process: int, reason: str) -> None:
        self.process = process
        self.reason = reason
        super().__init__(f"process {process} failed: {reason}")


class PeerDeadError(NbckptError):
    """A process of the job stopped sending heartbeats: it is dead.

    Parameters
    ----------
    processes
        The dead processes.
    phase
        What this process was waiting on when it noticed.
    silent_s
        How long the first of them has been silent, in seconds.
    """

    def __init__(self, processes: Iterable[int], phase: str, silent_s: float) -> None:
        self.processes = sorted(processes)
        self.phase = phase
        self.silent_s = silent_s
        super().__init__(
            f"{_names(self.processes)} died (no heartbeat for {silent_s:.1f} s) during "
            f"{phase}; restart the cluster, then restore the latest complete step"
        )


class CheckpointError(NbckptError):
    """A background save failed; raised once, on the next call to the checkpointer.

    Parameters
    ----------
    op
        The operation id (its journal lives under ``<root>/.nbckpt/ops/<op>``).
    step
        The step that was being saved.
    process
        The process that raises it.
    phase
        The phase the operation was in when it failed.
    reason
        The underlying error text.
    committed
        True when the step was finalized before the failure (a process died after
        the commit): the step is complete on disk.
    """

    def __init__(
        self, op: str, step: int, process: int, phase: str, reason: str, committed: bool = False
    ) -> None:
        self.op = op
        self.step = step
        self.process = process
        self.phase = phase
        self.reason = reason
        self.committed = committed
        outcome = (
            f"step {step} had been committed before the failure and is complete on disk"
            if committed
            else "nothing was committed for this step, earlier steps are untouched"
        )
        super().__init__(
            f"save of step {step} ({op}) failed on process {process} during {phase}: "
            f"{reason}; {outcome}"
        )


class StepExistsError(NbckptError, FileExistsError):
    """The step to save is already committed under the root."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"step already committed at {path}; pick a new step, or pass force=True to replace it"
        )


class StepNotFoundError(NbckptError, FileNotFoundError):
    """The step to restore is not a complete checkpoint under the root."""

    def __init__(self, root: str, step: int | None, existing: list[int]) -> None:
        self.root = root
        self.step = step
        self.existing = existing
        have = ", ".join(str(s) for s in existing) if existing else "none"
        what = "no complete checkpoint" if step is None else f"no complete step {step}"
        super().__init__(f"{what} in {root}; complete steps there: {have}")


class RootNotWritableError(NbckptError, PermissionError):
    """The checkpoint root cannot be created or written by some process."""

    def __init__(self, root: str, process: int, reason: str) -> None:
        self.root = root
        self.process = process
        self.reason = reason
        super().__init__(
            f"checkpoint root {root} is not writable from process {process} ({reason}); "
            "choose a directory every process can write, nothing was saved"
        )
