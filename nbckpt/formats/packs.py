"""Small leaves packed per process: one file and an index instead of a file per chunk.

A leaf whose shards are each of at most :data:`DEFAULT_PACK_BYTES` (the save's
``pack_bytes``) is not stored as its own zarr array: every process appends the chunks
of such leaves that it writes to one file, ``<step>/_PACKED/process_<i>``, and records
where each chunk lies in its checksums file, next to the chunk's checksum::

    {"#algorithm": "crc32c",
     "<leaf>": {"<chunk key>": <uint32>, ...},
     "#packed": {"file": "_PACKED/process_<i>",
                 "chunks": {"<leaf>": {"<chunk key>": [<offset>, <nbytes>], ...}, ...}}}

A chunk's bytes are the chunk in C order, exactly as a chunk file of a zarr array holds
them, so the same checksum covers them; each chunk starts at a multiple of
:data:`PACK_ALIGN` bytes. The leaf's entry in the step's metadata says
``"packed": true``; its shape, dtype and chunk grid are there as for any leaf. One
file and one fsync per process replace a directory, a ``.zarray``, a chunk file and an
fsync per small leaf or shard. A pack holds its whole leaves first, then the shards of
leaves split over devices (a reader relies on no order: the index says where each chunk
is), so that a restore, where every process needs the whole leaves and only one process
each shard, reads a few stretches of each pack (:mod:`nbckpt.engine.restore.bulk`).

Orbax reads zarr arrays only: a step with packed leaves carries no Orbax records
(``_METADATA``), and Orbax refuses it; a save with ``pack_bytes=0`` packs nothing, for
steps Orbax must restore. Needs neither jax nor tensorstore.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "DEFAULT_PACK_BYTES",
    "PACK_ALIGN",
    "PACK_DIR",
    "PACK_KEY",
    "PackIndex",
    "PackedChunk",
    "TIER_PACK_BYTES",
    "is_packed",
    "pack_entry",
    "pack_file",
    "parse_pack",
    "unit_files",
]

#: Leaves whose shards are each of at most this many bytes are packed by default: a
#: file per shard costs a create, an fsync and an open on top of moving its bytes.
#: Measured on the 2-core test machine (4 processes, a 1 GiB transformer-like state
#: whose matrices are split into shards of about 2 MiB): saves took 0.45-0.61 s with
#: those shards packed and 0.55-1.9 s as chunk files; restores 0.29-0.38 s and 1.6 s.
DEFAULT_PACK_BYTES = 4 << 20
#: With a local tier, only leaves of at most this many bytes in all (and at most the
#: save's ``pack_bytes``) are packed: peers send a pack whole, so a replaced host
#: fetches every pack that holds a chunk it needs, and those should hold small leaves
#: only, as before packing by shard.
TIER_PACK_BYTES = 1 << 20
#: Each chunk of a pack starts at a multiple of this many bytes (zeros fill the gaps).
#: A restore reads a stretch of a pack into a buffer aligned alike, and a leaf's view
#: of it is then aligned too: XLA's CPU client adopts host memory aligned to 64 bytes
#: as it is, and copies any other (every byte once more, into new memory). Steps
#: written before have their chunks end to end; they read as before, with that copy.
PACK_ALIGN = 64
#: The folder of a step that holds the packs.
PACK_DIR = "_PACKED"
#: The entry of a checksums file that indexes its process's pack.
PACK_KEY = "#packed"


class PackedChunk(NamedTuple):
    """Where one chunk of a packed leaf lies: a file of the step, and a byte range.

    A named tuple: a restore makes one per packed chunk of every process's index (tens
    of thousands for a state of thousands of leaves), and a tuple is made in half the
    time a frozen dataclass is (0.25 against 0.5 us here).
    """

    file: str
    offset: int
    nbytes: int


#: Leaf name -> chunk key -> where its bytes are, merged over every process.
PackIndex = dict[str, dict[str, PackedChunk]]


def pack_file(process: int) -> str:
    """The pack of ``process``, relative to its step."""
    return f"{PACK_DIR}/process_{process}"


def is_packed(meta: dict[str, Any]) -> bool:
    """Whether a leaf's metadata says it is stored in the packs."""
    return bool(meta.get("packed"))


def pack_entry(process: int, chunks: dict[str, dict[str, list[int]]]) -> dict[str, Any]:
    """The ``"#packed"`` entry of ``process``'s checksums file."""
    return {"file": pack_file(process), "chunks": chunks}


def parse_pack(entry: object, where: str, into: PackIndex) -> None:
    """Add the chunks of one checksums file's ``"#packed"`` entry to ``into``.

    Raises
    ------
    ValueError
        If the entry is not of the expected shape (``where`` names its file).
    """
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
        raise ValueError(f"{where}: its {PACK_KEY!r} entry names no file")
    file, chunks = entry["file"], entry.get("chunks")
    if file.startswith("/") or ".." in file.split("/") or not isinstance(chunks, dict):
        raise ValueError(f"{where}: its {PACK_KEY!r} entry is malformed")
    for leaf, keys in chunks.items():
        if not isinstance(keys, dict):
            raise ValueError(f"{where}: the packed chunks of leaf {leaf!r} are malformed")
        spans = into.setdefault(leaf, {})
        # JSON object keys are strings already. Checked inline, not by a generator per
        # chunk: this loop runs once per packed chunk of every process.
        for key, span in keys.items():
            if (
                not isinstance(span, list)
                or len(span) != 2
                or not (isinstance(span[0], int) and isinstance(span[1], int))
                or min(span) < 0
            ):
                raise ValueError(f"{where}: packed chunk {key} of leaf {leaf!r} is malformed")
            spans[key] = PackedChunk(file, span[0], span[1])


def unit_files(sums: dict[str, Any]) -> list[str]:
    """The data files one process's checksums file lists, relative to the step.

    A chunk file ``<leaf>/<key>`` per chunk stored in its own array, and the pack if
    the file indexes packed chunks.
    """
    entry = sums.get(PACK_KEY)
    packed = entry.get("chunks", {}) if isinstance(entry, dict) else {}
    files = [
        f"{leaf}/{key}"
        for leaf, keys in sums.items()
        if not leaf.startswith("#") and isinstance(keys, dict)
        for key in keys
        if key not in packed.get(leaf, {})
    ]
    if packed and isinstance(entry, dict):
        files.append(str(entry["file"]))
    return files
