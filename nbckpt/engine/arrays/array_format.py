"""How a save stores its arrays: one small strategy per format, behind one interface.

``Zarr2Arrays`` is nbckpt's own layout (an uncompressed zarr v2 array directory per
leaf); ``OcdbtZarr3Arrays`` (:mod:`nbckpt.engine.arrays.ocdbt_writer`) is Orbax's (zarr v3
arrays in per-process OCDBT databases, merged at the end). The background save never
branches on the format: it asks the strategy, as it asks the commit strategy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from nbckpt.engine.arrays.ocdbt_writer import OcdbtZarr3Arrays
from nbckpt.engine.save.snapshot import Snapshot
from nbckpt.engine.save.writer import create_arrays, write_shards
from nbckpt.formats.orbax_write import OrbaxFlags
from nbckpt.formats.packs import DEFAULT_PACK_BYTES
from nbckpt.protocol import FORMATS, NBCKPT_FORMAT, ORBAX_FORMAT, SaveFormat
from nbckpt.storage import Location

__all__ = ["ArrayFormat", "Zarr2Arrays", "format_for"]


class ArrayFormat(Protocol):
    """Where and how the processes of a save write their arrays.

    Attributes
    ----------
    name
        The save option that picks it (``"nbckpt"``, ``"orbax"``).
    arrays
        The ``arrays`` field of the step's nbckpt metadata; None for nbckpt's own
        layout, which is what a step without the field holds.
    flags
        How Orbax's ``_METADATA`` describes the arrays.
    pack_bytes
        Leaves whose shards are each of at most this many bytes are packed
        (:mod:`nbckpt.formats.packs`); 0 packs none.
    finishes_alone
        Whether :meth:`finish` needs nothing the other processes write: the primary
        then runs it while they still write, and only makes its files durable after.
    """

    name: SaveFormat
    arrays: str | None
    flags: OrbaxFlags
    pack_bytes: int
    finishes_alone: bool

    def create(self, work: Location, snap: Snapshot, process: int) -> None:
        """Primary only, before anyone writes: what the writers need to exist."""
        ...

    def write(
        self,
        work: Location,
        snap: Snapshot,
        process: int,
        *,
        progress: Callable[[int], None] | None = None,
        watch: Callable[[], None] | None = None,
        checksums: dict[str, Any] | None = None,
        issued: Callable[[], None] | None = None,
    ) -> int:
        """Write this process's shards durably, with their checksums; return the bytes.

        ``issued`` is as for :func:`nbckpt.engine.save.writer.write_shards`.
        """
        ...

    def finish(self, work: Location, snap: Snapshot) -> list[Location]:
        """Primary only, once every process has written: complete the arrays.

        Returns the files it wrote without making them durable: the save makes them
        durable together with its last records, in one batch.
        """
        ...


class Zarr2Arrays:
    """nbckpt's own layout: ``<step>/<leaf name>/``, an uncompressed zarr v2 array.

    Leaves whose shards are each of at most ``pack_bytes`` are packed instead, in one
    file per process.
    """

    name: SaveFormat = NBCKPT_FORMAT
    arrays: str | None = None
    flags = OrbaxFlags(use_ocdbt=False, use_zarr3=False)
    #: The ``.zarray`` files come from the snapshot's metadata alone.
    finishes_alone = True

    def __init__(self, pack_bytes: int = DEFAULT_PACK_BYTES) -> None:
        self.pack_bytes = pack_bytes

    def create(self, work: Location, snap: Snapshot, process: int) -> None:
        """Nothing: the writers open their arrays from the snapshot's metadata."""

    def write(
        self,
        work: Location,
        snap: Snapshot,
        process: int,
        *,
        progress: Callable[[int], None] | None = None,
        watch: Callable[[], None] | None = None,
        checksums: dict[str, Any] | None = None,
        issued: Callable[[], None] | None = None,
    ) -> int:
        """Write this process's chunks, one file each, and its pack."""
        return write_shards(
            work,
            snap,
            progress=progress,
            watch=watch,
            checksums=checksums,
            issued=issued,
            process=process,
        )

    def finish(self, work: Location, snap: Snapshot) -> list[Location]:
        """Write every array's ``.zarray`` (not fsync'd: the save's last batch does it).

        Written while the processes write their chunks, not before, so that no process
        waits for them (writers take the metadata from the snapshot): the step is
        unreadable until they are made durable with the rest, and only published after.
        """
        return create_arrays(work, snap, sync=False)


def format_for(name: str | None, pack_bytes: int = DEFAULT_PACK_BYTES) -> ArrayFormat:
    """Return a fresh strategy for format ``name`` (None: nbckpt's own).

    ``pack_bytes`` applies to nbckpt's own layout; Orbax's packs nothing.

    Raises
    ------
    ValueError
        If ``name`` is not one of :data:`nbckpt.protocol.FORMATS`.
    """
    if name is None or name == NBCKPT_FORMAT:
        return Zarr2Arrays(pack_bytes)
    if name == ORBAX_FORMAT:
        return OcdbtZarr3Arrays()
    raise ValueError(f"format must be one of {', '.join(map(repr, FORMATS))}, got {name!r}")
