"""Local (POSIX) roots: the operations a :class:`pathlib.Path` lacks.

Durable writes (fsync of the file and of its directory entry), directory fsyncs and an
atomic rename: what makes rename mode safe on a local or shared POSIX file system.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from nbckpt.pools import LazyPool

__all__ = ["file_system", "fsync_dir", "remove_tree", "write_all_durable", "write_durable"]

#: Concurrent fsyncs of one batch: enough for the file system to group them.
_FSYNC_THREADS = 16

#: Kept from one batch to the next: a save's claim and its commit each sync a batch,
#: and making their threads anew cost more than the fsyncs of a small save's records.
_fsyncing = LazyPool(_FSYNC_THREADS, "nbckpt-fsync")


def write_durable(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it before returning."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all_durable(
    files: dict[Path, bytes], dirs: Sequence[Path] = (), *, synced_too: Sequence[Path] = ()
) -> None:
    """Write every file, then fsync them, ``synced_too`` and ``dirs`` at once.

    The fsyncs run concurrently: a journaling file system then folds them into one or
    a few journal commits instead of one each, which is most of a small save's cost.
    Nothing is renamed or published here, so the order in which they land is free.
    """
    for path, data in files.items():
        with open(path, "wb") as f:
            f.write(data)
    targets = [(f, True) for f in [*files, *synced_too]] + [(d, False) for d in dirs]
    if not targets:
        return
    pool = _fsyncing.get()
    for done in [pool.submit(_fsync_path, t, is_file) for t, is_file in targets]:
        done.result()


def _fsync_path(path: Path, is_file: bool) -> None:
    fd = os.open(path, os.O_RDONLY if is_file else os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """Delete a directory and everything in it."""
    shutil.rmtree(path)


def file_system(directory: str | os.PathLike[str]) -> str | None:
    """The type of the file system that holds ``directory`` (``ext4``, ``nfs``...).

    Read from ``/proc/self/mountinfo``: the deepest mount point above the directory.
    None where that cannot be read (not Linux) or no mount holds it. Remembered per
    directory for the life of the process.
    """
    return _mounted_type(os.fspath(directory))


@functools.lru_cache(maxsize=64)
def _mounted_type(directory: str) -> str | None:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    path = os.path.realpath(directory)
    found, depth = None, -1
    for line in lines:
        # "<id> <parent> <major:minor> <root> <mount point> <options> ... - <type> ..."
        mine, _, theirs = line.partition(" - ")
        fields, kind = mine.split(), theirs.split()
        if len(fields) < 5 or not kind:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        # The deepest mount point that holds the path; a later one of the same depth
        # is mounted over the earlier.
        if inside and len(point) >= depth:
            found, depth = kind[0], len(point)
    return found
