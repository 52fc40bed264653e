"""Small packed leaves restored in bulk: a few reads for all of them, no per-leaf machinery.

Most leaves of a real training state are small (biases, norms, an optimizer's moments of
them, step counts) and are packed (:mod:`nbckpt.formats.packs`). A packed leaf of which
each device of this process needs exactly one whole chunk (a replicated leaf, one on a
single device, or one sharded along the save's own chunks), and which is restored
without a conversion, needs none of what a
:class:`~nbckpt.engine.restore.reads.LeafRead` keeps for the general case: regions,
chunk grids, futures and their callbacks. Through that machinery, a 4,006-leaf state
spent about 90 µs of Python per leaf. :class:`BulkReads` reads all such leaves of a
restore together instead:

- a local pack in stretches of at most :data:`STRETCH_BYTES` (a pack's chunks lie in
  the order they were written), each mapped from the page cache where the system can
  (:mod:`~nbckpt.engine.restore.mapped`), else read with a few ``preadv``, on a thread
  of its own ahead of the stretch being checked and placed; an object store's with
  the pack source's own coalesced range requests;
- each leaf's bytes are checked against their recorded checksum as a view of its
  stretch, before any value is used; a stretch that is read comes a piece at a time,
  each chunk checksummed as soon as it is in, while still in the CPU's cache;
- each leaf goes to its devices in one call as soon as its parts are in, while the
  next stretch is read (:func:`~nbckpt.engine.restore.assemble.assemble`); a CPU
  device takes its view of the stretch as it is, the pack's chunks being aligned
  (:data:`~nbckpt.formats.packs.PACK_ALIGN`), so a stretch lives as long as a leaf
  read from it.

Damage reads as it does on the general path: the leaf, the chunk, the pack and its
bytes are named, and nothing is returned.
"""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from nbckpt.engine.restore.bulklayout import BulkLayout, bulk_layout, stored_dtype
from nbckpt.engine.restore.chunkfiles import pread_full, read_pieces
from nbckpt.engine.restore.mapped import can_map, map_range
from nbckpt.engine.restore.packed import PackedSource
from nbckpt.engine.restore.reads import aligned_empty, leaf_value
from nbckpt.errors import CorruptCheckpointError
from nbckpt.formats import checksum as _checksum
from nbckpt.formats.checksum import crc32c_extend
from nbckpt.formats.packs import PackedChunk
from nbckpt.pools import LazyPool

__all__ = [
    "FIRST_STRETCH_BYTES",
    "GAP_BYTES",
    "READ_AHEAD",
    "STRETCH_BYTES",
    "BulkChunk",
    "BulkLeaf",
    "BulkReads",
]

#: A local pack is read in stretches of at most this many bytes (more for one larger
#: chunk): large enough that a stretch costs a few system calls for hundreds of leaves,
#: small enough that what a restore holds besides the leaves themselves stays small
#: (:data:`READ_AHEAD` more of them are read while one is placed).
STRETCH_BYTES = 8 << 20
#: The first stretch of a restore is at most this long, each next one twice the one
#: before, up to :data:`STRETCH_BYTES`: the leaves of the first are placed soon, while
#: the later ones are read in long requests.
FIRST_STRETCH_BYTES = 2 << 20
#: Chunks less than this far apart in a pack are read with one request (the bytes in
#: between, other processes' leaves, are read and dropped).
GAP_BYTES = 64 << 10
#: How many stretches are read ahead of the one being checked and placed.
READ_AHEAD = 2

#: The read-ahead thread (one: it alone opens a restore's packs), kept from one
#: restore to the next (see :mod:`nbckpt.pools`).
_reading = LazyPool(1, "nbckpt-pack-read")


@dataclass(slots=True)
class BulkChunk:
    """One chunk of a leaf read in bulk, and the positions of the devices that need it."""

    key: str
    where: PackedChunk
    shape: tuple[int, ...]
    #: The checksum recorded for the chunk (None: not checked).
    expected: tuple[str, int] | None
    #: Positions in the leaf's ``devices`` (none for a host value).
    positions: list[int] = field(default_factory=list)


@dataclass(slots=True)
class BulkLeaf:
    """One small packed leaf of a restore: where its chunks lie, where they go."""

    meta: dict[str, Any]
    label: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    sharding: jax.sharding.Sharding | None
    #: This process's devices that hold part of the leaf (empty: a host value).
    devices: list[Any]
    weak: bool
    chunks: list[BulkChunk]
    #: What makes the leaf's array from its parts, where one is known for its layout
    #: (:func:`~nbckpt.engine.restore.assemble.maker`).
    make: Callable[[list[Any]], jax.Array] | None = None
    #: The host value, or one array per device of ``devices``, once read.
    placed: list[Any] = field(default_factory=list)
    #: The restored leaf, made as soon as every part is placed (see :meth:`result`).
    value: Any = None
    made: bool = False
    #: The bytes read for this leaf (its chunks', summed once: a restore asks for it
    #: per leaf several times, and a state may have thousands).
    nbytes: int = field(init=False, default=0)

    #: How many of ``devices`` have no part yet.
    missing: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.missing = len(self.devices)
        self.nbytes = sum(c.where.nbytes for c in self.chunks)

    def result(self) -> Any:
        """The restored leaf (see :func:`~nbckpt.engine.restore.reads.leaf_value`)."""
        if not self.made:
            self.value = leaf_value(
                self.meta,
                self.shape,
                self.sharding,
                self.devices,
                self.placed,
                self.weak,
                self.make,
            )
            self.made = True
        return self.value


class BulkReads:
    """The small packed leaves of one restore, read together (see the module's notes).

    Parameters
    ----------
    source
        The step's packed-leaf source.
    """

    def __init__(self, source: PackedSource) -> None:
        self.source = source
        self.leaves: list[BulkLeaf] = []
        #: Each (sharding, shape, chunks, dtype, weak) met so far: its
        #: :func:`~nbckpt.engine.restore.bulklayout.bulk_layout`.
        self._layouts: dict[tuple[Any, ...], BulkLayout | None] = {}

    def add(
        self,
        meta: dict[str, Any],
        label: str,
        sharding: jax.sharding.Sharding | None,
        dtype: Any,
        recorded: dict[str, tuple[str, int]] | None,
        weak: bool,
    ) -> BulkLeaf | None:
        """Take leaf ``meta`` if it can be read in bulk, and return it; else None.

        ``sharding``, ``dtype``, ``recorded`` and ``weak`` are as for
        :class:`~nbckpt.engine.restore.reads.LeafRead`. A leaf is taken when each of
        this process's devices needs exactly one packed chunk of it (the whole leaf,
        for a host value), and it is not converted. Any other leaf, and one whose
        chunk is missing from the packs, has another size there or has no recorded
        checksum, is left to the general path, which also says what is wrong with it.
        """
        if meta["kind"] == "scalar":
            return None
        saved = stored_dtype(meta["dtype"])
        if dtype is not None and dtype != saved and np.dtype(dtype) != saved:
            return None
        # The leaves of a state share a few layouts (every layer's bias, say): what
        # depends on the layout alone is worked out, and checked, once for each.
        chunked = meta.get("chunks")
        grid = None if chunked is None else tuple(chunked)
        known = (sharding, tuple(meta.get("shape", ())), grid, saved, weak)
        try:
            layout = self._layouts[known]
        except KeyError:
            layout = self._layouts[known] = bulk_layout(label, sharding, meta, saved, weak)
        if layout is None:
            return None  # a device needs a part of a chunk, or several chunks
        shape, devices, boxes, parts, make = layout
        chunks: list[BulkChunk] = []
        name = meta["name"]
        for key, size, positions, nbytes in parts:
            where = self.source.chunk(name, key)
            if where is None or where.nbytes != nbytes:
                return None
            expected = None if recorded is None else recorded.get(key)
            if recorded is not None and expected is None:
                return None
            chunks.append(BulkChunk(key, where, size, expected, positions))
        leaf = BulkLeaf(meta, label, shape, saved, sharding, devices, weak, chunks, make)
        if not self.source.local:
            self.source.open(meta["name"], boxes)  # requested with the others
        self.leaves.append(leaf)
        return leaf

    @property
    def nbytes(self) -> int:
        """The bytes of every leaf taken."""
        return sum(leaf.nbytes for leaf in self.leaves)

    def read(self) -> None:
        """Read, check and place every leaf taken.

        Raises
        ------
        CorruptCheckpointError
            A pack is missing or cut short, or a chunk does not match its checksum.
        """
        if not self.leaves:
            return
        parts = [(leaf, chunk) for leaf in self.leaves for chunk in leaf.chunks]
        if self.source.local:
            # Closed at once on a failure too: the read-ahead thread and the packs' file
            # descriptors do not wait for the error's traceback to be let go.
            with contextlib.closing(self._local(parts)) as stretches:
                for buf, start, group, sums in stretches:
                    self._place(
                        [
                            (leaf, c, _part(buf, start, c), crc)
                            for (leaf, c), crc in zip(group, sums, strict=True)
                        ]
                    )
        else:
            self.source.fetch()
            self._place([(leaf, c, self._remote(leaf, c), None) for leaf, c in parts])
        for leaf in self.leaves:
            if leaf.devices and (
                leaf.missing or len(leaf.placed) != len(leaf.devices) or not leaf.made
            ):
                raise AssertionError(f"leaf {leaf.label}: a device got no chunk")

    def _remote(self, leaf: BulkLeaf, chunk: BulkChunk) -> np.ndarray:
        data = self.source.chunk_bytes(leaf.meta["name"], chunk.key, chunk.where)
        return np.frombuffer(data, np.uint8)

    def _local(
        self, parts: list[_Part]
    ) -> Generator[tuple[np.ndarray, int, list[_Part], list[int | None]]]:
        """Each stretch read: its bytes, first byte's offset, chunks, and their sums.

        The sums are each chunk's CRC-32C, computed as it was read (None: not computed).

        The next stretches are read on a thread of their own while the caller checks
        and places this one: a cold read then waits for the disk and the CPU at once,
        not one after the other. At most :data:`READ_AHEAD` stretches are held ahead.
        """
        files: dict[str, int] = {}
        plan = list(_stretches(parts))
        mapping = can_map(str(self.source.directory))
        pool = _reading.get()
        ahead: collections.deque[Future[tuple[np.ndarray, list[int | None]]]] = collections.deque()
        try:
            for i, (_, start, _, group) in enumerate(plan):
                while len(ahead) <= READ_AHEAD and i + len(ahead) < len(plan):
                    stretch = plan[i + len(ahead)]
                    ahead.append(pool.submit(self._stretch, files, stretch, mapping))
                buf, sums = ahead.popleft().result()
                yield buf, start, group, sums
        finally:
            for fut in ahead:
                fut.cancel()
            wait(ahead)  # no read is left running on a closed descriptor
            for fd in files.values():
                os.close(fd)

    def _stretch(
        self, files: dict[str, int], stretch: _Stretch, mapping: bool
    ) -> tuple[np.ndarray, list[int | None]]:
        """Map or read one stretch of a pack (on the read-ahead thread, which alone opens files).

        Returns its bytes and, for each of its chunks checked with CRC-32C, the CRC-32C
        of its bytes. With ``mapping`` (what :func:`~nbckpt.engine.restore.mapped.can_map`
        said of the step) the stretch is mapped where it can be, and checksummed once it
        is in. One that is read comes a piece at a time, each chunk checksummed as soon
        as it is all in, while it is still in the CPU's cache (see
        :mod:`~nbckpt.engine.restore.chunkfiles`).
        """
        file, start, stop, group = stretch
        fd = files.get(file)
        if fd is None:
            try:
                fd = files[file] = os.open(str(self.source.directory / file), os.O_RDONLY)
            except FileNotFoundError:
                raise self._damaged(*group[0], f"its pack {file} is missing") from None
        extend = crc32c_extend()
        summed = [c.expected is not None and c.expected[0] == _checksum.CRC32C for _, c in group]
        sums: list[int | None] = [None] * len(group)
        mapped = map_range(fd, start, stop) if mapping else None
        if mapped is not None:
            # The page cache's own pages (see nbckpt.engine.restore.mapped): checksummed
            # where they lie, each chunk that the file holds whole.
            buf, end = mapped
            got = end - start
            for i, (_, c) in enumerate(group):
                if extend is not None and summed[i] and c.where.offset + c.where.nbytes <= end:
                    sums[i] = extend(0, _part(buf, start, c))
        else:
            # Aligned as the pack's chunks are (``PACK_ALIGN``): a leaf's view of the
            # stretch then goes to a CPU device as it is, not copied once more.
            buf = aligned_empty((stop - start,), np.dtype(np.uint8))
            if extend is None or not any(summed):
                got = pread_full(fd, buf, start)
            else:
                got, i = 0, 0  # bytes read; the first chunk not all in yet
                for got in read_pieces(fd, buf, start):
                    # The group is in the pack's order: chunks end in order too.
                    while (
                        i < len(group) and (w := group[i][1].where).offset + w.nbytes <= start + got
                    ):
                        if summed[i]:
                            sums[i] = extend(0, _part(buf, start, group[i][1]))
                        i += 1
        for leaf, chunk in group:
            if chunk.where.offset + chunk.where.nbytes > start + got:
                raise self._damaged(leaf, chunk, f"its pack {file} is cut short")
        return buf, sums

    def _damaged(self, leaf: BulkLeaf, chunk: BulkChunk, detail: str) -> CorruptCheckpointError:
        return self.source.damaged(leaf.meta["name"], chunk.key, detail)

    def _place(self, parts: list[tuple[BulkLeaf, BulkChunk, np.ndarray, int | None]]) -> None:
        """Check each chunk's bytes, and keep each value for its devices.

        Each part comes with its CRC-32C if it was computed as it was read. The values
        stay on the host: a leaf's :meth:`BulkLeaf.result` puts all its parts on their
        devices in one call.
        """
        for leaf, chunk, raw, crc in parts:
            host = raw.view(leaf.dtype).reshape(chunk.shape)
            if chunk.expected is not None and (crc is None or crc != chunk.expected[1]):
                algorithm, expected = chunk.expected
                # Checked typed: an older step's checksum may be of the swapped bytes.
                if not _checksum.matches(host, algorithm, expected):
                    got = _checksum.checksum(host, algorithm)
                    raise CorruptCheckpointError(
                        self.source.location(leaf.meta["name"], chunk.key),
                        f"leaf {leaf.label} ({leaf.meta['name']}): chunk {chunk.key} does "
                        f"not match its checksum ({algorithm} recorded {expected:08x}, read "
                        f"{got:08x})",
                    )
            if not leaf.devices:
                leaf.placed = [host.copy()]  # its own array, not a view of the stretch
                continue
            if not leaf.placed:
                leaf.placed = [None] * len(leaf.devices)
            for i in chunk.positions:
                leaf.placed[i] = host
            leaf.missing -= len(chunk.positions)  # each device needs one chunk, once
            if not leaf.missing:
                # Made now, while the next stretch is read, not after the last one.
                leaf.result()


#: A chunk of a leaf, as the reads handle it.
_Part = tuple[BulkLeaf, BulkChunk]
#: A stretch of one pack read at once: (file, first byte, end, the chunks in it).
_Stretch = tuple[str, int, int, list[_Part]]


def _part(buf: np.ndarray, start: int, chunk: BulkChunk) -> np.ndarray:
    """The bytes of ``chunk`` in a stretch read from offset ``start``."""
    first = chunk.where.offset - start
    return buf[first : first + chunk.where.nbytes]


def _stretches(parts: list[_Part]) -> Iterator[_Stretch]:
    """Group the chunks into stretches of one pack: (file, first byte, end, chunks)."""
    ordered = sorted(parts, key=lambda p: (p[1].where.file, p[1].where.offset))
    group: list[_Part] = []
    file, start, stop = "", 0, 0
    limit = FIRST_STRETCH_BYTES
    for part in ordered:
        w = part[1].where
        end = w.offset + w.nbytes
        if (
            group
            and w.file == file
            and w.offset - stop < GAP_BYTES
            and max(stop, end) - start <= limit
        ):
            group.append(part)
            stop = max(stop, end)
            continue
        if group:
            yield file, start, stop, group
            limit = min(2 * limit, STRETCH_BYTES)
        group, file, start, stop = [part], w.file, w.offset, end
    if group:
        yield file, start, stop, group
