"""AsyncCheckpointer: a short blocking snapshot, then a background multihost commit.

The class is the public face; the work is its collaborators': :class:`Context` (root
and processes), :func:`start_save` (plan, preflight, snapshot), :class:`InFlight` (the
save in the background), :func:`restore_agreed` and :func:`prune_everywhere`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from nbckpt import storage
from nbckpt.engine.arrays.array_format import format_for
from nbckpt.engine.context import Context
from nbckpt.engine.options import CheckpointerOptions
from nbckpt.engine.options import check_step as _check_step
from nbckpt.engine.reader import CheckpointReader
from nbckpt.engine.save.inflight import InFlight
from nbckpt.engine.save.prune import prune_everywhere
from nbckpt.engine.save.start import start_save
from nbckpt.engine.sync import preemption
from nbckpt.engine.sync.barriers import SignalingClient
from nbckpt.engine.sync.preemption import DEFAULT_GRACE_S
from nbckpt.formats.layout import is_complete, step_dir
from nbckpt.formats.retention import BestMode, RetentionPolicy
from nbckpt.protocol import DEFAULT_SAVE_TIMEOUT_S, Mode, check_timeout
from nbckpt.storage import Location

__all__ = ["AsyncCheckpointer", "CheckpointerOptions"]


class AsyncCheckpointer(CheckpointReader):
    """Save and restore pytrees of ``jax.Array`` from every process of a JAX job.

    ``save`` returns once the state is safe to keep training on; the write, the
    barriers and the atomic commit run on a background thread. Every process of the
    job must make the same calls in the same order. Use one checkpointer per root in a
    process: it runs one save at a time, so saves to the root never overlap.
    :meth:`restore`, :meth:`restore_from` and :meth:`should_save` are its read side's
    (:class:`~nbckpt.engine.reader.CheckpointReader`); a restore waits for the save in
    flight first.

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
    preemption_grace_s
        Once this process hears of a preemption, how long it may live: at the end a
        process still running exits (0 if the agreed step was committed). See
        :meth:`reached_preemption`.

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
        preemption_grace_s: float = DEFAULT_GRACE_S,
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
        options = CheckpointerOptions(
            mode=mode, primary=primary, timeout_s=timeout_s, retention=retention, format=format
        )
        super().__init__(where, options, Context.connect(where, primary, client))
        self._inflight = InFlight(self._ctx.sync, self._ctx.health)
        self._grace_s = check_timeout(preemption_grace_s, "preemption_grace_s")
        self._watch: preemption.PreemptionWatch | None = None

    # -- public API ------------------------------------------------------------------

    def set_retention(self, policy: RetentionPolicy) -> None:
        """Apply ``policy`` from the next commit on (a save in flight keeps the old one)."""
        self.options = dataclasses.replace(self.options, retention=policy)

    def prune_after(self, step: int, *, timeout_s: float | None = None) -> list[int]:
        """Delete every complete step newer than ``step``, and return them: a rollback.

        A save older than the newest step is refused; call this first, on every
        process. Only nbckpt's steps are removed (each crash-safely), never Orbax's.
        """
        self._settle()
        timeout = check_timeout(timeout_s or self.options.timeout_s, "timeout_s")
        return prune_everywhere(
            self._ctx.sync, self.root, self.options.primary, _check_step(step), timeout
        )

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
        self._settle()
        job = start_save(
            self._ctx,
            self.options,
            get_tree,
            step,
            force=force,
            key=key,
            mode=mode,
            timeout_s=timeout_s,
            metrics=metrics,
            format=format,
            t_requested=t_requested,
        )
        self.last_op = job.op
        self._inflight.start(job)

    def reached_preemption(self, step: int) -> bool:
        """Tell whether to save ``step`` now because a process was told to stop.

        False until any process of the job gets SIGTERM (a preemption notice, or
        ``%ckpt_fault preempt``); then True on every process at the same step, the
        first one that every process can still reach, and only from there on. Call it
        at every step, on every process, from the main thread (the first call
        installs the SIGTERM handler); before a notice it costs a lock and a flag. A
        process stays alive after its SIGTERM until ``preemption_grace_s`` has passed
        or a second SIGTERM comes. See :mod:`nbckpt.engine.sync.preemption`.

        Examples
        --------
        >>> for step in range(start, steps):                          # doctest: +SKIP
        ...     state, loss = train_step(state, batch)
        ...     if ckptr.should_save(step) or ckptr.reached_preemption(step):
        ...         ckptr.save(step, state)
        ...     if ckptr.reached_preemption(step):
        ...         ckptr.wait_until_finished()
        ...         break
        """
        watch = self._watch
        if watch is None:
            watch = preemption.watch_for(self._ctx.health.client, grace_s=self._grace_s)
            if watch.committed is None:
                watch.committed = lambda s: is_complete(step_dir(self.root, s))
            self._watch = watch
        return watch.reached(_check_step(step))

    def wait_until_finished(self) -> None:
        """Block until the save in flight, if any, is committed or failed.

        Raises
        ------
        CheckpointError
            If that save failed (the error is then cleared), or if this process lost
            the coordination service while it waited: the save then cannot finish, and
            this process cannot rejoin the job.
        """
        self._inflight.wait()

    def check_for_errors(self) -> None:
        """Raise the error of a failed background save, once; return otherwise."""
        self._inflight.raise_error()

    def in_flight(self) -> bool:
        """Tell whether a save is still running in the background."""
        return self._inflight.running()

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

    @property
    def _thread(self) -> Any:
        # The save's thread, for tests that wait on it without raising its error.
        return self._inflight.thread

    def _settle(self) -> None:
        super()._settle()
        self.wait_until_finished()
