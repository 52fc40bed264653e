"""Host memory for a save's copies, kept from one save to the next.

What a save copies before ``save`` returns (:mod:`nbckpt.engine.save.snapshot`:
NumPy arrays, offloaded shards, and CPU shards only where XLA would donate a buffer
the save holds) is copied into these. A fresh copy of a large shard is new memory:
every page faults on first touch, and NumPy asks the kernel for transparent huge pages
for large arrays, which on a busy host compacts memory in the copy's path and slows the
page-cache writes that follow. Measured on the 2-core test machine (4 processes, 1 GiB
``fsdp`` state, 8 alternating runs): plain tensorstore writes of the shards took
0.57-0.68 s from the arrays themselves, 0.71-2.8 s after fresh NumPy copies, 0.81-1.7 s
after fresh copies without huge pages and 0.63-0.82 s after copies into buffers reused
from the run before.

So a save borrows its large buffers from those the last save used (same sizes: a
training loop saves the same state every time), and new ones are anonymous mappings
that ask for normal pages. A save that ends well gives them back; one that failed
drops them, since a write it gave up on may still read them.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import threading
from typing import Any

import numpy as np

__all__ = ["MIN_BYTES", "SLAB_BYTES", "HostBuffers", "Loan"]

#: Copies of at least this size get a buffer of their own; smaller ones are cut from
#: slabs, since a mapping per small leaf would cost more than it saves.
MIN_BYTES = 1 << 20
#: The size of a slab that small copies are cut from, one after the other. A state of
#: many small leaves copied into fresh NumPy arrays faulted in new pages at every
#: save: 442 leaves, 54 MiB per process, took 55-60 ms; cut from kept slabs, 10-25 ms.
SLAB_BYTES = 4 << 20
#: Where a copy cut from a slab starts: a multiple of this (a cache line, and more than
#: any dtype's alignment).
_ALIGN = 64


def _mapping(nbytes: int) -> mmap.mmap:
    """A new anonymous mapping of ``nbytes``, on normal pages where the kernel allows it."""
    m = mmap.mmap(-1, nbytes)
    advice = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if advice is not None:
        # A kernel without transparent huge pages has nothing to turn off.
        with contextlib.suppress(OSError):
            m.madvise(advice)
    return m


class HostBuffers:
    """The buffers one checkpointer's saves copy their large shards into.

    Parameters
    ----------
    keep
        Keep the buffers of a save that ended well for the next save (the default).
        False frees them once each save ends: less memory between saves, slower copies.
    """

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self._free: dict[int, list[mmap.mmap]] = {}
        #: The bytes of each held buffer (by ``id``) that a copy wrote at some save.
        self._touched: dict[int, int] = {}
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes held for the next save (the buffers' sizes)."""
        with self._lock:
            return sum(n * len(ms) for n, ms in self._free.items())

    @property
    def resident(self) -> int:
        """Bytes of the held buffers that copies wrote: the memory they take.

        A slab's tail that no copy reached was never touched, so it takes no memory
        (to the page); :attr:`nbytes` counts it.
        """
        with self._lock:
            return sum(self._touched.get(id(m), len(m)) for ms in self._free.values() for m in ms)

    def loan(self) -> Loan:
        """Start lending to one save."""
        return Loan(self)

    def clear(self) -> None:
        """Free every buffer held (the memory returns once no array uses it)."""
        with self._lock:
            self._free.clear()
            self._touched.clear()

    def _take(self, nbytes: int) -> tuple[mmap.mmap, int]:
        """A buffer of ``nbytes``, and how much of it copies wrote before."""
        with self._lock:
            stack = self._free.get(nbytes)
            if stack:
                m = stack.pop()
                return m, self._touched.pop(id(m), 0)
        return _mapping(nbytes), 0

    def _put(self, lent: list[mmap.mmap], touched: dict[int, int]) -> None:
        with self._lock:
            # Only the last save's buffers are kept: a state that changed shape does not
            # leave the old sizes behind.
            self._free.clear()
            self._touched.clear()
            if self.keep:
                # Stacked so that the next save, copying in the same order, gets each
                # buffer back where this one had it.
                for m in reversed(lent):
                    self._free.setdefault(len(m), []).append(m)
                    self._touched[id(m)] = touched.get(id(m), len(m))


class Loan:
    """The buffers one save borrowed: :meth:`empty` lends, :meth:`end` settles."""

    def __init__(self, owner: HostBuffers) -> None:
        self._owner = owner
        self._lent: list[mmap.mmap] = []
        #: The bytes of each lent buffer (by ``id``) that copies wrote, at any save.
        self._touched: dict[int, int] = {}
        self._open = True
        self._slab: memoryview | None = None  # the slab small copies are cut from now
        self._slab_id = 0  # its buffer's id
        self._used = 0  # bytes of it cut so far

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-ordered array of ``shape`` and ``dtype`` for a copy."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if not self._open or nbytes == 0:
            return np.empty(shape, dtype)
        if nbytes < MIN_BYTES:
            return np.frombuffer(self._cut(nbytes), dtype=dtype).reshape(shape)
        return np.frombuffer(self._borrow(nbytes), dtype=dtype).reshape(shape)

    def _borrow(self, nbytes: int, whole: bool = True) -> mmap.mmap:
        """A buffer of ``nbytes``: all of it written by the copy (``whole``), or cut up."""
        m, before = self._owner._take(nbytes)
        self._lent.append(m)
        self._touched[id(m)] = nbytes if whole else before
        return m

    def _cut(self, nbytes: int) -> memoryview:
        """``nbytes`` of the current slab, or of a new one where it has too few left."""
        start = -(-self._used // _ALIGN) * _ALIGN
        if self._slab is None or start + nbytes > len(self._slab):
            slab = self._borrow(SLAB_BYTES, whole=False)
            self._slab, self._slab_id, start = memoryview(slab), id(slab), 0
        self._used = start + nbytes
        self._touched[self._slab_id] = max(self._touched[self._slab_id], self._used)
        return self._slab[start : self._used]

    def copy_of(self, array: np.ndarray, dtype: Any = None) -> np.ndarray:
        """A C-ordered copy of ``array`` in a borrowed buffer, as ``dtype`` (same kind).

        ``dtype`` may differ from the array's in byte order only.
        """
        out = self.empty(tuple(array.shape), array.dtype if dtype is None else dtype)
        np.copyto(out, array, casting="equiv")
        return out

    def taken(self) -> None:
        """Every copy is made: free the held buffers this save did not borrow."""
        self._owner.clear()

    def end(self, ok: bool) -> None:
        """The save ended: give the buffers back if ``ok``, else drop them.

        After a failure a write the save gave up waiting for may still read its
        buffers: those are never lent again, and their memory returns with the last
        array that uses them.
        """
        if not self._open:
            return
        self._open = False
        self._slab = None
        lent, self._lent = self._lent, []
        if ok:
            self._owner._put(lent, self._touched)
