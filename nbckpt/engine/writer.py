"""The background write: this process's shards, chunk by chunk, with progress."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorstore as ts

from nbckpt import checksum as _checksum
from nbckpt.engine import hooks
from nbckpt.engine.snapshot import Snapshot
from nbckpt.engine.storage import (
    ZARRAY,
    chunk_key,
    chunk_regions,
    create_array_async,
    open_for_write_async,
)
from nbckpt.storage import Location

__all__ = ["array_leaves", "chunk_key", "chunk_regions", "create_arrays", "write_shards"]


def create_arrays(directory: Location, snap: Snapshot, *, sync: bool = True) -> list[Location]:
    """Create the (empty) zarr array of every array leaf under ``directory``.

    All creations are started before any is waited for: each one makes a directory
    and writes a ``.zarray`` file, and one after the other they add up. With ``sync``
    each ``.zarray`` is fsync'd; without, the caller makes the files returned durable.

    Returns
    -------
    list
        The ``.zarray`` file of every array created.
    """
    leaves = array_leaves(snap)
    futures = [
        create_array_async(
            directory / meta["name"],
            meta["shape"],
            np.dtype(meta["dtype"]),
            meta["chunks"],
            sync=sync,
        )
        for meta in leaves
    ]
    for f in futures:
        f.result()
    return [directory / meta["name"] / ZARRAY for meta in leaves]


def array_leaves(snap: Snapshot) -> list[dict[str, Any]]:
    """The leaves stored as arrays: every one but a Python number no array can hold.

    Python numbers are arrays too (0-d, where Orbax reads them); their metadata keeps
    the inline value, which is what nbckpt restores.
    """
    return [meta for meta in snap.leaves if "chunks" in meta]


def write_shards(
    directory: Location,
    snap: Snapshot,
    progress: Callable[[int], None] | None = None,
    progress_interval_s: float = 0.2,
    watch: Callable[[], None] | None = None,
    watch_interval_s: float = 0.5,
    checksums: dict[str, Any] | None = None,
    open_store: Callable[[str], ts.Future[ts.TensorStore]] | None = None,
    issued: Callable[[], None] | None = None,
) -> int:
    """Write this process's shards into the arrays under ``directory``.

    All chunk writes are issued at once so tensorstore overlaps them; each completes
    only once its file is fsync'd. ``progress`` receives the bytes committed so far, at
    most every ``progress_interval_s`` seconds and once at the end. ``watch`` runs
    every ``watch_interval_s`` seconds while writes are pending; it raises to abort
    (a dead or failed peer). ``checksums``, if given, receives the checksum of every
    chunk written, by leaf and zarr chunk key (``"0.3"``), and under
    ``nbckpt.checksum.ALGORITHM_KEY`` the name of the algorithm, so that it is the
    complete content of a checksums file (see :mod:`nbckpt.checksum`); restore and
    fsck verify against it. ``open_store``, given a leaf's name, starts opening the
    tensorstore to write it into and returns the future (by default its zarr array
    under ``directory``, opened from the snapshot's metadata: its ``.zarray`` need not
    exist yet). ``issued`` runs once every write is issued and every checksum is in
    ``checksums``, while the writes are still in flight.

    Returns
    -------
    int
        Bytes written.
    """
    metas = {m["name"]: m for m in array_leaves(snap)}
    chunks_of = {name: m["chunks"] for name, m in metas.items()}
    shapes_of = {name: m["shape"] for name, m in metas.items()}

    def open_leaf(leaf: str) -> ts.Future[ts.TensorStore]:
        m = metas[leaf]
        return open_for_write_async(directory / leaf, m["shape"], np.dtype(m["dtype"]), m["chunks"])

    opener = open_store or open_leaf
    # Every leaf's opening is started before any is waited for.
    openings = {w.leaf: opener(w.leaf) for w in snap.writes}
    stores: dict[str, Any] = {}
    pending: list[tuple[Any, int]] = []
    algorithm = _checksum.default_algorithm()
    if checksums is not None:
        checksums[_checksum.ALGORITHM_KEY] = algorithm
    for w in snap.writes:
        store = stores.get(w.leaf)
        if store is None:
            store = stores[w.leaf] = openings[w.leaf].result()
        host = np.asarray(w.data)  # for a device array, waits for its host copy
        itemsize = host.dtype.itemsize
        regions = chunk_regions(w.index, shapes_of[w.leaf], chunks_of[w.leaf])
        for i, (glob, local) in enumerate(regions):
            if i % w.parts != w.part:
                continue  # another replica of this shard writes that chunk
            part = host[local]
            fut = store[glob].write(part, can_reference_source_data_indefinitely=True)
            pending.append((fut, math.prod(part.shape) * itemsize))
            if checksums is not None:
                # Computed while tensorstore's threads write the chunk; neither CRC
                # holds the GIL while it runs.
                key = chunk_key(glob, chunks_of[w.leaf])
                checksums.setdefault(w.leaf, {})[key] = _checksum.checksum(part, algorithm)
    if issued is not None:
        issued()
    written = 0
    last = time.monotonic()
    t_prev = time.monotonic()
    for fut, nbytes in pending:
        while watch is not None and not fut.done():
            watch()
            try:
                fut.result(timeout=watch_interval_s)
            except TimeoutError:
                continue
        fut.result()
        slowdown = hooks.io_slowdown()
        if slowdown > 1:  # fault injection: stretch the time since the last chunk
            time.sleep((slowdown - 1) * (time.monotonic() - t_prev))
        t_prev = time.monotonic()
        written += nbytes
        now = time.monotonic()
        if progress is not None and now - last >= progress_interval_s:
            progress(written)
            last = now
    return written
