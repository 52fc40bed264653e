"""Local (POSIX) roots: the operations a :class:`pathlib.Path` lacks.

Durable writes (fsync of the file and of its directory entry), directory fsyncs and an
atomic rename: what makes rename mode safe on a local or shared POSIX file system.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["fsync_dir", "remove_tree", "write_durable"]


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


def remove_tree(path: Path) -> None:
    """Delete a directory and everything in it."""
    shutil.rmtree(path)
