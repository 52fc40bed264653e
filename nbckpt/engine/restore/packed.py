"""Reading packed leaves: the chunks a process needs, straight from the packs.

A step's small leaves live in one file per process (:mod:`nbckpt.formats.packs`).
:class:`PackedSource` serves them to a restore beside the leaves of their own arrays.
Opening a packed leaf reads nothing yet; the restore then asks it to fill each region
it reads (:meth:`PackedSource.fill`), and only the chunks those regions touch are read:
from a local pack with ``pread``, straight into the restore's buffer; from an object
store with byte-range requests, all issued at once (:meth:`PackedSource.fetch`) and
coalesced into requests of at most :data:`SPAN_BYTES`. The restore checks each chunk
against its recorded checksum and places it as it does any other read; other readers
(fsck) get the leaf as an in-memory tensorstore array.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import os
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts

from nbckpt import storage
from nbckpt.engine.arrays.tree import path_str
from nbckpt.engine.arrays.zarr import chunk_key, chunk_regions, context
from nbckpt.engine.restore.protocols import ArraySource, Box
from nbckpt.errors import CorruptCheckpointError
from nbckpt.formats.packs import PackedChunk, PackIndex, pack_file
from nbckpt.storage import Location

__all__ = ["COALESCE_GAP_BYTES", "READ_AHEAD_BYTES", "SPAN_BYTES", "PackedSource", "read_ahead"]

#: Byte ranges of one pack closer than this are read with one request ...
COALESCE_GAP_BYTES = 1 << 20
#: ... of at most this many bytes (more if one range is larger), so that several
#: requests are in flight at once: one long read keeps a disk's queue too short.
SPAN_BYTES = 1 << 20
#: What :func:`read_ahead` asks the system to read of a pack: about what the disk
#: reads while a restore plans its leaves. Measured on the 2-core test machine
#: (4 processes, the ``transformer`` state, cold, each restore paired with one without):
#: at 256 MiB, reading the whole pack (54 MiB) ahead made restores take 0.85x the time
#: (median of two runs of 10 and 12 pairs), its first 16 MiB 0.92x; at 1 GiB the whole
#: pack (224 MiB) made them slower (median 1.00 s against 0.66 s), the first 16 MiB
#: changed nothing measurable (1.02x, 6 pairs). Against the first 16 MiB, the whole
#: pack at 256 MiB gave 0.99x (12 pairs, 0.69-1.52). The machine is shared and noisy.
READ_AHEAD_BYTES = 16 << 20


class PackedSource:
    """nbckpt's own layout with packed leaves: those from the packs, the rest as usual.

    Parameters
    ----------
    directory
        The step.
    arrays
        The source of the leaves that are not packed (nbckpt's zarr arrays).
    leaves
        The metadata of every packed leaf, by name.
    index
        Where each packed chunk lies (from the step's checksums files).
    """

    def __init__(
        self,
        directory: Location,
        arrays: ArraySource,
        leaves: dict[str, dict[str, Any]],
        index: PackIndex,
    ) -> None:
        self.directory = directory
        self._arrays = arrays
        self._leaves = leaves
        #: A local step's packs are read with pread, straight into the read buffers
        #: (the kernel's readahead serves the chunks, which lie in reading order);
        #: an object store's with coalesced range requests.
        self._local = isinstance(directory, Path)
        self._files: dict[str, int] = {}
        self._index = index
        self._lock = threading.Lock()
        self._waiting: list[tuple[str, Sequence[Box] | None]] = []
        #: Per pack, the stretches requested, by their first byte.
        self._spans: dict[str, list[tuple[int, int, Future[bytes]]]] = {}

    def open(self, name: str, boxes: Sequence[Box] | None = None) -> Any:
        """Start opening leaf ``name``: a packed one is read with the others, later.

        Of a packed leaf only the chunks that ``boxes`` touch are fetched (None: all).
        """
        if name not in self._leaves:
            return self._arrays.open(name)
        if not self._local:  # a local pack is read when filled, nothing to gather
            with self._lock:
                self._waiting.append((name, boxes))
        return _Opening(self, name, boxes)

    def location(self, name: str, key: str | None = None) -> str:
        """The pack that holds the chunk (or the leaf), or the leaf's array."""
        if name not in self._leaves:
            return self._arrays.location(name, key)
        chunks = self._index.get(name, {})
        where = chunks.get(key) if key is not None else next(iter(chunks.values()), None)
        if where is None:
            return f"{self.directory} (packed leaf {name})"
        return (
            f"{self.directory / where.file} (leaf {name}, chunk {key or '0'}, bytes "
            f"{where.offset}-{where.offset + where.nbytes})"
        )

    @property
    def local(self) -> bool:
        """Whether the packs are local files (read with ``pread``), not objects."""
        return self._local

    def chunk(self, name: str, key: str) -> PackedChunk | None:
        """Where chunk ``key`` of packed leaf ``name`` lies (None: not in the packs)."""
        return self._index.get(name, {}).get(key) if name in self._leaves else None

    def note(self) -> str | None:
        """Nothing: the chunks are checked against their recorded checksums."""
        return None

    def chunk_files(self, name: str) -> Path | None:
        """A leaf that is not packed: its array's chunk files; a packed one: None."""
        return None if name in self._leaves else self._arrays.chunk_files(name)

    def _chunks(
        self, name: str, boxes: Sequence[Box] | None
    ) -> Iterable[tuple[tuple[slice, ...], PackedChunk | None]]:
        """The chunks of leaf ``name`` that ``boxes`` touch, and where each lies."""
        meta = self._leaves[name]
        whole = tuple(slice(0, d) for d in meta["shape"])
        recorded = self._index.get(name, {})
        for glob, _ in chunk_regions(whole, meta["shape"], meta["chunks"]):
            if boxes is None or any(_touches(glob, box) for box in boxes):
                yield glob, recorded.get(chunk_key(glob, meta["chunks"]))

    def fetch(self) -> None:
        """Issue the reads of every registered leaf not read yet, coalesced per pack.

        A restore calls it once every leaf is registered (the first wait would too).
        """
        if self._local:
            return
        with self._lock:
            names, self._waiting = self._waiting, []
            wanted: dict[str, list[tuple[int, int]]] = {}
            for name, boxes in names:
                for _, where in self._chunks(name, boxes):
                    if where is not None and self._span(where) is None:
                        wanted.setdefault(where.file, []).append(
                            (where.offset, where.offset + where.nbytes)
                        )
            if not wanted:
                return
            kv = ts.KvStore.open(storage.kvstore_spec(self.directory), context=context()).result()
            for file, ranges in wanted.items():
                spans = self._spans.setdefault(file, [])
                spans += [(a, b, _read(kv, file, a, b)) for a, b in _coalesce(ranges)]
                spans.sort(key=lambda s: s[0])

    def _span(self, where: PackedChunk) -> tuple[int, int, Future[bytes]] | None:
        """The stretch requested that holds the chunk, if any (found by bisection)."""
        spans = self._spans.get(where.file, [])
        end = where.offset + where.nbytes
        i = bisect.bisect_right(spans, where.offset, key=lambda s: s[0]) - 1
        if i >= 0 and spans[i][1] >= end:
            return spans[i]
        # Stretches of two fetches may overlap: look at the others too.
        return next((s for s in spans if s[0] <= where.offset and end <= s[1]), None)

    def chunk_bytes(self, name: str, key: str, where: PackedChunk) -> memoryview:
        """The bytes of one chunk of an object store's pack (requested by :meth:`fetch`)."""
        end = where.offset + where.nbytes
        span = self._span(where)
        assert span is not None, "fetch() requested every chunk assembled"
        try:
            data = span[2].result()
        except FileNotFoundError:
            raise self.damaged(name, key, f"its pack {where.file} is missing") from None
        except ValueError as e:
            if not str(e).startswith("OUT_OF_RANGE"):
                raise
            raise self.damaged(name, key, f"its pack {where.file} is cut short") from None
        piece = memoryview(data)[where.offset - span[0] : end - span[0]]
        if len(piece) != where.nbytes:
            raise self.damaged(name, key, f"its pack {where.file} is cut short")
        return piece

    def _pread(self, name: str, key: str, where: PackedChunk, out: np.ndarray) -> None:
        """Read one chunk of a local pack into ``out`` (C-contiguous, its size)."""
        fd = self._files.get(where.file)
        if fd is None:
            try:
                fd = self._files[where.file] = os.open(
                    str(self.directory / where.file), os.O_RDONLY
                )
            except FileNotFoundError:
                raise self.damaged(name, key, f"its pack {where.file} is missing") from None
        got = os.preadv(fd, [out.reshape(-1).view(np.uint8).data], where.offset)
        if got != where.nbytes:
            raise self.damaged(name, key, f"its pack {where.file} is cut short")

    def close(self) -> None:
        """Close the local packs this source opened (it opens them again if asked)."""
        files, self._files = self._files, {}
        for fd in files.values():
            os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def damaged(self, name: str, key: str | None, detail: str) -> CorruptCheckpointError:
        """The error that says chunk ``key`` of packed leaf ``name`` is damaged."""
        meta = self._leaves[name]
        where = path_str(tuple((k, v) for k, v in meta.get("path", [])))
        chunk = f"chunk {key}: " if key is not None else ""
        return CorruptCheckpointError(
            self.location(name, key), f"leaf {where} ({name}): {chunk}{detail}"
        )

    def fill(self, name: str, box: Box, out: np.ndarray) -> None:
        """Copy region ``box`` of leaf ``name`` into ``out`` (of the box's shape).

        Waits for the reads of the chunks it touches (issued by :meth:`fetch`).
        """
        self.fetch()
        meta = self._leaves[name]
        dtype = np.dtype(meta["dtype"])
        for glob, where in self._chunks(name, [box]):
            key = chunk_key(glob, meta["chunks"])
            if where is None:
                raise self.damaged(name, key, "the packs hold no such chunk")
            shape = tuple(s.stop - s.start for s in glob)
            if where.nbytes != math.prod(shape) * dtype.itemsize:
                raise self.damaged(name, key, f"its packed size {where.nbytes} is wrong")
            whole = tuple((g.start, g.stop) for g in glob) == box and out.flags.c_contiguous
            if self._local and whole:
                self._pread(name, key, where, out)  # straight into the buffer: one copy
                continue
            if self._local:
                chunk = np.empty(shape, dtype)
                self._pread(name, key, where, chunk)
            else:
                chunk = np.frombuffer(self.chunk_bytes(name, key, where), dtype).reshape(shape)
            inside = [
                (max(g.start, a), min(g.stop, b)) for g, (a, b) in zip(glob, box, strict=True)
            ]
            out[tuple(slice(s - a, t - a) for (s, t), (a, _) in zip(inside, box, strict=True))] = (
                chunk[
                    tuple(
                        slice(s - g.start, t - g.start)
                        for (s, t), g in zip(inside, glob, strict=True)
                    )
                ]
            )


class _Opening:
    """The opening of one packed leaf: a future in the way tensorstore's are used.

    ``late``: its data is read only once it is waited for. :meth:`fill` copies a
    region straight into a restore's buffer, without tensorstore; :meth:`result` is
    the leaf as an in-memory array, for other readers (the chunks its boxes touch).
    """

    late = True

    def __init__(self, source: PackedSource, name: str, boxes: Sequence[Box] | None) -> None:
        self._source = source
        self._name = name
        self._boxes = boxes

    def fill(self, box: Box, out: np.ndarray) -> None:
        """Copy region ``box`` of the leaf into ``out``."""
        self._source.fill(self._name, box, out)

    def result(self, timeout: float | None = None) -> ts.TensorStore:
        meta = self._source._leaves[self._name]
        whole: Box = tuple((0, d) for d in meta["shape"])
        out = np.empty(tuple(meta["shape"]), np.dtype(meta["dtype"]))
        for box in [whole] if self._boxes is None else self._boxes:
            region: tuple[Any, ...] = (*(slice(a, b) for a, b in box), Ellipsis)
            self.fill(box, out[region])  # with the Ellipsis, a view (a 0-d one too)
        return ts.array(out, copy=False)


def _touches(glob: tuple[slice, ...], box: Box) -> bool:
    """Whether a chunk (its region) and a box overlap (a 0-d chunk touches any box)."""
    return all(g.start < b and a < g.stop for g, (a, b) in zip(glob, box, strict=True))


def _coalesce(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge byte ranges that overlap or lie less than ``COALESCE_GAP_BYTES`` apart.

    A merged request holds at most ``SPAN_BYTES`` (or one range, where that is larger).
    """
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(ranges):
        if (
            merged
            and start - merged[-1][1] < COALESCE_GAP_BYTES
            and (stop <= merged[-1][1] or stop - merged[-1][0] <= SPAN_BYTES)
        ):
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def _read(kv: ts.KvStore, file: str, start: int, stop: int) -> Future[bytes]:
    """Start reading bytes ``start:stop`` of ``file``; a missing file fails the future."""
    out: Future[bytes] = Future()

    def done(f: ts.Future[ts.KvStore.ReadResult]) -> None:
        try:
            result = f.result()
        except Exception as e:
            out.set_exception(e)
            return
        if result.state != "value":
            out.set_exception(FileNotFoundError(file))
        else:
            out.set_result(bytes(result.value))

    kv.read(file, byte_range=slice(start, stop)).add_done_callback(done)
    return out


def read_ahead(directory: Location, process: int) -> None:
    """Have the system start reading the head of ``process``'s pack in ``directory``.

    A hint for a restore that will read that pack: the first :data:`READ_AHEAD_BYTES`
    of it go into the page cache while the restore reads the step's checksums and
    plans its leaves. It returns once the reads are issued, not done. Only a local
    pack is hinted (an object store's packs are fetched by
    :meth:`PackedSource.fetch`); one that is missing or cannot be opened is left to
    the restore's own reads, which say what is wrong with it.
    """
    if not isinstance(directory, Path) or not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(directory / pack_file(process), os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, READ_AHEAD_BYTES, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass  # only a hint
    finally:
        os.close(fd)
