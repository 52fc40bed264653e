"""One save's background part: prepare, write, barriers, finalize, retention.

:class:`SaveJob` runs on the checkpointer's thread once the snapshot is taken. It
journals every phase, fires the phase hooks, and on failure journals the cause as data
(``cause``, ``culprit``, ``committed``, ``previous_kept``) before telling the peers.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbckpt.engine import hooks
from nbckpt.engine.arrays.array_format import ArrayFormat, Zarr2Arrays
from nbckpt.engine.save.advice import reason
from nbckpt.engine.save.commit import CommitStrategy
from nbckpt.engine.save.hostmem import Loan
from nbckpt.engine.save.metadata import MetadataDraft, draft_metadata, seal_metadata
from nbckpt.engine.save.prune import apply_retention
from nbckpt.engine.save.snapshot import Snapshot
from nbckpt.engine.save.writer import SETTLE_TIMEOUT_S
from nbckpt.engine.sync.barriers import Synchronizer
from nbckpt.engine.tiers.local import LocalTier
from nbckpt.engine.tiers.local_save import save_local
from nbckpt.errors import (
    BarrierTimeoutError,
    CheckpointError,
    PeerDeadError,
    PeerError,
    PeerFailedError,
    StorageError,
)
from nbckpt.formats.layout import (
    CHECKSUMS_DIR,
    is_complete,
    read_metadata,
    read_owner,
    step_dir,
    write_durable,
)
from nbckpt.formats.retention import RetentionPolicy
from nbckpt.journal import JournalWriter, summarize_quietly
from nbckpt.pools import LazyPool
from nbckpt.protocol import (
    DECISION_KEY,
    Barrier,
    Cause,
    Event,
    Phase,
    Tier,
    barrier_key,
    barrier_phase,
)
from nbckpt.storage import Location, ObjectPath

__all__ = ["SaveJob", "cut_off", "fail", "failures"]

#: Where the primary prepares its finalize while its own shards are written.
_finalizing = LazyPool(1, "nbckpt-finalize")
#: Where a process writes its checksums file while its chunks are still written; two
#: threads, as for the packs (:data:`nbckpt.engine.save.writer._packing`).
_summing = LazyPool(2, "nbckpt-checksums-write")


def committed_by(final: Location, op: str) -> bool:
    """Whether ``final`` is complete and holds the step that operation ``op`` committed."""
    if not is_complete(final):
        return False
    meta = read_metadata(final)
    return meta is not None and meta.get("op") == op


def _cause(error: BaseException, me: int) -> tuple[Cause, int | None]:
    """Why this process failed, and which process it blames."""
    if isinstance(error, PeerFailedError):
        return Cause.PEER_FAILED, error.process
    if isinstance(error, PeerDeadError):
        return Cause.PEER_DEAD, error.processes[0] if error.processes else None
    if isinstance(error, BarrierTimeoutError):
        return Cause.TIMEOUT, error.missing[0] if error.missing else None
    return Cause.ERROR, me


def failures(error: BaseException, me: int, text: str) -> dict[int, str]:
    """Per process, the cause of a failure: the peers' own, or this process's ``text``."""
    if isinstance(error, PeerError) and error.failures:
        return dict(error.failures)
    return {me: text}


def fail(
    sync: Synchronizer,
    journal: JournalWriter,
    root: Location,
    error: BaseException,
    phase: str,
    *,
    committed: bool,
    previous_kept: bool,
) -> str:
    """Journal a failure with its cause as data, then tell the peers; return its text."""
    text = reason(error, root)
    cause, culprit = _cause(error, sync.process_index)
    # Every process found silent, so that the views mark each one dead; not when this
    # process is the one cut off (the others then only look dead from here).
    silent: dict[str, Any] = {}
    if isinstance(error, PeerDeadError) and not error.cut_off:
        silent = {"dead": error.processes, "unreachable": sorted(error.unreachable)}
    # Journal before telling the peers, so the cause is the first failure on record.
    journal.emit(
        Event.FAILED,
        error=text,
        phase=phase,
        cause=cause,
        culprit=culprit,
        committed=committed,
        previous_kept=previous_kept,
        **silent,
    )
    if cause == Cause.ERROR:
        sync.signal_failure(journal.op, f"{text} (during {phase})")
    return text


def _check_exists(work: Location) -> None:
    """Raise FileNotFoundError if a local working directory is gone (read as "vanished")."""
    if isinstance(work, Path) and not work.is_dir():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(work))


@dataclass
class SaveJob:
    """Everything the background part of one save needs."""

    root: Location
    op: str
    step: int
    snap: Snapshot
    journal: JournalWriter
    strategy: CommitStrategy
    sync: Synchronizer
    health: Callable[[str], None]
    primary: int
    timeout_s: float
    t_requested: float
    retention: RetentionPolicy
    metrics: dict[str, float] = field(default_factory=dict)
    #: Whether the caller asked to replace a committed ``step`` (finalize checks again).
    force: bool = False
    #: How the arrays are stored (``format=``): nbckpt's own layout, or Orbax's.
    arrays: ArrayFormat = field(default_factory=Zarr2Arrays)
    #: The phase it is in; with ``written_everywhere``, what a waiter that stops
    #: waiting for it (this process lost the job, see ``health``) can say.
    phase: str = field(default=Phase.PREPARE, init=False)
    #: Whether every process had written its shards (the primary may then commit).
    written_everywhere: bool = field(default=False, init=False)
    #: Set once its failure was reported without it: its own error is then not raised.
    abandoned: bool = field(default=False, init=False)
    #: The checkpointer's local tier, if it has one: written first, on every save.
    tier: LocalTier | None = None
    #: Whether the step also goes to the root (always, without a local tier).
    persistent: bool = True
    #: The host buffers the snapshot borrowed, settled when the job ends.
    loan: Loan | None = None

    def run(self) -> CheckpointError | None:
        """Write, meet the others, commit; return the error to raise later, if any."""
        error = self._run()
        # The checkpointer keeps its last job: without its copies, which the buffers'
        # owner keeps for the next save (or frees), not the job.
        if self.loan is not None:
            self.loan.end(error is None)
        for w in self.snap.writes:
            w.data = None
        return error

    def _run(self) -> CheckpointError | None:
        me = self.sync.process_index
        is_primary = me == self.primary
        work = self.strategy.work_dir(self.root, self.step)

        def enter(name: str) -> None:
            self.phase = name
            hooks.fire(name)

        try:
            if self.tier is not None:
                save_local(self, self.tier)
            if self.persistent:
                self._persist(work, is_primary, enter)
            else:
                self.journal.emit(Event.COMMITTED, tier=Tier.LOCAL)
        except BaseException as e:
            if is_primary:
                self._decide(Event.FAILED)
            elif self.written_everywhere:
                # The primary may still finalize (every shard is durable): say what it
                # decided, not what the disk held a moment before.
                self._await_decision()
            # Past the finalize the step may be complete although a peer then failed;
            # a forced re-save that failed earlier left the old step as it was.
            final = step_dir(self.root, self.step)
            unknown = False
            try:
                committed = committed_by(final, self.op)
                kept = not committed and is_complete(final)
            except StorageError:
                # The store stopped answering. The primary commits only once every
                # process has written: before that, nothing can have been committed.
                committed = kept = False
                unknown = self.written_everywhere
            text = fail(
                self.sync,
                self.journal,
                self.root,
                e,
                self.phase,
                committed=committed,
                previous_kept=kept,
            )
            return CheckpointError(
                self.op,
                self.step,
                me,
                self.phase,
                text,
                committed,
                kept,
                unknown=unknown,
                failures=failures(e, me, text),
            )
        finally:
            self.journal.close()
        n = self.sync.process_count
        if is_primary and self.persistent and n > 1 and isinstance(self.journal.path, ObjectPath):
            # One object for the whole save, once every process has recorded the commit.
            summarize_quietly(self.journal.path.parent, n)
        return None

    def _persist(self, work: Location, is_primary: bool, enter: Callable[[str], None]) -> None:
        """Write the step under the root, meet the others, and let the primary commit."""
        me = self.sync.process_index
        enter(Phase.PREPARE)
        if is_primary:
            # The preflight claimed the working directory, owner record and all.
            self.strategy.prepare(self.root, self.step)
            self._check_still_ours(work)
            self.arrays.create(work, self.snap, me)
        enter(barrier_phase(Barrier.TMP_READY))
        self._barrier(Barrier.TMP_READY)
        self.journal.emit(Event.TMP_READY)
        enter(Phase.WRITE)
        ahead: Future[tuple[list[Location], MetadataDraft]] | None = None
        if is_primary and self.arrays.finishes_alone:
            # Its metadata rendered and its arrays' records written (not yet durable)
            # while the shards are: a few ms a save off the primary's finalize.
            ahead = _finalizing.get().submit(self._prepare_finalize, work, check=True)
        try:
            self._write(work)
            enter(barrier_phase(Barrier.WRITE_COMPLETE))
            self._barrier(Barrier.WRITE_COMPLETE)
        except BaseException:
            if ahead is not None:
                # It writes into the working directory: it must not outlive the save,
                # whose step a retry may claim again (its own error is this one's).
                wait([ahead], timeout=SETTLE_TIMEOUT_S)
            raise
        self.written_everywhere = True
        if is_primary:
            enter(Phase.FINALIZE)
            self.journal.emit(Event.FINALIZE_STARTED)
            self._check_still_ours(work)
            unsynced, draft = self._prepare_finalize(work) if ahead is None else ahead.result()
            seal_metadata(draft, work, unsynced)
            self.strategy.finalize(self.root, self.step, self.op, force=self.force)
            self._decide(Event.COMMITTED)
            self.journal.emit(Event.FINALIZED)
        enter(barrier_phase(Barrier.COMMIT_COMPLETE))
        self._barrier(Barrier.COMMIT_COMPLETE)
        self.journal.emit(Event.COMMITTED)
        if is_primary and self.retention.limits:
            self.phase = Phase.RETENTION
            apply_retention(self.root, self.retention, keep=self.step)

    def _prepare_finalize(
        self, work: Location, *, check: bool = False
    ) -> tuple[list[Location], MetadataDraft]:
        """Primary only: the arrays' own records (not durable yet) and the metadata.

        With ``check``, first make sure the working directory is still this save's:
        writing the records would otherwise bring back one removed under the save.
        """
        if check:
            self._check_still_ours(work)
        return self.arrays.finish(work, self.snap), draft_metadata(self)

    def _barrier(self, name: str) -> None:
        self.journal.emit(Event.BARRIER_ENTER, name=name)
        self.sync.barrier(self.op, name, timeout_s=self.timeout_s)
        self.journal.emit(Event.BARRIER_EXIT, name=name)

    def _check_still_ours(self, work: Location) -> None:
        """Raise if the working directory vanished, or is no longer this save's.

        Writers create the directories their chunks need, so a working directory
        removed under a save would otherwise come back, without its owner record.
        """
        _check_exists(work)
        owner = read_owner(work)
        if owner is None or owner.get("op") != self.op:
            raise FileNotFoundError(
                errno.ENOENT, f"{os.strerror(errno.ENOENT)} (its owner record)", str(work)
            )

    def _write(self, work: Location) -> None:
        """Write this process's shards and their checksums, durably."""
        _check_exists(work)
        # An injected slowdown is part of the record: a view can say why it was slow.
        slowdown = hooks.io_slowdown()
        fault: dict[str, Any] = {"fault": f"slow-io x{slowdown:g}"} if slowdown > 1 else {}
        self.journal.emit(Event.WRITE_STARTED, bytes=self.snap.nbytes, **fault)

        def watch() -> None:
            # A long write still gives up soon after a peer dies or fails.
            self.health(Phase.WRITE)
            self.sync.check_failures(self.op)

        checksums: dict[str, Any] = {}
        sums = work / CHECKSUMS_DIR
        name = f"process_{self.sync.process_index}.json"

        def write_sums() -> None:
            sums.mkdir(exist_ok=True)
            write_durable(sums / name, json.dumps(checksums))

        # The checksums are known once every chunk write is issued: their file is
        # written and fsync'd while the chunks still are, not after them.
        sums_written: list[Future[None]] = []
        try:
            written = self.arrays.write(
                work,
                self.snap,
                self.sync.process_index,
                progress=lambda b: self.journal.emit(Event.WRITE_PROGRESS, bytes=b),
                watch=watch,
                checksums=checksums,
                issued=lambda: sums_written.append(_summing.get().submit(write_sums)),
            )
            if sums_written:
                sums_written[0].result()
            else:
                write_sums()
        finally:
            wait(sums_written)  # a failed write leaves no file being written behind
        self.journal.emit(Event.WRITE_DONE, bytes=written)

    def _decide(self, outcome: str) -> None:
        """Primary only: publish whether it finalized, once (best effort)."""
        with contextlib.suppress(Exception):
            self.sync.client.key_value_set(barrier_key(self.op, DECISION_KEY), outcome)

    def _await_decision(self) -> None:
        """Wait until the primary has finalized or given up, or is known dead."""
        deadline = time.monotonic() + self.timeout_s
        key = barrier_key(self.op, DECISION_KEY)
        while time.monotonic() < deadline:
            try:
                if self.sync.client.blocking_key_value_get(key, 0.2):
                    return
                self.health(Phase.FINALIZE)
            except Exception:
                return  # the primary or the service is gone: the disk says the rest


def cut_off(
    job: SaveJob | None, check_service: Callable[[str], None], process: int
) -> tuple[SaveJob, CheckpointError] | None:
    """The save and the error to raise if this process lost the coordination service.

    Every call to the service then hangs, the save's own thread's too: a waiter raises
    this instead of waiting as long. None while the service answers (or no save runs).
    """
    if job is None:
        return None
    try:
        check_service(job.phase.replace(":", " "))
    except PeerDeadError as e:
        # Only once every process has written can the primary have committed.
        text = reason(e, job.root)
        error = CheckpointError(
            job.op,
            job.step,
            process,
            job.phase,
            text,
            unknown=job.written_everywhere,
            failures=failures(e, process, text),
        )
        error.__cause__ = e
        return job, error
    return None
