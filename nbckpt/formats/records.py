"""nbckpt's own records in a checkpoint root: their names, and how they are read and written.

What the names mean together, and which directory is complete, is
:mod:`nbckpt.formats.layout`'s; which layout a directory is, :mod:`nbckpt.formats.registry`'s.
This module knows only nbckpt's files, and needs neither jax nor tensorstore.
"""

from __future__ import annotations

import json
import os
from typing import Any

from nbckpt import storage
from nbckpt.protocol import Mode
from nbckpt.storage import Location

__all__ = [
    "CHECKSUMS_DIR",
    "COMMIT_FILE",
    "DELETING_SUFFIX",
    "FORMAT",
    "LEGACY_METADATA_FILE",
    "METADATA_FILE",
    "OWNER_FILE",
    "STATE_DIR",
    "TMP_SUFFIX",
    "Where",
    "fsync_dir",
    "metadata_path",
    "ops_dir",
    "parse_step",
    "read_metadata",
    "read_owner",
    "step_dir",
    "tmp_dir",
    "write_durable",
    "write_owner",
]

TMP_SUFFIX = ".nbckpt-tmp"
DELETING_SUFFIX = ".nbckpt-deleting"
#: nbckpt's own step metadata. Its name is nbckpt's alone: Orbax writes a file named
#: ``_CHECKPOINT_METADATA`` with other contents into its steps.
METADATA_FILE = "_NBCKPT_METADATA"
#: Where steps saved before nbckpt 0.2 keep the same metadata (read, never written).
LEGACY_METADATA_FILE = "_CHECKPOINT_METADATA"
COMMIT_FILE = "commit_success.txt"
#: Per-process checksum of every chunk written (CRC-32C; zlib CRC-32 in older steps, see
#: :mod:`nbckpt.formats.checksum`), ``<step>/_CHECKSUMS/process_<i>.json``.
CHECKSUMS_DIR = "_CHECKSUMS"
#: Written (durably) by the primary into a directory it creates, before anything else.
OWNER_FILE = "_NBCKPT_OWNER"
STATE_DIR = ".nbckpt"
#: The ``format`` field of nbckpt's own step metadata.
FORMAT = "nbckpt/1"

#: A root, or a directory or file under it: a path, a URL or a location.
Where = str | os.PathLike[str] | Location


def step_dir(root: Where, step: int) -> Location:
    """Return the final directory of ``step`` under ``root``."""
    return storage.location(root) / str(step)


def tmp_dir(root: Where, step: int) -> Location:
    """Return the temporary directory a rename-mode save of ``step`` writes into."""
    return storage.location(root) / f"{step}{TMP_SUFFIX}"


def ops_dir(root: Where) -> Location:
    """Return the directory that holds one journal folder per operation."""
    return storage.location(root) / STATE_DIR / "ops"


def parse_step(name: str) -> int | None:
    """Return the step a directory name stands for, or None if it names no step."""
    # isdigit() alone accepts "²" or "٣", which int() then rejects or reads as 3.
    if name.isascii() and name.isdigit() and (name == "0" or not name.startswith("0")):
        return int(name)
    return None


def _read_json(path: Location) -> dict[str, Any] | None:
    """A JSON object file's contents, or None (see :func:`nbckpt.storage.read_json`)."""
    data = storage.read_json(path)
    return data if isinstance(data, dict) else None


def metadata_path(path: Where) -> Location:
    """Return the file that holds (or would hold) nbckpt's metadata of a step directory.

    ``_NBCKPT_METADATA``, or ``_CHECKPOINT_METADATA`` for a step saved before the rename
    whose file is there and nbckpt's (Orbax uses that name too, for other contents).
    """
    p = storage.location(path)
    new = p / METADATA_FILE
    if new.exists():
        return new
    legacy = p / LEGACY_METADATA_FILE
    data = _read_json(legacy)
    return legacy if data is not None and data.get("format") == FORMAT else new


def read_metadata(path: Where) -> dict[str, Any] | None:
    """Return nbckpt's parsed metadata of a step directory, or None if absent or unreadable.

    Reads ``_NBCKPT_METADATA``, or, for steps saved before it was named so,
    ``_CHECKPOINT_METADATA`` when that file is nbckpt's (an Orbax step's file of that
    name is not nbckpt metadata, and gives None).
    """
    p = storage.location(path)
    data = _read_json(p / METADATA_FILE)
    if data is not None:
        return data
    legacy = _read_json(p / LEGACY_METADATA_FILE)
    return legacy if legacy is not None and legacy.get("format") == FORMAT else None


def write_durable(path: Where, text: str) -> None:
    """Write ``text`` to ``path``; on return it is durable (fsync'd, or acknowledged)."""
    storage.write_durable(storage.location(path), text)


def write_owner(path: Where, op: str, mode: Mode, step: int) -> None:
    """Record, durably, that operation ``op`` created directory ``path``."""
    text = json.dumps({"format": FORMAT, "op": op, "mode": mode, "step": step})
    p = storage.location(path)
    storage.write_all_durable({p / OWNER_FILE: text}, [p])  # both fsyncs at once


def read_owner(path: Where) -> dict[str, Any] | None:
    """Return the owner record of a directory nbckpt created, or None."""
    data = _read_json(storage.location(path) / OWNER_FILE)
    return data if data is not None and data.get("format") == FORMAT else None


def fsync_dir(path: Where) -> None:
    """Make a directory's entries (creations, renames) durable (nothing on object stores)."""
    storage.sync_dir(storage.location(path))
