"""Functions that ``benchmarks/s3.py`` runs in the workers, against an S3 server.

Each runs inside one JAX process of a :class:`nbckpt.procgroup.ProcessGroup`, on every
process at once, on the state :func:`_workers.build` made. Each takes the S3
environment (endpoint, region, keys) first and puts it in ``os.environ`` before naming
an ``s3://`` root: nbckpt reads it when a path is made, and the process group may
outlive any one server.

The raw figures are tensorstore's ``KvStore.write``/``read`` of the same bytes, cut
into the same objects as nbckpt's chunks (one per shard chunk of at most
:data:`nbckpt.engine.arrays.zarr.DEFAULT_CHUNK_BYTES`), with every request in flight at
once, through nbckpt's own tensorstore context (same S3 retries and concurrency
limits, no cache): what this server can take.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import _workers

_SYNC_OP = "bench-s3"


def _env(env: dict[str, str]) -> None:
    os.environ.update(env)


def nb_save(env: dict[str, str], root: str, step: int) -> dict[str, float]:
    """nbckpt's durable save of the state to ``root`` (``s3://…``); see ``_workers.nb_save``."""
    _env(env)
    return _workers.nb_save(root, step)


def nb_restore(env: dict[str, str], root: str, step: int) -> float:
    """A fresh checkpointer's restore into the same shardings; seconds (checked)."""
    _env(env)
    return _workers.nb_restore(root, step)


def _chunks(name: str, shard: Any, max_bytes: int) -> list[tuple[str, tuple[slice, ...]]]:
    """``(key, local slice)`` of each chunk of one shard, named by its global grid index."""
    from nbckpt.engine.arrays.zarr import chunk_shape

    data = shard.data
    shape = [int(d) for d in data.shape]
    chunks = chunk_shape(shape, data.dtype.itemsize, max_bytes)
    starts = [idx.indices(10**18)[0] if isinstance(idx, slice) else 0 for idx in shard.index]
    out = []
    for grid in itertools.product(*(range(d // c) for d, c in zip(shape, chunks, strict=True))):
        local = tuple(slice(g * c, (g + 1) * c) for g, c in zip(grid, chunks, strict=True))
        glob = [(s + g * c) // c for s, g, c in zip(starts, grid, chunks, strict=True)]
        out.append((f"{name}/{'.'.join(map(str, glob)) or '0'}", local))
    return out


def _objects(max_bytes: int, owned_only: bool) -> list[tuple[str, Any, tuple[slice, ...]]]:
    """``(key, shard, local slice)`` of every chunk this process writes (or reads)."""
    out = []
    for name, array in _workers._state["tree"].items():
        for shard in array.addressable_shards:
            if owned_only and shard.replica_id != 0:
                continue
            out += [(key, shard, local) for key, local in _chunks(name, shard, max_bytes)]
    return out


def _kvstore(prefix: str) -> Any:
    import tensorstore as ts

    from nbckpt import storage
    from nbckpt.engine.arrays.zarr import context

    spec = storage.kvstore_spec(storage.location(prefix))
    return ts.KvStore.open(spec, context=context()).result()


def raw_write(env: dict[str, str], prefix: str, tag: str) -> dict[str, float]:
    """PUT every owned shard chunk as one object under ``prefix``, all in flight at once.

    The bytes are made (``tobytes``, tensorstore takes ``bytes`` only) before the
    start barrier; ``write`` is this process's time from that barrier to its last
    acknowledged PUT. The parent takes the slowest process.
    """
    import numpy as np

    from nbckpt.engine.arrays.zarr import DEFAULT_CHUNK_BYTES

    _env(env)
    sync = _workers._sync()
    kv = _kvstore(prefix)
    payload = [
        (key, np.ascontiguousarray(np.asarray(shard.data)[local]).tobytes())
        for key, shard, local in _objects(DEFAULT_CHUNK_BYTES, owned_only=True)
    ]
    sync.barrier(_SYNC_OP, f"{tag}-w0", timeout_s=120)
    t0 = time.perf_counter()
    futures = [kv.write(key, data) for key, data in payload]
    for f in futures:
        f.result()
    elapsed = time.perf_counter() - t0
    sync.barrier(_SYNC_OP, f"{tag}-w1", timeout_s=600)
    return {
        "write": elapsed,
        "objects": float(len(payload)),
        "bytes": float(sum(len(d) for _, d in payload)),
    }


def raw_read(env: dict[str, str], prefix: str, tag: str) -> float:
    """GET every chunk of this process's shards back, all in flight at once; seconds."""
    import numpy as np

    from nbckpt.engine.arrays.zarr import DEFAULT_CHUNK_BYTES

    _env(env)
    sync = _workers._sync()
    kv = _kvstore(prefix)
    objects = _objects(DEFAULT_CHUNK_BYTES, owned_only=False)
    sync.barrier(_SYNC_OP, f"{tag}-r0", timeout_s=120)
    t0 = time.perf_counter()
    futures = [kv.read(key) for key, _, _ in objects]
    results = [f.result() for f in futures]
    elapsed = time.perf_counter() - t0
    sync.barrier(_SYNC_OP, f"{tag}-r1", timeout_s=600)
    # A wrong read is no figure: every object there, and the first one's bytes right.
    for (key, shard, local), r in zip(objects, results, strict=True):
        want = np.asarray(shard.data)[local]
        if r.state != "value" or len(r.value) != want.nbytes:
            raise AssertionError(f"raw read of {prefix}/{key}: {r.state}, {len(r.value)} bytes")
    key, shard, local = objects[0]
    if bytes(results[0].value) != np.ascontiguousarray(np.asarray(shard.data)[local]).tobytes():
        raise AssertionError(f"raw read of {prefix}/{key} differs from what was written")
    return elapsed
