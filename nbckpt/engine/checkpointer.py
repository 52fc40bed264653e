"""AsyncCheckpointer: a short blocking snapshot, then a background multihost commit.

The class is the public face: its options, retention, rollback and preemption here;
its save side is :class:`~nbckpt.engine.saver.CheckpointSaver` (:func:`start_save`,
:class:`InFlight`) and its read side :class:`~nbckpt.engine.reader.CheckpointReader`
(:func:`restore_agreed`); the rest is its collaborators': :class:`Context` (root and
processes) and :func:`prune_everywhere`.
"""

from __future__ import annotations

import dataclasses
import os

from nbckpt import storage
from nbckpt.engine.arrays.array_format import format_for
from nbckpt.engine.context import Context
from nbckpt.engine.options import CheckpointerOptions, check_pack_bytes, root_or_default
from nbckpt.engine.options import check_step as _check_step
from nbckpt.engine.save.prune import prune_everywhere
from nbckpt.engine.saver import CheckpointSaver
from nbckpt.engine.sync import preemption
from nbckpt.engine.sync.barriers import SignalingClient
from nbckpt.engine.sync.preemption import DEFAULT_GRACE_S
from nbckpt.engine.tiers.local import LocalTier
from nbckpt.engine.tiers.options import tier_options
from nbckpt.formats.layout import is_complete, step_dir
from nbckpt.formats.packs import DEFAULT_PACK_BYTES
from nbckpt.formats.retention import BestMode, RetentionPolicy
from nbckpt.protocol import DEFAULT_SAVE_TIMEOUT_S, Event, Mode, check_timeout
from nbckpt.storage import Location

__all__ = ["AsyncCheckpointer", "CheckpointerOptions"]


class AsyncCheckpointer(CheckpointSaver):
    """Save and restore pytrees of ``jax.Array`` from every process of a JAX job.

    ``save`` returns once the state is safe to keep training on; the write, the
    barriers and the atomic commit run on a background thread. Every process of the
    job must make the same calls in the same order. Use one checkpointer per root in a
    process: it runs one save at a time, so saves to the root never overlap.
    :meth:`save`, :meth:`save_from` and :meth:`wait_until_finished` are its save
    side's (:class:`~nbckpt.engine.saver.CheckpointSaver`); :meth:`restore`,
    :meth:`restore_from` and :meth:`should_save` its read side's
    (:class:`~nbckpt.engine.reader.CheckpointReader`); a restore waits for the save in
    flight first.

    Parameters
    ----------
    root
        The checkpoint root, a directory every process can write (shared storage when
        the processes run on several hosts), or an object-store URL such as
        ``s3://bucket/prefix`` or ``gs://bucket/prefix`` (see :mod:`nbckpt.storage`
        for their configuration). A URL of another scheme is refused, never taken for
        a local path. None: the cluster's ``--dir`` (``%ckpt_cluster start --dir D``
        sets ``NBCKPT_DIR`` on every engine); without one, a
        :class:`~nbckpt.errors.NoRootError`.
    mode, primary, timeout_s, format, pack_bytes, keep_host_buffers
        See :class:`CheckpointerOptions`; ``mode``, ``timeout_s`` and ``format`` are
        defaults that each call may override. ``pack_bytes=0`` stores every leaf as
        its own zarr array, so that Orbax can restore the steps.
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
    local_dir, local_replicas, persistent_every, local_keep
        The local tier (see :class:`~nbckpt.engine.tiers.options.TierOptions`): with
        ``local_dir`` (this host's directory, such as ``/dev/shm/ckpt``), every save
        writes each process's shards there and copies them to ``local_replicas``
        other hosts; steps that are multiples of ``persistent_every`` also go to
        ``root``; each host keeps its newest ``local_keep`` local steps. ``restore``
        then reads the newest step the live hosts hold whole, or the root's if newer.

    Examples
    --------
    >>> ckptr = AsyncCheckpointer("/tmp/ckpt")          # doctest: +SKIP
    >>> ckptr.save(10, {"params": params})              # doctest: +SKIP
    >>> ckptr.wait_until_finished()                     # doctest: +SKIP
    >>> state = ckptr.restore(target={"params": shardings})  # doctest: +SKIP
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Location | None = None,
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
        local_dir: str | os.PathLike[str] | None = None,
        local_replicas: int = 1,
        persistent_every: int = 1,
        local_keep: int = 2,
        pack_bytes: int = DEFAULT_PACK_BYTES,
        keep_host_buffers: bool = True,
    ) -> None:
        where = storage.location(root_or_default(root))  # refuses a URL it cannot store at
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
        tiers = tier_options(local_dir, local_replicas, persistent_every, local_keep)
        options = CheckpointerOptions(
            mode=mode,
            primary=primary,
            timeout_s=timeout_s,
            retention=retention,
            format=format,
            tiers=tiers,
            pack_bytes=check_pack_bytes(pack_bytes),
            keep_host_buffers=bool(keep_host_buffers),
        )
        super().__init__(where, options, Context.connect(where, primary, client))
        self._grace_s = check_timeout(preemption_grace_s, "preemption_grace_s")
        self._watch: preemption.PreemptionWatch | None = None
        self._preemption_saved = False

    # -- public API ------------------------------------------------------------------

    def set_retention(self, policy: RetentionPolicy) -> None:
        """Apply ``policy`` from the next commit on (a save in flight keeps the old one)."""
        self.options = dataclasses.replace(self.options, retention=policy)

    def set_tiers(
        self,
        *,
        local_dir: str | os.PathLike[str] | None = None,
        local_replicas: int = 1,
        persistent_every: int = 1,
        local_keep: int = 2,
    ) -> None:
        """Keep a local tier from the next save on, or none (``local_dir`` None).

        The keywords are the constructor's. The save in flight finishes first. Every
        process must make the same call, each with its own host's directory.
        """
        tiers = tier_options(local_dir, local_replicas, persistent_every, local_keep)
        self._settle()
        if self._tier is not None:
            self._tier.close()
        self.options = dataclasses.replace(self.options, tiers=tiers)
        self._tier = LocalTier(tiers, self.root) if tiers.local_dir else None

    def prune_after(
        self, step: int, *, timeout_s: float | None = None, key: str | None = None
    ) -> list[int]:
        """Delete every complete step newer than ``step``, and return them: a rollback.

        A save older than the newest step is refused; call this first, on every
        process. Only nbckpt's steps are removed (each crash-safely), never Orbax's.
        ``key`` is as for :meth:`save`: the processes' calls are matched by it rather
        than by their order.
        """
        self._settle()
        timeout = check_timeout(timeout_s or self.options.timeout_s, "timeout_s")
        return prune_everywhere(
            self._ctx.sync, self.root, self.options.primary, _check_step(step), timeout, key
        )

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

        Once the save of the step agreed after a preemption notice is committed, its
        journal says so for this process (``preemption_saved``): it may stop.

        Raises
        ------
        CheckpointError
            If that save failed (the error is then cleared), or if this process lost
            the coordination service while it waited: the save then cannot finish, and
            this process cannot rejoin the job.
        """
        super().wait_until_finished()
        job, watch = self._inflight.job, self._watch
        if job is None or watch is None or self._preemption_saved:
            return
        told = preemption.notice_for(self._ctx.health.client, job.step)
        if told is not None and is_complete(step_dir(self.root, job.step)):
            self._preemption_saved = True
            job.journal.emit(Event.PREEMPTION_SAVED, preemption=told)

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
            self._buffers.clear()
            if self._tier is not None:
                self._tier.close()

    def __enter__(self) -> AsyncCheckpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
