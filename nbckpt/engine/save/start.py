"""The blocking part of a save: plan, preflight agreement, snapshot, then a SaveJob.

:func:`start_save` returns once the snapshot is safe; the :class:`SaveJob` it builds
is what runs in the background (see :mod:`nbckpt.engine.save.inflight`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from nbckpt import storage
from nbckpt.engine import hooks
from nbckpt.engine.arrays.array_format import format_for
from nbckpt.engine.arrays.tree import flatten
from nbckpt.engine.context import Context
from nbckpt.engine.options import CheckpointerOptions, check_pack_bytes, check_step
from nbckpt.engine.save.agreement import save_plan
from nbckpt.engine.save.background import SaveJob, fail, failures
from nbckpt.engine.save.commit import strategy_for
from nbckpt.engine.save.hostmem import HostBuffers
from nbckpt.engine.save.snapshot import take_snapshot
from nbckpt.engine.sync import preemption
from nbckpt.engine.tiers.local import LocalTier
from nbckpt.errors import CheckpointError
from nbckpt.formats.layout import is_complete, step_dir
from nbckpt.formats.packs import TIER_PACK_BYTES
from nbckpt.formats.retention import check_metrics
from nbckpt.journal import JournalWriter
from nbckpt.protocol import Event, Kind, Mode, Phase, check_timeout

__all__ = ["start_save"]


def start_save(
    ctx: Context,
    options: CheckpointerOptions,
    get_tree: Callable[[], Any],
    step: int,
    *,
    force: bool = False,
    key: str | None = None,
    mode: Mode | None = None,
    timeout_s: float | None = None,
    metrics: Mapping[str, Any] | None = None,
    format: str | None = None,
    t_requested: float | None = None,
    tier: LocalTier | None = None,
    persistent: bool | None = None,
    pack_bytes: int | None = None,
    buffers: HostBuffers | None = None,
) -> SaveJob:
    """Agree on a save with the other processes and snapshot this process's shards.

    The arguments are :meth:`AsyncCheckpointer.save_from`'s; ``options`` are the
    checkpointer's defaults; ``t_requested``, when the call came (now if None). The
    returned job has not started. With a local ``tier``, the step goes to every host's
    local directory, and to the root too when ``persistent`` (None: when the tier's
    ``persistent_every`` says so). What the snapshot copies goes into ``buffers``
    (the checkpointer's, kept from one save to the next; fresh ones if None).

    Raises
    ------
    NbckptError, TypeError, ValueError
        As :meth:`AsyncCheckpointer.save` documents; a failed snapshot raises
        :class:`~nbckpt.errors.CheckpointError` after telling the peers.
    """
    if t_requested is None:
        t_requested = time.time()
    # A process that lost the job says so at once, rather than wait for the others.
    ctx.health.check_service("the start of a save")
    step = check_step(step)
    metrics = check_metrics(metrics)
    strategy = strategy_for(storage.commit_mode(ctx.root, mode or options.mode))
    if persistent is None:
        persistent = options.tiers.persistent(step)
    if tier is None:
        persistent = True  # without a local tier, the root is the only place
    packing = options.pack_bytes if pack_bytes is None else check_pack_bytes(pack_bytes)
    # A local tier's peers send packs whole: there, small whole leaves only (take_snapshot).
    by_shard = tier is None
    if not by_shard:
        packing = min(packing, TIER_PACK_BYTES)
    arrays = format_for(format or options.format, packing)
    timeout = check_timeout(timeout_s or options.timeout_s, "timeout_s")
    local: BaseException | None = None
    leaves: list[Any] = []
    try:
        leaves = flatten(get_tree())
    except Exception as e:
        local = e  # shared by the preflight, so that no peer waits for this process
    plan = save_plan(
        leaves,
        format=arrays.name,
        pack_bytes=arrays.pack_bytes,
        # What gets packed depends on it: every process must decide alike.
        pack_by_shard=by_shard,
        mode=strategy.mode,
        force=force,
        timeout_s=timeout,
        primary=ctx.primary,
        metrics=metrics,
        retention=options.retention.as_dict(),
    )
    extra = None if tier is None else tier.post(ctx.sync.client, ctx.primary, timeout)
    op, _ = ctx.preflight.agree(
        Kind.SAVE,
        step,
        timeout,
        local,
        strategy=strategy if persistent else None,
        force=force,
        key=key,
        plan=plan,
        extra=extra,
    )
    if tier is not None:
        tier.join(ctx.preflight.extras)
    me, n = ctx.sync.process_index, ctx.sync.process_count
    journal = JournalWriter(ctx.root, op, me, Kind.SAVE, step, n)
    told = preemption.notice_for(ctx.health.client, step)
    journal.emit(
        Event.REQUESTED,
        t=t_requested,
        process_count=n,
        primary=ctx.primary,
        mode=strategy.mode,
        **({"preemption": told} if told is not None else {}),
        **({"tiers": {"host": tier.host, "persistent": persistent}} if tier is not None else {}),
    )
    loan = (buffers or HostBuffers(keep=False)).loan()
    try:
        hooks.fire(Phase.SNAPSHOT)
        snap = take_snapshot(
            leaves,
            process=me,
            process_count=n,
            primary=ctx.primary,
            pack_bytes=arrays.pack_bytes,
            loan=loan,
            pack_by_shard=by_shard,
        )
    except Exception as e:
        loan.end(ok=False)
        ctx.preflight.release(op)  # nothing but the claim was written
        kept = is_complete(step_dir(ctx.root, step))
        text = fail(
            ctx.sync, journal, ctx.root, e, Phase.SNAPSHOT, committed=False, previous_kept=kept
        )
        journal.close()
        raise CheckpointError(
            op, step, me, Phase.SNAPSHOT, text, False, kept, failures=failures(e, me, text)
        ) from e
    journal.emit(Event.SNAPSHOT_DONE, bytes=snap.nbytes)
    return SaveJob(
        root=ctx.root,
        op=op,
        step=step,
        snap=snap,
        journal=journal,
        strategy=strategy,
        sync=ctx.sync,
        health=ctx.health.check,
        primary=ctx.primary,
        timeout_s=timeout,
        t_requested=t_requested,
        retention=options.retention,
        metrics=metrics,
        arrays=arrays,
        force=force,
        tier=tier,
        persistent=persistent,
        loan=loan,
    )
