"""Where a restore's arrays come from: nbckpt's plain zarr arrays, or Orbax's layout.

A restore reads every leaf through an :class:`ArraySource`, which opens the leaf's
array by name and says where a damaged chunk lies. The restore itself (which regions,
which checks, which devices) does not depend on how the arrays are stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tensorstore as ts

from nbckpt.engine.arrays.orbax_arrays import open_orbax_array_async
from nbckpt.engine.arrays.zarr import fresh_context, open_array_async
from nbckpt.engine.restore.packed import PackedSource
from nbckpt.engine.restore.protocols import ArraySource, Box
from nbckpt.formats.checksum import read_checksums
from nbckpt.formats.orbax_write import ORBAX_ARRAYS
from nbckpt.formats.packs import PackIndex, is_packed
from nbckpt.storage import Location

__all__ = ["ArraySource", "OrbaxSource", "Zarr2Source", "source_for"]

#: What an error about an Orbax step adds: the damage it may not see.
ORBAX_UNVERIFIED = (
    "Orbax records no checksums of the data, so damage that still decodes cannot be "
    "detected; only missing or undecodable chunks are"
)


@dataclass(frozen=True)
class Zarr2Source:
    """nbckpt's default layout: one plain zarr v2 array directory per leaf.

    Every chunk of a complete step was stored, so a missing chunk file fails the read
    (``fill_missing=False``) instead of reading as zeros.
    """

    directory: Location

    def open(self, name: str, boxes: Sequence[Box] | None = None) -> ts.Future[ts.TensorStore]:
        """Open ``<directory>/<name>`` (its reads fetch only what they touch)."""
        return open_array_async(self.directory / name, fill_missing=False)

    def location(self, name: str, key: str | None = None) -> str:
        """The array's directory, or the chunk's file in it."""
        where = self.directory / name
        return str(where / key if key else where)

    def note(self) -> str | None:
        """Nothing: nbckpt's chunks are checked against their recorded checksums."""
        return None

    def chunk_files(self, name: str) -> Path | None:
        """The array's directory, on a local disk (its chunks are stored raw)."""
        return self.directory / name if isinstance(self.directory, Path) else None


@dataclass(frozen=True)
class OrbaxSource:
    """Arrays in Orbax's layout: an OCDBT database, or one array directory per leaf.

    Attributes
    ----------
    directory
        The pytree item's directory (or an nbckpt step's).
    ocdbt, zarr3
        How its arrays are stored.
    fill_missing
        Read a chunk that is not stored as the fill value (only where the save did not
        promise to store every chunk); else a missing chunk fails the read.
    orbax
        The data was written by Orbax (its errors then say what cannot be checked).
    context
        The tensorstore context its arrays are opened in: a fresh one per source, so
        that a source never sees an OCDBT database as an earlier one cached it (a step
        re-saved with ``force=True`` in the same process has a new database, with a
        new uuid, under the same directory).
    """

    directory: Location
    ocdbt: bool
    zarr3: bool
    fill_missing: bool = False
    orbax: bool = True
    context: ts.Context = field(default_factory=fresh_context, compare=False, repr=False)

    def open(self, name: str, boxes: Sequence[Box] | None = None) -> ts.Future[ts.TensorStore]:
        """Open array ``name`` as Orbax reads it (its reads fetch only what they touch)."""
        return open_orbax_array_async(
            self.directory,
            name,
            ocdbt=self.ocdbt,
            zarr3=self.zarr3,
            fill_missing=self.fill_missing,
            context=self.context,
        )

    def location(self, name: str, key: str | None = None) -> str:
        """The array's directory, or (OCDBT) its key in the item's database."""
        where = self.directory / name
        if self.ocdbt:
            inside = f"{name}/{key}" if key else name
            return f"{self.directory} (OCDBT key {inside})"
        return str(where / key if key else where)

    def note(self) -> str | None:
        """For Orbax's data: that it carries no checksums."""
        return ORBAX_UNVERIFIED if self.orbax else None

    def chunk_files(self, name: str) -> Path | None:
        """None: Orbax's layouts are read with tensorstore."""
        return None


def source_for(
    directory: Location, meta: dict[str, Any], packs: PackIndex | None = None
) -> ArraySource:
    """Return the source of an nbckpt step's arrays, by its metadata's ``arrays`` field.

    ``"ocdbt+zarr3"``: one OCDBT database of zarr v3 arrays at the step's top (as
    Orbax lays them out); absent: nbckpt's plain zarr v2 arrays, one per leaf, and
    the packed leaves from their packs, whose index is ``packs`` (read from the
    step's checksums files when None).

    Raises
    ------
    ValueError
        The field names a layout this version of nbckpt does not know.
    """
    arrays = meta.get("arrays")
    packed = {m["name"]: m for m in meta.get("leaves", []) if is_packed(m)}
    if arrays is None and packed:
        if packs is None:
            packs = {}
            read_checksums(directory, packs)
        return PackedSource(directory, Zarr2Source(directory), packed, packs)
    if arrays is None:
        return Zarr2Source(directory)
    if arrays == ORBAX_ARRAYS:
        return OrbaxSource(directory, ocdbt=True, zarr3=True, fill_missing=False, orbax=False)
    raise ValueError(
        f"{directory}: its arrays are stored as {arrays!r}, which this version of nbckpt "
        "cannot read; upgrade nbckpt"
    )
