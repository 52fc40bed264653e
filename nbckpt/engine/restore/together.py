"""The regions of one leaf that this process reads together with the other holders.

A large region that several processes of one host need whole is read once per host
(:mod:`nbckpt.engine.restore.hostshare`): each holder reads and checks its slab of the
region's chunk rows into one file in the host's shared memory, and once every holder
has passed the restore's barrier each maps the whole file as its array. A
:class:`Together` is that part of one :class:`~nbckpt.engine.restore.reads.LeafRead`:
it opens the slabs and, after the barrier, hands back the whole regions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from nbckpt.engine.restore import hostshare
from nbckpt.engine.restore.hostshare import HostRegion, holder_rows
from nbckpt.engine.restore.protocols import Box

__all__ = ["Slab", "Together"]

#: A slab opened for reading: its region (the shared file), the slab's box, its buffer.
Slab = tuple[HostRegion, Box, np.ndarray]


class Together:
    """The slabs of one leaf read into host-shared files, and their placing.

    Parameters
    ----------
    tag
        Unique to this restore and leaf, the same on every process (it names the files).
    chunk_rows
        The saved chunks' size along the first dimension: slabs are whole chunk rows.
    """

    def __init__(self, tag: str, chunk_rows: int) -> None:
        self.tag = tag
        self.chunk_rows = max(1, chunk_rows)
        #: The slabs read and checked (their reads), placed by :meth:`adopt`.
        self.pending: list[Any] = []

    def slab(self, box: Box, dtype: np.dtype[Any], share: tuple[int, int]) -> Slab | None:
        """Open this process's slab of ``box`` in the holders' shared file.

        ``share`` is this process's rank among the region's holders and their number.
        None when the shared memory has no room or cannot be used: the caller reads
        the whole region itself, as every holder then does.
        """
        rank, holders = share
        shape = tuple(b - a for a, b in box)
        if not hostshare.usable(math.prod(shape) * dtype.itemsize):
            return None
        try:
            region = HostRegion(f"{self.tag}|{box}", shape, dtype, rank, holders)
        except OSError:
            return None
        try:
            rows = holder_rows(box[0], self.chunk_rows, holders, rank)
            start, stop = region.slab(rows, self.chunk_rows)
        except OSError:
            region.close()
            return None
        (a, _), *rest = box
        return region, ((a + start, a + stop), *rest), region.buffer()[start:stop]

    def adopt(
        self,
        reread: Callable[[HostRegion, Box], np.ndarray],
        place: Callable[[Box, np.ndarray], None],
    ) -> None:
        """Place each pending region whole, once every holder passed the barrier.

        A region whose file misses another holder's slab (that holder read the region
        itself, or this host name hides several hosts' shared memories) is read again
        by ``reread(region, whole box)``, unchecked: its holders checked every chunk
        of it, each its slab.
        """
        for read in self.pending:
            host = read.region.adopt()
            if host is None:
                host = reread(read.region, read.whole)
            read.region.close()
            place(read.whole, host)
        self.pending.clear()
