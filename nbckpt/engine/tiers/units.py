"""The files of a local step copy: its skeleton, and each process's unit of shards.

A local copy of a step is laid out like any nbckpt step, but holds only some
processes' shards. What a process wrote is its *unit*: its checksums file
``_CHECKSUMS/process_<q>.json`` and the chunk files it lists (and its pack of small
leaves, ``_PACKED/process_<q>``, which the file indexes). A unit is always placed
with its checksums file last, after every chunk it lists is durable, so a copy holds
process ``q``'s shards exactly when that file is there; a restore that reads a chunk
of a unit that is not there fails on the chunk's missing checksum, never on zeros.

The *skeleton* is everything else: the step's metadata, Orbax's records and every
array's ``.zarray``; every host's copy has the same one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from nbckpt.engine.tiers.peers import fetch, list_files
from nbckpt.formats.layout import CHECKSUMS_DIR, fsync_dir
from nbckpt.formats.packs import unit_files

__all__ = [
    "checksums_file",
    "held_processes",
    "is_skeleton",
    "pull_skeleton",
    "pull_unit",
    "unit_files",
]

_SUMS = re.compile(r"process_(\d+)\.json")


def checksums_file(process: int) -> str:
    """The path of ``process``'s checksums file, relative to its step."""
    return f"{CHECKSUMS_DIR}/process_{process}.json"


def held_processes(step: Path) -> list[int]:
    """The processes whose units ``step`` holds (their checksums files are there)."""
    try:
        names = os.listdir(step / CHECKSUMS_DIR)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := _SUMS.fullmatch(n)))


def is_skeleton(relpath: str) -> bool:
    """Whether a file of a step (relative path) is part of its skeleton, not a unit's."""
    parts = relpath.split("/")
    if parts[0] == CHECKSUMS_DIR:
        return False
    return len(parts) == 1 or parts[-1].startswith(".")


def pull_unit(
    address: str,
    key: bytes,
    step: Path,
    process: int,
    *,
    deadline_s: float,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Copy ``process``'s unit of ``step`` from the peer at ``address``; return its bytes.

    ``step`` is this host's copy, which must exist; the peer serves the same step under
    the same name. The chunk files come first, each made durable, then the checksums
    file, placed in one rename: until then this copy does not count the unit as held.

    Raises
    ------
    PeerTransferError
        The peer could not be reached, refused, or lacks a file, before the deadline.
    """
    scratch = step.parent / f".incoming-{uuid.uuid4().hex[:12]}"
    name = checksums_file(process)
    remote = f"{step.name}/{name}"
    try:
        got = fetch(address, key, [remote], scratch, deadline_s=deadline_s)
        sums = json.loads((scratch / remote).read_text())
        files = [f"{step.name}/{f}" for f in unit_files(sums)]
        if files:
            got += fetch(address, key, files, step.parent, deadline_s=deadline_s, progress=progress)
        (step / CHECKSUMS_DIR).mkdir(exist_ok=True)
        os.replace(scratch / remote, step / name)
        fsync_dir(step / CHECKSUMS_DIR)
        return got
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def pull_skeleton(address: str, key: bytes, step: Path, *, deadline_s: float) -> bool:
    """Make ``step`` (this host's copy, absent) from a peer's skeleton of it.

    The skeleton is fetched into a directory of its own and renamed into place, so the
    copy appears whole or not at all; if another process of this host placed it
    first, that one is kept. Return whether this call placed it.

    Raises
    ------
    PeerTransferError
        As :func:`pull_unit`.
    """
    listed = list_files(address, key, step.name, deadline_s=deadline_s)
    wanted = [p for p, _size in listed if is_skeleton(p.split("/", 1)[1])]
    work = step.parent / f".incoming-{uuid.uuid4().hex[:12]}"
    try:
        fetch(address, key, wanted, work, deadline_s=deadline_s)
        try:
            os.rename(work / step.name, step)
        except OSError:
            if step.is_dir():
                return False  # another process of this host placed it first
            raise
        fsync_dir(step.parent)
        return True
    finally:
        shutil.rmtree(work, ignore_errors=True)
