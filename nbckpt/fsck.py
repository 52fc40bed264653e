"""fsck: check every entry of a checkpoint root, and clean what was abandoned.

Classification comes from :mod:`nbckpt.inventory` (complete, in progress, abandoned,
corrupt, foreign). ``verify`` goes further for complete steps: it opens every array,
compares its shape and dtype with the metadata, and recomputes the checksum (CRC-32C,
or CRC-32 for older steps) of every chunk that the saving processes recorded in
``<step>/_CHECKSUMS``. ``clean`` removes abandoned
entries only; a complete or corrupt step, and anything nbckpt did not create (a
``foreign`` entry), is never touched.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from nbckpt.inventory import STALE_AFTER_S, STATES, Entry, classify, existing_root
from nbckpt.layout import DELETING_SUFFIX, read_metadata

__all__ = ["FsckReport", "fsck", "verify_step"]


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


def verify_step(step_path: str | os.PathLike[str]) -> list[str]:
    """Check a complete step's arrays against its metadata and recorded checksums.

    Every chunk is read and its checksum (CRC-32C, or zlib CRC-32 for steps saved
    before CRC-32C; :mod:`nbckpt.checksum`) compared with the one recorded at save
    time. A chunk file that is missing is reported as such, not read as zeros.

    Returns
    -------
    list of str
        One line per problem; empty when everything matches.
    """
    import numpy as np

    from nbckpt.checksum import checksum, read_checksums
    from nbckpt.engine.storage import open_array
    from nbckpt.engine.writer import chunk_key, chunk_regions

    path = Path(step_path)
    meta = read_metadata(path)
    if meta is None:
        return ["metadata missing or unreadable"]
    try:
        sums = read_checksums(path) or {}
    except (OSError, ValueError) as e:
        return [f"checksums unreadable: {e}"]
    problems = []
    for leaf in meta.get("leaves", []):
        if leaf["kind"] == "scalar":
            continue
        name = leaf["name"]
        try:
            store = open_array(path / name, fill_missing=False)
        except Exception as e:  # tensorstore raises ValueError for most I/O problems
            problems.append(f"{name}: cannot open ({e})")
            continue
        dtype = store.dtype.numpy_dtype
        if list(store.shape) != list(leaf["shape"]) or dtype != np.dtype(leaf["dtype"]):
            problems.append(
                f"{name}: shape/dtype {list(store.shape)}/{dtype} on disk, "
                f"{leaf['shape']}/{leaf['dtype']} in the metadata"
            )
            continue
        recorded = sums.get(name, {})
        if not recorded:
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
                if checksum(data, algorithm) != expected:
                    problems.append(f"{name}: chunk {key} does not match its checksum")
            except ImportError as e:
                return [*problems, f"cannot verify: {e}"]
        extra = set(recorded) - seen
        if extra:
            problems.append(f"{name}: checksums for unknown chunks {sorted(extra)[:3]}")
    return problems


def fsck(
    root: str | os.PathLike[str],
    *,
    clean: bool = False,
    verify: bool = False,
    stale_after_s: float = STALE_AFTER_S,
) -> FsckReport:
    """Classify every entry of ``root``; optionally verify complete steps and clean.

    Parameters
    ----------
    root
        The checkpoint root.
    clean
        Remove the abandoned entries (and only those).
    verify
        Read every array of every complete step and check shapes, dtypes and chunk
        checksums; a step that fails becomes ``corrupt``.
    stale_after_s
        A save whose journal has been silent this long counts as abandoned; pass 0
        when you know no process of that job is alive.

    Raises
    ------
    FileNotFoundError
        If ``root`` is not a directory.
    """
    path = existing_root(root)
    report = FsckReport(root=str(path))
    for entry in classify(path, stale_after_s=stale_after_s):
        if verify and entry.state == "complete":
            problems = verify_step(path / entry.path)
            if problems:
                more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
                entry = replace(entry, state="corrupt", reason=problems[0] + more)
        report.entries.append(entry)
    if clean:
        for entry in report.by_state("abandoned"):
            target = path / entry.path
            # Move it out of the way atomically first: if its save were still alive and
            # finalizing, either its rename or ours fails, and a committed step is never
            # half removed.
            doomed = path / f".{entry.path}.{uuid.uuid4().hex[:8]}{DELETING_SUFFIX}"
            try:
                os.rename(target, doomed)
            except FileNotFoundError:
                continue
            shutil.rmtree(doomed)
            report.removed.append(entry.path)
    return report
