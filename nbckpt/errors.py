"""Every error nbckpt raises on purpose: one hierarchy under :class:`NbckptError`.

Every message is one line that says what happened and what to do next. None of these
classes needs jax, so notebook-side code can catch them without importing it::

    NbckptError
    ├── BarrierTimeoutError (also TimeoutError)
    ├── PeerFailedError, PeerDeadError        a peer failed; died or became unreachable
    ├── CheckpointError                       a background save failed (engine side)
    ├── StepExistsError (FileExistsError), StepNotFoundError (FileNotFoundError)
    ├── StepBusyError (FileExistsError)       another save owns the step being written
    ├── RollbackRefusedError (ValueError)     a save older than the newest step
    ├── DisagreementError (ValueError)        the processes of a save asked for different things
    ├── RootNotWritableError (PermissionError), ForeignEntryError (FileExistsError)
    ├── CommitRefusedError (FileExistsError)  commit-file mode cannot replace safely
    ├── CorruptCheckpointError                a chunk failed its checksum on restore
    ├── StorageError (OSError)                the store failed a request (object stores)
    ├── StorageURLError (ValueError)          a root URL nbckpt cannot store at
    ├── RenameUnavailableError (ValueError)   rename mode asked of a store without rename
    └── ClusterError                          engines failed a call (notebook side)
        ├── ClusterGoneError                  process 0 died
        └── SaveFailedError                   a save failed on some processes

:func:`who` and :func:`by_process` are the one way a message names processes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = [
    "BarrierTimeoutError",
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
    "RollbackRefusedError",
    "RootNotWritableError",
    "SaveFailedError",
    "StepBusyError",
    "StepExistsError",
    "StepNotFoundError",
    "StorageError",
    "StorageURLError",
    "RenameUnavailableError",
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
            f"{who(self.missing)} did not arrive; check that "
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
    """A process of the job stopped sending heartbeats: it died, or became unreachable.

    Parameters
    ----------
    processes
        The silent processes.
    phase
        What this process was waiting on when it noticed.
    silent_s
        How long the one silent longest has been silent, in seconds.
    hosts
        Where processes run, as ``"h2 at 10.0.0.3"``, where known.
    unreachable
        The silent processes that did not die, each with what dialing it found:
        ``"unreachable"`` (its host did not answer), ``"hung"`` (it still accepts
        connections) or ``"left"`` (it lost the coordination service earlier and left
        the job). The others died: their host answered that nothing listens for them.
    service
        True when the silence is the coordination service's (process 0's), as this
        process saw it, rather than a peer's heartbeat.
    cut_off
        This process, as ``"process 2 on host h2 at 10.0.0.3"``, when no other host
        answered it either: its own link is then the likely cause.
    """

    def __init__(
        self,
        processes: Iterable[int],
        phase: str,
        silent_s: float,
        *,
        hosts: Mapping[int, str] | None = None,
        unreachable: Mapping[int, str] | None = None,
        service: bool = False,
        cut_off: str | None = None,
    ) -> None:
        self.processes = sorted(processes)
        self.phase = phase
        self.silent_s = silent_s
        self.hosts = dict(hosts or {})
        self.unreachable = dict(unreachable or {})
        self.service = service
        self.cut_off = cut_off
        super().__init__(self._message())

    def _named(self, processes: list[int], verb: str) -> str:
        where = [self.hosts[p] for p in processes if p in self.hosts]
        if not where:
            return f"{who(processes)} {verb}"
        return f"{who(processes)} {verb} on host{'s' if len(where) > 1 else ''} {', '.join(where)}"

    def _message(self) -> str:
        restart = "restart the cluster, then restore the latest complete step"
        silent = f"{self.silent_s:.1f} s"
        if not (self.hosts or self.unreachable or self.service or self.cut_off):
            return (
                f"{who(self.processes)} died (no heartbeat for {silent}) during {self.phase}; "
                + restart
            )
        died = [p for p in self.processes if p not in self.unreachable]
        lost = [p for p in self.processes if p in self.unreachable]
        names = " and ".join(
            self._named(ps, verb)
            for ps, verb in ((died, "died"), (lost, "became unreachable"))
            if ps
        )
        # Each clause in the singular, then the plural.
        plural = int(len(self.processes) > 1)
        if self.service:
            runs = "ran" if died else "runs"
            evidence = f"the coordination service it {runs} has not answered for {silent}"
        else:
            evidence = f"no heartbeat for {silent}"
        kinds = set(self.unreachable.values())
        if self.cut_off:
            evidence += f", and no other host answers this one ({self.cut_off}) either"
        elif not lost and all(p in self.hosts for p in died):
            evidence += (
                ", and its host answers that it is gone",
                ", and their hosts answer that they are gone",
            )[plural]
        elif not died and kinds == {"unreachable"}:
            evidence += (", and its host does not answer", ", and their hosts do not answer")[
                plural
            ]
        elif not died and kinds == {"hung"}:
            evidence += (
                ", though it still accepts connections (it hangs, or cannot reach the "
                "coordination service)",
                ", though they still accept connections (they hang, or cannot reach the "
                "coordination service)",
            )[plural]
        elif not died and kinds == {"left"}:
            evidence = (
                "it lost the coordination service earlier and left the job",
                "they lost the coordination service earlier and left the job",
            )[plural]
        text = f"{names}: {evidence}, during {self.phase}; "
        if not lost and not self.cut_off:
            return text + restart
        if self.cut_off:
            return text + f"check this host's network link; the job cannot continue: {restart}"
        return text + f"check the network between the hosts; the job cannot continue: {restart}"


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
        the commit, or removing old steps failed): the step is complete on disk.
    previous_kept
        True when ``step`` was committed before this save (a forced re-save) and that
        earlier data is still there, complete.
    unknown
        True when the store could not be asked what the save left (it stopped
        answering after the primary may have committed).
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
            f"{reason}; {outcome(step, committed, previous_kept, unknown)}"
        )


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


class ForeignEntryError(NbckptError, FileExistsError):
    """A path nbckpt would write holds something nbckpt did not create."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"{path} exists and was not created by nbckpt, which never writes over or "
            "deletes it (even with force); nothing was written: move it away or pick "
            "another step"
        )


class CorruptCheckpointError(NbckptError, ValueError):
    """A chunk read back does not match the checksum recorded when it was saved."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(
            f"checkpoint data at {path} is damaged ({detail}); nothing was restored: "
            "restore another step, and run %ckpt_fsck --verify to see what else is hurt"
        )


class ClusterError(NbckptError):
    """Something went wrong on one or more engines; the message names the processes.

    Attributes
    ----------
    processes
        The processes concerned.
    causes
        Per process, its own error text (``"StepExistsError: step already ..."``), as
        data; empty when the error is not one per process.
    """

    def __init__(
        self,
        message: str,
        processes: list[int] | None = None,
        *,
        causes: Mapping[int, str] | None = None,
    ) -> None:
        self.processes = processes or []
        self.causes = dict(causes or {})
        super().__init__(message)


class ClusterGoneError(ClusterError):
    """Process 0 died, and with it the coordination service and every JAX process."""

    def __init__(self) -> None:
        super().__init__(
            "the JAX cluster is gone: process 0, which hosts the coordination service, "
            "died and every JAX process ended with it; run %ckpt_cluster restart, then "
            "%ckpt_restore VAR to resume from the latest complete step",
            [0],
        )


class SaveFailedError(ClusterError):
    """A save failed on one or more processes; the message says what is on disk."""


class CommitRefusedError(NbckptError, FileExistsError):
    """A forced re-save in commit-file mode would have to delete the committed step first."""

    def __init__(self, path: str) -> None:
        self.path = path
        local = "://" not in path
        super().__init__(
            f"step already committed at {path}, and commit-file mode writes in place, so "
            "replacing it would lose it if the new save failed; nothing was written: save "
            + (
                "under a new step, or use mode='rename' to replace it safely"
                if local
                else "under a new step (object stores have no rename, so a committed step "
                "there is never replaced)"
            )
        )


class StorageError(NbckptError, OSError):
    """A request to the store holding the root failed (after the store's own retries).

    Parameters
    ----------
    url
        The object or prefix the request was about.
    action
        ``"read"``, ``"write"``, ``"list"`` or ``"delete"``.
    reason
        Why, in a few words (e.g. ``bucket 'ck' does not exist``).
    advice
        What to do about it.
    """

    def __init__(self, url: str, action: str, reason: str, advice: str) -> None:
        self.url = url
        self.action = action
        self.reason = reason
        super().__init__(f"{action} of {url} failed: {reason}; {advice}")


class StorageURLError(NbckptError, ValueError):
    """A root given as a URL whose scheme nbckpt cannot store checkpoints at."""

    def __init__(self, url: str, supported: str) -> None:
        self.url = url
        super().__init__(
            f"cannot store checkpoints at {url}: nbckpt supports {supported}; nothing was "
            "written (a URL is never taken for a local path)"
        )


class RenameUnavailableError(NbckptError, ValueError):
    """Rename mode was asked of a root whose store has no atomic rename."""

    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__(
            f"rename mode is not available at {url}: object stores have no atomic rename, "
            "so steps there are published by a commit object written last; leave mode "
            "unset (or pass mode='commit_file')"
        )


class StepBusyError(NbckptError, FileExistsError):
    """Another job (or another save of this one) owns the step this save would write.

    Attributes
    ----------
    path
        The working directory the other save holds.
    owner
        Its owner record: ``op``, ``host``, ``pid`` and ``time`` (when it claimed it).
    """

    def __init__(self, path: str, owner: Mapping[str, object]) -> None:
        self.path = path
        self.owner = dict(owner)
        since = owner.get("time")
        when = ""
        if isinstance(since, int | float):
            import datetime

            stamp = datetime.datetime.fromtimestamp(float(since), datetime.UTC)
            when = f" since {stamp:%Y-%m-%d %H:%M:%S} UTC"
        super().__init__(
            f"{path} is being written by another save (op {owner.get('op')}, host "
            f"{owner.get('host')}, pid {owner.get('pid')}{when}); two jobs must not save "
            "one step to one root: wait for it to end, or if that job is dead remove its "
            "claim with %ckpt_fsck --clean --stale-after 0 (in a shell: nbckpt fsck "
            "ROOT --clean --stale-after 0)"
        )


class RollbackRefusedError(NbckptError, ValueError):
    """A save of a step older than the newest complete step under the root."""

    def __init__(self, root: str, step: int, newer: list[int]) -> None:
        self.root = root
        self.step = step
        self.newer = list(newer)
        shown = ", ".join(str(s) for s in newer[:5]) + (" ..." if len(newer) > 5 else "")
        super().__init__(
            f"step {step} is older than steps {shown} under {root}: retention would delete it "
            f"and a restore would pick step {newer[-1]}; to roll back, delete the newer steps "
            f"first (ckptr.prune_after({step}), or %ckpt_rollback {step} in a notebook), then "
            "save; nothing was written"
        )


class DisagreementError(NbckptError, ValueError):
    """The processes of a save asked for different things; nothing was written."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(
            f"the processes disagree on this save: {detail}; every process must save the "
            "same tree with the same options; nothing was written"
        )
