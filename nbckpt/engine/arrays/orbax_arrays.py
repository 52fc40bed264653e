"""Arrays in Orbax's layout, opened with tensorstore the way Orbax reads them.

An Orbax pytree keeps its arrays either in one OCDBT database at the top of its
directory (the default: ``manifest.ocdbt``, with data files under ``d/`` and each
writing process's ``ocdbt.process_<i>/``), each array under the key of its dotted name;
or, without OCDBT, as one zarr array directory per leaf, ``<dir>/<name>/``. Either way
the arrays are zarr v2 (zstd chunks) or zarr v3 (a sharding codec whose index carries a
CRC-32C). nbckpt's own steps in this layout (``"arrays": "ocdbt+zarr3"`` in their
metadata) are read through the same function.

Orbax records no checksum of the data: zarr v2 chunks and the zstd frames of zarr v3
carry none (their checksum flag is off), so a chunk damaged on disk that still
decompresses is read as it is. Only a missing chunk can be detected, and only where
the save stored every chunk (``store_array_data_equal_to_fill_value``).
"""

from __future__ import annotations

from typing import Any

import tensorstore as ts

from nbckpt import storage
from nbckpt.engine.arrays.zarr import context as default_context
from nbckpt.storage import Location

__all__ = ["array_spec", "open_orbax_array_async"]


def array_spec(
    item_dir: Location, name: str, *, ocdbt: bool, zarr3: bool, fill_missing: bool = False
) -> dict[str, Any]:
    """Return the tensorstore spec that reads array ``name`` of ``item_dir``.

    The spec Orbax's ``ArrayReadSpec`` builds, less its caching options: the driver is
    ``zarr3`` or ``zarr``; the key-value store an OCDBT database whose base is the
    item's directory (the array under the key ``name``), or the plain file directory
    ``<item_dir>/<name>``.
    """
    kvstore: dict[str, Any]
    if ocdbt:
        kvstore = {"driver": "ocdbt", "base": storage.kvstore_spec(item_dir), "path": name}
    else:
        kvstore = storage.kvstore_spec(item_dir / name)
    return {
        "driver": "zarr3" if zarr3 else "zarr",
        "kvstore": kvstore,
        "fill_missing_data_reads": fill_missing,
    }


def open_orbax_array_async(
    item_dir: Location,
    name: str,
    *,
    ocdbt: bool,
    zarr3: bool,
    fill_missing: bool = False,
    context: ts.Context | None = None,
) -> ts.Future[ts.TensorStore]:
    """Start opening array ``name`` of an Orbax pytree (or OCDBT nbckpt step) for reading.

    Parameters
    ----------
    item_dir
        The pytree's directory: where ``_METADATA`` (and, with OCDBT,
        ``manifest.ocdbt``) is.
    name
        The array's name: the leaf's keys joined by ``.`` for Orbax, nbckpt's leaf
        name for nbckpt's own steps.
    ocdbt, zarr3
        How the arrays are stored (``use_ocdbt``, ``use_zarr3`` in Orbax's
        ``_METADATA``).
    fill_missing
        What a read of a chunk that is not stored gives: the fill value, or (False) a
        ``NOT_FOUND`` error. Pass False where every chunk was stored (Orbax's
        ``store_array_data_equal_to_fill_value``): a missing chunk is damage then.
    context
        The tensorstore context to open it in; by default the process's own
        (:func:`nbckpt.engine.arrays.zarr.context`). An OCDBT database is cached per
        context: pass a fresh one to see a database rewritten since the last read.

    Returns
    -------
    tensorstore.Future
        Its result is the opened store; opening reads the array's metadata only.
    """
    spec = array_spec(item_dir, name, ocdbt=ocdbt, zarr3=zarr3, fill_missing=fill_missing)
    return ts.open(spec, open=True, read=True, context=context or default_context())
