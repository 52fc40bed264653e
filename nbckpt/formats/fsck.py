"""fsck: check every entry of a checkpoint root, and clean what was abandoned.

Classification comes from :mod:`nbckpt.formats.inventory` (complete, in progress, abandoned,
corrupt, foreign). ``verify`` goes further for complete steps: it opens every array,
compares its shape and dtype with the metadata, and recomputes the checksum (CRC-32C,
or CRC-32 for older steps) of every chunk that the saving processes recorded in
``<step>/_CHECKSUMS``. For an Orbax step it checks what can be checked: that Orbax's
records parse, that every array opens, and (where the save stored every chunk,
``store_array_data_equal_to_fill_value``) that every chunk is there and decodes; Orbax
records no checksums, so its data is not verified, and the report says so. ``clean``
removes abandoned entries only; a complete or corrupt step, a step whose journal says
its save committed (even if its commit file is gone: it is reported as corrupt, needing
attention), and anything nbckpt did not create (a ``foreign`` entry, Orbax's steps
included), is never touched.

A root may be local or in an object store (``s3://`` or ``gs://bucket/prefix``, see
:mod:`nbckpt.storage`). A request the store fails raises
:class:`~nbckpt.errors.StorageError`: it never makes a step look corrupt or absent.
"""

from __future__ import annotations

import math
import os
import shutil
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nbckpt import storage
from nbckpt.errors import StorageError
from nbckpt.formats import orbax as _orbax
from nbckpt.formats.inventory import STALE_AFTER_S, STATES, Entry, classify, existing_root
from nbckpt.formats.layout import DELETING_SUFFIX, read_metadata, remove_aside

__all__ = ["ORBAX_NOT_VERIFIED", "FsckReport", "fsck", "verify_orbax_step", "verify_step"]

#: What a verified Orbax step's line ends with: the check nbckpt cannot make.
ORBAX_NOT_VERIFIED = "Orbax records no chunk checksums; not verified"

#: Reads fsck keeps in flight per Orbax array while it checks that every chunk is there.
_IN_FLIGHT = 16


@dataclass
class FsckReport:
    """What fsck found under a root, and what it removed."""

    root: str
    entries: list[Entry] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def by_state(self, state: str) -> list[Entry]:
        """The entries in ``state``."""
        return [e for e in self.entries if e.state == state]

    def table(self) -> str:
        """A text table: one line per entry, then one summary line."""
        lines = [f"fsck {self.root}"]
        for e in self.entries:
            gone = "  (removed)" if e.path in self.removed else ""
            lines.append(f"{e.path:>24}  {e.state:<11}  {e.reason}{gone}")
        counts = ", ".join(f"{len(self.by_state(s))} {s.replace('_', ' ')}" for s in STATES)
        lines.append(f"{counts}; removed {len(self.removed)}")
        return "\n".join(lines)


def verify_step(step_path: str | os.PathLike[str] | storage.Location) -> list[str]:
    """Check a complete step's arrays against its metadata and recorded checksums.

    Every chunk is read and its checksum (CRC-32C, or zlib CRC-32 for steps saved
    before CRC-32C; :mod:`nbckpt.formats.checksum`) compared with the one recorded at save
    time. A chunk file that is missing is reported as such, not read as zeros.

    Returns
    -------
    list of str
        One line per problem; empty when everything matches.

    Raises
    ------
    StorageError
        The store failed to read the step's records (not a problem of the step).
    """
    import numpy as np

    from nbckpt.engine.arrays.zarr import chunk_key, chunk_regions
    from nbckpt.engine.restore.sources import source_for
    from nbckpt.formats.checksum import matches, read_checksums
    from nbckpt.formats.packs import PackIndex

    path = storage.location(step_path)
    meta = read_metadata(path)
    if meta is None:
        return ["metadata missing or unreadable"]
    packs: PackIndex = {}
    try:
        sums = read_checksums(path, packs) or {}
    except StorageError:
        raise
    except (OSError, ValueError) as e:
        return [f"checksums unreadable: {e}"]
    try:
        source = source_for(path, meta, packs)
    except ValueError as e:
        return [str(e)]
    problems = []
    for leaf in meta.get("leaves", []):
        if leaf["kind"] == "scalar":
            continue
        name = leaf["name"]
        try:
            store = source.open(name).result()
        except Exception as e:  # tensorstore raises ValueError for most I/O problems
            problems.append(f"{name}: cannot open ({getattr(e, 'detail', e)})")
            continue
        dtype = store.dtype.numpy_dtype
        if list(store.shape) != list(leaf["shape"]) or dtype != np.dtype(leaf["dtype"]):
            problems.append(
                f"{name}: shape/dtype {list(store.shape)}/{dtype} on disk, "
                f"{leaf['shape']}/{leaf['dtype']} in the metadata"
            )
            continue
        recorded = sums.get(name, {})
        # A leaf without elements has no chunks, so no checksums either.
        if not recorded and math.prod(leaf["shape"]) > 0:
            problems.append(f"{name}: no checksums recorded")
            continue
        whole = tuple(slice(0, d) for d in leaf["shape"])
        seen = set()
        for region, _local in chunk_regions(whole, leaf["shape"], leaf["chunks"]):
            key = chunk_key(region, leaf["chunks"])
            seen.add(key)
            if key not in recorded:
                problems.append(f"{name}: chunk {key} has no recorded checksum")
                continue
            try:
                data = store[region].read().result()
            except Exception as e:
                missing = str(e).startswith("NOT_FOUND")
                problems.append(
                    f"{name}: chunk {key} " + ("missing" if missing else f"unreadable ({e})")
                )
                continue
            algorithm, expected = recorded[key]
            try:
                if not matches(data, algorithm, expected):
                    problems.append(f"{name}: chunk {key} does not match its checksum")
            except ImportError as e:
                return [*problems, f"cannot verify: {e}"]
        extra = set(recorded) - seen
        if extra:
            problems.append(f"{name}: checksums for unknown chunks {sorted(extra)[:3]}")
    return problems


def verify_orbax_step(
    step_path: str | os.PathLike[str] | storage.Location,
) -> tuple[list[str], str]:
    """Check what can be checked of an Orbax step: records, arrays, chunks.

    Orbax's records must parse; every array of every pytree item must open; and where
    the save stored every chunk (``store_array_data_equal_to_fill_value``), every chunk
    is read, a write chunk at a time, so that a missing or undecodable one is found.
    The values cannot be verified: Orbax records no checksums.

    Returns
    -------
    tuple of (list of str, str)
        One line per problem (empty when nothing was found), and one line saying what
        was checked and what was not.
    """
    from nbckpt.engine.arrays.orbax_arrays import open_orbax_array_async

    path = storage.location(step_path)
    step = _orbax.describe(path)
    if step is None:
        return [_orbax.describe_unknown(path)], ORBAX_NOT_VERIFIED
    if step.state != "complete":
        return [step.reason], ORBAX_NOT_VERIFIED
    problems: list[str] = []
    chunks_checked = True
    arrays = 0
    for item in step.pytree_items():
        tree = item.tree
        if tree is None:  # describe() reports an unreadable tree as corrupt
            continue
        prefix = f"{item.name}/" if item.name is not None else ""
        chunks_checked = chunks_checked and tree.store_equal_to_fill
        for leaf in tree.leaves:
            if not leaf.is_array:
                continue
            arrays += 1
            opening = open_orbax_array_async(
                item.directory,
                leaf.name,
                ocdbt=tree.ocdbt,
                zarr3=tree.zarr3,
                fill_missing=not tree.store_equal_to_fill,
            )
            try:
                store = opening.result()
            except Exception as e:  # tensorstore raises ValueError for most I/O problems
                problems.append(f"{prefix}{leaf.name}: cannot open ({e})")
                continue
            if tree.store_equal_to_fill:
                problems.extend(f"{prefix}{leaf.name}: {p}" for p in _read_every_chunk(store))
    checked = f"Orbax records parse, {arrays} arrays open"
    if chunks_checked:
        checked += ", every chunk is there"
    else:
        checked += (
            "; missing chunks cannot be told from fill values (saved without "
            "store_array_data_equal_to_fill_value)"
        )
    return problems, f"{checked}; {ORBAX_NOT_VERIFIED}"


def _read_every_chunk(store: Any) -> list[str]:
    """Read an array a write chunk at a time; return the chunks that fail, as lines."""
    import itertools

    shape = [int(s) for s in store.shape]
    grid = store.chunk_layout.write_chunk.shape or shape
    step = [max(1, int(c or d)) for c, d in zip(grid, shape, strict=True)]
    starts = itertools.product(*(range(0, d, c) for d, c in zip(shape, step, strict=True)))
    problems: list[str] = []
    pending: list[tuple[tuple[int, ...], Any]] = []

    def settle(limit: int) -> None:
        while len(pending) > limit:
            origin, future = pending.pop(0)
            try:
                future.result()
            except Exception as e:
                missing = str(e).startswith("NOT_FOUND")
                what = "missing" if missing else f"unreadable ({e})"
                problems.append(f"chunk at {list(origin)} {what}")

    for origin in starts:
        region = tuple(slice(o, min(o + c, d)) for o, c, d in zip(origin, step, shape, strict=True))
        pending.append((origin, store[region].read()))
        settle(_IN_FLIGHT)
    settle(0)
    return problems


def fsck(
    root: str | os.PathLike[str] | storage.Location,
    *,
    clean: bool = False,
    verify: bool = False,
    stale_after_s: float = STALE_AFTER_S,
) -> FsckReport:
    """Classify every entry of ``root``; optionally verify complete steps and clean.

    Parameters
    ----------
    root
        The checkpoint root: a path, or an object-store URL (``s3://`` or ``gs://bucket/prefix``).
    clean
        Remove the abandoned entries (and only those). Locally each is first renamed
        aside, then deleted. An object store has no rename: its commit object is
        deleted first (so what is left is never taken for a complete step), then every
        object under it.
    verify
        Read every array of every complete step and check shapes, dtypes and chunk
        checksums; a step that fails becomes ``corrupt``. An Orbax step is checked as
        far as it can be (see :func:`verify_orbax_step`), and its line says that its
        data is not verified.
    stale_after_s
        A save whose journal has been silent this long counts as abandoned; pass 0
        when you know no process of that job is alive.

    Raises
    ------
    FileNotFoundError
        If ``root`` is a local path that is not a directory.
    StorageError
        If the root's store failed a request.
    """
    path = existing_root(root)
    report = FsckReport(root=str(path))
    for entry in classify(path, stale_after_s=stale_after_s):
        if verify and entry.state == "complete" and entry.format == "orbax":
            problems, checked = verify_orbax_step(path / entry.path)
            if problems:
                more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
                entry = replace(entry, state="corrupt", reason=problems[0] + more)
            else:
                entry = replace(entry, reason=f"Orbax step: {checked}")
        elif verify and entry.state == "complete":
            problems = verify_step(path / entry.path)
            if problems:
                more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
                entry = replace(entry, state="corrupt", reason=problems[0] + more)
        report.entries.append(entry)
    if clean:
        for entry in report.by_state("abandoned"):
            if _remove(path, entry.path):
                report.removed.append(entry.path)
    return report


def _remove(root: storage.Location, name: str) -> bool:
    """Delete the abandoned entry ``name`` of ``root``; False if it was already gone."""
    target = root / name
    if isinstance(root, Path) and isinstance(target, Path):
        # Move it out of the way atomically first: if its save were still alive and
        # finalizing, either its rename or ours fails, and a committed step is never
        # half removed.
        doomed = root / f".{name}.{uuid.uuid4().hex[:8]}{DELETING_SUFFIX}"
        try:
            os.rename(target, doomed)
        except FileNotFoundError:
            return False
        shutil.rmtree(doomed)
        return True
    # No rename in an object store: remove_aside deletes what makes a step complete
    # first, so a removal cut short never leaves something that reads as complete.
    if not target.is_dir():
        return False
    remove_aside(target)
    return True
