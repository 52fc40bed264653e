"""Restore from the fastest tier: the newest step the live hosts can supply in full.

Every process posts its host's local holdings in the restore's preflight (per local
step: the processes whose units the host holds). :func:`choose` then decides, alike on
every process: the newest local step whose units the live hosts hold between them,
unless the root has a newer one; a step asked for by number, locally if the hosts hold
it whole, else from the root. :func:`gather_local` then makes this host's copy able to
serve this process: the skeleton if the host has none (a replaced host), and each unit
that holds a chunk this process's devices need, from a peer that holds it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax

from nbckpt.engine.arrays.tree import leaf_name, path_entry
from nbckpt.engine.arrays.zarr import chunk_key, chunk_regions
from nbckpt.engine.restore.targets import default_sharding, target_parts
from nbckpt.engine.tiers.local import LocalTier
from nbckpt.engine.tiers.peers import fetch
from nbckpt.engine.tiers.units import (
    checksums_file,
    held_processes,
    pull_skeleton,
    pull_unit,
    unit_files,
)
from nbckpt.formats.checksum import ALGORITHM_KEY
from nbckpt.formats.layout import is_complete, read_metadata, write_durable
from nbckpt.formats.packs import PACK_KEY, is_packed
from nbckpt.journal import JournalWriter
from nbckpt.protocol import Event, Tier

__all__ = ["Choice", "choose", "gather_local", "needed_chunks"]


@dataclass(frozen=True)
class Choice:
    """The step a restore reads, from which tier, and why (in words for the journal)."""

    step: int | None
    tier: Tier
    why: str
    #: Local: for each host id, the processes whose units it holds of ``step``.
    holders: dict[str, list[int]] = field(default_factory=dict)


def _held_by_host(extras: dict[int, dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """Host id -> step -> its holding, from every process's post (one per host kept)."""
    found: dict[str, dict[int, dict[str, Any]]] = {}
    for _process, post in sorted(extras.items()):
        holdings = post.get("holdings") or {}
        found.setdefault(str(post["host"]), {int(s): h for s, h in holdings.items()})
    return found


def choose(extras: dict[int, dict[str, Any]], persistent: int | None, wanted: int | None) -> Choice:
    """Pick the step and tier to restore (every process computes the same).

    Parameters
    ----------
    extras
        Every process's post: ``host`` and ``holdings`` (step -> ``processes``, the
        process count that saved it, and ``held``, the units the host holds).
    persistent
        The root's step: its newest (``wanted`` None) or ``wanted`` if complete there.
    wanted
        The step asked for, or None for the newest.
    """
    by_host = _held_by_host(extras)
    steps = sorted({s for held in by_host.values() for s in held}, reverse=True)
    covered: dict[int, dict[str, list[int]]] = {}
    partial: list[int] = []
    for step in steps:
        holders = {h: sorted(held[step]["held"]) for h, held in by_host.items() if step in held}
        count = max(int(held[step]["processes"]) for held in by_host.values() if step in held)
        union = {p for units in holders.values() for p in units}
        if union >= set(range(count)):
            covered[step] = holders
        else:
            partial.append(step)
    lost = f"; the live hosts hold only part of step(s) {sorted(partial)}" if partial else ""
    if wanted is not None:
        if wanted in covered:
            return Choice(
                wanted, Tier.LOCAL, "the live hosts hold it whole" + lost, covered[wanted]
            )
        if persistent is not None:
            return Choice(persistent, Tier.PERSISTENT, "the live hosts lack part of it" + lost)
        return Choice(None, Tier.PERSISTENT, "neither the hosts nor the root hold it" + lost)
    best = max(covered, default=None)
    if best is not None and (persistent is None or best >= persistent):
        why = "the newest step the live hosts hold whole"
        if persistent is not None:
            why += f" (the root's newest is {persistent})"
        return Choice(best, Tier.LOCAL, why + lost, covered[best])
    if persistent is not None:
        why = "the root's newest step"
        why += f"; the hosts' newest whole one is {best}" if best is not None else lost
        return Choice(persistent, Tier.PERSISTENT, why)
    return Choice(None, Tier.PERSISTENT, "no step is complete anywhere" + lost)


def _boxes(sharding: Any, shape: tuple[int, ...]) -> Iterator[tuple[slice, ...]]:
    whole = tuple(slice(0, d) for d in shape)
    if sharding is None:
        yield whole
        return
    for index in sharding.addressable_devices_indices_map(shape).values():
        yield tuple(slice(*sl.indices(d)[:2]) for sl, d in zip(index, shape, strict=True)) or whole


def needed_chunks(meta: dict[str, Any], target: Any) -> dict[str, set[str]]:
    """The chunk keys of each leaf that this process's restore into ``target`` reads.

    Every chunk of a packed leaf: it is read whole, from every pack that holds part of it.
    """
    by_name = {m["name"]: m for m in meta["leaves"]}
    wanted: list[tuple[dict[str, Any], Any]] = []
    if target is None:
        for m in meta["leaves"]:
            wanted.append((m, default_sharding(m) if m["kind"] == "jax" else None))
    else:
        for path, t in jax.tree_util.tree_flatten_with_path(target)[0]:
            m = by_name.get(leaf_name(tuple(path_entry(k) for k in path)))
            if m is not None:  # an unknown leaf: the restore itself names it
                wanted.append((m, target_parts(t)[0]))
    found: dict[str, set[str]] = {}
    for m, sharding in wanted:
        if m["kind"] == "scalar":
            continue
        shape = tuple(int(d) for d in m.get("shape", ()))
        chunks = [int(c) for c in m.get("chunks", [1] * len(shape))]
        keys = found.setdefault(m["name"], set())
        whole = tuple(slice(0, d) for d in shape)
        for box in [whole] if is_packed(m) else _boxes(sharding, shape):
            for glob, _local in chunk_regions(box, shape, chunks):
                keys.add(chunk_key(glob, chunks))
    return found


def gather_local(
    tier: LocalTier,
    choice: Choice,
    target: Any,
    journal: JournalWriter,
    *,
    deadline_s: float,
) -> tuple[Path, Path | None]:
    """Make the chosen step's local copy serve this process; return it, and what to remove.

    A unit this process reads whole (a replaced host's own shards, on the same
    topology) is pulled into the host's copy, which then holds it again. Of a unit
    it reads only part of (a replicated leaf written by one process, another process
    count), only the chunks it reads are fetched, into a staging copy of its own: the
    host's copy linked file by file, plus those chunks and their checksums. The
    second path returned is that staging folder, to remove once the restore read it.

    Raises
    ------
    PeerTransferError
        A peer could not supply what this process needs before the deadline.
    """
    assert choice.step is not None and tier.key is not None
    step, key = choice.step, tier.key
    mine = tier.step_path(step)
    sources = [h for h in choice.holders if h != tier.host]
    if not is_complete(mine):
        pull_skeleton(tier.address_of(sources[0]), key, mine, deadline_s=deadline_s)
    meta = read_metadata(mine)
    assert meta is not None
    here = set(held_processes(mine))
    missing = sorted(set(range(int(meta["process_count"]))) - here)
    if not missing:
        return mine, None
    need = needed_chunks(meta, target)
    # A scalar's chunk is written (Orbax reads it) but restore takes its value from
    # the metadata: a unit is read whole when every chunk of its arrays is.
    arrays = {m["name"] for m in meta["leaves"] if m["kind"] != "scalar"}
    partial: list[tuple[int, str, dict[str, Any]]] = []
    scratch = mine.parent / f".incoming-{uuid.uuid4().hex[:12]}"
    try:
        for process in missing:
            host = next(h for h in sources if process in choice.holders[h])
            address = tier.address_of(host)
            remote = f"{mine.name}/{checksums_file(process)}"
            fetch(address, key, [remote], scratch, deadline_s=deadline_s)
            sums = json.loads((scratch / remote).read_text())
            wanted = {
                leaf: {k: v for k, v in sums[leaf].items() if k in keys}
                for leaf, keys in need.items()
                if isinstance(sums.get(leaf), dict)
            }
            count = sum(len(v) for v in wanted.values())
            if count == 0:
                continue  # none of its chunks is read here
            if count == sum(len(v) for k, v in sums.items() if k in arrays):
                t0 = time.monotonic()
                got = pull_unit(address, key, mine, process, deadline_s=deadline_s)
                _fetched(journal, address, host, process, got, t0, whole=True)
            else:
                wanted[ALGORITHM_KEY] = sums.get(ALGORITHM_KEY)
                _keep_packed(wanted, sums.get(PACK_KEY))
                partial.append((process, host, {k: v for k, v in wanted.items() if v}))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not partial:
        return mine, None
    staging = tier.local_root / f".restore-{uuid.uuid4().hex[:12]}"
    try:
        _link_tree(mine, staging / mine.name)
        for process, host, sums in partial:
            address, t0 = tier.address_of(host), time.monotonic()
            files = [f"{mine.name}/{f}" for f in unit_files(sums)]
            got = fetch(address, key, files, staging, deadline_s=deadline_s)
            sums_path = staging / mine.name / checksums_file(process)
            sums_path.parent.mkdir(exist_ok=True)
            write_durable(sums_path, json.dumps(sums))
            _fetched(journal, address, host, process, got, t0, whole=False)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging / mine.name, staging


def _keep_packed(wanted: dict[str, Any], pack: object) -> None:
    """Add to a partial unit's checksums the index of the packed chunks it keeps."""
    if not isinstance(pack, dict) or not isinstance(pack.get("chunks"), dict):
        return
    chunks = {
        leaf: {k: v for k, v in pack["chunks"].get(leaf, {}).items() if k in keys}
        for leaf, keys in wanted.items()
        if isinstance(keys, dict)
    }
    if kept := {leaf: c for leaf, c in chunks.items() if c}:
        wanted[PACK_KEY] = {**pack, "chunks": kept}


def _fetched(
    journal: JournalWriter, peer: str, host: str, process: int, got: int, t0: float, whole: bool
) -> None:
    journal.emit(
        Event.FETCHED,
        peer=peer,
        host=host,
        processes=[process],
        bytes=got,
        whole=whole,
        seconds=round(time.monotonic() - t0, 6),
    )


def _link_tree(source: Path, dest: Path) -> None:
    """Recreate ``source``'s folders under ``dest``, its files as hard links (no copy)."""
    for folder, _dirs, files in os.walk(source):
        there = dest / Path(folder).relative_to(source)
        there.mkdir(parents=True, exist_ok=True)
        for name in files:
            if not name.endswith(".nbckpt-part"):  # a peer's copy still arriving
                os.link(Path(folder) / name, there / name)
