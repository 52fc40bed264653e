"""What a save writes of a jax array leaf, worked out once per layout.

A training loop saves the same leaves, laid out alike, every time. What a snapshot
works out for a jax array leaf (its metadata, its chunks, which of its shards this
process writes, how many bytes each, and the chunks of each the writer will cut and
name) depends on the leaf's name and path, its
shape, dtype and sharding, the job and the save's packing options; never on its
values. Worked out anew at every save, it was most of a save's blocking time for a
state of thousands of small leaves. :func:`plan_jax_leaf` works it out the first time
and hands back the same answer while the layout stays; only the shards themselves are
taken anew at every save. Measured on the 2-core test machine (4 processes saving
``benchmarks/compare.py``'s ``many`` state, 4,006 leaves, medians of 28 saves, two
rounds each way): the snapshot's CPU per process went from 63-66 ms to 38-43 ms, and
``save`` returned after 161-178 ms instead of 224-226 ms; with the chunks' regions and
keys kept too, the save was durable after 376-431 ms instead of 474-493 ms (medians
of 10, two rounds each way).

A process that holds no replica writing a leaf (a small replicated leaf is written
whole by one replica, see :func:`plan_jax_leaf`) does not ask for its shards at all:
jax makes a ``Shard`` for each device at every ask.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import jax
import numpy as np

from nbckpt.engine.arrays.tree import Leaf, dtype_name
from nbckpt.engine.arrays.zarr import (
    DEFAULT_CHUNK_BYTES,
    Region,
    chunk_shape,
    replica_regions,
)

__all__ = [
    "SPLIT_MIN_BYTES",
    "LeafPlan",
    "PlannedWrite",
    "array_meta",
    "describe_sharding",
    "pack_if_small",
    "plan_jax_leaf",
    "replica_count",
]

#: A shard held by several devices is split among its replicas, each writing some of
#: its chunks, only if every replica then writes at least this much: smaller leaves
#: (biases, counters) are not worth more files.
SPLIT_MIN_BYTES = 1 << 20

_T = TypeVar("_T")


@dataclass(frozen=True)
class PlannedWrite:
    """One shard of a leaf this process writes (see ``ShardWrite``), its data aside."""

    device: Any
    index: tuple[slice, ...]
    nbytes: int
    part: int
    parts: int
    #: The chunks this replica writes (:func:`~nbckpt.engine.arrays.zarr.replica_regions`).
    regions: tuple[Region, ...]


@dataclass(frozen=True)
class LeafPlan:
    """A jax array leaf's metadata and this process's writes of it.

    ``meta`` is shared by every save that plans the leaf alike, and by their
    snapshots: nothing may change it.
    """

    meta: dict[str, Any]
    writes: tuple[PlannedWrite, ...]

    @functools.cached_property
    def text(self) -> str:
        """``meta`` as the step's metadata holds it (JSON), rendered once.

        Rendered when first asked, by the primary's metadata draft on its background
        thread, not by every process's blocking snapshot.
        """
        return json.dumps(self.meta)


def array_meta(leaf: Leaf) -> tuple[dict[str, Any], np.dtype[Any], tuple[int, ...]]:
    """An array leaf's metadata head (name, path, kind, shape, dtype, key impl).

    Returned with the dtype stored (native byte order: so are the stored array, its
    checksums and what a restore returns) and the shape.
    """
    value = leaf.value
    dtype = np.dtype(value.dtype)
    if not dtype.isnative:
        dtype = dtype.newbyteorder("=")
    shape = tuple(int(s) for s in value.shape)
    meta: dict[str, Any] = {
        "name": leaf.name,
        "path": [list(p) for p in leaf.path],
        "kind": leaf.kind,
        "shape": list(shape),
        "dtype": dtype_name(dtype),
    }
    if leaf.key_impl is not None:
        meta["key_impl"] = leaf.key_impl
    return meta, dtype, shape


def describe_sharding(sharding: Any) -> dict[str, Any]:
    """Return a JSON-able description of a sharding (enough to rebuild a NamedSharding).

    Equal shardings share one description, which callers must not change: a state's
    leaves have a few shardings among thousands of leaves.
    """
    try:
        return _described(sharding)
    except TypeError:  # a sharding that cannot be hashed
        return _describe_sharding(sharding)


def _describe_sharding(sharding: Any) -> dict[str, Any]:
    if isinstance(sharding, jax.sharding.NamedSharding):
        mesh = sharding.mesh
        spec = [list(p) if isinstance(p, tuple) else p for p in sharding.spec]
        return {
            "type": "named",
            "axis_names": [str(a) for a in mesh.axis_names],
            "mesh_shape": [int(s) for s in mesh.devices.shape],
            "spec": spec,
            # Orbax's record of a sharding names the devices and axis types too, so
            # that a restore without a target puts each shard where it was.
            "device_ids": np.asarray(mesh.device_ids).tolist(),
            "axis_types": [getattr(t, "name", str(t)) for t in mesh.axis_types],
        }
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return {"type": "single_device", "device": str(next(iter(sharding.device_set)))}
    return {"type": type(sharding).__name__}


_described = functools.lru_cache(maxsize=256)(_describe_sharding)


@functools.lru_cache(maxsize=4096)
def replica_count(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> int:
    """How many devices hold each shard of an array of ``shape`` under ``sharding``."""
    boxes = {
        tuple(sl.indices(d)[:2] for sl, d in zip(index, shape, strict=True))
        for index in sharding.devices_indices_map(shape).values()
    }
    return max(1, len(sharding.device_set) // max(1, len(boxes)))


def pack_if_small(
    meta: dict[str, Any], shard_shape: tuple[int, ...], itemsize: int, pack_bytes: int
) -> None:
    """Mark the leaf packed if each of its shards is at most ``pack_bytes``.

    Its shards, not the whole leaf: a file's fixed cost (create, fsync, open) is paid
    per shard, so a large matrix split into small shards is as costly per byte as a
    small vector. Every process decides alike, from the global shape and sharding.
    """
    if 0 < math.prod(shard_shape) * itemsize <= pack_bytes:
        meta["packed"] = True


#: Plans by everything they depend on (see :func:`plan_jax_leaf`).
_PLANS: dict[tuple[Any, ...], LeafPlan] = {}
#: Past this many, :data:`_PLANS` starts over (a state of thousands of leaves fits).
_PLANS_MAX = 1 << 16


def plan_jax_leaf(
    leaf: Leaf,
    job: tuple[int, int, int],
    ordinal: int,
    pack_bytes: int,
    by_shard: bool,
) -> LeafPlan:
    """The plan of jax array leaf ``leaf``: the same object while its layout stays.

    A replicated shard is written once per job: its replicas split its chunks among
    them, or, where it is too small to split (or packed), the replica picked by the
    leaf's position writes it whole, so that the small replicated leaves of a state
    are spread over the processes. An array each process holds whole (fully
    addressable while several processes run) is written by the primary only.

    ``job`` is (this process, the process count, the primary); ``ordinal`` the leaf's
    position in the tree, the same on every process; ``pack_bytes`` and ``by_shard``
    as :func:`~nbckpt.engine.save.snapshot.take_snapshot`'s ``pack_bytes`` and
    ``pack_by_shard``.
    """
    value = leaf.value
    sharding = value.sharding
    shape = tuple(value.shape)
    key: tuple[Any, ...] = (leaf.name, leaf.path, leaf.key_impl, ordinal, shape, value.dtype)
    key += (sharding, job, pack_bytes, by_shard)
    return _kept(_PLANS, _PLANS_MAX, key, lambda: _plan(leaf, job, ordinal, pack_bytes, by_shard))


def _plan(
    leaf: Leaf, job: tuple[int, int, int], ordinal: int, pack_bytes: int, by_shard: bool
) -> LeafPlan:
    process, process_count, primary = job
    value = leaf.value
    meta, dtype, shape = array_meta(leaf)
    sharding = value.sharding
    meta["sharding"] = describe_sharding(sharding)
    shard_shape = sharding.shard_shape(shape)
    pack_if_small(meta, shard_shape if by_shard else shape, dtype.itemsize, pack_bytes)
    local = process_count > 1 and value.is_fully_addressable
    # Replicas of one shard split its chunks among them, so a replicated leaf is
    # written once per job by every process that holds it, not by one alone.
    parts = 1 if local else replica_count(sharding, shape)
    shard_bytes = math.prod(shard_shape) * dtype.itemsize
    writer = 0  # the replica that writes each shard, where one writes it whole
    if parts > 1 and (meta.get("packed") or shard_bytes < parts * SPLIT_MIN_BYTES):
        writer, parts = ordinal % parts, 1
    if parts == 1:
        chunks = chunk_shape(shard_shape, dtype.itemsize)
    else:
        split = min(DEFAULT_CHUNK_BYTES, -(-shard_bytes // parts))
        chunks = chunk_shape(shard_shape, dtype.itemsize, max_bytes=split)
    meta["chunks"] = chunks
    writes: list[PlannedWrite] = []
    if not local or process == primary:
        for device, (index, replica) in _places(sharding, shape, value).items():
            if not (replica < parts if parts > 1 else replica == writer):
                continue
            part = replica if parts > 1 else 0
            regions = replica_regions(index, shape, chunks, part, parts)
            nbytes = dtype.itemsize * sum(
                math.prod(sl.stop - sl.start for sl in glob) for glob, _, _ in regions
            )
            writes.append(PlannedWrite(device, index, nbytes, part, parts, regions))
    return LeafPlan(meta, tuple(writes))


#: Per (sharding, global shape): each addressable device's shard index and replica id.
_PLACES: dict[tuple[Any, tuple[int, ...]], dict[Any, tuple[Any, int]]] = {}
#: Past this many, :data:`_PLACES` starts over (a state has a few dozen).
_PLACES_MAX = 4096


def _places(sharding: Any, shape: tuple[int, ...], value: Any) -> dict[Any, tuple[Any, int]]:
    """Each device's shard index and replica id under ``sharding``, for ``shape``.

    Both depend on the sharding, the shape and the device only, as jax computes them;
    but each ``Shard`` of ``addressable_shards`` is new, and computes them again behind
    a lock. Asked once per sharding and shape, of the first leaf's shards (``value``
    is that leaf).
    """

    def ask() -> dict[Any, tuple[Any, int]]:
        return {s.device: (s.index, s.replica_id) for s in value.addressable_shards}

    return _kept(_PLACES, _PLACES_MAX, (sharding, shape), ask)


def _kept(table: dict[Any, _T], bound: int, key: Any, make: Callable[[], _T]) -> _T:
    """``table[key]``, made by ``make`` the first time; past ``bound`` keys it starts over.

    A key that cannot be hashed (a sharding of a type that does not hash) is made
    every time.
    """
    try:
        known = table.get(key)
    except TypeError:
        return make()
    if known is None:
        known = make()
        if len(table) >= bound:
            table.clear()
        table[key] = known
    return known
