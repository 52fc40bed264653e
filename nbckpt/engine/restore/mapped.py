"""Local packs and chunk files mapped as the restored values' memory, not copied out.

A restore that reads a pack with ``pread`` pays three times per byte: the kernel
zeroes a new page of the restore's memory, copies the byte into it from the page
cache, and the checksum reads it once more. The plain read the benchmarks compare
against pays only the copy, into one buffer it reuses. Mapped copy-on-write
(``MAP_PRIVATE``) and read in with one ``madvise(MADV_POPULATE_READ)``, a stretch's
pages *are* the page cache's: nothing is zeroed or copied, and a CPU device takes a
leaf's view of the stretch as its buffer, as it takes a read buffer
(:mod:`~nbckpt.engine.restore.bulk`). Measured on this project's 2-core machine (4
processes, page cache dropped, 8 repetitions of each, alternating): the 1 GiB
``transformer`` state of ``benchmarks/compare.py`` restored in 0.37 s mapped against
0.62 s read (medians), 0.13 s both at 256 MiB.

A leaf's own chunk file (tens of MiB) is mapped too, once it has been read through
with a small buffer, and a shard of several chunks is its files mapped end to end
(:func:`map_files`; :func:`~nbckpt.engine.restore.chunkfiles.map_region`): populated
straight from the disk, page by page, it restored slower than it was read (the 1 GiB
``fsdp`` state in 0.45 s against 0.39 s), but read through first it needs no new
memory at all. That matters where new memory is dear: on the project's VM, whose
free memory goes back to its host, zeroing the pages of a read's buffer took most of
a cold restore (``perf``: 72 % of one process's samples in ``clear_page_erms``).
Medians of 8 alternating, 4 processes: ``fsdp`` 1 GiB 0.40 s mapped against 0.45 s
read, and 0.39 s against 0.60 s when the restore came 3 s after the cache was
dropped; ``small`` 1 GiB 0.42 s against 0.52 s.

What it asks of the files: a committed step's files are never written again, only
removed (retention, a forced re-save, ``prune_after``), so a value that maps them
keeps the bytes that were checked. A write to such a value (an XLA computation that
reuses a donated buffer) lands in the process's own copy of the page, never in the
file. A removed file stays readable while a value maps it: its disk space comes back
when the value is dropped. A pack changed in place while a value maps it (something
outside nbckpt rewriting a committed step) would change the value too, and one cut
short would end the process with ``SIGBUS``; nbckpt never does either.

The populate call reports a failed read as an error, where a first touch of the page
would raise ``SIGBUS`` (the stretch is then read, and the read reports the failure as
it always has): the mapping is used only where the call exists (Linux 5.14 and
later), on a local file system (:data:`LOCAL_FILE_SYSTEMS`: on a network one another
host may remove a file this one maps, and a page dropped since cannot come back) and
where the file can be mapped; anywhere else, and in a process whose :data:`MAP_ENV` is
``0``, packs are read as before.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from nbckpt.storage.local import file_system

__all__ = ["LOCAL_FILE_SYSTEMS", "MAP_ENV", "can_map", "map_files", "map_range"]

#: ``MADV_POPULATE_READ`` (Linux 5.14): fault a range in, reading what is not in the
#: page cache; a read that fails is the call's error, not a ``SIGBUS`` later.
_POPULATE_READ = 22


#: Set to ``0`` in a process's environment, restores there read their files instead of
#: mapping them (a file system whose mappings misbehave, say, or to give a removed
#: step's disk space back before the values restored from it are dropped).
MAP_ENV = "NBCKPT_RESTORE_MAP"


#: File systems whose files stay as they were while mapped: local disks and memory. On
#: a network file system another host can remove a file this one maps, and a page the
#: kernel dropped then fails to come back (``SIGBUS``).
LOCAL_FILE_SYSTEMS = frozenset(
    {"bcachefs", "btrfs", "ext2", "ext3", "ext4", "f2fs", "overlay", "ramfs", "tmpfs", "xfs", "zfs"}
)


def can_map(directory: str | os.PathLike[str]) -> bool:
    """Whether a restore in this process maps the files in ``directory``.

    It does where the system can (Linux 5.14 or later), the directory is on a local
    file system (:data:`LOCAL_FILE_SYSTEMS`) and :data:`MAP_ENV` is not ``0``.
    """
    return (
        os.environ.get(MAP_ENV, "1") != "0"
        and _can_populate()
        and file_system(directory) in LOCAL_FILE_SYSTEMS
    )


@functools.cache
def _can_populate() -> bool:
    """Whether this system can map and populate a range (Linux 5.14 or later)."""
    if not sys.platform.startswith("linux"):
        return False
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        probe.madvise(_POPULATE_READ)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def map_range(fd: int, start: int, stop: int) -> tuple[np.ndarray, int] | None:
    """Bytes ``start`` to ``stop`` of file ``fd``, mapped copy-on-write and read in.

    Returns
    -------
    tuple or None
        The bytes (a writable view; a write goes to this process's own copy of the
        page, never to the file) and where they end: before ``stop`` when the file is
        shorter. None when the file cannot be mapped, or its bytes not read in so
        (read them instead: the read reports what failed).
    """
    end = min(stop, os.fstat(fd).st_size)
    if end <= start:
        return np.empty(0, np.uint8), start
    base = start - start % mmap.ALLOCATIONGRANULARITY
    try:
        mapping = mmap.mmap(fd, end - base, access=mmap.ACCESS_COPY, offset=base)
    except (OSError, ValueError):
        return None  # a file system without mmap, say
    view = np.frombuffer(mapping, np.uint8)
    if not _populate(view):
        # A failed read, or no memory for the mapping: the read says which, as ever.
        del view  # the mapping cannot close while a view of it is alive
        mapping.close()
        return None
    return view[start - base :], end


def map_files(fds: Sequence[int], sizes: Sequence[int]) -> np.ndarray | None:
    """Files ``fds`` mapped copy-on-write one after another, as one stretch, and read in.

    What :func:`map_range` does for a stretch of one file, for the whole chunk files
    of a region (one, or several for a shard the save split into chunks of 64 MiB):
    the region's value is the files themselves, end to end, with no new memory. Each
    file is ``sizes[i]`` bytes long; every size but the last must be a whole number of
    pages (a file is mapped from a page boundary).

    Returns
    -------
    numpy.ndarray or None
        The bytes (a writable view; writes go to this process's own copy of a page,
        never to a file), unmapped once the last view of them is gone. None when the
        files cannot be mapped so, or not read in (read them instead).
    """
    total = sum(sizes)
    if total <= 0 or any(n <= 0 or n % mmap.PAGESIZE for n in sizes[:-1]):
        return None
    stretch = _Stretch.reserve(total)
    if stretch is None:
        return None
    offset = 0
    for fd, nbytes in zip(fds, sizes, strict=True):
        if not stretch.place(fd, offset, nbytes):
            return None  # the stretch is unmapped as it goes
        offset += nbytes
    view = np.asarray(stretch)
    if not _populate(view):
        return None
    return view


class _Stretch:
    """Address space that files are mapped into side by side; unmapped when let go.

    NumPy takes it as an array (``__array_interface__``) and keeps it as that array's
    base, so the mapping lasts exactly as long as any view of it (or a CPU device
    buffer made from one) does.
    """

    # Linux's values (this module maps only on Linux, see _can_populate).
    _PROT_READ_WRITE = 0x1 | 0x2
    _MAP_PRIVATE, _MAP_FIXED, _MAP_ANONYMOUS, _MAP_NORESERVE = 0x02, 0x10, 0x20, 0x4000

    def __init__(self, address: int, nbytes: int, length: int) -> None:
        self._address, self._length = address, length
        self._munmap = _libc().munmap
        self.__array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
        }

    @classmethod
    def reserve(cls, nbytes: int) -> _Stretch | None:
        """``nbytes`` of address space, holding nothing yet; None if there is none."""
        length = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        flags = cls._MAP_PRIVATE | cls._MAP_ANONYMOUS | cls._MAP_NORESERVE
        address = _libc().mmap(None, length, 0, flags, -1, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            return None
        return cls(address, nbytes, length)

    def place(self, fd: int, offset: int, nbytes: int) -> bool:
        """Map file ``fd``'s first ``nbytes`` at ``offset`` of the stretch (a page boundary)."""
        flags = self._MAP_PRIVATE | self._MAP_FIXED
        want = self._address + offset
        got = _libc().mmap(want, nbytes, self._PROT_READ_WRITE, flags, fd, 0)
        if got != want:
            self.release()
            return False
        return True

    def release(self) -> None:
        """Unmap the whole stretch (once; no view of it may be left)."""
        if self._length:
            self._munmap(self._address, self._length)
            self._length = 0

    def __del__(self) -> None:
        self.release()


@functools.cache
def _libc() -> Any:
    """The C library's ``mmap``, ``munmap`` and ``madvise``, typed for ctypes.

    Called through ctypes, each lets go of the GIL (see :func:`_populate`).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    # mmap(addr, length, prot, flags, fd, offset)
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mmap.restype = ctypes.c_void_p
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.munmap.restype = ctypes.c_int
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    return libc


def _populate(view: np.ndarray) -> bool:
    """Read the mapped pages of ``view`` in; False if that failed.

    Not ``mmap.madvise``: CPython holds the GIL through that call, which on a cold
    file lasts as long as the disk takes to read the range, and every other thread of
    the process (the one placing the leaves already read, those reading the chunk
    files, the caller's own) waits for it. ``py-spy --gil`` on 4 processes restoring
    the 256 MiB ``small`` state: the call held the GIL in 31 % of the samples that
    had it. (The restore took as long either way there, its 2 cores busy throughout.)
    """
    address = view.__array_interface__["data"][0]
    while _libc().madvise(address, view.nbytes, _POPULATE_READ) != 0:
        if ctypes.get_errno() != errno.EINTR:
            return False
    return True
