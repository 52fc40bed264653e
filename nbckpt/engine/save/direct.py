"""Large chunk files and packs written with ``O_DIRECT``: from the save's buffers to the disk.

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
:data:`MIN_BYTES`, whose bytes are one contiguous stretch of memory, in a directory on
a file system known to take such writes (:data:`DIRECT_FILE_SYSTEMS`), in a process
whose :data:`DIRECT_ENV` is not ``0``. Bytes that start on a :data:`BLOCK` boundary (a
copy's buffer is a mapping of its own) go from where they are; others (a CPU array's
own buffer, which the snapshot holds without copying it) are copied a stretch at a
time into a kept page-aligned buffer of :data:`CHUNK_STAGE_BYTES` and written from
there: the one copy such a save makes, on the writing threads rather than in the
caller's way.
The bytes up to the last whole :data:`BLOCK` go with ``O_DIRECT``; the rest (a
file's tail) is written through the page cache, and ``fdatasync`` makes the whole
file durable before the write counts as done, as tensorstore's own writes do. A file
system that refuses ``O_DIRECT`` (``EINVAL``) gets the bytes through the page cache
instead. A process's pack goes the same way (:func:`write_gathered`), through a
kept page-aligned buffer, since its small pieces start nowhere in particular: the
1 GiB ``transformer`` state of ``benchmarks/compare.py`` saved in 0.54 s against
0.60 s written through the page cache (medians of 6 alternating, 4 processes).
Everything else is written by tensorstore as before.

A restore reads these files as any other; the bytes are the same as tensorstore, or
the pack's plain write, would have written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from nbckpt.pools import LazyPool
from nbckpt.storage.local import file_system

__all__ = [
    "BLOCK",
    "DIRECT_ENV",
    "DIRECT_FILE_SYSTEMS",
    "CHUNK_STAGE_BYTES",
    "MIN_BYTES",
    "can_write_direct",
    "suits",
    "write_file",
    "write_gathered",
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

#: The buffer a pack's pieces are copied into before each ``O_DIRECT`` write. Each
#: write waits for the device, so a write must be large enough to keep it busy: with
#: 4 MiB the 256 MiB ``transformer`` state of ``benchmarks/compare.py`` (its FSDP
#: shards packed) saved in 0.82-0.91 of the time it took with 1 MiB (medians of 12-16
#: alternating pairs, 4 processes; 0.91 at 1 GiB); 8 and 16 MiB were no faster, nor
#: were two buffers taking turns, one copied into while the other is written.
STAGE_BYTES = 4 << 20

#: The buffer a chunk file's bytes are copied through where they do not start on a
#: block: one long stretch, so a larger buffer, fewer and larger writes.
CHUNK_STAGE_BYTES = 8 << 20

#: Kept buffers, by size.
_stages: dict[int, list[mmap.mmap]] = {}
_stages_lock = threading.Lock()


def _new_lock_in_child() -> None:
    # A child made by fork while a thread held the lock would wait on it for ever; the
    # buffers themselves are the child's own copies.
    global _stages_lock
    _stages_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


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
    )


def write_file(path: Path, part: np.ndarray) -> Future[None]:
    """Start writing ``part``'s bytes as the file ``path``; done once it is durable.

    ``path``'s folder is made if missing. A write that fails removes the file it made.
    """
    return _pool.get().submit(_write, path, part)


def write_gathered(
    path: Path,
    pieces: Sequence[tuple[int, np.ndarray]],
    nbytes: int,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Write the file ``path`` of ``nbytes``: each piece at its offset, zeros between.

    For a pack: many small pieces, none on a block boundary, so they are copied in
    order into a page-aligned buffer of :data:`STAGE_BYTES` (kept for the next file)
    and written from it a buffer at a time, with ``O_DIRECT`` as in
    :func:`write_file`. ``pieces`` are C-contiguous, in order of their offsets, and
    do not overlap. ``progress`` gets the pieces' bytes as each buffer is written.
    The file is durable on return; a write that fails removes it.
    """
    with _created(path) as file, _staged(STAGE_BYTES) as stage:
        view = memoryview(stage)
        base = fill = copied = 0  # the buffer's offset in the file; bytes in it; of pieces

        def flush() -> None:
            nonlocal base, fill, copied
            file.write(view[:fill], base)
            if progress is not None:
                progress(copied)
            base, fill, copied = base + fill, 0, 0

        def stage_in(data: memoryview | None, size: int) -> None:
            """Copy ``size`` bytes of ``data`` (zeros for None), writing full buffers."""
            nonlocal fill, copied
            at = 0
            while at < size:
                n = min(size - at, STAGE_BYTES - fill)
                view[fill : fill + n] = bytes(n) if data is None else data[at : at + n]
                fill, at = fill + n, at + n
                copied += 0 if data is None else n
                if fill == STAGE_BYTES:
                    flush()

        for start, piece in pieces:
            stage_in(None, start - base - fill)
            data = piece.reshape(-1).view(np.uint8).data
            stage_in(data, len(data))
        stage_in(None, nbytes - base - fill)
        flush()


def _write(path: Path, part: np.ndarray) -> None:
    data = part.reshape(-1).view(np.uint8).data
    with _created(path) as file:
        if part.__array_interface__["data"][0] % BLOCK == 0:
            file.write(data, 0)
            return
        with _staged(CHUNK_STAGE_BYTES) as stage:
            view = memoryview(stage)
            for at in range(0, len(data), CHUNK_STAGE_BYTES):
                n = min(CHUNK_STAGE_BYTES, len(data) - at)
                view[:n] = data[at : at + n]
                file.write(view[:n], at)


class _File:
    """A file being written, with ``O_DIRECT`` while its file system takes it."""

    def __init__(self, path: Path) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        try:
            self.fd, self.direct = os.open(path, flags | os.O_DIRECT, 0o644), True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self.fd, self.direct = os.open(path, flags, 0o644), False

    def write(self, data: memoryview, offset: int) -> None:
        """Write ``data`` at ``offset`` (a multiple of :data:`BLOCK` while direct).

        Its whole blocks go with ``O_DIRECT``; the rest (a file's tail), or everything
        from a refusal on, through the page cache, and so does every later write.
        """
        at = 0
        if self.direct:
            at = _put(self.fd, data, 0, len(data) - len(data) % BLOCK, offset, direct=True)
        if at < len(data):
            if self.direct:
                flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
                fcntl.fcntl(self.fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
                self.direct = False
            _put(self.fd, data, at, len(data), offset, direct=False)


@contextlib.contextmanager
def _created(path: Path) -> Iterator[_File]:
    """Make the file ``path`` (and its folder); durable once the block ends.

    A failure in the block removes the file and names it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    file = _File(path)
    try:
        yield file
        os.fdatasync(file.fd)
    except BaseException as e:
        os.close(file.fd)
        # A half-written file is of no use, and holds space the next save needs: this
        # write made it, and drops it.
        path.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            raise OSError(e.errno, e.strerror, str(path)) from e  # name the file, as open does
        raise
    os.close(file.fd)


@contextlib.contextmanager
def _staged(nbytes: int) -> Iterator[mmap.mmap]:
    """A page-aligned buffer of ``nbytes``, kept for the next file after use.

    Kept because new memory is slow to touch on the test machine (see the module's
    notes); a file written on each of a process's writing threads at once takes one each.
    """
    with _stages_lock:
        kept = _stages.get(nbytes)
        stage = kept.pop() if kept else mmap.mmap(-1, nbytes)
    try:
        yield stage
    finally:
        with _stages_lock:
            _stages.setdefault(nbytes, []).append(stage)


def _put(fd: int, data: memoryview, start: int, stop: int, offset: int, *, direct: bool) -> int:
    """Write ``data[start:stop]`` at file offset ``offset + start``; return where it stopped.

    A ``direct`` write ends early where the file system refuses it (``EINVAL``): the
    caller writes the rest through the page cache.
    """
    at = start
    while at < stop:
        try:
            n = os.pwrite(fd, data[at:stop], offset + at)
        except InterruptedError:
            continue
        except OSError as e:
            if direct and e.errno == errno.EINVAL:
                return at
            raise
        if n == 0:
            raise OSError(errno.EIO, f"wrote nothing at offset {offset + at}")
        at += n
    return at
