"""Arrays on disk: plain zarr (v2) arrays written and read with tensorstore.

Each leaf is one zarr array any zarr reader can open. Chunks never straddle two shards,
so processes that write different shards never touch the same file.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorstore as ts

from nbckpt import storage
from nbckpt.storage import Location
from nbckpt.storage.backend import RETRY_CONTEXT

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "ZARRAY",
    "Region",
    "chunk_key",
    "chunk_regions",
    "chunk_shape",
    "context",
    "create_array",
    "create_array_async",
    "dtype_supported",
    "fresh_context",
    "open_array",
    "open_array_async",
    "open_for_write_async",
    "replica_regions",
]

#: Upper bound on one chunk: a shard larger than this is split into several chunks,
#: so that progress is reported per chunk and a restore that needs part of a shard
#: reads less than the whole shard.
DEFAULT_CHUNK_BYTES = 64 * 1024 * 1024

#: The name of a zarr v2 array's metadata file.
ZARRAY = ".zarray"

_context: ts.Context | None = None


def context() -> ts.Context:
    """Return this process's tensorstore context.

    ``file_io_sync`` is on (tensorstore's default, spelled out because durability
    depends on it): every file is fsync'd before its write commits. On an object store a
    write commits when its PUT is acknowledged; a failed or throttled request is retried
    with backoff a bounded number of times (:data:`nbckpt.storage.backend.RETRIES`).
    """
    global _context
    if _context is None:
        _context = _make_context(sync=True)
    return _context


def fresh_context() -> ts.Context:
    """Return a new tensorstore context configured as :func:`context`, sharing nothing.

    An OCDBT database's driver (its manifest, its configuration and uuid) is kept per
    context: a reader that shares one with an earlier read of the same directory sees
    that read's database, not one written there since (a step re-saved with
    ``force=True``). Each restore of an OCDBT step opens its arrays in a fresh one.
    """
    return _make_context(sync=True)


def _make_context(*, sync: bool) -> ts.Context:
    return ts.Context(
        {
            "file_io_sync": sync,
            "cache_pool": {"total_bytes_limit": 0},
            **RETRY_CONTEXT,
        }
    )


def chunk_shape(
    shard_shape: Sequence[int], itemsize: int, max_bytes: int = DEFAULT_CHUNK_BYTES
) -> list[int]:
    """Return a chunk shape that tiles ``shard_shape`` exactly, at most ``max_bytes``.

    Dimensions are split from the first one on, each by the smallest divisor that is
    enough (or by its full length, then the next dimension), so chunks stay large and
    contiguous. A shard that cannot be split finely enough keeps larger chunks.
    """
    chunks = [max(1, int(d)) for d in shard_shape]
    for axis in range(len(chunks)):
        size = math.prod(chunks) * itemsize
        if size <= max_bytes:
            break
        length = chunks[axis]
        need = math.ceil(size / max_bytes)
        divisor = next((d for d in range(need, length + 1) if length % d == 0), length)
        chunks[axis] = length // divisor
    return chunks


def chunk_key(region: tuple[slice, ...], chunks: Sequence[int]) -> str:
    """Return the zarr key of the chunk at ``region`` (``"0"`` for a 0-d array)."""
    if not region:
        return "0"
    return ".".join(str(sl.start // max(1, c)) for sl, c in zip(region, chunks, strict=True))


def chunk_regions(
    index: tuple[slice, ...], shape: Sequence[int], chunks: Sequence[int]
) -> Iterator[tuple[tuple[slice, ...], tuple[slice, ...]]]:
    """Split one shard into chunk-sized regions.

    Parameters
    ----------
    index
        The shard's position in the global array.
    shape
        The global array's shape.
    chunks
        The array's chunk shape; shard boundaries fall on chunk boundaries.

    Yields
    ------
    tuple
        ``(global_region, local_region)``: where the chunk sits in the array, and in
        the shard's own buffer.
    """
    bounds = [sl.indices(dim)[:2] for sl, dim in zip(index, shape, strict=True)]
    ranges = [
        range(start, stop, max(1, c)) for (start, stop), c in zip(bounds, chunks, strict=True)
    ]
    for corner in itertools.product(*ranges):
        glob = tuple(
            slice(c, min(c + max(1, ch), stop))
            for c, ch, (_, stop) in zip(corner, chunks, bounds, strict=True)
        )
        local = tuple(
            slice(g.start - start, g.stop - start)
            for g, (start, _) in zip(glob, bounds, strict=True)
        )
        yield glob, local


#: A chunk a replica writes: where it sits in the array, in the shard, and its key.
Region = tuple[tuple[slice, ...], tuple[slice, ...], str]


def replica_regions(
    index: tuple[slice, ...], shape: Sequence[int], chunks: Sequence[int], part: int, parts: int
) -> tuple[Region, ...]:
    """The chunks of the shard at ``index`` that its replica ``part`` of ``parts`` writes.

    Those whose position in :func:`chunk_regions` order is ``part`` modulo ``parts``,
    each as ``(global_region, local_region, key)``.
    """
    return tuple(
        (glob, local, chunk_key(glob, chunks))
        for i, (glob, local) in enumerate(chunk_regions(index, shape, chunks))
        if i % parts == part
    )


def _spec(path: Location) -> dict[str, Any]:
    return {"driver": "zarr", "kvstore": storage.kvstore_spec(path)}


def _array_spec(
    path: Location, shape: Sequence[int], dtype: np.dtype[Any], chunks: Sequence[int]
) -> dict[str, Any]:
    """The spec of nbckpt's zarr array at ``path``, with its metadata in full."""
    spec = _spec(path)
    spec["metadata"] = {
        "shape": [int(s) for s in shape],
        "chunks": [int(c) for c in chunks] if len(shape) else [],
        "compressor": None,
    }
    spec["store_data_equal_to_fill_value"] = True
    spec["dtype"] = np.dtype(dtype).name
    return spec


def create_array_async(
    path: Location,
    shape: Sequence[int],
    dtype: np.dtype[Any],
    chunks: Sequence[int],
    *,
    sync: bool = True,
) -> ts.Future[ts.TensorStore]:
    """Start creating an empty zarr array (metadata only) at ``path``.

    No compression: the write then runs at the disk's speed, and a reader can fetch a
    region straight from the chunk files. Chunks equal to the fill value are stored
    anyway, so every chunk of a complete checkpoint exists on disk. The ``.zarray``
    file is fsync'd before the future completes, unless ``sync`` is False: then the
    caller makes it durable (a save does, with the rest of the step, in one batch).
    """
    spec = _array_spec(path, shape, dtype, chunks)
    return ts.open(spec, create=True, context=context() if sync else _unsynced_context())


def open_for_write_async(
    path: Location, shape: Sequence[int], dtype: np.dtype[Any], chunks: Sequence[int]
) -> ts.Future[ts.TensorStore]:
    """Start opening the array at ``path`` for writing chunks, without its ``.zarray``.

    The metadata is taken from the arguments (tensorstore's ``assume_metadata``): the
    ``.zarray`` need not exist yet, so processes write their chunks while the primary
    creates it, and no process reads one file per leaf before it writes.
    """
    spec = _array_spec(path, shape, dtype, chunks)
    return ts.open(spec, open=True, assume_metadata=True, context=context())


_unsynced: ts.Context | None = None


def _unsynced_context() -> ts.Context:
    """A context like :func:`context` whose file writes are not fsync'd."""
    global _unsynced
    if _unsynced is None:
        _unsynced = _make_context(sync=False)
    return _unsynced


def create_array(
    path: Location, shape: Sequence[int], dtype: np.dtype[Any], chunks: Sequence[int]
) -> None:
    """Create an empty zarr array (metadata only) at ``path`` (see ``create_array_async``)."""
    create_array_async(path, shape, dtype, chunks).result()


def open_array_async(path: Location, *, fill_missing: bool = True) -> ts.Future[ts.TensorStore]:
    """Start opening an existing zarr array; the future's result is the store.

    A restore starts every leaf's open at once: each one reads a ``.zarray`` file,
    which after a cache drop is a disk round trip, and done one after the other
    they add up.

    Parameters
    ----------
    path
        The array's directory.
    fill_missing
        What a read of a chunk whose file is absent gives: the fill value (zarr's
        default), or, when False, a ``NOT_FOUND`` error. Every chunk of a complete
        nbckpt step exists on disk (they are stored even when equal to the fill
        value, and have been since the first format), so readers pass False: a
        deleted chunk file is damage, not zeros.
    """
    spec = _spec(path)
    spec["store_data_equal_to_fill_value"] = True
    if not fill_missing:
        spec["fill_missing_data_reads"] = False
    return ts.open(spec, open=True, context=context())


def open_array(path: Location, *, fill_missing: bool = True) -> ts.TensorStore:
    """Open an existing zarr array for reading or writing (see ``open_array_async``)."""
    store: ts.TensorStore = open_array_async(path, fill_missing=fill_missing).result()
    return store


@functools.cache
def dtype_supported(dtype: np.dtype[Any]) -> bool:
    """Tell whether a leaf of ``dtype`` can be stored as an nbckpt zarr array.

    Asked of tensorstore itself, by creating a one-element array of that dtype in
    memory, once per dtype: its list grows with each release (``int4``, ``float8_*``).
    """
    try:
        spec = {
            "driver": "zarr",
            "kvstore": {"driver": "memory"},
            "metadata": {"shape": [1], "chunks": [1], "compressor": None},
        }
        ts.open(spec, create=True, dtype=ts.dtype(np.dtype(dtype).name)).result()
    except (ValueError, TypeError):
        return False
    return True
