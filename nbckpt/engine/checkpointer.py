"""AsyncCheckpointer: a short blocking snapshot, then a background multihost commit."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nbckpt import storage
from nbckpt.engine import hooks
from nbckpt.engine.arrays.array_format import format_for
from nbckpt.engine.arrays.tree import flatten
from nbckpt.engine.options import CheckpointerOptions
from nbckpt.engine.options import check_step as _check_step
from nbckpt.engine.restore import step as _restore
from nbckpt.engine.restore.exchange import JobReads
from nbckpt.engine.save.advice import reason as _reason
from nbckpt.engine.save.agreement import save_plan
from nbckpt.engine.save.background import SaveJob, cut_off, fail
from nbckpt.engine.save.commit import strategy_for
from nbckpt.engine.save.preflight import Preflight
from nbckpt.engine.save.prune import prune_everywhere
from nbckpt.engine.save.snapshot import take_snapshot
from nbckpt.engine.sync import health
from nbckpt.engine.sync.barriers import SignalingClient, Synchronizer, default_client
from nbckpt.errors import CheckpointError, NbckptError
from nbckpt.formats.layout import all_steps, is_complete, step_dir
from nbckpt.formats.retention import BestMode, RetentionPolicy, check_metrics, should_save
from nbckpt.journal import JournalWriter
from nbckpt.protocol import (
    DEFAULT_SAVE_TIMEOUT_S,
    READ_BARRIER,
    Cause,
    Event,
    Kind,
    Mode,
    Phase,
    check_timeout,
)
from nbckpt.storage import Location

__all__ = ["AsyncCheckpointer", "CheckpointerOptions"]


class AsyncCheckpointer:
    """Save and restore pytrees of ``jax.Array`` from every process of a JAX job.

    ``save`` returns once the state is safe to keep training on; the write, the
    barriers and the atomic commit run on a background thread. Every process of the
    job must make the same calls in the same order. Use one checkpointer per root in a
    process: it runs one save at a time, so saves to the root never overlap.

    Parameters
    ----------
    root
        The checkpoint root, a directory every process can write (shared storage when
        the processes run on several hosts), or an object-store URL such as
        ``s3://bucket/prefix`` (see :mod:`nbckpt.storage` for its configuration). A
        URL of another scheme is refused, never taken for a local path.
    mode, primary, timeout_s, format
        See :class:`CheckpointerOptions`; ``mode``, ``timeout_s`` and ``format`` are
        defaults that each call may override.
    max_to_keep, keep_period, best_n, best_metric, best_mode, save_interval_steps
        The retention policy, as Orbax's ``CheckpointManagerOptions`` names it (see
        :class:`~nbckpt.formats.retention.RetentionPolicy`); :meth:`set_retention` changes it.
    client
        The key-value client used for barriers; by default the coordination service
        of ``jax.distributed``, or an in-process one for a single process.

    Examples
    --------
    >>> ckptr = AsyncCheckpointer("/tmp/ckpt")          # doctest: +SKIP
    >>> ckptr.save(10, {"params": params})              # doctest: +SKIP
    >>> ckptr.wait_until_finished()                     # doctest: +SKIP
    >>> state = ckptr.restore(target={"params": shardings})  # doctest: +SKIP
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Location,
        *,
        mode: Mode | None = None,
        primary: int = 0,
        timeout_s: float = DEFAULT_SAVE_TIMEOUT_S,
        max_to_keep: int | None = None,
        keep_period: int | None = None,
        best_n: int | None = None,
        best_metric: str | None = None,
        best_mode: BestMode = "min",
        save_interval_steps: int | None = None,
        format: str | None = None,
        client: SignalingClient | None = None,
    ) -> None:
        where = storage.location(root)  # refuses a URL it cannot store at
        mode = storage.commit_mode(where, mode)  # refuses rename mode on an object store
        format_for(format)  # validates the format
        timeout_s = check_timeout(timeout_s, "timeout_s")
        retention = RetentionPolicy(
            max_to_keep=max_to_keep,
            keep_period=keep_period,
            best_n=best_n,
            best_metric=best_metric,
            best_mode=best_mode,
            save_interval_steps=save_interval_steps,
        )
        self.root: Location = where
        self.options = CheckpointerOptions(
            mode=mode, primary=primary, timeout_s=timeout_s, retention=retention, format=format
        )
        kv = client if client is not None else default_client()
        self._health = health.monitor_for(kv)
        self._sync = Synchronizer(kv, health=self._health.check)
        n = self._sync.process_count
        if not 0 <= primary < n:
            raise ValueError(f"primary must be a process index in 0..{n - 1}, got {primary}")
        self._thread: threading.Thread | None = None
        self._job: SaveJob | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._preflight = Preflight(self._sync, self.root, primary)
        #: The id of the last operation this checkpointer started (its journal folder).
        self.last_op: str | None = None

    # -- public API ------------------------------------------------------------------

    @property
    def process_index(self) -> int:
        """This process's index."""
        return self._sync.process_index

    @property
    def process_count(self) -> int:
        """The number of processes in the job."""
        return self._sync.process_count

    def set_retention(self, policy: RetentionPolicy) -> None:
        """Apply ``policy`` from the next commit on (a save in flight keeps the old one)."""
        self.options = dataclasses.replace(self.options, retention=policy)

    def prune_after(self, step: int, *, timeout_s: float | None = None) -> list[int]:
        """Delete every complete step newer than ``step``, and return them: a rollback.

        A save older than the newest step is refused; call this first, on every
        process. Only nbckpt's steps are removed (each crash-safely), never Orbax's.
        """
        self._check_open()
        self.wait_until_finished()
        timeout = check_timeout(timeout_s or self.options.timeout_s, "timeout_s")
        return prune_everywhere(
            self._sync, self.root, self.options.primary, _check_step(step), timeout
        )

    def should_save(self, step: int) -> bool:
        """Tell whether ``step`` is due for a save, as Orbax's ``should_save`` does.

        False for a step not newer than the latest complete step under the root;
        otherwise True when ``save_interval_steps`` is unset or divides ``step``. It
        reads only the root, so every process that sees it answers the same.
        """
        return should_save(_check_step(step), all_steps(self.root), self.options.retention)

    def save(
        self,
        step: int,
        tree: Any,
        *,
        force: bool = False,
        key: str | None = None,
        mode: Mode | None = None,
        timeout_s: float | None = None,
        metrics: Mapping[str, Any] | None = None,
        format: str | None = None,
    ) -> None:
        """Start saving ``tree`` as ``step``; return once the snapshot is safe.

        The snapshot is a host copy of every shard this process writes, so the arrays
        may be donated or changed as soon as this returns. ``None`` and empty
        containers are recorded with the tree, so positions never shift.

        Parameters
        ----------
        step
            A non-negative int; the step directory is ``<root>/<step>``.
        tree
            A pytree whose leaves are ``jax.Array`` (sharded across processes,
            replicated, or mixed), NumPy arrays or Python numbers. NumPy arrays and
            process-local jax arrays must hold the same values on every process: the
            primary writes them.
        force
            Replace ``step`` if it is already committed (rename mode only: the old step
            stays complete until the new one commits).
        key
            A string unique to this call and the same on every process (a driver such
            as the notebook client passes one). Without it, calls are matched across
            processes by their order, so every process must make the same calls.
        mode, timeout_s, format
            Override this checkpointer's defaults for this save (``format``: see
            :class:`CheckpointerOptions`).
        metrics
            Numbers to record with the step (``{"loss": 0.31}``), by which retention
            keeps the best steps (``best_n``, ``best_metric``): Python numbers, NumPy
            scalars or 0-d NumPy or jax arrays (stored as floats).

        Raises
        ------
        StepExistsError
            ``step`` is already committed and ``force`` is False (also when another job
            committed it while this save was writing: that step is kept).
        StepBusyError
            Another job's save is writing ``step`` (the message names it).
        RollbackRefusedError
            ``step`` is older than the newest step; :meth:`prune_after` rolls back.
        DisagreementError
            The processes differ in the tree or an option (the message says where).
        ForeignEntryError
            ``<root>/<step>`` holds a directory nbckpt did not create.
        CommitRefusedError
            ``force`` in commit-file mode for a committed step.
        RootNotWritableError
            Some process cannot write the root; nothing was written.
        TypeError
            A leaf, its dtype or a key cannot be stored (the message names the leaf);
            nothing was written.
        ValueError
            The tree cannot be flattened, or two leaves would get the same name on disk
            (also when they differ only in case), or a name is over 255 bytes or
            reserved by the step directory; nothing was written.
        PeerFailedError
            Another process could not start this save (its error is the reason).
        PeerDeadError
            A process died or became unreachable before the save started, or this
            process lost the coordination service earlier (it cannot rejoin the job).
        CheckpointError
            The previous save failed in the background (raised once).
        """
        self.save_from(
            lambda: tree,
            step,
            force=force,
            key=key,
            mode=mode,
            timeout_s=timeout_s,
            metrics=metrics,
            format=format,
        )

    def save_from(
        self,
        get_tree: Callable[[], Any],
        step: int,
        *,
        force: bool = False,
        key: str | None = None,
        mode: Mode | None = None,
        timeout_s: float | None = None,
        metrics: Mapping[str, Any] | None = None,
        format: str | None = None,
    ) -> None:
        """:meth:`save` the tree that ``get_tree()`` returns.

        An error raised by ``get_tree`` (a variable missing on this process, say) is
        shared with the other processes at once, so none of them waits for this one.
        """
        t_requested = time.time()
        self._check_open()
        self.wait_until_finished()
        # A process that lost the job says so at once, rather than wait for the others.
        self._health.check_service("the start of a save")
        step = _check_step(step)
        metrics = check_metrics(metrics)
        strategy = strategy_for(storage.commit_mode(self.root, mode or self.options.mode))
        arrays = format_for(format or self.options.format)
        timeout = check_timeout(timeout_s or self.options.timeout_s, "timeout_s")
        local: BaseException | None = None
        leaves: list[Any] = []
        try:
            leaves = flatten(get_tree())
        except Exception as e:
            local = e
        plan = save_plan(
            leaves,
            format=arrays.name,
            mode=strategy.mode,
            force=force,
            timeout_s=timeout,
            primary=self.options.primary,
            metrics=metrics,
            retention=self.options.retention.as_dict(),
        )
        op, _ = self._preflight.agree(
            Kind.SAVE, step, timeout, local, strategy=strategy, force=force, key=key, plan=plan
        )
        me, n = self.process_index, self.process_count
        journal = JournalWriter(self.root, op, me, Kind.SAVE, step)
        journal.emit(
            Event.REQUESTED,
            t=t_requested,
            process_count=n,
            primary=self.options.primary,
            mode=strategy.mode,
        )
        try:
            hooks.fire(Phase.SNAPSHOT)
            snap = take_snapshot(leaves, process=me, process_count=n, primary=self.options.primary)
        except Exception as e:
            self._preflight.release(op)  # nothing but the claim was written
            kept = is_complete(step_dir(self.root, step))
            text = fail(
                self._sync,
                journal,
                self.root,
                e,
                Phase.SNAPSHOT,
                committed=False,
                previous_kept=kept,
            )
            journal.close()
            raise CheckpointError(op, step, me, Phase.SNAPSHOT, text, False, kept) from e
        journal.emit(Event.SNAPSHOT_DONE, bytes=snap.nbytes)
        self.last_op = op
        job = SaveJob(
            root=self.root,
            op=op,
            step=step,
            snap=snap,
            journal=journal,
            strategy=strategy,
            sync=self._sync,
            health=self._health.check,
            primary=self.options.primary,
            timeout_s=timeout,
            t_requested=t_requested,
            retention=self.options.retention,
            metrics=metrics,
            arrays=arrays,
            force=force,
        )
        self._job = job
        self._thread = threading.Thread(
            target=self._run, args=(job,), name=f"nbckpt-save-{step}", daemon=True
        )
        self._thread.start()

    def _run(self, job: SaveJob) -> None:
        error = job.run()
        with self._lock:
            if not job.abandoned:
                self._error = error

    def wait_until_finished(self) -> None:
        """Block until the save in flight, if any, is committed or failed.

        Raises
        ------
        CheckpointError
            If that save failed (the error is then cleared), or if this process lost
            the coordination service while it waited: the save then cannot finish, and
            this process cannot rejoin the job.
        """
        thread, job = self._thread, self._job
        if thread is not None:
            while thread.is_alive():
                thread.join(self._sync.poll_s)
                cut = None
                if thread.is_alive():
                    cut = cut_off(job, self._health.check_service, self.process_index)
                if cut is not None:
                    # Its thread may finish once the network is back; its error is this.
                    with self._lock:
                        cut[0].abandoned, self._error = True, None
                    raise cut[1]
            self._thread = None
        self.check_for_errors()

    def check_for_errors(self) -> None:
        """Raise the error of a failed background save, once; return otherwise."""
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def in_flight(self) -> bool:
        """Tell whether a save is still running in the background."""
        return self._thread is not None and self._thread.is_alive()

    def restore(
        self,
        step: int | None = None,
        target: Any = None,
        *,
        key: str | None = None,
        timeout_s: float | None = None,
        cast: bool = False,
        item: str | None = None,
        partial: bool = False,
    ) -> Any:
        """Read a complete step back, each process reading only what it needs.

        The step may be nbckpt's or Orbax's (a ``CheckpointManager`` step, or a
        ``StandardCheckpointer`` pytree saved as ``<root>/<step>``). Every chunk of an
        nbckpt step is checked against the checksum recorded when it was saved. Orbax
        records no checksums: its data is read unchecked (the journal's ``read_done``
        says ``verified: false``), and a missing chunk is an error only where Orbax
        stored every chunk (``store_array_data_equal_to_fill_value``, its default);
        otherwise it reads as the fill value, as it does in Orbax.

        Parameters
        ----------
        step
            The step to read; None means the latest complete step (of either kind).
        target
            None to restore every leaf (jax arrays get their saved mesh layout when the
            device count allows, or are replicated otherwise); or a pytree whose
            leaves are ``jax.ShapeDtypeStruct`` with a sharding, ``jax.sharding``
            objects or ``jax.Array`` (restored as jax arrays with that sharding), or
            anything else (restored as host values; a NumPy array asks for its own
            shape and dtype). A target that leaves saved leaves out is refused unless
            ``partial`` (an Orbax step's subtree target restores that subtree, as in
            Orbax). The process count and mesh may differ from those at save time.
        key
            As for :meth:`save`.
        timeout_s
            Deadline of the agreement among the processes; this checkpointer's default
            if None.
        cast
            Allow a target whose dtype differs from the saved one (the values are
            converted); without it such a target is refused.
        item
            The item of an Orbax ``CheckpointManager`` step to restore (``"params"``);
            None picks its only pytree item. nbckpt steps hold one tree: leave it None.
        partial
            Allow a target that leaves out saved leaves (only its leaves are restored);
            without it such a target is refused, naming the leaves it lacks.

        Returns
        -------
        The restored pytree, shaped like ``target`` (or as nested dicts and lists).
        Without a target, an Orbax step's jax arrays get the sharding Orbax recorded
        when the device count matches, and are replicated otherwise.

        Raises
        ------
        StepNotFoundError
            The step is not complete under the root; the message lists those that are.
        CorruptCheckpointError
            A chunk read back does not match the checksum recorded when it was saved,
            or is missing or unreadable.
        KeyError
            A target leaf is not in the step (the message names it and lists the saved
            leaves), or an Orbax step has no item ``item``.
        ValueError
            A target leaf's shape differs from the saved one, or its dtype does and
            ``cast`` is False; the target leaves saved leaves out and ``partial`` is
            False; a 64-bit leaf would become a jax array in a process without
            ``jax_enable_x64`` (it would be truncated); a target sharding cannot split
            its leaf evenly; or an Orbax step holds several pytree items and ``item``
            is None.
        """
        return self.restore_from(
            lambda: target,
            step,
            key=key,
            timeout_s=timeout_s,
            cast=cast,
            item=item,
            partial=partial,
        )

    def restore_from(
        self,
        get_target: Callable[[], Any],
        step: int | None = None,
        *,
        key: str | None = None,
        timeout_s: float | None = None,
        cast: bool = False,
        item: str | None = None,
        partial: bool = False,
    ) -> Any:
        """:meth:`restore` into the target that ``get_target()`` returns.

        As with :meth:`save_from`, an error raised by ``get_target`` reaches the other
        processes at once.
        """
        self._check_open()
        self.wait_until_finished()
        self._health.check_service("the start of a restore")
        if step is not None:
            step = _check_step(step)
        timeout = check_timeout(timeout_s or self.options.timeout_s, "timeout_s")
        local: BaseException | None = None
        target = None
        try:
            target = get_target()
        except Exception as e:
            local = e
        op, step = self._preflight.agree(Kind.RESTORE, step, timeout, local)
        assert step is not None
        journal = JournalWriter(self.root, op, self.process_index, Kind.RESTORE, step)
        journal.emit(Event.REQUESTED, process_count=self.process_count)

        def agree() -> None:
            # Every process has read and checked its part, or one says why not.
            self._sync.barrier(op, READ_BARRIER, timeout_s=timeout)

        job = JobReads(
            agree, self._preflight.hosts, local_root=isinstance(self.root, Path), scratch=op
        )
        try:
            result = _restore.restore_step(
                step_dir(self.root, step),
                target,
                journal,
                cast=cast,
                item=item,
                job=job,
                partial=partial,
            )
        except BaseException as e:
            error = _reason(e, self.root)
            journal.emit(
                Event.FAILED,
                error=error,
                phase=Phase.READ,
                cause=Cause.ERROR,
                culprit=self.process_index,
            )
            # A peer waiting to exchange pieces with this process gives up at once.
            self._sync.signal_failure(op, error)
            raise
        journal.emit(Event.RESTORED)
        self.last_op = op
        return result

    def close(self) -> None:
        """Wait for the save in flight and stop accepting calls.

        Raises
        ------
        CheckpointError
            If the last save failed.
        """
        if self._closed:
            return
        try:
            self.wait_until_finished()
        finally:
            self._closed = True

    def __enter__(self) -> AsyncCheckpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the protocol ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise NbckptError("this checkpointer is closed; create a new AsyncCheckpointer")
