"""The background write: this process's shards, chunk by chunk, with progress."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import tensorstore as ts

from nbckpt import storage
from nbckpt.engine import hooks
from nbckpt.engine.arrays.zarr import (
    ZARRAY,
    context,
    create_array_async,
    open_for_write_async,
    replica_regions,
)
from nbckpt.engine.progress import ProgressReport
from nbckpt.engine.save import direct as _direct
from nbckpt.engine.save.snapshot import Snapshot
from nbckpt.formats import checksum as _checksum
from nbckpt.formats.packs import PACK_ALIGN, PACK_KEY, is_packed, pack_entry, pack_file
from nbckpt.pools import LazyPool
from nbckpt.storage import Location

__all__ = [
    "array_leaves",
    "create_arrays",
    "write_shards",
]


def create_arrays(directory: Location, snap: Snapshot, *, sync: bool = True) -> list[Location]:
    """Create the (empty) zarr array of every leaf not packed under ``directory``.

    All creations are started before any is waited for: each one makes a directory
    and writes a ``.zarray`` file, and one after the other they add up. With ``sync``
    each ``.zarray`` is fsync'd; without, the caller makes the files returned durable.

    Returns
    -------
    list
        The ``.zarray`` file of every array created.
    """
    leaves = [meta for meta in array_leaves(snap) if not is_packed(meta)]
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
    process: int | None = None,
) -> int:
    """Write this process's shards into the arrays under ``directory``.

    All chunk writes are issued at once so tensorstore overlaps them; each completes
    only once its file is fsync'd. On a local disk that takes them, large chunks of
    nbckpt's own layout are written with ``O_DIRECT`` instead, by
    :mod:`~nbckpt.engine.save.direct` (same bytes, also made durable one by one).
    ``progress`` receives the bytes durable so far (chunks counted in the order they
    were issued; a local pack's pieces as they are written to its file, which is
    fsync'd before the phase ends), as :class:`ProgressReport` says:
    after each eighth of the bytes, and at least every ``progress_interval_s`` while
    chunks complete, from the first one on (also while later writes are still being
    issued); ``write_done`` carries the last count. ``watch`` runs every
    ``watch_interval_s`` seconds while writes are pending; it raises to abort (a dead
    or failed peer). ``checksums``, if given, receives the checksum of every
    chunk written, by leaf and zarr chunk key (``"0.3"``), and under
    ``nbckpt.formats.checksum.ALGORITHM_KEY`` the name of the algorithm, so that it is the
    complete content of a checksums file (see :mod:`nbckpt.formats.checksum`); restore and
    fsck verify against it. ``open_store``, given a leaf's name, starts opening the
    tensorstore to write it into and returns the future (by default its zarr array
    under ``directory``, opened from the snapshot's metadata: its ``.zarray`` need not
    exist yet). ``issued`` runs once every write is issued and every checksum is in
    ``checksums``, while the writes are still in flight.

    The chunks of packed leaves (``"packed"`` in their metadata) go into one file,
    this ``process``'s pack, written (and fsync'd) with one request started before
    the other writes are issued and before any chunk is summed; ``checksums`` also
    receives its index (:mod:`nbckpt.formats.packs`).

    Under an injected slowdown (``%ckpt_fault slow-io``, :func:`hooks.io_slowdown`
    ``factor`` > 1) the chunks are written one at a time instead, and after each one
    the writer sleeps ``factor - 1`` times as long as that chunk took: the write phase
    then takes ``factor`` times as long as writing its chunks one by one; so does the
    pack, after which the writer sleeps ``factor - 1`` times as long as it took. (Stretching
    the time between completions of writes issued together would not: the writes in
    flight complete during the sleep, and the stretch is lost.)

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
    packed = {name for name, m in metas.items() if is_packed(m)}
    slowdown = hooks.io_slowdown()
    # Large chunks of nbckpt's own layout on a local disk are written here, not by
    # tensorstore (see :mod:`.direct`); a leaf is then opened only for a chunk that
    # cannot be. An injected slowdown times tensorstore's writes, one by one.
    folder = directory if isinstance(directory, Path) else None
    direct = (
        folder is not None
        and open_store is None
        and slowdown <= 1
        and _direct.can_write_direct(folder.parent)
    )

    # Every opening that may be needed is started before any is waited for: with direct
    # writes, those of the leaves whose chunks are too small for them.
    def may_open(leaf: str) -> bool:
        m = metas[leaf]
        small = math.prod(m["chunks"]) * np.dtype(m["dtype"]).itemsize < _direct.MIN_BYTES
        return leaf not in packed and (small or not direct)

    openings = {leaf: opener(leaf) for leaf in {w.leaf for w in snap.writes} if may_open(leaf)}
    pack = _Pack()
    stores: dict[str, Any] = {}
    waiter = _Waiter(watch, watch_interval_s)
    report = ProgressReport(progress, snap.nbytes, interval_s=progress_interval_s)
    counting = threading.Lock()

    def count(nbytes: int) -> None:  # also on the pack's own thread
        with counting:
            report.add(nbytes)

    #: Writes not issued yet (slowed down only), and writes in flight, in issue order.
    deferred: list[tuple[Any, Any, int]] = []
    pending: list[tuple[Any, int]] = []
    counted = 0  # the writes in ``pending`` whose bytes ``report`` has counted
    algorithm = _checksum.default_algorithm()
    if checksums is not None:
        checksums[_checksum.ALGORITHM_KEY] = algorithm

    def regions_of(w: Any) -> tuple[np.ndarray, Any]:
        host = np.asarray(w.data)  # for a device array, waits for its host copy
        regions = w.regions
        if regions is None:
            # Another replica of this shard writes the chunks not among these.
            regions = replica_regions(
                w.index, shapes_of[w.leaf], chunks_of[w.leaf], w.part, w.parts
            )
        return host, regions

    packed_at = None
    pack_written: list[tuple[Any, int]] = []
    # The pack goes first, before any checksum: one request that keeps the disk busy
    # while this thread issues the other writes and sums every chunk (the 54 MiB packs
    # of the 256 MiB ``transformer`` state waited 12-23 ms for that, 4 processes on 2
    # cores).
    found = {i: regions_of(w) for i, w in enumerate(snap.writes) if w.leaf in packed}
    try:
        for i, (host, regions) in found.items():
            shape = shapes_of[snap.writes[i].leaf]
            for glob, local, key in regions:
                whole = all(g.stop - g.start == d for g, d in zip(glob, shape, strict=True))
                pack.add(snap.writes[i].leaf, key, host[local], whole)
        if pack:
            if process is None or checksums is None:
                raise ValueError("packed leaves need the writing process and a checksums file")
            pack.seal()
            packed_at = time.monotonic()
            # A local pack counts its parts as it writes them; an object, once it is put.
            on_disk = isinstance(directory, Path)
            written = pack.write(directory, process, count if on_disk else None, direct)
            # Kept apart until every other write is issued: progress counts completed
            # writes in order, and would wait for the pack's before any chunk's.
            pack_written.append((written, 0 if on_disk else pack.nbytes))
            checksums[PACK_KEY] = pack_entry(process, pack.index)
        for i, w in enumerate(snap.writes):
            host, regions = found.get(i) or regions_of(w)
            itemsize = host.dtype.itemsize
            chunks = chunks_of[w.leaf]
            for glob, local, key in regions:
                part = host[local]
                nbytes = math.prod(part.shape) * itemsize
                if i in found:
                    pass  # in the pack, on its way already: only its checksum is left
                elif (
                    direct
                    and folder is not None
                    and _direct.suits(
                        part, all(g.stop - g.start == c for g, c in zip(glob, chunks, strict=True))
                    )
                ):
                    pending.append((_direct.write_file(folder / w.leaf / key, part), nbytes))
                else:
                    store = stores.get(w.leaf)
                    if store is None:
                        opening = openings.get(w.leaf) or opener(w.leaf)
                        store = stores[w.leaf] = opening.result()
                    if slowdown > 1:
                        deferred.append((store[glob], part, nbytes))
                    else:
                        fut = store[glob].write(part, can_reference_source_data_indefinitely=True)
                        pending.append((fut, nbytes))
                if checksums is not None:
                    # Computed while tensorstore's threads write the chunk; neither CRC
                    # holds the GIL while it runs.
                    checksums.setdefault(w.leaf, {})[key] = _checksum.checksum(part, algorithm)
                # Issuing (host copies, checksums) can take seconds: report what completed.
                while counted < len(pending) and pending[counted][0].done():
                    pending[counted][0].result()
                    count(pending[counted][1])
                    counted += 1
        pending.extend(pack_written)
        pack_written.clear()
        if issued is not None:
            issued()
        for fut, nbytes in pending[counted:]:
            waiter.wait(fut)
            count(nbytes)
        if packed_at is not None and slowdown > 1:
            # Fault injection: the pack, one write, takes ``slowdown`` times as long too.
            waiter.sleep((slowdown - 1) * (time.monotonic() - packed_at))
        for target, part, nbytes in deferred:
            t0 = time.monotonic()
            fut = target.write(part, can_reference_source_data_indefinitely=True)
            pending.append((fut, nbytes))  # settled too if the wait gives up
            waiter.wait(fut)
            # Fault injection: this chunk takes ``slowdown`` times as long as it did.
            waiter.sleep((slowdown - 1) * (time.monotonic() - t0))
            count(nbytes)
    except BaseException:
        # Writes still in flight would land after this save gave up, into a directory
        # that a retry of the step may own by then: none may outlive the failure.
        _settle([*pending, *pack_written])
        raise
    return report.done


class _Pack:
    """This process's packed chunks, and where each one lies once :meth:`seal` ordered them.

    Whole leaves come first, then the shards of leaves split over devices: every
    process that holds a replicated leaf reads its chunk, but only one process each
    shard, so a process reads the replicated leaves of every pack as one stretch
    instead of one read between each two shards it does not need.
    """

    def __init__(self) -> None:
        self._gathered: tuple[list[tuple[str, str, np.ndarray]], ...] = ([], [])
        #: Each chunk with where it starts in the pack, in the pack's order.
        self.parts: list[tuple[int, np.ndarray]] = []
        self.index: dict[str, dict[str, list[int]]] = {}
        self.nbytes = 0

    def add(self, leaf: str, key: str, part: np.ndarray, whole: bool) -> None:
        """Add a chunk: ``whole`` if it is all of its leaf."""
        self._gathered[0 if whole else 1].append((leaf, key, np.ascontiguousarray(part)))

    def __bool__(self) -> bool:
        return any(self._gathered)

    def seal(self) -> None:
        """Lay the chunks out in the pack's order, each at a multiple of ``PACK_ALIGN``."""
        for leaf, key, data in (*self._gathered[0], *self._gathered[1]):
            start = -(-self.nbytes // PACK_ALIGN) * PACK_ALIGN
            self.index.setdefault(leaf, {})[key] = [start, data.nbytes]
            self.parts.append((start, data))
            self.nbytes = start + data.nbytes

    def write(
        self,
        directory: Location,
        process: int,
        progress: Callable[[int], None] | None = None,
        direct: bool = False,
    ) -> Any:
        """Start writing the pack (fsync'd before the returned future completes).

        A local file is written on a thread of :data:`_packing`, piece by piece from the
        snapshot's buffers (no copy of the packed bytes is made) or, if ``direct``,
        copied a buffer at a time and written from there with ``O_DIRECT``
        (:func:`~nbckpt.engine.save.direct.write_gathered`); ``progress`` gets each
        piece's bytes once written to the file (the sync at the end makes them
        durable). An object is one request, of their concatenation.
        """
        if isinstance(directory, Path):
            path = directory / pack_file(process)
            if direct:
                return _packing.get().submit(
                    _direct.write_gathered, path, self.parts, self.nbytes, progress
                )
            return _packing.get().submit(self._write_file, path, progress)
        # One buffer of the packed bytes, filled in place: joining ``tobytes()`` copies
        # held a second copy of them all while it ran.
        blob = bytearray(self.nbytes)
        for at, part in self.parts:
            blob[at : at + part.nbytes] = part.reshape(-1).view(np.uint8).data
        kv = ts.KvStore.open(storage.kvstore_spec(directory), context=context()).result()
        # tensorstore takes any bytes-like value; its stubs name bytes only.
        return kv.write(pack_file(process), cast(bytes, blob))

    def _write_file(self, path: Path, progress: Callable[[int], None] | None) -> None:
        path.parent.mkdir(exist_ok=True)
        try:
            with open(path, "wb") as f:
                at = 0
                for start, part in self.parts:
                    if start > at:
                        f.write(bytes(start - at))
                    f.write(part.reshape(-1).view(np.uint8).data)
                    at = start + part.nbytes
                    if progress is not None:
                        progress(part.nbytes)
                f.flush()
                # Its directory entry is made durable with the step's (seal_tree).
                os.fsync(f.fileno())
        except BaseException:
            # What a full disk let through is of no use, and holds the space the
            # journal and the next save need: this save made the file, and drops it.
            with contextlib.suppress(OSError):
                path.unlink()
            raise


#: How long a failed write waits for the chunk writes it had issued to settle.
SETTLE_TIMEOUT_S = 60.0

#: Writes the saves' packs, one a save, on threads kept from one save to the next (see
#: :mod:`nbckpt.pools`); two, so that checkpointers of two roots saving at once in one
#: process do not wait for each other.
_packing = LazyPool(2, "nbckpt-pack")


def _settle(pending: list[tuple[Any, int]], timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    """Wait until each write in flight has completed or failed (at most ``timeout_s``).

    Not cancelled: a tensorstore write that has started goes on to the file even once
    its future is cancelled, so only its completion shows that it will not land later.
    """
    deadline = time.monotonic() + timeout_s
    for fut, _ in pending:
        # asyncio's CancelledError is no Exception: a write cancelled elsewhere is settled.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            fut.result(timeout=max(0.0, deadline - time.monotonic()))


class _Waiter:
    """Wait for writes (or sleep) while running ``watch`` every ``interval_s``."""

    def __init__(self, watch: Callable[[], None] | None, interval_s: float) -> None:
        self.watch = watch
        self.interval_s = interval_s

    def wait(self, fut: Any) -> None:
        while self.watch is not None and not fut.done():
            self.watch()
            try:
                fut.result(timeout=self.interval_s)
            except TimeoutError:
                continue
        fut.result()

    def sleep(self, seconds: float) -> None:
        # A slowed write still gives up soon after a peer dies.
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self.watch is not None:
                self.watch()
            time.sleep(min(left, self.interval_s))
