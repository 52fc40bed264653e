"""A save's local tier: each host's own copy, then its peers' replicas, at barriers.

Every process runs :func:`save_local` on the save's thread, after the snapshot and
before the persistent part (if the step goes to the root too)::

    leader of each host: claim <local>/<step>.nbckpt-tmp     --local_ready-->
    every process: write its shards and checksums there      --local_written-->
    leader: metadata, fsync, rename to <local>/<step>        --local_committed-->
    leader: pull each origin host's units from that host     --replicated-->

The leader of a host is its lowest process; a host's processes share its directory.
Past ``replicated``, every unit has a committed copy on its own host and on
``local_replicas`` others: the step is recoverable while no more hosts than that are
lost together. Each host then keeps its newest ``local_keep`` steps, removing only
steps whose owner record says this checkpointer's saves made them.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbckpt.engine import hooks
from nbckpt.engine.arrays.array_format import Zarr2Arrays
from nbckpt.engine.save import ownership
from nbckpt.engine.save.commit import RenameCommit
from nbckpt.engine.save.metadata import write_metadata
from nbckpt.engine.save.prune import apply_retention
from nbckpt.engine.tiers.local import LocalTier
from nbckpt.engine.tiers.units import pull_unit
from nbckpt.errors import ForeignEntryError, PeerTransferError
from nbckpt.formats.layout import CHECKSUMS_DIR, read_owner, tmp_dir, write_durable
from nbckpt.formats.retention import RetentionPolicy
from nbckpt.protocol import RENAME, Event, Phase, TierBarrier, barrier_phase

if TYPE_CHECKING:
    from nbckpt.engine.save.background import SaveJob

__all__ = ["DEATH_NOTICE_S", "save_local"]

#: How long a failed copy waits to learn whether its peer died (and then says so).
DEATH_NOTICE_S = 5.0


def save_local(job: SaveJob, tier: LocalTier) -> None:
    """Write, commit and replicate this process's part of ``job``'s step locally.

    Raises
    ------
    PeerError, OSError, PeerTransferError
        As the persistent part does: a barrier gives up on a dead or failed peer, a
        write or a peer's copy fails; the peers are told by the caller.
    """
    me = job.sync.process_index
    leader = tier.leader(me) == me
    local = tier.local_root
    work = local / tmp_dir(local, job.step).name
    arrays = Zarr2Arrays()

    def meet(name: TierBarrier) -> None:
        job.phase = barrier_phase(name)
        hooks.fire(job.phase)
        job._barrier(name)

    job.phase = Phase.LOCAL_WRITE
    hooks.fire(Phase.LOCAL_WRITE)
    if leader:
        _claim(local, work, job.op, job.step)
    meet(TierBarrier.LOCAL_READY)
    checksums: dict[str, Any] = {}
    written = arrays.write(
        work, job.snap, me, watch=lambda: job.sync.check_failures(job.op), checksums=checksums
    )
    (work / CHECKSUMS_DIR).mkdir(exist_ok=True)
    write_durable(work / CHECKSUMS_DIR / f"process_{me}.json", json.dumps(checksums))
    meet(TierBarrier.LOCAL_WRITTEN)
    if leader:
        unsynced = arrays.finish(work, job.snap)
        write_metadata(job, work, unsynced, mode=RENAME, arrays=arrays)
        RenameCommit().finalize(local, job.step, job.op, force=True)
        held = tier.processes_of(tier.host)
        job.journal.emit(
            Event.LOCAL_COMMITTED, host=tier.host, processes=held, bytes=written, dir=str(local)
        )
    meet(TierBarrier.LOCAL_COMMITTED)
    job.phase = Phase.REPLICATE
    hooks.fire(Phase.REPLICATE)
    if leader:
        _replicate(job, tier)
    meet(TierBarrier.REPLICATED)
    if leader:
        apply_retention(local, RetentionPolicy(max_to_keep=tier.options.local_keep), keep=job.step)


def _blame_the_dead(job: SaveJob) -> None:
    """A peer stopped serving: if it died, say that (the heartbeats tell within seconds)."""
    until = time.monotonic() + DEATH_NOTICE_S
    while time.monotonic() < until:
        job.health(Phase.REPLICATE)  # raises PeerDeadError once a death is known
        job.sync.check_failures(job.op)  # or the peer's own error
        time.sleep(0.2)


def _claim(local: Path, work: Path, op: str, step: int) -> None:
    """Leader: make ``work`` this save's, removing a working copy an earlier save left."""
    if work.exists():
        owner = read_owner(work)
        if owner is None:
            # Not ours to remove: the error names it, and nothing else is touched.
            raise ForeignEntryError(str(work))
        shutil.rmtree(work)  # a save of ours died here: a local copy is never the only one
    refused = ownership.claim(local, step, work, ownership.owner_record(op, RENAME, step))
    if refused:
        raise FileExistsError(f"{work}: {refused.get('kind', 'busy')} ({refused.get('path', '')})")


def _replicate(job: SaveJob, tier: LocalTier) -> None:
    """Leader: pull every unit of each host whose replicas this host keeps."""
    mine = tier.step_path(job.step)
    assert tier.key is not None
    for origin in tier.origins(tier.host):
        t0, got = time.monotonic(), 0
        units = sorted(tier.processes_of(origin))
        for process in units:
            try:
                got += pull_unit(
                    tier.address_of(origin), tier.key, mine, process, deadline_s=job.timeout_s
                )
            except PeerTransferError:
                _blame_the_dead(job)
                raise
        job.journal.emit(
            Event.REPLICATED,
            origin=origin,
            processes=units,
            bytes=got,
            seconds=round(time.monotonic() - t0, 6),
        )
