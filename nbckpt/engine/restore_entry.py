"""The restore entry: agree on the step with the other processes, then read it.

The reading itself is :func:`nbckpt.engine.restore.step.restore_step`'s; this module
adds what every restore of a checkpointer shares: the preflight agreement, the
journal's first and last events, the read barrier, and telling the peers on failure.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nbckpt.engine.context import Context
from nbckpt.engine.options import CheckpointerOptions, check_step
from nbckpt.engine.restore import step as _restore
from nbckpt.engine.restore.exchange import JobReads
from nbckpt.engine.save.advice import reason
from nbckpt.engine.tiers.local import LocalTier
from nbckpt.engine.tiers.recover import choose, gather_local
from nbckpt.errors import StepNotFoundError
from nbckpt.formats.layout import all_steps, step_dir
from nbckpt.journal import JournalWriter, summarize_quietly
from nbckpt.protocol import (
    READ_BARRIER,
    Cause,
    Event,
    Kind,
    Phase,
    Tier,
    TierBarrier,
    barrier_phase,
    check_timeout,
)
from nbckpt.storage import ObjectPath

__all__ = ["restore_agreed"]


def restore_agreed(
    ctx: Context,
    options: CheckpointerOptions,
    get_target: Callable[[], Any],
    step: int | None = None,
    *,
    key: str | None = None,
    timeout_s: float | None = None,
    cast: bool = False,
    item: str | None = None,
    partial: bool = False,
    tier: LocalTier | None = None,
) -> tuple[str, int, Any]:
    """Restore a step on every process; return the operation id, the step and the tree.

    The arguments are :meth:`AsyncCheckpointer.restore_from`'s; ``options`` are the
    checkpointer's defaults. An error raised by ``get_target`` reaches the other
    processes through the preflight, and a failed read through their failure keys.

    Raises
    ------
    NbckptError, KeyError, ValueError
        As :meth:`AsyncCheckpointer.restore` documents.
    """
    ctx.health.check_service("the start of a restore")
    if step is not None:
        step = check_step(step)
    timeout = check_timeout(timeout_s or options.timeout_s, "timeout_s")
    local: BaseException | None = None
    target = None
    try:
        target = get_target()
    except Exception as e:
        local = e
    extra = None
    if tier is not None:
        holdings = {str(s): h for s, h in tier.holdings().items()}
        extra = {**tier.post(ctx.sync.client, ctx.primary, timeout), "holdings": holdings}
    wanted = step
    op, step = ctx.preflight.agree(
        Kind.RESTORE, step, timeout, local, key=key, extra=extra, missing_ok=tier is not None
    )
    choice = None
    if tier is not None:
        tier.join(ctx.preflight.extras)
        choice = choose(ctx.preflight.extras, step, wanted)
        if choice.step is None:
            raise StepNotFoundError(str(ctx.root), wanted, all_steps(ctx.root))
        step = choice.step
        op = ctx.preflight.renamed(op, step)
    assert step is not None
    me = ctx.sync.process_index
    journal = JournalWriter(ctx.root, op, me, Kind.RESTORE, step, ctx.sync.process_count)
    journal.emit(Event.REQUESTED, process_count=ctx.sync.process_count)
    if choice is not None:
        journal.emit(Event.TIER_CHOSEN, tier=choice.tier, why=choice.why, holders=choice.holders)

    def agree() -> None:
        # Every process has read and checked its part, or one says why not.
        ctx.sync.barrier(op, READ_BARRIER, timeout_s=timeout)

    job: JobReads | None = JobReads(
        agree, ctx.preflight.hosts, local_root=isinstance(ctx.root, Path), scratch=op
    )
    phase: str = Phase.READ
    staging = None
    try:
        directory = step_dir(ctx.root, step)
        if tier is not None and choice is not None and choice.tier == Tier.LOCAL:
            phase = Phase.FETCH
            directory, staging = gather_local(tier, choice, target, journal, deadline_s=timeout)
            job, phase = None, Phase.READ  # each process reads its part of its host's copy
        result = _restore.restore_step(
            directory,
            target,
            journal,
            cast=cast,
            item=item,
            job=job,
            partial=partial,
        )
        if choice is not None and choice.tier == Tier.LOCAL:
            # Each process serves its host's copy until every peer has what it needs;
            # they read meanwhile, and all succeed or all fail.
            phase = barrier_phase(TierBarrier.FETCHED)
            journal.emit(Event.BARRIER_ENTER, name=TierBarrier.FETCHED)
            ctx.sync.barrier(op, TierBarrier.FETCHED, timeout_s=timeout)
            journal.emit(Event.BARRIER_EXIT, name=TierBarrier.FETCHED)
    except BaseException as e:
        error = reason(e, ctx.root)
        journal.emit(Event.FAILED, error=error, phase=phase, cause=Cause.ERROR, culprit=me)
        # A peer waiting to exchange pieces with this process gives up at once.
        ctx.sync.signal_failure(op, error)
        journal.close()
        raise
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    journal.emit(Event.RESTORED)
    journal.close()
    n = ctx.sync.process_count
    if me == 0 and n > 1 and isinstance(journal.path, ObjectPath):
        # One object for the whole restore, once every process has recorded its end.
        summarize_quietly(journal.path.parent, n, Event.RESTORED)
    return op, step, result
