"""A step's metadata: what nbckpt's restore reads first, and Orbax's records beside it.

The primary renders it from the snapshot (:func:`draft_metadata`), while the processes
still write their shards where the array format allows, and writes it into the working
directory once every process has written (:func:`seal_metadata`), making the whole tree
durable in one batch; the commit that follows publishes it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbckpt.engine.arrays.array_format import ArrayFormat
from nbckpt.formats.layout import FORMAT, METADATA_FILE, seal_tree
from nbckpt.formats.orbax_write import orbax_records
from nbckpt.formats.packs import is_packed
from nbckpt.storage import Location

if TYPE_CHECKING:
    from nbckpt.engine.save.background import SaveJob
    from nbckpt.engine.save.snapshot import Snapshot

__all__ = [
    "MetadataDraft",
    "draft_metadata",
    "leaves_json",
    "seal_metadata",
    "write_metadata",
]


@dataclass(frozen=True)
class MetadataDraft:
    """A step's records, rendered: Orbax's files, and nbckpt's metadata but its time.

    ``meta`` is the metadata's JSON object without ``time_finalized``, which
    :func:`seal_metadata` adds when it writes it.
    """

    records: dict[str, str]
    meta: str


def draft_metadata(
    job: SaveJob, *, mode: str | None = None, arrays: ArrayFormat | None = None
) -> MetadataDraft:
    """Render ``job``'s metadata and Orbax's records (hundreds of leaves: a few ms).

    ``mode`` and ``arrays``: the commit mode and array format, if not the save's
    own (the local tier's copies are always renamed, in nbckpt's layout).
    """
    arrays = arrays if arrays is not None else job.arrays
    head = {
        "format": FORMAT,
        "step": job.step,
        "mode": mode or job.strategy.mode,
        "op": job.op,
        "process_count": job.sync.process_count,
        "primary": job.primary,
        "time_requested": job.t_requested,
    }
    # After the leaves, whose text is made apart (leaves_json).
    tail: dict[str, Any] = {
        # Empty nodes (None, empty containers), so that positions are kept.
        "empty": job.snap.empty,
        # Restore then knows that a missing _CHECKSUMS is damage, not an old step.
        "checksums": True,
        # What retention ranks steps by (RetentionPolicy.best_metric).
        "metrics": job.metrics,
    }
    if arrays.arrays is not None:
        tail["arrays"] = arrays.arrays  # how restore opens them
    # Orbax's records (_METADATA, _sharding), so that Orbax restores the step too;
    # none where leaves are packed: Orbax cannot read those, and refuses the step.
    records: dict[str, str] = {}
    if not any(is_packed(m) for m in job.snap.leaves):
        records = orbax_records(job.snap.leaves, arrays.flags, job.snap.empty)
    text = f'{json.dumps(head)[:-1]}, "leaves": {leaves_json(job.snap)}, {json.dumps(tail)[1:]}'
    return MetadataDraft(records, text)


def leaves_json(snap: Snapshot) -> str:
    """The JSON array of the snapshot's leaves' metadata, as ``json.dumps`` renders it.

    A jax leaf's kept plan (:mod:`~nbckpt.engine.save.leafplan`) renders its text once
    and keeps it for the saves after; other leaves are rendered now. For a state of
    thousands of leaves the metadata was a large part of the primary's work at every
    save, holding the GIL its write threads need (3,996 leaves in one process: 19.5 ms
    of CPU, against 1.3 ms joined from kept texts).
    """
    plans = snap.plans if len(snap.plans) == len(snap.leaves) else [None] * len(snap.leaves)
    pairs = zip(snap.leaves, plans, strict=True)
    parts = [json.dumps(m) if p is None else p.text for m, p in pairs]
    return f"[{', '.join(parts)}]"


def seal_metadata(draft: MetadataDraft, work: Location, unsynced: list[Location]) -> None:
    """Primary only: write ``draft`` into ``work``, stamped now, and make ``work`` durable.

    ``unsynced``: files the array format wrote without making them durable.
    """
    meta = f'{draft.meta[:-1]}, "time_finalized": {json.dumps(time.time())}}}'
    # Nothing reads the working directory before it is published, so the records
    # and every directory entry are made durable in one batch, not one by one.
    seal_tree(work, {**draft.records, METADATA_FILE: meta}, unsynced)


def write_metadata(
    job: SaveJob,
    work: Location,
    unsynced: list[Location],
    *,
    mode: str | None = None,
    arrays: ArrayFormat | None = None,
) -> None:
    """Primary only: write ``job``'s metadata and Orbax's records into ``work``, durably.

    :func:`draft_metadata`, then :func:`seal_metadata`.
    """
    seal_metadata(draft_metadata(job, mode=mode, arrays=arrays), work, unsynced)
