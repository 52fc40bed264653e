"""Whole chunks of a local step, read with ``preadv`` straight into a restore's buffers.

nbckpt stores its arrays' chunks raw (zarr v2, no compressor, no filters, C order), so
on a local disk a whole chunk's file *is* that chunk's bytes, and the restore's buffer
for a region of whole chunks holds each of them as one contiguous stretch whenever the
chunk spans the region's trailing dimensions (:func:`~nbckpt.engine.arrays.zarr.chunk_shape`
splits from the first dimension on, so with the save's own shardings it always does).

tensorstore reads such a file into a buffer of its own and then copies it into ours:
twice the memory to fault in, and a copy. Measured on this project's 2-core machine (4
processes restoring the 1 GiB ``fsdp`` state, page cache dropped, medians of 8): 0.58 s
through tensorstore, 0.45 s read here, against 0.31 s for the plain read of the same
bytes into one reused buffer (``benchmarks/RESULTS.md``).

A file is read a piece (:data:`SUM_PIECE`) at a time when the restore checks checksums,
and each piece gets its CRC-32C right after it is read, while it is still in the CPU's
cache: 29 GB/s there against 15 GB/s for a chunk of 32 MiB read back from memory, on
the same machine. The restore then compares the sum with the recorded one instead of
reading the chunk again (:func:`~nbckpt.engine.restore.reads.LeafRead.check`). Same
restore, cold, medians of 12, before and after alternating: 0.50 s to 0.38 s at
1 GiB, 0.20 s to 0.14 s at 256 MiB.

Where packs are mapped (:func:`~nbckpt.engine.restore.mapped.can_map`), a region made
of whole chunks, one after another, is not read into a new buffer at all: its files are
read through (and checksummed) with a small buffer, then mapped (:func:`map_region`).

Anything else goes through tensorstore as before: an object store, another layout, a
region that is not made of whole chunks stored as contiguous stretches of it, an edge
chunk (stored padded), and a chunk file that is missing, of the wrong size or fails to
read; tensorstore then reports the damage in its own words.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorstore as ts

from nbckpt.engine.arrays.zarr import chunk_key, chunk_regions
from nbckpt.engine.restore.mapped import map_files
from nbckpt.engine.restore.protocols import Box
from nbckpt.formats.checksum import crc32c_extend
from nbckpt.pools import LazyPool

__all__ = [
    "MAP_MIN_BYTES",
    "SUM_PIECE",
    "THREADS",
    "is_raw",
    "map_region",
    "pread_full",
    "read_pieces",
    "read_region",
]


def _threads_for(cores: int) -> int:
    # More readers than this per process only queued behind each other on 2 cores
    # (8 per process, 4 processes: medians 0.38-1.04 s, against 0.45 s with 1 or 2).
    return min(8, max(2, cores // 2))


#: Threads reading chunk files at once, shared by every restore of this process.
THREADS = _threads_for(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2)

#: A chunk checksummed as it is read is read this many bytes at a time: small enough to
#: be in the CPU's cache still when checksummed, large enough that the system calls
#: cost nothing next to the bytes.
SUM_PIECE = 1 << 20

#: A smaller chunk is read, not mapped: a mapping costs a few system calls and a page
#: of address space at least, more than reading a few KiB.
MAP_MIN_BYTES = 1 << 20

#: The dtypes whose stored bytes are NumPy's in memory: little endian or single bytes
#: (a zarr v2 ``bfloat16`` is stored little endian).
_NATIVE = ("<", "|")

_pool = LazyPool(THREADS, "nbckpt-chunk-read")


def is_raw(store: ts.TensorStore) -> bool:
    """Whether ``store``'s chunk files hold exactly their chunks' bytes, in C order."""
    try:
        spec = store.spec(retain_context=False).to_json()
    except (ValueError, AttributeError):
        return False
    meta = spec.get("metadata", {})
    dtype = meta.get("dtype")
    return (
        spec.get("driver") == "zarr"
        and meta.get("compressor") is None
        and not meta.get("filters")
        and meta.get("order", "C") == "C"
        and meta.get("dimension_separator", ".") == "."
        and isinstance(dtype, str)
        and (dtype.startswith(_NATIVE) or dtype == "bfloat16")
    )


def read_region(
    folder: Path,
    store: ts.TensorStore,
    box: Box,
    shape: Sequence[int],
    chunks: Sequence[int],
    buf: np.ndarray,
    sums: dict[str, int] | None = None,
) -> Future[None] | None:
    """Start reading region ``box`` of the array in ``folder`` into ``buf``.

    Parameters
    ----------
    folder
        The array's directory; its chunk files are named by
        :func:`~nbckpt.engine.arrays.zarr.chunk_key` and raw (:func:`is_raw`).
    store
        The same array, opened: what a chunk that cannot be read here is read with.
    box, shape, chunks
        The region, the array's shape and its chunk shape.
    buf
        A C-contiguous buffer of the region's shape and the array's dtype.
    sums
        Given, and CRC-32C computed in place here (:func:`~nbckpt.formats.checksum.crc32c_extend`),
        each chunk read from its file gets its CRC-32C here, by chunk key: computed
        piece by piece as the file is read, each piece checksummed while it is still
        in the CPU's cache (twice as fast as checksumming the chunk once it is read,
        measured on this project's machine). A chunk read by tensorstore gets none.

    Returns
    -------
    Future or None
        Done when every chunk is in ``buf``; its exception is tensorstore's for a
        chunk it could not read either. None when the region is not made of whole,
        contiguous chunks, or the array's chunks are not raw: read it with tensorstore.
    """
    pieces = _pieces(box, shape, chunks, buf)
    if not pieces or not is_raw(store):
        return None
    flat = buf.reshape(-1).view(np.uint8)
    done: Future[None] = Future()
    left = [len(pieces)]
    lock = threading.Lock()

    def finished(f: Future[int | None]) -> None:
        error = f.exception()
        with lock:
            left[0] -= 1
            last = left[0] == 0
            if error is not None and not done.done():
                done.set_exception(error)
                return
        if last and not done.done():
            done.set_result(None)

    pool = _pool.get()
    extend = None if sums is None else crc32c_extend()
    for p in pieces:
        task = pool.submit(
            _read, folder / p.key, store, p.glob, buf[p.local], flat[p.start : p.stop], extend
        )
        if extend is not None:
            assert sums is not None
            task.add_done_callback(functools.partial(_keep_sum, sums, p.key))
        task.add_done_callback(finished)
    return done


def map_region(
    folder: Path,
    store: ts.TensorStore,
    box: Box,
    shape: Sequence[int],
    chunks: Sequence[int],
    buf: np.ndarray,
    sums: dict[str, int] | None = None,
) -> Future[np.ndarray] | None:
    """Start restoring region ``box`` as a mapping of its chunk files, if it is made of them.

    Each file is read through once, a piece at a time into a small buffer of this
    thread's (checksummed there, as :func:`read_region` does, while each piece is in
    the CPU's cache); the bytes are then in the page cache, and the region's value is
    the files mapped copy-on-write, end to end
    (:func:`~nbckpt.engine.restore.mapped.map_files`): no new memory is zeroed and
    filled, which on the project's VM was most of a cold restore's time when the memory
    had gone back to the host. A shard of more than one chunk (over 64 MiB, as the save
    splits them) is mapped so too: read into new memory, the 4 GiB ``fsdp`` state
    restored at a third of the plain read's speed there (see ``benchmarks/RESULTS.md``).
    Files that cannot be mapped are read into ``buf`` as :func:`read_region` would.

    Returns
    -------
    Future or None
        Its result is the region's value (the mapping, or ``buf``); its exception
        tensorstore's for a chunk it could not read either. None when the region is
        not whole raw chunks, of at least :data:`MAP_MIN_BYTES` in all, that fill it
        one after another, each from a page boundary of it: use :func:`read_region`.
    """
    if buf.nbytes < MAP_MIN_BYTES:
        return None
    pieces = sorted(_pieces(box, shape, chunks, buf), key=lambda p: p.start)
    if not _end_to_end(pieces, buf.nbytes) or not is_raw(store):
        return None
    extend = None if sums is None else crc32c_extend()
    flat = buf.reshape(-1).view(np.uint8)
    task = _pool.get().submit(_map, folder, store, pieces, buf, flat, extend)
    done: Future[np.ndarray] = Future()

    def finished(f: Future[tuple[np.ndarray, dict[str, int]]]) -> None:
        error = f.exception()
        if error is not None:
            done.set_exception(error)
            return
        value, crcs = f.result()
        if sums is not None:
            sums.update(crcs)  # kept before anyone is told the region is in
        done.set_result(value)

    task.add_done_callback(finished)
    return done


def _end_to_end(pieces: list[_Piece], nbytes: int) -> bool:
    """Whether ``pieces`` fill ``nbytes`` one after another, each from a page boundary."""
    at = 0
    for p in pieces:
        if p.start != at or p.start % mmap.PAGESIZE:
            return False
        at = p.stop
    return bool(pieces) and at == nbytes


def _map(
    folder: Path,
    store: ts.TensorStore,
    pieces: list[_Piece],
    buf: np.ndarray,
    flat: np.ndarray,
    extend: Callable[[int, np.ndarray], int] | None,
) -> tuple[np.ndarray, dict[str, int]]:
    """Map the region's chunk files (each read through first); else read them into ``buf``.

    Returns the region's value and, with ``extend``, each chunk's CRC-32C by its key.
    """
    sizes = [p.stop - p.start for p in pieces]
    fds: list[int] = []
    crcs: dict[str, int] = {}
    try:
        for p, nbytes in zip(pieces, sizes, strict=True):
            fds.append(os.open(folder / p.key, os.O_RDONLY))
            whole = os.fstat(fds[-1]).st_size == nbytes
            crc = _read_through(fds[-1], nbytes, extend) if whole else None
            if crc is None:
                break
            crcs[p.key] = crc
        else:
            view = map_files(fds, sizes)
            if view is not None:
                return view.view(buf.dtype).reshape(buf.shape), crcs if extend else {}
    except OSError:
        pass
    finally:
        for fd in fds:
            os.close(fd)
    # Not mapped: read, and the read reports what is wrong with a file.
    crcs.clear()
    for p in pieces:
        part = buf[p.local]
        crc = _read(folder / p.key, store, p.glob, part, flat[p.start : p.stop], extend)
        if crc is not None:
            crcs[p.key] = crc
    return buf, crcs


#: Each reading thread's buffer for :func:`_read_through`.
_scratch = threading.local()


def _read_through(
    fd: int, nbytes: int, extend: Callable[[int, np.ndarray], int] | None
) -> int | None:
    """Read ``nbytes`` of ``fd`` into the page cache; their CRC-32C (0 without ``extend``).

    None if the file ends first.
    """
    piece = getattr(_scratch, "buf", None)
    if piece is None:
        piece = _scratch.buf = np.empty(SUM_PIECE, np.uint8)
    crc, at = 0, 0
    while at < nbytes:
        n = pread_full(fd, piece[: min(SUM_PIECE, nbytes - at)], at)
        if n == 0:
            return None
        if extend is not None:
            crc = extend(crc, piece[:n])
        at += n
    return crc


@dataclass(frozen=True)
class _Piece:
    """One chunk of a region: its key and place in the array, its place in the buffer."""

    key: str
    glob: tuple[slice, ...]
    local: tuple[slice, ...]
    #: The bytes of the flat buffer it fills.
    start: int
    stop: int


def _pieces(box: Box, shape: Sequence[int], chunks: Sequence[int], buf: np.ndarray) -> list[_Piece]:
    """Each chunk of ``box`` and where it goes in ``buf``.

    Empty if any chunk is not whole (an edge chunk, or a region not on the chunk grid)
    or not one contiguous stretch of ``buf``.
    """
    if not box or buf.size == 0 or not buf.flags.c_contiguous:
        return []
    for (start, stop), c in zip(box, chunks, strict=True):
        if c <= 0 or start % c or (stop - start) % c:
            return []
    region = tuple(slice(a, b) for a, b in box)
    dims = buf.shape
    pieces = []
    for glob, local in chunk_regions(region, shape, chunks):
        extents = [sl.stop - sl.start for sl in local]
        if extents != list(chunks):
            return []  # an edge chunk: its file holds the whole chunk, padded
        # Contiguous in C order: the whole buffer's extent after some axis, 1 before it.
        axis = len(dims) - 1
        while axis > 0 and extents[axis] == dims[axis]:
            axis -= 1
        if any(e != 1 for e in extents[:axis]):
            return []
        offset = int(np.ravel_multi_index([sl.start for sl in local], dims)) * buf.itemsize
        nbytes = math.prod(extents) * buf.itemsize
        pieces.append(_Piece(chunk_key(glob, chunks), glob, local, offset, offset + nbytes))
    return pieces


def _keep_sum(sums: dict[str, int], key: str, task: Future[int | None]) -> None:
    # Runs before the region's own future is done: its checks find every sum kept.
    if task.exception() is None and (crc := task.result()) is not None:
        sums[key] = crc


def _read(
    path: Path,
    store: ts.TensorStore,
    glob: tuple[slice, ...],
    part: np.ndarray,
    into: np.ndarray,
    extend: Callable[[int, np.ndarray], int] | None,
) -> int | None:
    """Read one chunk: its file into ``into``, else with tensorstore into ``part``.

    Returns the chunk's CRC-32C when ``extend`` is given and the file was read here.
    """
    read, crc = _read_file(path, into, extend)
    if not read:
        # tensorstore then says what is wrong, as it always has.
        ts.array(part, copy=False, write=True).write(store[glob]).result()
    return crc


def _read_file(
    path: Path, into: np.ndarray, extend: Callable[[int, np.ndarray], int] | None
) -> tuple[bool, int | None]:
    """Fill ``into`` from the file at ``path``, and checksum it if ``extend`` is given.

    (False, None) if the file is missing, of the wrong size, or fails to read.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False, None
    try:
        if os.fstat(fd).st_size != into.nbytes:
            return False, None
        if extend is None:
            return pread_full(fd, into, 0) == into.nbytes, None
        crc, done = 0, 0
        for got in read_pieces(fd, into, 0):
            crc, done = extend(crc, into[done:got]), got
        return done == into.nbytes, crc if done == into.nbytes else None
    except OSError:
        return False, None
    finally:
        os.close(fd)


def read_pieces(fd: int, buf: np.ndarray, offset: int) -> Iterator[int]:
    """Fill ``buf`` from ``offset``, :data:`SUM_PIECE` at a time; yield the bytes in after each.

    The piece just read is then still in the CPU's cache. Stops early at the file's end.
    """
    got = 0
    while got < buf.nbytes:
        piece = buf[got : got + SUM_PIECE]
        n = pread_full(fd, piece, offset + got)
        got += n
        yield got
        if n < piece.nbytes:
            return


def pread_full(fd: int, buf: np.ndarray, offset: int) -> int:
    """Read ``buf``'s size from ``offset`` (fewer only at the file's end); the bytes read."""
    view = buf.data
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            break
        done += got
    return done
