"""The reads of a restore: each process reads only the regions its own devices need.

A :class:`LeafRead` reads one leaf from an :class:`~nbckpt.engine.restore.protocols.ArraySource`:
for each device of this process that holds part of the leaf, the region that device
needs (or the whole leaf, for a host value). Where checksums were recorded at save time
(nbckpt's own steps), each region is widened to whole chunks of the saved grid, read
whole into one buffer, and every chunk in it is checked before any value is used: a
checksum covers a whole chunk. With the shardings of the save the regions are whole
chunks already and nothing more is read; a target sharding that cuts chunks reads up to
one more chunk at each edge of a region, which then is copied out of the checked
buffer. Without checksums (Orbax's steps) nothing is widened: exactly the region is
read. :func:`read_all` (:mod:`nbckpt.engine.restore.schedule`) issues every leaf's reads before it
waits for any, and checks reads in the order they complete, while the others are still
in flight.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import tensorstore as ts

from nbckpt.engine.arrays.tree import path_str
from nbckpt.engine.arrays.zarr import chunk_key, chunk_regions
from nbckpt.engine.restore import chunkfiles
from nbckpt.engine.restore.assemble import assemble
from nbckpt.engine.restore.hostshare import HostRegion, holder_rows
from nbckpt.engine.restore.mapped import can_map
from nbckpt.engine.restore.protocols import ArraySource, Box, index_box
from nbckpt.engine.restore.targets import check_x64, convert, is_weak, weaken
from nbckpt.engine.restore.together import Together
from nbckpt.errors import CorruptCheckpointError
from nbckpt.formats import checksum as _checksum
from nbckpt.formats.packs import PACK_ALIGN

__all__ = [
    "SMALL_READ_BYTES",
    "Box",
    "LeafRead",
    "aligned_empty",
    "leaf_value",
]

#: XLA's CPU client adopts a host buffer without copying it only if it is aligned to
#: this many bytes (the packs' chunks are aligned so for the same reason);
#: tensorstore's own read buffers are aligned to 16 only.
_ALIGNMENT = PACK_ALIGN

#: Reads smaller than this are checked on the thread that places them (handing a read
#: to a checking thread costs more than its CRC) and put on their devices with the
#: leaf, when it is assembled (:func:`~nbckpt.engine.restore.assemble.assemble`).
SMALL_READ_BYTES = 256 << 10


#: tensorstore status codes that mean the stored data is missing or damaged (any other
#: failure, such as PERMISSION_DENIED, is raised as it is).
_DAMAGE = ("NOT_FOUND", "FAILED_PRECONDITION", "DATA_LOSS", "OUT_OF_RANGE")
#: How tensorstore names a chunk in its errors: ``chunk {1, 0} stored at ...``.
_CHUNK_IN_ERROR = re.compile(r"chunk \{([0-9, ]*)\}")
#: ... or the file it could not read: ``Error reading local file "<dir>/1.0": ...``.
_FILE_IN_ERROR = re.compile(r'file "(?:[^"]*/)?([0-9]+(?:\.[0-9]+)*)"')


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """Return an uninitialized C-ordered array whose data is ``_ALIGNMENT``-aligned.

    A restore reads each region into such a buffer, so that ``jax.device_put`` on a
    CPU device takes it as it is instead of copying it once more.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGNMENT, np.uint8)
    offset = -raw.ctypes.data % _ALIGNMENT
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


def _chunk_box(box: Box, shape: Sequence[int], chunks: Sequence[int]) -> Box:
    """Widen ``box`` to the boundaries of the chunks it touches (clipped to the array)."""
    return tuple(
        (a // c * c, min(-(-b // c) * c, d))
        for (a, b), c, d in zip(box, (max(1, c) for c in chunks), shape, strict=True)
    )


def _call(on_done: Callable[[RegionRead], None], read: RegionRead, _future: Any) -> None:
    on_done(read)


def _start(leaf: LeafRead, read: RegionRead, store: ts.TensorStore) -> Any:
    """Start one read of ``leaf``; return its future.

    A region made of whole local chunk files, one after another, is mapped where packs
    are; one made of whole chunk files otherwise is read from them here; anything else
    goes through tensorstore.
    """
    # A slab of a host-shared region is part of a chunk: tensorstore reads it.
    folder = None if read.region is not None else leaf.source.chunk_files(leaf.name)
    if folder is not None:
        if leaf.recorded is not None:
            read.sums = {}
        args = (folder, store, read.box, leaf.shape, leaf.chunks, read.buf, read.sums)
        mapped = chunkfiles.map_region(*args) if can_map(str(leaf.source.directory)) else None
        if mapped is not None:
            # The value is the mapping (or ``buf``), before anyone is told.
            mapped.add_done_callback(functools.partial(_take_value, read))
            return mapped
        if (future := chunkfiles.read_region(*args)) is not None:
            return future
    return ts.array(read.buf, copy=False, write=True).write(store[_slices(read.box)])


def _take_value(read: RegionRead, future: Future[np.ndarray]) -> None:
    if future.exception() is None:
        read.buf = future.result()


@dataclass
class RegionRead:
    """One read: a box of one leaf (chunk-aligned where it is checked), into ``buf``."""

    leaf: LeafRead
    box: Box
    buf: np.ndarray
    future: Any = None
    #: (rank, holders): this process checks only the chunks of its slab of the read
    #: (:func:`~nbckpt.engine.restore.hostshare.slab_rows`); the other holders check the rest
    #: (None: all of them).
    share: tuple[int, int] | None = None
    #: The host-shared file this read is this process's slab of, and the whole region
    #: (``box`` is then only the slab); placed once every holder has passed the barrier.
    region: HostRegion | None = None
    whole: Box | None = None
    #: The CRC-32C of each chunk computed as it was read, by chunk key (see
    #: :func:`~nbckpt.engine.restore.chunkfiles.read_region`); None: none were.
    sums: dict[str, int] | None = None


class LeafRead:
    """The reads of one leaf: opened, issued, checked as they complete, then assembled.

    ``__init__`` starts opening the array (unless an opening is given), ``issue``
    issues the reads, ``check`` checks one finished read, ``place`` puts it on the
    devices that need it, ``adopt`` places the regions read together with other
    processes once they all passed the barrier, and ``result`` assembles the leaf. The
    steps are separate so that a restore opens every leaf, then issues every read,
    before it waits for any: tensorstore overlaps them all. ``release`` frees what the
    leaf holds in shared memory; call it whatever happened.

    Parameters
    ----------
    source
        Where the leaf's array is.
    meta
        The leaf: ``name``, ``path`` (path entries), ``kind`` (``"jax"``, ``"numpy"``
        or ``"scalar"``: a value kept in the metadata), ``shape``, ``dtype``,
        ``chunks``; ``value`` and ``py_type`` for a scalar; ``python_scalar: True``
        for a 0-d array restored as a Python number when it goes to the host;
        ``key_impl`` for a typed PRNG key array stored as its key data.
    sharding
        Where the leaf goes; None restores it as a host value.
    dtype
        The dtype to convert it to, or None to keep the saved one.

        A leaf placed on devices whose dtype jax would truncate (64 bits without
        ``jax_enable_x64``) is refused with ValueError (:func:`check_x64`).
    recorded
        The checksum recorded for each chunk (key -> (algorithm, value)); None when
        there are none to check, and then reads are not widened to whole chunks.
    opening
        The array's opening, if already started.
    shares
        For a region other processes read too (keyed by the region a device needs):
        this process's rank among them and their number. It then checks only its
        share of the region's chunks (:func:`nbckpt.engine.restore.exchange.verify_shares`);
        the restore must make every process agree that all shares passed.
    scratch
        Given (a tag unique to this restore and the same on every process), a region
        in ``shares`` is read together with the other holders into one file in the
        host's shared memory (:mod:`nbckpt.engine.restore.hostshare`): this process reads only
        its slab, and :meth:`adopt`, after the barrier, maps the whole region.
    weak, exact
        The target leaf is weakly typed, and so is the jax array restored; refuse values
        that ``dtype`` does not hold exactly (:func:`~nbckpt.engine.restore.targets.convert`).
    """

    def __init__(
        self,
        source: ArraySource,
        meta: dict[str, Any],
        sharding: jax.sharding.Sharding | None,
        dtype: Any,
        recorded: dict[str, tuple[str, int]] | None,
        opening: ts.Future[ts.TensorStore] | None = None,
        shares: dict[Box, tuple[int, int]] | None = None,
        scratch: str | None = None,
        weak: bool = False,
        exact: bool = False,
    ) -> None:
        self.source = source
        self.meta = meta
        self.name: str = meta["name"]
        self.where = path_str(tuple((k, v) for k, v in meta.get("path", [])))
        self.sharding = sharding
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.weak, self.exact = weak, exact
        if sharding is not None and meta["kind"] != "scalar":
            check_x64(self.where, self.dtype or np.dtype(meta["dtype"]))
        self.recorded = recorded
        self.shape = tuple(int(s) for s in meta.get("shape", ()))
        self.chunks = [int(c) for c in meta.get("chunks", [1] * len(self.shape))]
        self.nbytes = 0
        self.reads: dict[Box, RegionRead] = {}
        #: (device, the box it needs) per addressable device; None means host values.
        self.devices: list[tuple[Any, Box]] = []
        self.placed: dict[int, Any] = {}
        self.shares = shares or {}
        #: The regions read together with other processes, where ``scratch`` is given.
        self.together = None
        if scratch is not None:
            self.together = Together(f"{scratch}|{self.name}", (self.chunks or [1])[0])
        self._opening: Any = None
        if meta["kind"] != "scalar":
            whole: Box = tuple((0, d) for d in self.shape)
            if sharding is None:
                self.devices.append((None, whole))
            else:
                for device, index in sharding.addressable_devices_indices_map(self.shape).items():
                    self.devices.append((device, index_box(index, self.shape) if index else whole))
            boxes = [self._box(want) for _, want in self.devices]
            self._opening = opening if opening is not None else source.open(self.name, boxes)
        #: Whether a small read stays on the host until :meth:`result` assembles the
        #: leaf (set by ``read_all``): one call then puts all its parts on their devices.
        self.defer_small = False

    @property
    def late(self) -> bool:
        """Whether its data is fetched only once it is waited for (a packed leaf)."""
        return bool(getattr(self._opening, "late", False))

    def _damaged(self, detail: str, key: str | None = None) -> CorruptCheckpointError:
        note = self.source.note()
        return CorruptCheckpointError(
            self.source.location(self.name, key),
            f"leaf {self.where} ({self.name}): {detail}" + (f"; {note}" if note else ""),
        )

    def _box(self, want: Box) -> Box:
        """The box read for a device that needs ``want``: whole chunks where they are checked."""
        return want if self.recorded is None else _chunk_box(want, self.shape, self.chunks)

    def store(self) -> ts.TensorStore:
        """Wait for the array's opening; raise CorruptCheckpointError if it is missing."""
        try:
            store: ts.TensorStore = self._opening.result()
        except ValueError as e:
            if str(e).startswith("NOT_FOUND"):
                raise self._damaged(f"its array is missing ({e})") from None
            raise
        return store

    def issue(self, on_done: Callable[[RegionRead], None]) -> int:
        """Issue the reads of every region this process needs; return their number.

        ``on_done(read)`` is called, on a tensorstore thread, as each read completes
        (for a packed leaf, at once on this thread: its reads are done by then).
        """
        if self._opening is None:
            return 0
        dtype = np.dtype(self.meta["dtype"])
        # A packed leaf's regions are copied straight into their buffers; its shape and
        # dtype are the metadata's (it has no array metadata of its own).
        fill = getattr(self._opening, "fill", None)
        store = None if fill is not None else self.store()
        if store is not None and (
            tuple(store.shape) != self.shape or store.dtype.numpy_dtype != dtype
        ):
            raise self._damaged(
                f"the array on disk is {list(store.shape)} {store.dtype.numpy_dtype}, the "
                f"metadata says {list(self.shape)} {dtype}"
            )
        for _, want in self.devices:
            box = self._box(want)
            if box in self.reads:
                continue
            share = self.shares.get(want)
            slab = None
            if share is not None and self.together is not None:
                slab = self.together.slab(box, dtype, share)
            if slab is not None:
                region, part, buf = slab
                read = RegionRead(self, part, buf, region=region, whole=box)
            else:
                buf = aligned_empty(tuple(b - a for a, b in box), dtype)
                read = RegionRead(self, box, buf, share=share)
            if fill is not None:
                fill(read.box, read.buf)
                read.future = Future()
                read.future.set_result(None)
            elif store is not None and (read.region is None or read.buf.size):
                read.future = _start(self, read, store)
            else:  # an empty slab: the other holders read the whole region
                read.future = Future()
                read.future.set_result(None)
            read.future.add_done_callback(functools.partial(_call, on_done, read))
            self.reads[box] = read
            self.nbytes += read.buf.nbytes
        return len(self.reads)

    def check(self, read: RegionRead) -> None:
        """Raise if a finished read failed, or if a chunk in it fails its checksum."""
        try:
            read.future.result()
        except ValueError as e:
            raise _read_failed(self, e, read.box) from None
        _verify(self, read)

    def place(self, read: RegionRead) -> None:
        """Put what each device needs of a checked read on that device.

        A slab of a host-shared region is only recorded as done: :meth:`adopt` places
        the region once every holder has passed the barrier.
        """
        if read.region is not None and self.together is not None:
            read.region.mark()
            self.together.pending.append(read)
            return
        self._place(read.box, read.buf)

    def adopt(self) -> None:
        """Place the regions read together with other processes (after the barrier)."""
        if self.together is not None:
            self.together.adopt(self._reread, self._place)

    def _reread(self, region: HostRegion, whole: Box) -> np.ndarray:
        host = aligned_empty(region.shape, region.dtype)
        try:
            dst = ts.array(host, copy=False, write=True)
            dst.write(self.store()[_slices(whole)]).result()
        except ValueError as e:
            raise _read_failed(self, e, whole) from None
        self.nbytes += host.nbytes
        return host

    def release(self) -> None:
        """Unlink and drop every host-shared file of this leaf (idempotent)."""
        for read in self.reads.values():
            if read.region is not None:
                read.region.close()

    def _place(self, box: Box, buf: np.ndarray) -> None:
        for i, (device, want) in enumerate(self.devices):
            if self._box(want) != box:
                continue
            host = buf
            if want != box:  # the target cuts chunks: copy its part out
                part = host[
                    tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(want, box, strict=True))
                ]
                host = aligned_empty(part.shape, part.dtype)
                host[...] = part
            if self.dtype is not None and host.dtype != self.dtype:
                host = convert(self.where, host, self.dtype, self.exact)
            if device is None or (self.defer_small and host.nbytes < SMALL_READ_BYTES):
                self.placed[i] = host
            else:
                self.placed[i] = jax.device_put(host, device)

    def result(self) -> Any:
        """Return the restored leaf: a Python number, a host array or a jax array."""
        if self.meta["kind"] == "scalar":
            return _number(self.meta)
        placed = [self.placed[i] for i in range(len(self.devices))]
        devices = [device for device, _ in self.devices]
        return leaf_value(self.meta, self.shape, self.sharding, devices, placed, self.weak)


def leaf_value(
    meta: dict[str, Any],
    shape: tuple[int, ...],
    sharding: jax.sharding.Sharding | None,
    devices: list[Any],
    placed: list[Any],
    weak: bool,
    make: Callable[[list[Any]], jax.Array] | None = None,
) -> Any:
    """The restored leaf from its parts: one host array, or one part per local device.

    A host value is returned as it is (a Python number if it was saved as one); the
    parts on ``devices`` (host arrays, or arrays already on those devices) are
    assembled under ``sharding``, by ``make`` if given (an
    :func:`~nbckpt.engine.restore.assemble.maker` of the leaf's layout, the parts being
    host arrays of its shards). A typed PRNG key comes back wrapped.
    """
    if sharding is None:
        host = placed[0]
        value = host.item() if meta.get("python_scalar") else host
    else:
        if make is not None:
            value = make(placed)
        else:
            value = assemble(shape, placed[0].dtype, sharding, devices, placed, weak)
        if weak and not is_weak(value):
            value = weaken(value)
    if meta.get("key_impl"):
        # A typed PRNG key, stored as its key data.
        return jax.random.wrap_key_data(value, impl=meta["key_impl"])
    return value


def _verify(leaf: LeafRead, read: RegionRead) -> None:
    """Check every chunk of ``read`` against its recorded checksum."""
    recorded = leaf.recorded
    if recorded is None:  # nothing was recorded to check against
        return
    # A shared region has a first dimension (only leaves of 2 MiB or more are
    # shared); a 0-d leaf is checked whole.
    mine, first, step = None, 0, 1
    if read.share is not None and read.share[1] > 1:
        rank, holders = read.share
        first, step = read.box[0][0], max(1, leaf.chunks[0])
        mine = holder_rows(read.box[0], step, holders, rank)
    for glob, local in chunk_regions(_slices(read.box), leaf.shape, leaf.chunks):
        if mine is not None and (glob[0].start - first) // step not in mine:
            continue  # another process that read this region checks that chunk
        key = chunk_key(glob, leaf.chunks)
        rec = recorded.get(key)
        if rec is None:
            raise leaf._damaged(f"chunk {key} has no recorded checksum", key)
        algorithm, expected = rec
        if algorithm == _checksum.CRC32C and read.sums and read.sums.get(key) == expected:
            continue  # checksummed as it was read
        # A zero-copy view when the chunk spans the buffer's trailing dimensions
        # (always, with the save's own sharding); a copy otherwise.
        chunk = read.buf[local]
        if not _checksum.matches(chunk, algorithm, expected):
            got = _checksum.checksum(chunk, algorithm)
            raise leaf._damaged(
                f"chunk {key} does not match its checksum ({algorithm} recorded "
                f"{expected:08x}, read {got:08x})",
                key,
            )


def _number(meta: dict[str, Any]) -> Any:
    """A leaf saved as a Python number, as the number it was.

    Whatever the target's dtype: nothing is converted, so a weak target's exactness
    (``exact``) has nothing to check.
    """
    value = meta["value"]
    py_type = meta.get("py_type")
    if py_type == "complex":
        return complex(value[0], value[1])
    return {"bool": bool, "int": int, "float": float}.get(py_type or "", lambda v: v)(value)


def _read_failed(leaf: LeafRead, e: Exception, box: Box) -> Exception:
    """Turn a tensorstore error that means damage to ``leaf`` into CorruptCheckpointError."""
    text = str(e)
    if not text.startswith(_DAMAGE):
        return e
    m = _CHUNK_IN_ERROR.search(text)
    key: str | None = None
    if m is not None:
        key = ".".join(p.strip() for p in m.group(1).split(",")) if m.group(1) else "0"
        what = f"chunk {key}"
    elif (f := _FILE_IN_ERROR.search(text)) is not None:
        key = f.group(1)
        what = f"chunk {key}"
    else:
        regions = chunk_regions(_slices(box), leaf.shape, leaf.chunks)
        keys = [chunk_key(g, leaf.chunks) for g, _ in itertools.islice(regions, 5)]
        what = "one of chunks " + ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
    if "is missing" in text:
        return leaf._damaged(f"{what} is missing (its file was deleted?)", key)
    return leaf._damaged(f"{what} cannot be read ({text})", key)


def _slices(box: Box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)
