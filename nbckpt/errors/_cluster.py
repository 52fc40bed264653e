"""Cluster errors: an operation of the job failed on one or more processes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

from nbckpt.errors._base import JobError, by_process, outcome

__all__ = ["CheckpointError", "ClusterError", "ClusterGoneError", "SaveFailedError"]


class CheckpointError(JobError):
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
        the commit, or removing old steps failed): the step is complete on disk.
    previous_kept
        True when ``step`` was committed before this save (a forced re-save) and that
        earlier data is still there, complete.
    unknown
        True when the store could not be asked what the save left (it stopped
        answering after the primary may have committed).
    failures
        Per process, the cause of the failure (its own error text); by default
        ``{process: reason}``, and the peers' own when a peer's failure or death
        stopped this process. The message is the same either way.
    """

    def __init__(
        self,
        op: str,
        step: int,
        process: int,
        phase: str,
        reason: str,
        committed: bool = False,
        previous_kept: bool = False,
        unknown: bool = False,
        *,
        failures: Mapping[int, str] | None = None,
    ) -> None:
        self.op = op
        self.step = step
        self.process = process
        self.phase = phase
        self.reason = reason
        self.committed = committed
        self.previous_kept = previous_kept
        self.unknown = unknown
        super().__init__(
            f"save of step {step} ({op}) failed on process {process} during {phase}: "
            f"{reason}; {outcome(step, committed, previous_kept, unknown)}",
            failures=failures or {process: reason},
        )


class ClusterError(JobError):
    """Something went wrong on one or more engines; the message names the processes.

    Attributes
    ----------
    processes
        The processes concerned.
    failures
        Per process, its own error text (``"StepExistsError: step already ..."``), as
        data; empty when the error is not one per process. ``-1`` stands for an engine
        that could not be matched to a process.
    causes
        The same mapping as ``failures`` (its earlier name).
    """

    def __init__(
        self,
        message: str,
        processes: list[int] | None = None,
        *,
        causes: Mapping[int, str] | None = None,
        failures: Mapping[int, str] | None = None,
    ) -> None:
        self.processes = processes or []
        super().__init__(message, failures=failures if failures is not None else causes)
        self.causes = self.failures

    @classmethod
    def from_failures(cls, what: str, failures: Mapping[int, str]) -> Self:
        """One error for per-process error texts: ``<what> failed on <by process>``.

        Processes with equal texts are named together; the processes concerned are
        those of ``failures`` (``-1``, an unmatched engine, is not one).
        """
        failures = dict(failures)
        procs = sorted(p for p in failures if p >= 0)
        return cls(f"{what} failed on {by_process(failures)}", procs, failures=failures)


class ClusterGoneError(ClusterError):
    """Process 0 died, and with it the coordination service and every JAX process."""

    def __init__(self) -> None:
        super().__init__(
            "the JAX cluster is gone: process 0, which hosts the coordination service, "
            "died and every JAX process ended with it; run %ckpt_cluster restart, then "
            "%ckpt_restore VAR to resume from the latest complete step",
            [0],
            failures={0: "died (it hosted the coordination service)"},
        )


class SaveFailedError(ClusterError):
    """A save failed on one or more processes; the message says what is on disk."""
