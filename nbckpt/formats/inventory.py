"""Classify every entry of a checkpoint root: complete, in progress, abandoned, corrupt, foreign.

The sidebar of the JupyterLab extension shows this classification, and fsck reuses it.
Completeness itself is decided by :func:`nbckpt.formats.layout.is_complete` alone; this module
only adds what a person wants to know about everything else under the root:

``complete``
    :func:`~nbckpt.formats.layout.is_complete` holds, the metadata is readable, and every array
    leaf it lists has its zarr array (a ``.zarray`` file) on disk, or is packed and
    the step has its packs.
``corrupt``
    Named like a complete step (a ``<step>`` directory with the commit file, or with
    rename-mode metadata) but its metadata is unreadable or an array is missing; or an
    uncommitted-looking entry whose save's journal says it committed (its commit file
    was removed, its records edited): it needs attention and is never cleaned.
``in_progress``
    A temporary entry (``<step>.nbckpt-tmp``, or a commit-file-mode ``<step>``
    directory without its commit file) whose save is still running according to the
    journal, and whose newest journal event is recent.
``abandoned``
    A temporary entry whose save failed, went stale or left no journal, and any
    ``<step>.nbckpt-deleting`` directory (a removal that did not finish). Only these
    may be cleaned.
``foreign``
    A ``<step>``-named directory that nbckpt did not create (no owner record, no
    nbckpt metadata): listed so the user sees it, never written, cleaned or deleted.
    Orbax's unfinished saves (a step without its commit record, an
    ``<step>.orbax-checkpoint-tmp-<t>`` directory) are foreign too: Orbax cleans them.

Orbax's steps (:mod:`nbckpt.formats.orbax`) are listed with ``format="orbax"``:
``complete`` by Orbax's completion rule, and ``corrupt`` only when Orbax's own records
in them cannot be read. They are never cleaned. Other names under the root (the
``.nbckpt`` state directory, stray files) are not entries. Nothing here needs jax, and
nothing here writes.

A root may be local or in an object store (``s3://`` or ``gs://bucket/prefix``, see
:mod:`nbckpt.storage`); entries are classified the same way. An object store lists
keys without sizes or times, so there an entry's ``bytes`` is None (unknown) and its
``time`` comes from its metadata only. A request the store fails raises
:class:`~nbckpt.errors.StorageError`: it never makes an entry look absent or damaged.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from nbckpt import storage
from nbckpt.formats import orbax as _orbax
from nbckpt.formats.layout import (
    COMMIT_FILE,
    DELETING_SUFFIX,
    METADATA_FILE,
    TMP_SUFFIX,
    StepFormat,
    entry_state,
    is_complete,
    parse_step,
    read_metadata,
    read_owner,
    step_format,
)
from nbckpt.formats.orbax_names import OCDBT_MANIFEST
from nbckpt.formats.orbax_write import ORBAX_ARRAYS
from nbckpt.formats.packs import PACK_DIR, is_packed
from nbckpt.formats.saveops import SaveOps, find_save_op, journal_committed, own_op
from nbckpt.journal import OperationRecord, failure_of
from nbckpt.protocol import COMMIT_FILE_MODE, RENAME, Status

__all__ = [
    "STALE_AFTER_S",
    "STATES",
    "Entry",
    "State",
    "classify",
    "existing_root",
    "find_save_op",
    "journal_committed",
    "list_steps",
]

State = Literal["complete", "in_progress", "abandoned", "corrupt", "foreign"]

#: Every state an entry can be in.
STATES: tuple[State, ...] = ("complete", "in_progress", "abandoned", "corrupt", "foreign")

#: A running save whose newest journal event is older than this (seconds) is abandoned.
STALE_AFTER_S = 600.0


@dataclass(frozen=True)
class Entry:
    """One entry of a checkpoint root.

    Attributes
    ----------
    step
        The step the entry stands for.
    path
        The entry's name, relative to the root (``"20"``, ``"30.nbckpt-tmp"``).
    state
        One of :data:`STATES`.
    reason
        One line saying why the entry has this state.
    bytes
        Total size of the files under the entry (apparent sizes); None in an object
        store, whose listing gives no sizes (summing them would cost a request per
        object).
    time
        When the step was finalized (from its metadata), else the entry's mtime (0.0
        in an object store, which records no times for a prefix).
    process_count
        The number of processes of the save, from the metadata or the journal.
    op
        The id of the save's journal operation, if the root has its journal.
    mode
        ``"rename"`` or ``"commit_file"`` when known, ``None`` otherwise.
    format
        Who wrote the entry: ``"nbckpt"``, ``"orbax"``, or ``None`` for a directory
        of neither kind.
    """

    step: int
    path: str
    state: State
    reason: str
    bytes: int | None
    time: float
    process_count: int | None
    op: str | None
    mode: str | None
    format: StepFormat | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict of the entry."""
        return asdict(self)


def classify(
    root: str | os.PathLike[str] | storage.Location,
    *,
    now: float | None = None,
    stale_after_s: float = STALE_AFTER_S,
) -> list[Entry]:
    """Classify every step-like entry under ``root``.

    Parameters
    ----------
    root
        The checkpoint root: a path, a URL or a location. A missing root (or a prefix
        with no objects) has no entries.
    now
        The wall time to judge staleness against (default: the current time).
    stale_after_s
        A temporary entry whose running save has recorded nothing for this long is
        abandoned.

    Returns
    -------
    list of Entry
        Sorted by step, then by path.

    Raises
    ------
    StorageError
        The root's store failed a request.
    """
    now = time.time() if now is None else now
    where = storage.location(root)
    names = _subdir_names(where)
    if names is None:
        return []
    ops = SaveOps(where)
    entries = []
    for name in names:
        entry = _classify_one(where, name, ops, now, stale_after_s)
        if entry is not None:
            entries.append(entry)
    return sorted(entries, key=lambda e: (e.step, e.path))


def _subdir_names(root: storage.Location) -> list[str] | None:
    """The names of a root's subdirectories (symlinks not followed); None if it is missing.

    On an object store, the prefixes one level below the root, from one listing (there
    are no links); a root with no objects has none.
    """
    if not isinstance(root, Path):
        return sorted({k.split("/", 1)[0] for k in root.list_keys() if "/" in k})
    try:
        return [e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return None


def existing_root(root: str | os.PathLike[str] | storage.Location) -> storage.Location:
    """Return ``root`` as an absolute location; raise FileNotFoundError if it is no directory.

    A local root must be an existing directory. An object-store root (a URL or an
    :class:`~nbckpt.storage.ObjectPath`) is accepted as it is: a prefix exists only
    while objects lie under it, so one without objects is an empty root, not an error.
    (A missing bucket or an unreachable store shows as a
    :class:`~nbckpt.errors.StorageError` once the root is listed.)
    """
    if isinstance(root, storage.ObjectPath) or (isinstance(root, str) and storage.is_url(root)):
        where = storage.location(root)  # file:///… is a local path, checked below
        if not isinstance(where, Path):
            return where
        path = where
    else:
        path = Path(root).absolute()
    if not path.is_dir():
        raise FileNotFoundError(f"no directory {path}; check the path, or save there first")
    return path


def list_steps(root: str | os.PathLike[str] | storage.Location) -> list[dict[str, Any]]:
    """List every entry of a root with its state and format, as rows for ``%ckpt_ls``.

    Raises
    ------
    FileNotFoundError
        If ``root`` is a local path that is not a directory.
    StorageError
        If the root's store failed a request.
    """
    path = existing_root(root)
    return [
        {
            "step": e.step,
            "state": e.state,
            "path": str(path / e.path),
            "reason": e.reason,
            "format": e.format,
        }
        for e in classify(path)
    ]


def _classify_one(
    root: storage.Location, name: str, ops: SaveOps, now: float, stale_after_s: float
) -> Entry | None:
    path = root / name
    for suffix, is_deleting in ((TMP_SUFFIX, False), (DELETING_SUFFIX, True)):
        if name.endswith(suffix):
            step = parse_step(name.removesuffix(suffix))
            if step is None:
                return None
            if is_deleting:
                reason = "a removal that did not finish"
                return _entry(path, step, "abandoned", reason, None, format="nbckpt")
            return _temporary(path, step, RENAME, ops, now, stale_after_s)
    orbax_final = _orbax.tmp_target(name)
    if orbax_final is not None:
        step = parse_step(orbax_final)
        if step is None:
            return None
        reason = "an Orbax save's temporary directory (Orbax cleans it): left alone"
        return _entry(path, step, "foreign", reason, None, format="orbax")
    step = parse_step(name)
    if step is None:
        return None
    kind = step_format(path)
    if kind == "orbax":
        return _orbax_entry(path, step)
    if kind is None:
        reason = f"{_orbax.describe_unknown(path)}; not created by nbckpt: left alone"
        return _entry(path, step, "foreign", reason, None)
    state = entry_state(path)
    if state == "foreign":
        return _entry(path, step, "foreign", "not created by nbckpt: left alone", None)
    if state == "incomplete":
        return _temporary(path, step, COMMIT_FILE_MODE, ops, now, stale_after_s)
    meta = read_metadata(path)
    mode = COMMIT_FILE_MODE if (path / COMMIT_FILE).is_file() else RENAME
    op = _metadata_op(meta, ops) or ops.newest(step)
    if meta is None:
        reason = f"{METADATA_FILE} is missing or unreadable"
        return _entry(path, step, "corrupt", reason, op, mode=mode, format="nbckpt")
    missing = _missing_arrays(path, meta)
    count = meta.get("process_count")
    fields: dict[str, Any] = {
        "format": "nbckpt",
        "mode": mode,
        "process_count": count if isinstance(count, int) else None,
        "time": _float_or_none(meta.get("time_finalized")),
    }
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        reason = f"array {missing[0]!r}{more} missing"
        return _entry(path, step, "corrupt", reason, op, **fields)
    return _entry(path, step, "complete", Status.COMMITTED, op, **fields)


def _orbax_entry(path: storage.Location, step: int) -> Entry:
    """Classify a step directory Orbax wrote: complete, unfinished (foreign) or damaged."""
    found = _orbax.describe(path)
    if found is None:  # it changed under us: say what is there now
        return _entry(path, step, "foreign", _orbax.describe_unknown(path), None)
    fields: dict[str, Any] = {
        "format": "orbax",
        "process_count": found.process_count,
        "time": found.time,
    }
    if found.state == "incomplete":
        reason = f"{found.reason}: not listed as a step, left alone"
        return _entry(path, step, "foreign", reason, None, **fields)
    return _entry(path, step, found.state, found.reason, None, **fields)


def _temporary(
    path: storage.Location, step: int, mode: str, ops: SaveOps, now: float, stale_after_s: float
) -> Entry:
    """Classify an entry a save writes into before it commits."""
    owner = read_owner(path) or {}
    claimed, since = owner.get("op"), owner.get("time")
    if isinstance(claimed, str) and isinstance(since, int | float) and not ops.exists(claimed):
        # Claimed in a save's preflight, whose journal starts a moment later.
        if now - since <= stale_after_s:
            return _entry(path, step, "in_progress", "claimed", claimed, mode=mode, format="nbckpt")
        reason = f"claimed {now - since:.0f} s ago by a save that journaled nothing"
        return _entry(path, step, "abandoned", reason, claimed, mode=mode, format="nbckpt")
    op = own_op(path, step, ops)
    if op is None:
        return _entry(
            path, step, "abandoned", "no journal for this save", None, mode=mode, format="nbckpt"
        )
    rec = ops.record(op)
    count = rec.process_count
    if journal_committed(rec) and (
        mode == COMMIT_FILE_MODE or not is_complete(path.parent / str(step))
    ):
        # The journal says this save committed, yet its record of completion is gone
        # (a commit file removed by hand, a rename that never landed): the data here
        # may be the step's only copy.
        missing = COMMIT_FILE if mode == COMMIT_FILE_MODE else f"step {step}"
        reason = (
            f"its save {op} committed according to the journal, but {missing} is "
            "missing: needs attention (check the data, restore its record), never cleaned"
        )
        return _entry(
            path, step, "corrupt", reason, op, mode=mode, process_count=count, format="nbckpt"
        )
    if rec.status != Status.RUNNING:
        reason = f"its save {rec.status}" + _first_error(rec)
        return _entry(
            path, step, "abandoned", reason, op, mode=mode, process_count=count, format="nbckpt"
        )
    last = max(
        (float(e.get("t", 0.0)) for p in rec.processes.values() for e in p.events), default=0
    )
    if now - last > stale_after_s:
        reason = f"its save recorded nothing for {now - last:.0f} s"
        return _entry(
            path, step, "abandoned", reason, op, mode=mode, process_count=count, format="nbckpt"
        )
    return _entry(
        path, step, "in_progress", "saving", op, mode=mode, process_count=count, format="nbckpt"
    )


def _first_error(rec: OperationRecord) -> str:
    """The failure, its culprit first (a survivor that gave up is not named as its cause)."""
    account = failure_of(rec)
    return account.clause if account is not None else ""


def _metadata_op(meta: dict[str, Any] | None, ops: SaveOps) -> str | None:
    op = meta.get("op") if meta else None
    return op if isinstance(op, str) and ops.exists(op) else None


def _missing_arrays(path: storage.Location, meta: dict[str, Any]) -> list[str]:
    leaves = meta.get("leaves")
    if not isinstance(leaves, list):
        return ["(leaf list)"]
    if meta.get("arrays") == ORBAX_ARRAYS:
        # One OCDBT database holds every array: its leaves cannot be listed without
        # reading it (fsck --verify opens each one).
        return [] if (path / OCDBT_MANIFEST).is_file() else [f"(the OCDBT {OCDBT_MANIFEST})"]
    has_file = _file_test(path)
    missing = []
    packed = False
    for leaf in leaves:
        if not isinstance(leaf, dict) or leaf.get("kind") == "scalar":
            continue
        if is_packed(leaf):
            packed = True  # its bytes are in a pack (fsck --verify reads them)
            continue
        name = str(leaf.get("name", ""))
        if not name or not has_file(f"{name}/.zarray"):
            missing.append(name)
    if packed and not has_file(PACK_DIR + "/"):
        missing.append(f"(the packs in {PACK_DIR})")
    return missing


def _file_test(path: storage.Location) -> Callable[[str], bool]:
    """Return a test of whether a file (a relative ``/``-separated name) is under ``path``.

    Locally each name is looked up; in an object store the prefix is listed once, rather
    than once per name. A name ending in ``/`` asks for a folder holding some file.
    """
    if isinstance(path, Path):
        return lambda rel: (
            any(p.is_file() for p in (path / rel).glob("*"))
            if rel.endswith("/")
            else (path / rel).is_file()
        )
    keys = set(path.list_keys())
    return lambda rel: (
        any(k.startswith(rel) for k in keys)
        if rel.endswith("/")
        else "/".join(p for p in rel.split("/") if p) in keys
    )


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _entry(
    path: storage.Location,
    step: int,
    state: State,
    reason: str,
    op: str | None,
    *,
    mode: str | None = None,
    process_count: int | None = None,
    time: float | None = None,
    format: StepFormat | None = None,
) -> Entry:
    mtime = 0.0
    size: int | None = None
    if isinstance(path, Path):  # an object store lists neither times nor sizes
        try:
            mtime = path.stat().st_mtime
        except OSError:
            mtime = 0.0
        size = sum(_file_sizes(path))
    return Entry(
        step=step,
        path=path.name,
        state=state,
        reason=reason,
        bytes=size,
        time=time if time is not None else mtime,
        process_count=process_count,
        op=op,
        mode=mode,
        format=format,
    )


def _file_sizes(path: Path) -> Iterator[int]:
    # A save or a removal may delete files while we walk: skip what vanished.
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                yield os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                continue
