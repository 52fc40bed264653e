"""Where a checkpoint root lives: one small interface over local disks and object stores.

:func:`location` turns what a user typed into a *location*: a :class:`pathlib.Path`
for a local (or shared POSIX) root, or an :class:`~nbckpt.storage.objects.ObjectPath`
for ``s3://bucket/prefix`` (:class:`S3Path`) or ``gs://bucket/prefix``
(:class:`GCSPath`). Both offer the same part of pathlib's interface (``/``, ``name``,
``exists``, ``iterdir``, ``read_bytes`` …), so the layout, the journal and every reader
are written once. What differs is here, behind four functions:

- :func:`write_durable`: on return the bytes survive a crash (fsync; an acknowledged PUT),
  and :func:`write_all_durable`, the same for many files and directories at once;
- :func:`sync_dir`: make a directory's entries durable (no-op on object stores);
- :func:`remove_tree`: delete a directory or prefix;
- :func:`can_rename`: whether the store renames atomically (rename mode needs it);

and :func:`kvstore_spec`, how tensorstore reaches a directory. A new backend is a new
:class:`ObjectPath` subclass registered in :data:`SCHEMES`.

A URL whose scheme is not supported is an error, never a local path: ``s3:`` is not a
directory name nbckpt will make. Nothing here imports tensorstore until a request is made.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeAlias

from nbckpt.errors import RenameUnavailableError, StorageError, StorageURLError
from nbckpt.protocol import COMMIT_FILE_MODE, MODES, RENAME, Mode
from nbckpt.storage import local as _local
from nbckpt.storage.gcs import GCSPath
from nbckpt.storage.objects import ObjectPath
from nbckpt.storage.s3 import S3Path

__all__ = [
    "SCHEMES",
    "GCSPath",
    "Location",
    "ObjectPath",
    "S3Path",
    "can_rename",
    "commit_mode",
    "glob",
    "is_url",
    "kvstore_spec",
    "location",
    "read_json",
    "remove_tree",
    "sync_dir",
    "write_all_durable",
    "write_durable",
]

#: A root or a path under it.
Location: TypeAlias = Path | ObjectPath

#: The object stores nbckpt can hold a root in, by URL scheme.
SCHEMES: dict[str, type[ObjectPath]] = {"s3": S3Path, "gs": GCSPath}

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://(.*)$", re.DOTALL)
# A store's scheme followed by a colon but not by "//".
_NEAR_URL = re.compile(r"^(s3|gs|gcs|file|https?):(?!//)", re.IGNORECASE)


def _supported() -> str:
    return "local paths, file:// and " + ", ".join(f"{s}://" for s in SCHEMES)


def is_url(root: object) -> bool:
    """Whether ``root`` is written as a URL (``scheme://…``) rather than a path."""
    return isinstance(root, ObjectPath) or (isinstance(root, str) and _URL.match(root) is not None)


def location(root: str | os.PathLike[str] | Location) -> Location:
    """Return the location ``root`` names.

    Parameters
    ----------
    root
        A local path (``~`` expanded, made absolute), ``file:///abs/path``,
        ``s3://bucket/prefix``, ``gs://bucket/prefix``, or a location already.

    Raises
    ------
    StorageURLError
        For a URL of any other scheme, or one without a (valid) bucket name.
    ValueError
        For an empty root, which would otherwise be the current directory.
    """
    if isinstance(root, ObjectPath):
        return root
    text = os.fspath(root)
    if not text.strip():  # "" would be the current directory: never a choice by accident
        raise ValueError(
            "the checkpoint root is empty; name a directory (or s3:// or gs://bucket/prefix), "
            "nothing was written"
        )
    match = _URL.match(text)
    if match is None:
        if _NEAR_URL.match(text):  # "s3:bucket/x" or "s3:/bucket/x": a typo, not a path
            raise StorageURLError(text, _supported())
        return Path(os.path.abspath(os.path.expanduser(text)))
    scheme, rest = match.group(1).lower(), match.group(2)
    supported = _supported()
    if scheme == "file":
        if not rest.startswith("/"):
            raise StorageURLError(text, supported)
        return Path(os.path.abspath(rest))
    cls = SCHEMES.get(scheme)
    if cls is None:
        raise StorageURLError(text, supported)
    bucket, _, key = rest.partition("/")
    try:
        return cls(bucket, key)
    except ValueError as e:
        raise StorageURLError(f"{text} ({e})", supported) from e


def read_json(loc: Location) -> Any:
    """Return a JSON file's parsed contents, or None if it is absent or unreadable.

    A failure of the store itself (:class:`~nbckpt.errors.StorageError`) is raised: a
    network error must never read as "no such file", or a complete step as missing.
    """
    try:
        raw = loc.read_bytes()
    except StorageError:
        raise
    except OSError:
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError:  # not UTF-8, or not JSON
        return None


def can_rename(loc: Location) -> bool:
    """Whether the store renames a directory atomically (only local file systems)."""
    return isinstance(loc, Path)


def commit_mode(loc: Location, mode: str | None) -> Mode:
    """The commit mode a save under ``loc`` uses: the store's default, or ``mode``.

    Parameters
    ----------
    loc
        The checkpoint root.
    mode
        What the user asked for, or None for the store's default: rename where the
        store renames atomically (local file systems), the commit object elsewhere.

    Raises
    ------
    RenameUnavailableError
        If rename mode is asked of a store without atomic rename.
    ValueError
        If ``mode`` is not a mode.
    """
    if mode is None:
        return RENAME if can_rename(loc) else COMMIT_FILE_MODE
    if mode not in MODES:
        raise ValueError(f"mode must be 'rename' or 'commit_file', got {mode!r}")
    if mode == RENAME and not can_rename(loc):
        raise RenameUnavailableError(str(loc))
    return RENAME if mode == RENAME else COMMIT_FILE_MODE


def write_durable(loc: Location, data: bytes | str) -> None:
    """Write ``data`` to ``loc``; on return it is durable (fsync'd, or acknowledged)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if isinstance(loc, Path):
        _local.write_durable(loc, raw)
    else:
        loc.write_bytes(raw)


def write_all_durable(
    files: dict[Location, bytes | str],
    dirs: Sequence[Location] = (),
    *,
    synced_too: Sequence[Location] = (),
) -> None:
    """Write every file and make it durable, with ``dirs``' entries, all at once.

    One batch instead of :func:`write_durable` and :func:`sync_dir` call by call: local
    files are written, then every fsync runs concurrently; objects are PUT concurrently.
    ``synced_too`` are local files written earlier without an fsync: they are fsync'd
    in the same batch (an object was durable once its PUT was acknowledged). On return
    everything is durable; on error some of it may not be.
    """
    raw = {loc: d.encode("utf-8") if isinstance(d, str) else d for loc, d in files.items()}
    local = {loc: d for loc, d in raw.items() if isinstance(loc, Path)}
    _local.write_all_durable(
        local,
        [d for d in dirs if isinstance(d, Path)],
        synced_too=[f for f in synced_too if isinstance(f, Path)],
    )
    objects = [(loc, d) for loc, d in raw.items() if not isinstance(loc, Path)]
    if objects:
        with ThreadPoolExecutor(min(16, len(objects))) as pool:
            for done in [pool.submit(loc.write_bytes, d) for loc, d in objects]:
                done.result()


def sync_dir(loc: Location) -> None:
    """Make a local directory's entries durable; object stores need nothing."""
    if isinstance(loc, Path):
        _local.fsync_dir(loc)


def remove_tree(loc: Location) -> None:
    """Delete a directory (or every object under a prefix)."""
    if isinstance(loc, Path):
        _local.remove_tree(loc)
    else:
        loc.remove_tree()


def glob(loc: Location, pattern: str) -> list[Location]:
    """The entries right under ``loc`` whose name matches ``pattern``, sorted by name."""
    found: list[Location] = list(loc.glob(pattern))
    return sorted(found, key=lambda p: p.name)


def kvstore_spec(loc: Location) -> dict[str, Any]:
    """The tensorstore kvstore spec of a directory (its ``path`` ends in ``/``)."""
    if isinstance(loc, Path):
        return {"driver": "file", "path": f"{os.path.abspath(loc)}/"}
    return loc.kvstore_spec()
