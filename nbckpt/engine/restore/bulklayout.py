"""Where a small packed leaf's chunks go, worked out once per layout.

A state's small leaves share a few layouts (every layer's bias has the same shape,
dtype and sharding). What a restore in bulk (:mod:`~nbckpt.engine.restore.bulk`) needs
of a leaf before reading it depends on its layout alone: which chunk each of this
process's devices needs, its size, that a jax array can hold the dtype, and the maker
of the leaf's array (:func:`~nbckpt.engine.restore.assemble.maker`). Worked out per
leaf it was most of the restore's Python for a state of thousands of leaves.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from nbckpt.engine.arrays.zarr import chunk_key
from nbckpt.engine.restore.assemble import maker
from nbckpt.engine.restore.protocols import Box, index_box
from nbckpt.engine.restore.targets import check_x64

__all__ = ["BulkLayout", "Layout", "bulk_layout", "stored_dtype"]

#: Where a leaf's chunks go: this process's devices (none for a host value), the box
#: each needs, and per chunk needed its key, shape and the positions of its devices.
Layout = tuple[list[Any], list[Box], list[tuple[str, tuple[int, ...], list[int]]]]


#: What a bulk restore needs of a layout: the leaf's shape, its :data:`Layout` (each
#: chunk with its byte count) and its array maker.
BulkLayout = tuple[
    tuple[int, ...],
    list[Any],
    list[Box],
    list[tuple[str, tuple[int, ...], list[int], int]],
    Callable[[list[Any]], jax.Array] | None,
]


@functools.lru_cache(maxsize=64)
def stored_dtype(name: str) -> np.dtype[Any]:
    """The dtype a leaf's metadata names (a state names a few, thousands of times)."""
    return np.dtype(name)


def bulk_layout(
    label: str,
    sharding: jax.sharding.Sharding | None,
    meta: dict[str, Any],
    saved: np.dtype[Any],
    weak: bool,
) -> BulkLayout | None:
    """A leaf's layout as a bulk restore takes it; None if it is not read in bulk.

    Refuses (``check_x64``, naming leaf ``label``) a dtype a jax array cannot hold.
    """
    shape = tuple(int(s) for s in meta.get("shape", ()))
    grid = tuple(max(1, int(c)) for c in meta.get("chunks", shape))
    if sharding is not None:
        check_x64(label, saved)
    layout = _layout(sharding, shape, grid)
    if layout is None:
        return None
    devices, boxes, parts = layout
    sized = [(k, size, at, math.prod(size) * saved.itemsize) for k, size, at in parts]
    make = None if sharding is None else maker(shape, saved, sharding, devices, weak)
    return shape, devices, boxes, sized, make


def _layout(
    sharding: jax.sharding.Sharding | None, shape: tuple[int, ...], grid: tuple[int, ...]
) -> Layout | None:
    """Which chunk each device of a leaf needs; None unless each needs one whole chunk.

    An empty chunk counts as none: such a leaf is left to the general path.
    """
    whole: Box = tuple((0, d) for d in shape)
    devices: list[Any] = []
    if sharding is None:
        boxes: list[Box] = [whole]
    elif sharding.is_fully_replicated:
        # The common case, without asking the sharding where each device is (a leaf
        # of several chunks then finds no chunk of its whole below).
        devices = sorted(sharding.addressable_devices, key=lambda d: d.id)
        boxes = [whole] * len(devices)
    else:
        placement = sharding.addressable_devices_indices_map(shape)
        devices = list(placement)
        boxes = [index_box(index, shape) if index else whole for index in placement.values()]
    parts: dict[str, tuple[str, tuple[int, ...], list[int]]] = {}
    for i, box in enumerate(boxes):
        key = _key(box, shape, grid)
        if key is None:
            return None
        part = parts.get(key)
        if part is None:
            size = tuple(b - a for a, b in box)
            if math.prod(size) == 0:
                return None
            part = parts[key] = (key, size, [])
        if devices:
            part[2].append(i)
    return (devices, boxes, list(parts.values())) if parts else None


def _key(box: Box, shape: tuple[int, ...], grid: Sequence[int]) -> str | None:
    """The key of the chunk whose region is exactly ``box``; None if there is none."""
    for (a, b), d, c in zip(box, shape, grid, strict=True):
        if a % c or b != min(a + c, d):
            return None
    return chunk_key(tuple(slice(a, b) for a, b in box), grid)
