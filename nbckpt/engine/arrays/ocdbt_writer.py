"""Orbax's array format: zarr v3 arrays in OCDBT databases, one per process, merged.

The layout orbax-checkpoint 0.12.8 writes with OCDBT and ``use_zarr3=True`` (its
``StandardCheckpointer`` default is the same OCDBT layout holding zarr v2 arrays; Orbax
reads either, by the flags of ``_METADATA``), written by nbckpt's protocol (barriers,
journal, checksums, atomic commit)::

    <step>/ocdbt.process_<i>/   process i's own database: its chunks (the primary's
                                also holds every array's zarr.json)
    <step>/manifest.ocdbt, d/   the step's database: the primary merges every process's
                                database into it by reference, after all have written

Each leaf is a zarr v3 array ``<name>/`` in those databases, with Orbax's codecs: one
``sharding_indexed`` shard per chunk, its chunk encoded as little-endian bytes then
zstd (see :data:`COMPRESSION`), its index checksummed with CRC-32C. The chunk grid is
nbckpt's (chunks never straddle two shards), so the checksums in ``_CHECKSUMS`` are
keyed by the same chunk grid indices as in nbckpt's own layout, and taken over the
same (uncompressed) bytes. Every chunk is stored, even one equal to the fill value.

A fresh tensorstore context serves each save: an OCDBT database's manifest and B-tree
are cached in the context, and a later save into a directory of the same name (a
forced re-save) must not see the one before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import numpy as np
import tensorstore as ts

from nbckpt import storage
from nbckpt.engine.arrays.tree import path_str
from nbckpt.engine.save.snapshot import Snapshot
from nbckpt.engine.save.writer import array_leaves, write_shards
from nbckpt.errors import CheckpointDataError
from nbckpt.formats.orbax_names import OCDBT_PROCESS_PREFIX
from nbckpt.formats.orbax_write import ORBAX_ARRAYS, OrbaxFlags, orbax_param_name
from nbckpt.protocol import ORBAX_FORMAT, SaveFormat
from nbckpt.storage import Location
from nbckpt.storage.backend import RETRY_CONTEXT

__all__ = [
    "COMPRESSION",
    "OcdbtZarr3Arrays",
    "array_spec",
    "kvstore_spec",
    "new_context",
    "process_db",
    "zarr3_metadata",
]

#: What Orbax's tensorstore context sets, and durability spelled out: every file is
#: fsync'd before its write commits.
_CONTEXT: Final = {
    "file_io_sync": True,
    "file_io_concurrency": {"limit": 128},
    # B-tree nodes of the OCDBT databases, read back while merging.
    "cache_pool#ocdbt": {"total_bytes_limit": 100_000_000},
    # Object stores: bounded retries with backoff, as for nbckpt's own arrays.
    **RETRY_CONTEXT,
}
#: Orbax's OCDBT write options: a data file grows to at most 2 GiB; values up to
#: 1 KiB (zarr.json, tiny chunks) live in the B-tree; one manifest file.
_TARGET_DATA_FILE_SIZE: Final = 2**31
_OCDBT_CONFIG: Final = {
    "max_inline_value_bytes": 1024,
    "max_decoded_node_bytes": 100_000_000,
    "manifest_kind": "single",
}
#: The inner chunk codec after ``bytes``, as Orbax's ``use_compression=True``. Orbax's
#: zarr v3 arrays use zstd level 3, its default zarr v2 arrays (``StandardCheckpointer``)
#: level 1. Level 1 it is: on float32 weights (random mantissas) level 3 stores no
#: fewer bytes and made the save about 1.5 times slower (benchmarks/orbax_format.py);
#: a reader does not care which level wrote a frame.
COMPRESSION: Final = {"name": "zstd", "configuration": {"level": 1}}


def new_context() -> ts.Context:
    """Return a fresh tensorstore context with the resources :func:`kvstore_spec` names."""
    return ts.Context(_CONTEXT)


def process_db(work: Location, process: int) -> Location:
    """Return the directory of process ``process``'s own OCDBT database in ``work``."""
    return work / f"{OCDBT_PROCESS_PREFIX}{process}"


def kvstore_spec(directory: Location, *, write: bool) -> dict[str, Any]:
    """Return the spec of the OCDBT database at ``directory``, as Orbax builds it.

    Data files are written in place (no temporary file and rename: nothing reads them
    before the database is complete), the manifest atomically. ``write`` adds Orbax's
    write options; ``assume_config`` spares the empty manifest a new database would
    first get (each database has one writer).
    """
    base = storage.kvstore_spec(directory)
    # Local files: no lock files (each database has one writer).
    locking = {"file_io_locking": {"mode": "non_atomic"}} if base["driver"] == "file" else {}
    spec: dict[str, Any] = {
        "driver": "ocdbt",
        "base": {**base, **locking},
        "manifest": base,
        "cache_pool": "cache_pool#ocdbt",
    }
    if write:
        spec["target_data_file_size"] = _TARGET_DATA_FILE_SIZE
        spec["config"] = dict(_OCDBT_CONFIG)
        spec["assume_config"] = True
    return spec


def zarr3_metadata(shape: Sequence[int], chunks: Sequence[int]) -> dict[str, Any]:
    """Return the zarr v3 metadata of an array, with Orbax's codecs."""
    chunk_shape = [max(1, int(c)) for c in chunks]
    return {
        "shape": [int(s) for s in shape],
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk_shape}},
        "codecs": [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": chunk_shape,
                    "codecs": [
                        {"name": "bytes", "configuration": {"endian": "little"}},
                        COMPRESSION,
                    ],
                    "index_codecs": [
                        {"name": "bytes", "configuration": {"endian": "little"}},
                        {"name": "crc32c"},
                    ],
                    "index_location": "end",
                },
            }
        ],
    }


def array_spec(db: Location, leaf: Mapping[str, Any]) -> dict[str, Any]:
    """Return the tensorstore spec that writes ``leaf`` into the database at ``db``."""
    return {
        "driver": "zarr3",
        "kvstore": {**kvstore_spec(db, write=True), "path": leaf["name"]},
        "metadata": zarr3_metadata(leaf["shape"], leaf["chunks"]),
        "dtype": np.dtype(leaf["dtype"]).name,
        "store_data_equal_to_fill_value": True,
        "recheck_cached_data": False,
        "recheck_cached_metadata": False,
    }


def _chunk_count(leaf: Mapping[str, Any]) -> int:
    return math.prod(
        -(-int(s) // max(1, int(c))) for s, c in zip(leaf["shape"], leaf["chunks"], strict=True)
    )


class OcdbtZarr3Arrays:
    """Orbax's OCDBT + zarr v3 arrays behind nbckpt's array-format interface."""

    name: SaveFormat = ORBAX_FORMAT
    arrays: str | None = ORBAX_ARRAYS
    #: The merge reads every process's database: only once all of them are written.
    finishes_alone = False
    flags = OrbaxFlags(use_ocdbt=True, use_zarr3=True)
    pack_bytes = 0  # Orbax reads every leaf from the databases

    def __init__(self) -> None:
        self._context = new_context()

    def create(self, work: Location, snap: Snapshot, process: int) -> None:
        """Primary only: write every array's zarr.json into its own database."""
        db = process_db(work, process)
        futures = [
            ts.open(array_spec(db, leaf), create=True, open=True, context=self._context)
            for leaf in array_leaves(snap)
        ]
        for f in futures:
            f.result()

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
        """Write this process's chunks into its own database; return the bytes."""
        db = process_db(work, process)
        specs = {leaf["name"]: array_spec(db, leaf) for leaf in array_leaves(snap)}

        def open_store(name: str) -> ts.Future[ts.TensorStore]:
            # The zarr.json is the primary's: the others write chunks only.
            return ts.open(specs[name], open=True, assume_metadata=True, context=self._context)

        return write_shards(
            work,
            snap,
            progress=progress,
            watch=watch,
            checksums=checksums,
            open_store=open_store,
            issued=issued,
        )

    def finish(self, work: Location, snap: Snapshot) -> list[Location]:
        """Primary only: merge every process's database into the step's, then check it.

        As Orbax's ``merge_ocdbt_per_process_files``: one atomic transaction copies each
        database's entries (by reference: the data stays in the per-process files) into
        the database at ``work``. The merged database must then hold every array's
        zarr.json and every one of its chunks, or the save fails before it commits.
        """
        children = sorted(p for p in work.glob(f"{OCDBT_PROCESS_PREFIX}*") if p.is_dir())
        opening = [
            ts.KvStore.open(kvstore_spec(child, write=False), context=self._context)
            for child in children
        ]
        parent = ts.KvStore.open(kvstore_spec(work, write=True), context=self._context).result()
        txn = ts.Transaction(atomic=True)
        into = parent.with_transaction(txn)
        copies = [f.result().experimental_copy_range_to(into) for f in opening]
        for c in copies:
            c.result()
        txn.commit_async().result()
        self._check_merged(parent, snap)
        return []  # the merge's commit is durable already

    def _check_merged(self, parent: ts.KvStore, snap: Snapshot) -> None:
        keys = [k.decode("utf-8", "replace") for k in parent.list().result()]
        problems = []
        for leaf in array_leaves(snap):
            name = leaf["name"]
            # The user's tree path; the database key only where it differs.
            where = path_str(tuple((k, v) for k, v in leaf.get("path", [])))
            where += f" (key {name})" if orbax_param_name(leaf.get("path", [])) != name else ""
            mine = [k[len(name) + 1 :] for k in keys if k.startswith(f"{name}/")]
            chunks = sum(1 for k in mine if k == "c" or k.startswith("c/"))
            if "zarr.json" not in mine:
                problems.append(f"leaf {where}: no zarr.json")
            elif chunks != _chunk_count(leaf):
                problems.append(f"leaf {where}: {chunks} of {_chunk_count(leaf)} chunks")
        if problems:
            raise CheckpointDataError(
                "the merged OCDBT database lacks what the processes wrote: "
                + "; ".join(problems[:5])
                + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
            )
