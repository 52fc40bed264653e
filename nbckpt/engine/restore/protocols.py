"""What the parts of a restore agree on: a region of a leaf, and a source of arrays.

Its own module so that the sources (:mod:`~nbckpt.engine.restore.sources`), the packs
(:mod:`~nbckpt.engine.restore.packed`) and the reads
(:mod:`~nbckpt.engine.restore.reads`) use one definition without importing each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import tensorstore as ts

from nbckpt.storage import Location

__all__ = ["ArraySource", "Box", "index_box"]

#: Where a region of a leaf lies: ``(start, stop)`` per dimension.
Box = tuple[tuple[int, int], ...]


def index_box(index: tuple[slice, ...], shape: tuple[int, ...]) -> Box:
    """The :data:`Box` of a shard's index (slices, as a sharding gives them) in ``shape``."""
    return tuple(sl.indices(d)[:2] for sl, d in zip(index, shape, strict=True))


class ArraySource(Protocol):
    """Opens the arrays of one step (or Orbax item) by leaf name."""

    @property
    def directory(self) -> Location:
        """The directory the arrays are in."""
        ...

    def open(self, name: str, boxes: Sequence[Box] | None = None) -> ts.Future[ts.TensorStore]:
        """Start opening the array of leaf ``name`` for reading.

        ``boxes``, if given, are the regions this process will read (``(start, stop)``
        per dimension): a source may fetch only the data they touch.
        """
        ...

    def location(self, name: str, key: str | None = None) -> str:
        """Where leaf ``name`` (or its chunk ``key``) is, for an error message."""
        ...

    def note(self) -> str | None:
        """What an error about this source's data should add, if anything."""
        ...

    def chunk_files(self, name: str) -> Path | None:
        """The local directory of leaf ``name``'s chunk files, each a chunk's raw bytes.

        None where chunks are not plain local files of their own (an object store,
        Orbax's layouts, a packed leaf): they are then read with tensorstore.
        """
        ...
