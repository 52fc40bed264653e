"""Regions of a replicated leaf that the processes of one host read together, once.

When several processes on one host hold the same region of a leaf (data-parallel
state), each would otherwise read the whole region into memory of its own: on a host
with four processes, four copies of every byte. Instead they read it together into one
file in the host's shared memory (``/dev/shm``): each process reads its *slab* (a
contiguous run of the region's chunk rows along its first dimension, the chunks it also
checks), writes it into the file through a shared mapping, and marks its slot in the
file's trailer. After the restore's barrier (every process has read and checked its
slab, or the barrier raised) each process maps the whole file again, privately
(copy-on-write: a computation that writes into a buffer, say through donation, copies
that page for itself and never changes its neighbours' arrays), and jax adopts that
mapping as the device buffer without copying it (CPU devices only). The file is
unlinked as soon as every process has it open, so its memory goes back to the host
when the last array that uses it is freed.

Nothing here can make a restore wrong, only slower: a process that cannot get room
for the file (the shared memory is full or absent) reads the whole region itself, as
before, and a process that finds another holder's slot unmarked after the barrier (it
fell back, or the processes that share a host name do not share ``/dev/shm``) reads
the whole region again itself. The holders of a region check its chunks in the same
slabs on either path, so every chunk is checked once whichever path each took.
"""

from __future__ import annotations

import errno
import hashlib
import math
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["SCRATCH_DIR", "HostRegion", "holder_rows", "slab_rows", "usable"]

#: Where the shared files go: a tmpfs every process of the host sees. Tests point it
#: elsewhere to play processes that share a host name but not the memory.
SCRATCH_DIR = Path("/dev/shm")

#: Bytes kept free in the scratch file system beyond a region, so that a restore never
#: fills the host's shared memory to the last page.
_HEADROOM = 64 << 20


def usable(nbytes: int) -> bool:
    """Whether the scratch file system exists and has room for ``nbytes`` more."""
    try:
        st = os.statvfs(SCRATCH_DIR)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= nbytes + _HEADROOM


def slab_rows(rows: int, holders: int, rank: int) -> range:
    """The chunk rows (along the first dimension) that holder ``rank`` reads and checks.

    Row ``i`` of ``rows`` belongs to rank ``i * holders // rows``: contiguous runs, as
    even as the rows allow, and every row has exactly one owner.
    """
    return range(-(-rank * rows // holders), -(-(rank + 1) * rows // holders))


def holder_rows(first: tuple[int, int], chunk_rows: int, holders: int, rank: int) -> range:
    """The chunk rows of a region that holder ``rank`` reads and checks.

    ``first`` is the region's (start, stop) along the first dimension, whose chunks
    are ``chunk_rows`` long; rows count from the region's start (:func:`slab_rows`).
    """
    start, stop = first
    return slab_rows(-(-(stop - start) // max(1, chunk_rows)), holders, rank)


class HostRegion:
    """One region's shared file, as one of its ``holders`` processes sees it.

    Parameters
    ----------
    tag
        The same on every holder and unique to this region of this restore (the
        caller hashes the operation, the leaf and the region into it).
    shape, dtype
        The region's.
    rank, holders
        This process's rank among the processes that hold the region, and their
        number.

    Raises
    ------
    OSError
        The file cannot be made or given its room (``ENOSPC`` when the shared memory
        is full): the caller reads the region the ordinary way.
    """

    def __init__(
        self, tag: str, shape: tuple[int, ...], dtype: np.dtype[Any], rank: int, holders: int
    ) -> None:
        self.shape = shape
        self.dtype = dtype
        self.rank = rank
        self.holders = holders
        self.nbytes = math.prod(shape) * dtype.itemsize
        # The trailer (one byte per holder) starts on a page of its own, so the data
        # mapping stays page-aligned and free of it.
        self._trailer = -(-self.nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        size = self._trailer + max(holders, 1)
        digest = hashlib.sha256(tag.encode()).hexdigest()[:24]
        self.path = SCRATCH_DIR / f"nbckpt-{os.getuid()}-{digest}"
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if os.fstat(self._fd).st_size < size:  # never shrink what another holder made
                os.ftruncate(self._fd, size)
            os.posix_fallocate(self._fd, self._trailer + rank, 1)
            self._shared: mmap.mmap | None = mmap.mmap(self._fd, size, flags=mmap.MAP_SHARED)
        except BaseException:
            self.close()
            raise

    def slab(self, rows: range, chunk_rows: int) -> tuple[int, int]:
        """Reserve this process's slab; return its (start, stop) along the first dimension.

        The pages are allocated now (``posix_fallocate``), so that a full shared memory
        fails here, with ``ENOSPC``, rather than as a SIGBUS when a read writes there.
        """
        first = self.shape[0] if self.shape else 1
        start, stop = min(rows.start * chunk_rows, first), min(rows.stop * chunk_rows, first)
        row_bytes = self.nbytes // first if first else 0
        if stop > start and self._fd is not None:
            os.posix_fallocate(self._fd, start * row_bytes, (stop - start) * row_bytes)
        return start, stop

    def buffer(self) -> np.ndarray:
        """The whole region, through the shared mapping: write this process's slab here."""
        assert self._shared is not None
        return np.frombuffer(self._shared, self.dtype, math.prod(self.shape)).reshape(self.shape)

    def mark(self) -> None:
        """Record that this process's slab is in the file, read and checked."""
        assert self._shared is not None
        self._shared[self._trailer + self.rank] = 1

    def adopt(self) -> np.ndarray | None:
        """After the barrier: the whole region, mapped privately; None if a slab is missing.

        Call it only once every holder has passed the restore's barrier: their slabs
        are then in the file, or their slots say they are not.
        """
        assert self._shared is not None and self._fd is not None
        marks = self._shared[self._trailer : self._trailer + self.holders]
        if marks != b"\x01" * self.holders:
            return None
        if not self.nbytes:
            return np.empty(self.shape, self.dtype)
        private = mmap.mmap(
            self._fd,
            self.nbytes,
            flags=mmap.MAP_PRIVATE,
            prot=mmap.PROT_READ | mmap.PROT_WRITE,
        )
        return np.frombuffer(private, self.dtype, math.prod(self.shape)).reshape(self.shape)

    def close(self) -> None:
        """Unlink the file and drop this process's handle on it (idempotent).

        Every holder opened the file before the barrier, so unlinking after it takes
        nothing from anyone; arrays adopted from it keep their mapping.
        """
        try:
            self.path.unlink()
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        # The shared mapping closes when the last view of it (a slab being read) goes.
        self._shared = None
