"""Large chunk files written with ``O_DIRECT``: from the save's buffers to the disk.

A buffered write copies every byte into the page cache, into pages the kernel takes
from its free lists, and the writeback that ``fsync`` waits for sends them on. On the
project's test machine (a VM whose free memory goes back to its host) those pages are
sometimes new to the host as well, and the copy into them was up to nine times slower
than usual: ``perf`` put 157 ms of one process's 1 GiB ``fsdp`` save in the kernel's
copy into the page cache, against 18 ms in a quiet run, and the save took 0.8-1.2 s
where it takes 0.6 s. A write with ``O_DIRECT`` goes from the save's own buffers (kept
from one save to the next, :mod:`~nbckpt.engine.save.hostmem`) to the device: nothing
is copied and no page-cache memory is taken. Measured there (4 processes, 256 MiB
each as 8 files of 32 MiB, ``fdatasync`` each, 6 alternating runs): 0.49-0.50 s
with ``O_DIRECT`` whatever the number of threads, 0.48-1.50 s buffered.

Where it applies: a chunk file of the nbckpt layout (raw bytes, C order) of at least
:data:`MIN_BYTES`, whose bytes are one contiguous stretch of memory starting on a
:data:`BLOCK` boundary (a large shard's buffer is a mapping of its own, so its first
chunk always does), in a directory on a file system known to take such writes
(:data:`DIRECT_FILE_SYSTEMS`), in a process whose :data:`DIRECT_ENV` is not ``0``.
The bytes up to the last whole :data:`BLOCK` go with ``O_DIRECT``; the rest (a
file's tail) is written through the page cache, and ``fdatasync`` makes the whole
file durable before the write counts as done, as tensorstore's own writes do. A file
system that refuses ``O_DIRECT`` (``EINVAL``) gets the bytes through the page cache
instead. Everything else is written by tensorstore as before.

A restore reads these files as any other; the bytes are the same as tensorstore would
have written.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from nbckpt.engine.pools import LazyPool
from nbckpt.storage.local import file_system

__all__ = [
    "BLOCK",
    "DIRECT_ENV",
    "DIRECT_FILE_SYSTEMS",
    "MIN_BYTES",
    "can_write_direct",
    "suits",
    "write_file",
]

#: Set to ``0`` in a process's environment, its saves write every chunk file through
#: the page cache (with tensorstore), as before.
DIRECT_ENV = "NBCKPT_DIRECT_WRITE"

#: File systems measured or documented to take ``O_DIRECT`` writes of block-aligned
#: buffers without a copy. Others (tmpfs has no device to write to; a network file
#: system has its own rules) keep the page cache.
DIRECT_FILE_SYSTEMS = frozenset({"ext4", "xfs"})

#: The alignment of an ``O_DIRECT`` write's memory, offset and length: a page, which
#: covers every logical block size of the devices in use.
BLOCK = 4096

#: Smaller chunk files are not worth a file descriptor flag: they are few bytes of a
#: save, and a small leaf's copy is cut from a shared slab at no block boundary.
MIN_BYTES = 1 << 20

#: The names of the dtypes whose bytes in memory are their chunk's bytes in a zarr v2
#: file (little-endian, whole bytes); sub-byte types (``int4``) are packed differently.
_RAW_DTYPES = frozenset(
    {
        "bool",
        "int8",
        "uint8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    }
)

#: Threads writing chunk files at once per process. One already keeps the disk busy
#: (a write of a chunk is many requests in flight); the second overlaps a file's
#: ``fdatasync`` with the next file's write.
THREADS = 2

_pool = LazyPool(THREADS, "nbckpt-direct")


def can_write_direct(directory: str | os.PathLike[str]) -> bool:
    """Whether a save in this process writes large chunk files under ``directory`` itself.

    It does on Linux, on a file system of :data:`DIRECT_FILE_SYSTEMS`, where
    :data:`DIRECT_ENV` is not ``0``.
    """
    return (
        os.environ.get(DIRECT_ENV, "1") != "0"
        and sys.platform.startswith("linux")
        and sys.byteorder == "little"
        and hasattr(os, "O_DIRECT")
        and file_system(directory) in DIRECT_FILE_SYSTEMS
    )


def suits(part: np.ndarray, whole: bool) -> bool:
    """Whether chunk ``part`` is written here: see the module's notes.

    ``whole``: the chunk is all of its chunk-shaped region (an edge chunk is not: its
    file holds it padded to the chunk shape).
    """
    return (
        whole
        and part.nbytes >= MIN_BYTES
        and part.flags.c_contiguous
        and part.dtype.name in _RAW_DTYPES
        and part.dtype.byteorder in "=<|"
        and part.__array_interface__["data"][0] % BLOCK == 0
    )


def write_file(path: Path, part: np.ndarray) -> Future[None]:
    """Start writing ``part``'s bytes as the file ``path``; done once it is durable.

    ``path``'s folder is made if missing. A write that fails removes the file it made.
    """
    return _pool.get().submit(_write, path, part)


def _write(path: Path, part: np.ndarray) -> None:
    data = part.reshape(-1).view(np.uint8).data
    path.parent.mkdir(parents=True, exist_ok=True)
    aligned = len(data) - len(data) % BLOCK
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_DIRECT, 0o644)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        fd, aligned = os.open(path, flags, 0o644), 0
    try:
        at = _put(fd, data, 0, aligned, direct=True)
        if at < len(data):
            # The tail, or everything after a refusal: through the page cache.
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            _put(fd, data, at, len(data), direct=False)
        os.fdatasync(fd)
    except BaseException as e:
        os.close(fd)
        # A half-written chunk is of no use, and holds space the next save needs: this
        # write made the file, and drops it.
        path.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            raise OSError(e.errno, e.strerror, str(path)) from e  # name the file, as open does
        raise
    os.close(fd)


def _put(fd: int, data: memoryview, start: int, stop: int, *, direct: bool) -> int:
    """Write ``data[start:stop]`` at its offset; return where the writes stopped.

    A ``direct`` write ends early where the file system refuses it (``EINVAL``): the
    caller writes the rest through the page cache.
    """
    at = start
    while at < stop:
        try:
            n = os.pwrite(fd, data[at:stop], at)
        except InterruptedError:
            continue
        except OSError as e:
            if direct and e.errno == errno.EINVAL:
                return at
            raise
        if n == 0:
            raise OSError(errno.EIO, f"wrote nothing at offset {at}")
        at += n
    return at
