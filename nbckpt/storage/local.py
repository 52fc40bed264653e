"""Local (POSIX) roots: the operations a :class:`pathlib.Path` lacks.

Durable writes (fsync of the file and of its directory entry), directory fsyncs and an
atomic rename: what makes rename mode safe on a local or shared POSIX file system.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["fsync_dir", "remove_tree", "write_all_durable", "write_durable"]

#: Concurrent fsyncs of one batch: enough for the file system to group them.
_FSYNC_THREADS = 16


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
    with ThreadPoolExecutor(min(_FSYNC_THREADS, len(targets))) as pool:
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
