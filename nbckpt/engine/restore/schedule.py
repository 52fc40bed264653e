"""All the reads of a restore, at once: issued, checked as they complete, placed.

:func:`read_all` drives the :class:`~nbckpt.engine.restore.reads.LeafRead` of every
leaf: it issues every read before it waits for any, so that tensorstore overlaps them;
checks each read's chunks as it completes (on a few threads for large reads, in line
for small ones), while the others are still in flight; places each large one on its
devices (a small one goes there with its leaf, when the leaf is assembled); and reports
progress.
"""

from __future__ import annotations

import functools
import os
import queue
from collections.abc import Callable
from concurrent.futures import Future

from nbckpt.engine.progress import ProgressReport
from nbckpt.engine.restore.reads import SMALL_READ_BYTES, LeafRead, RegionRead
from nbckpt.pools import LazyPool

__all__ = ["read_all"]

#: Threads that check chunks while others are still being read: enough to keep up with
#: fast storage (CRC-32C runs at several GB/s per core), few enough to leave the cores
#: to the processes that share the host.
_VERIFY_THREADS = max(1, min(4, (os.cpu_count() or 1) // 2))

#: Kept from one restore to the next (see :mod:`nbckpt.pools`).
_verifying = LazyPool(_VERIFY_THREADS, "nbckpt-verify")


def read_all(
    leaves: list[LeafRead],
    progress: Callable[[int, int], None] | None = None,
    meanwhile: Callable[[], None] | None = None,
    meanwhile_bytes: int = 0,
) -> None:
    """Issue every leaf's reads, check each as it completes, and place it on its devices.

    The checksum checks run on a few threads (the CRC releases the GIL), so that on a
    host with cores to spare they keep up with the reads however fast the storage is;
    the main thread places each read on its devices as soon as it is checked (a read
    smaller than ``SMALL_READ_BYTES`` stays on the host until its leaf is assembled,
    with one call for all its parts). A chunk read from its own file comes with its
    checksum, computed as it was read (:mod:`~nbckpt.engine.restore.chunkfiles`): its
    check compares two numbers. Leaves without recorded checksums are only checked
    for read errors.

    ``progress(done, total)``, if given, is called once every read is issued (``done``
    0), then with the bytes read and checked so far as
    :class:`~nbckpt.engine.progress.ProgressReport` paces it (each eighth of ``total``,
    and at least every 0.2 s while reads complete); the last read is not reported.

    ``meanwhile()``, if given, runs on this thread once every read is issued, while
    they are in flight (the small packed leaves read in bulk); its ``meanwhile_bytes``
    count in the progress.
    """
    #: (a completed read, None) or (a checked read, its check's future).
    events: queue.SimpleQueue[tuple[RegionRead, Future[None] | None]] = queue.SimpleQueue()
    for leaf in leaves:
        leaf.defer_small = True
    # Sources that fetch late (the packs) start their reads now, every leaf known; a
    # leaf fetched so is issued after all others, so waiting for it holds back none.
    for source in {id(leaf.source): leaf.source for leaf in leaves}.values():
        if hasattr(source, "fetch"):
            source.fetch()
    ordered = [leaf for leaf in leaves if not leaf.late] + [x for x in leaves if x.late]
    remaining = sum(leaf.issue(lambda r: events.put((r, None))) for leaf in ordered)
    total = sum(leaf.nbytes for leaf in leaves) + meanwhile_bytes
    report = ProgressReport(None if progress is None else lambda b: progress(b, total), total)
    if progress is not None:
        progress(0, total)
    pool = None
    if remaining > 1 and any(leaf.recorded is not None for leaf in leaves):
        pool = _verifying.get()
    checks: list[Future[None]] = []
    try:
        if meanwhile is not None:
            meanwhile()
            report.add(meanwhile_bytes)
        while remaining:
            read, checked = events.get()
            small = read.buf.nbytes < SMALL_READ_BYTES
            if (
                checked is None
                and pool is not None
                and read.leaf.recorded is not None
                and not small
            ):
                checking = pool.submit(read.leaf.check, read)
                checking.add_done_callback(functools.partial(_checked, events, read))
                checks.append(checking)
                continue
            if checked is None:
                read.leaf.check(read)
            else:
                checked.result()
            read.leaf.place(read)
            report.add(read.buf.nbytes)
            remaining -= 1
    finally:
        for leaf in leaves:
            leaf.defer_small = False  # what is placed later (adopt) is placed at once
        for source in {id(leaf.source): leaf.source for leaf in leaves}.values():
            if hasattr(source, "close"):
                source.close()  # the packs it opened
        # After a failure the checks not yet started are of no use (the pool is shared).
        for checking in checks:
            checking.cancel()


def _checked(
    events: queue.SimpleQueue[tuple[RegionRead, Future[None] | None]],
    read: RegionRead,
    f: Future[None],
) -> None:
    events.put((read, f))
