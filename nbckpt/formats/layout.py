"""The on-disk layout of a checkpoint root, and the one rule for what is complete.

A root holds::

    <root>/<step>/                    a step (complete, see below)
    <root>/<step>/_NBCKPT_OWNER       written first by the save that claimed the directory
                                      (its op, host, pid, time: see nbckpt.engine.save.ownership)
    <root>/<step>/_NBCKPT_METADATA    nbckpt's metadata: leaves, mode, op, processes, times
    <root>/<step>/_METADATA, _sharding   Orbax's tree metadata, so Orbax can restore the step
    <root>/<step>/_CHECKSUMS/         checksum of every chunk, one file per process
    <root>/<step>.nbckpt-tmp/         a save in progress, or one that was abandoned
    <root>/<step>.nbckpt-deleting/    a step being removed by retention
    <root>/.nbckpt/ops/<op>/process_<i>.jsonl   the journal of every operation

A root may also hold Orbax's steps (``<root>/<step>/`` with Orbax's
``_CHECKPOINT_METADATA`` and ``commit_success.txt``, see :mod:`nbckpt.formats.orbax`),
which nbckpt lists and restores but never writes. :func:`step_format` says which kind a
directory is, by the records in it, through the registry of layouts
(:mod:`nbckpt.formats.registry`): nbckpt's own first (the owner file, or nbckpt
metadata), then Orbax's. nbckpt's records themselves, their names and readers, are
:mod:`nbckpt.formats.records` (re-exported here).

An nbckpt ``<step>`` directory is complete if and only if it holds the commit-success
file (commit-file mode) or metadata that says it was finalized by rename (rename mode:
the directory only gets its final name once everything in it is durable); an Orbax one
by the completion rule of :mod:`nbckpt.formats.orbax`. A directory of neither kind is
never complete. Everything that lists steps (``all_steps``, restore, the server) goes
through :func:`is_complete`.

What nbckpt may touch is decided by :func:`entry_state`: a directory is nbckpt's own
only when its records say so (the owner file, or nbckpt metadata); anything else under
the root, Orbax's steps included, is *foreign* and is never written over, cleaned or
deleted. Damage to a committed step makes it *corrupt*, which is reported and never
cleaned either. This module needs neither jax nor tensorstore.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from nbckpt import storage
from nbckpt.formats.records import (
    CHECKSUMS_DIR,
    COMMIT_FILE,
    DELETING_SUFFIX,
    FORMAT,
    LEGACY_METADATA_FILE,
    METADATA_FILE,
    OWNER_FILE,
    STATE_DIR,
    TMP_SUFFIX,
    Where,
    fsync_dir,
    metadata_path,
    ops_dir,
    parse_step,
    read_metadata,
    read_owner,
    step_dir,
    tmp_dir,
    write_durable,
    write_owner,
)
from nbckpt.formats.registry import StepFormat, layout_of
from nbckpt.protocol import COMMIT_FILE_MODE, RENAME, Mode
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
    "EntryState",
    "Mode",
    "StepFormat",
    "StepState",
    "Where",
    "all_steps",
    "entry_state",
    "fsync_dir",
    "is_complete",
    "latest_step",
    "metadata_path",
    "ops_dir",
    "parse_step",
    "read_metadata",
    "read_owner",
    "remove_aside",
    "seal_tree",
    "step_dir",
    "step_format",
    "tmp_dir",
    "write_durable",
    "write_owner",
]

#: What a ``<step>`` directory is, by the records in it (see :func:`entry_state`). The
#: inventory's richer classification of a whole root is
#: :data:`nbckpt.formats.inventory.State`.
StepState = Literal["complete", "corrupt", "incomplete", "foreign"]
#: The old name of :data:`StepState`, kept for one release.
EntryState = StepState


def entry_state(path: Where) -> StepState:
    """Say what a ``<root>/<step>`` directory is, from the records in it.

    Returns
    -------
    str
        ``"complete"`` (see :func:`is_complete`); ``"corrupt"``: it was committed (a
        commit file, or a rename-mode owner record: such a directory only gets its
        final name once finalized) but its metadata is damaged; ``"incomplete"``: a
        save of nbckpt's wrote it and never committed it (commit-file mode); or
        ``"foreign"``: nothing shows nbckpt created it (an Orbax step, complete or
        not, is foreign too: see :func:`step_format`), so nbckpt never touches it.
        A directory with unreadable metadata and no owner record (saved before owner
        records existed) counts as corrupt, the cautious reading.
    """
    p = storage.location(path)
    if step_format(p) != "nbckpt":
        return "foreign"  # Orbax's step, or nobody's: never nbckpt's to touch
    if is_complete(p):
        return "corrupt" if read_metadata(p) is None else "complete"
    owner = read_owner(p)
    if owner is not None:
        return "corrupt" if owner.get("mode") == RENAME else "incomplete"
    meta = read_metadata(p)
    if meta is not None:
        ours = meta.get("format") == FORMAT and meta.get("mode") == COMMIT_FILE_MODE
        return "incomplete" if ours else "foreign"
    return "corrupt" if (p / METADATA_FILE).exists() else "foreign"


def is_complete(path: Where) -> bool:
    """Tell whether a step directory is a complete checkpoint.

    Parameters
    ----------
    path
        A ``<root>/<step>`` directory.

    Returns
    -------
    bool
        For an nbckpt step: True if the commit-success file exists, or the metadata
        records a rename-mode save (such a directory only exists once finalized). For
        an Orbax step: :func:`nbckpt.formats.orbax.is_complete`. A temporary directory,
        a commit-file-mode directory without its commit file, unreadable metadata
        without a commit file, or a directory of neither kind is never complete.
    """
    p = storage.location(path)
    if parse_step(p.name) is None:
        return False
    layout = layout_of(p)
    return layout is not None and layout.is_complete(p)


def step_format(path: Where) -> StepFormat | None:
    """Say who wrote a directory, by the records in it, whether complete or not.

    Returns
    -------
    str or None
        ``"nbckpt"`` if it holds nbckpt's owner record or nbckpt's metadata (also when
        that metadata is damaged, or when the step also carries Orbax's records so
        that Orbax can read it); else ``"orbax"`` if Orbax's records are in it (see
        :func:`nbckpt.formats.orbax.recognise`); else None. The registry of layouts
        (:func:`nbckpt.formats.registry.layout_of`) answers.
    """
    layout = layout_of(path)
    return None if layout is None else layout.name


def all_steps(root: Where) -> list[int]:
    """List the complete steps under ``root``, ascending.

    Parameters
    ----------
    root
        The checkpoint root. A missing root has no steps.

    Returns
    -------
    list of int
        Only complete steps (see :func:`is_complete`), nbckpt's and Orbax's (ask
        :func:`step_format` which is which); temporary, abandoned or half-deleted
        directories, and directories of neither kind, are never listed.
    """
    try:
        entries: list[Location] = list(storage.location(root).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    steps = []
    for entry in entries:
        step = parse_step(entry.name)
        if step is not None and is_complete(entry):
            steps.append(step)
    return sorted(steps)


def latest_step(root: Where) -> int | None:
    """Return the newest complete step under ``root``, or None if there is none."""
    steps = all_steps(root)
    return steps[-1] if steps else None


def remove_aside(path: Where) -> None:
    """Delete a directory of nbckpt's, never leaving it half removed under its name.

    Locally it is first renamed to ``<name>.nbckpt-deleting`` (out of every reader's
    view, atomically) and that is made durable; then it is removed. An object store
    cannot rename, so the record that makes the step complete is deleted first (the
    commit object; the metadata of a step that was renamed into place elsewhere and
    copied there): from then on no reader takes what is left for a complete step,
    while the owner record still marks it as nbckpt's to clean if the rest is not
    deleted. Then the rest is deleted.
    """
    p = storage.location(path)
    if not storage.can_rename(p):
        (p / COMMIT_FILE).unlink(missing_ok=True)
        meta = read_metadata(p)
        if meta is not None and meta.get("mode") == RENAME:
            metadata_path(p).unlink(missing_ok=True)
        storage.remove_tree(p)
        return
    doomed = p.with_name(f"{p.name}{DELETING_SUFFIX}")
    if doomed.exists():
        storage.remove_tree(doomed)  # a removal of ours that did not finish
    assert isinstance(p, Path) and isinstance(doomed, Path)
    os.rename(p, doomed)
    fsync_dir(p.parent)
    storage.remove_tree(doomed)


def seal_tree(path: Where, files: dict[str, str], written: Sequence[Location] = ()) -> None:
    """Write ``files`` (name -> text) into ``path`` and make the whole tree durable.

    The chunk files are fsync'd by their writers; this writes the last records, makes
    ``written`` (files already under ``path`` that are not durable yet) durable, and
    every directory entry under ``path`` too, so a rename that publishes the tree never
    points at missing names. All of it is one batch
    (:func:`nbckpt.storage.write_all_durable`): the fsyncs run at once, not one after
    the other. Object stores have no directory entries, and acknowledge every write:
    there only the files are written.
    """
    p = storage.location(path)
    dirs: list[Location] = []
    if isinstance(p, Path):
        dirs = [Path(d) for d, _subdirs, _files in os.walk(p)]
    storage.write_all_durable(
        {p / name: text for name, text in files.items()}, dirs, synced_too=written
    )
