"""Orbax's on-disk layout, read without jax or tensorstore: what an Orbax step holds.

Two shapes of directory come from Orbax (orbax-checkpoint 0.12)::

    <dir>/                         a pytree (StandardCheckpointer, PyTreeCheckpointer)
      _METADATA                    tree metadata: one entry per leaf, the array flags
      _CHECKPOINT_METADATA         Orbax's own: item handler, timestamps, metrics
      _sharding                    each jax.Array leaf's sharding
      commit_success.txt
      manifest.ocdbt, d/, ocdbt.process_<i>/   the arrays (OCDBT), or <name>/ per leaf
    <root>/<step>/                 a CheckpointManager step
      _CHECKPOINT_METADATA         with ``item_handlers``: one handler, or item -> handler
      commit_success.txt
      <item>/                      one directory per item (``default``, or named items);
                                   a pytree item as above, or another kind (JSON, ...)

and Orbax's temporary directories, ``<name>.orbax-checkpoint-tmp`` or
``<name>.orbax-checkpoint-tmp-<timestamp>``, which are never steps.

Completion rule. An Orbax directory (one that holds Orbax's records, see
:func:`recognise`) that is not a temporary one is complete if and only if

1. ``commit_success.txt`` is in it (Orbax writes it last where rename is not atomic,
   and since 0.12 before every rename too); or
2. its Orbax ``_CHECKPOINT_METADATA`` has a ``commit_timestamp_nsecs``: older Orbax
   only renamed the temporary directory, stamping the commit time just before.

Under rule 2 a step written in place (commit-file mode, object stores) whose save died
between stamping the time and writing the commit file would pass; Orbax itself never
leaves such a directory behind on a file system with atomic rename.

Every leaf of a pytree is named as Orbax names it: its keys joined by ``.``
(``params.w``, ``opt.0.mu``); its key path maps Orbax's key types to nbckpt's path
entries: a sequence key becomes ``("index", i)``, a dict key ``("key", k)``. Orbax
stores attribute keys as dict keys and every dict key as a string, so neither an
``("attr", name)`` entry nor an integer dict key comes back.

Every function takes a local path or a location (:mod:`nbckpt.storage`): an Orbax
step in ``s3://`` or ``gs://bucket/prefix`` is read the same way, with the store's listing standing
in for the directory's. A failing request to the store raises
:class:`~nbckpt.errors.StorageError`; it is never taken for an absent file.

Nothing here writes, and nothing here needs jax or tensorstore (an object store's
requests import tensorstore when made): the notebook kernel, the server and the engine
decide the same way.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from nbckpt import storage
from nbckpt.errors import StorageError
from nbckpt.formats.orbax_names import (
    CHECKPOINT_METADATA,
    COMMIT_SUCCESS,
    TMP_SUFFIX,
    TREE_METADATA,
)
from nbckpt.formats.orbax_tree import (
    ARRAY_TYPES,
    OrbaxFormatError,
    OrbaxLeaf,
    PathEntry,
    TreeMetadata,
    Where,
    leaf_name,
    process_count,
    read_shardings,
    read_strings,
    read_tree_metadata,
    tree_leaves,
)

__all__ = [
    "ARRAY_TYPES",
    "KIND",
    "ItemKind",
    "OrbaxFormatError",
    "OrbaxItem",
    "OrbaxLeaf",
    "OrbaxState",
    "OrbaxStep",
    "PathEntry",
    "TreeMetadata",
    "describe",
    "describe_unknown",
    "is_complete",
    "is_tmp_name",
    "leaf_name",
    "read_checkpoint_metadata",
    "read_shardings",
    "read_strings",
    "read_tree_metadata",
    "recognise",
    "tmp_target",
    "tree_leaves",
]


#: What :func:`nbckpt.formats.layout.step_format` calls a directory Orbax wrote.
KIND = "orbax"

OrbaxState = Literal["complete", "incomplete", "corrupt"]
#: ``"pytree"``: a tree of arrays nbckpt restores; ``"json"``: Orbax's JSON item;
#: ``"other"``: any other handler's item (listed, never read).
ItemKind = Literal["pytree", "json", "other"]

#: The first words of the commit file Orbax writes; nbckpt's holds an operation id.
_COMMIT_TEXT = "Checkpoint commit was successful"
#: Keys of Orbax's ``_CHECKPOINT_METADATA`` (metadata/checkpoint.py), any one of which
#: tells it from nbckpt's legacy file of that name (which has ``"format"``).
_STEP_METADATA_KEYS = frozenset(
    {"item_handlers", "init_timestamp_nsecs", "commit_timestamp_nsecs", "metrics"}
)
_TMP_NAME = re.compile(rf"^(?P<final>.+){re.escape(TMP_SUFFIX)}(?:-\d+)?$")
#: How many names :func:`describe_unknown` shows.
_SHOWN = 5


@dataclass(frozen=True)
class OrbaxItem:
    """One item of an Orbax step.

    Attributes
    ----------
    name
        The item's name (its directory), or None when the step directory is itself
        the pytree (a ``StandardCheckpointer`` save).
    directory
        Where its files are.
    kind
        See :data:`ItemKind`.
    handler
        Orbax's handler class for the item, where recorded.
    tree
        The tree metadata of a readable pytree item, else None.
    problem
        Why the item cannot be read, or None.
    """

    name: str | None
    directory: storage.Location
    kind: ItemKind
    handler: str | None
    tree: TreeMetadata | None
    problem: str | None

    @property
    def label(self) -> str:
        """The item's name for messages: its name, or ``"(pytree)"`` for a bare pytree."""
        return self.name if self.name is not None else "(pytree)"


@dataclass(frozen=True)
class OrbaxStep:
    """What :func:`describe` found in an Orbax directory.

    Attributes
    ----------
    path
        The directory.
    state
        ``"complete"`` (the completion rule of this module holds and every item's
        records parse), ``"incomplete"`` (a save that did not finish) or
        ``"corrupt"`` (complete, but Orbax's records are damaged or missing).
    reason
        One line saying what the directory holds, or what is wrong with it.
    items
        Its items, pytree or not, in name order.
    time
        The commit time from Orbax's metadata (seconds since the epoch), if recorded.
    process_count
        How many processes wrote the pytree arrays (from ``array_metadatas``), if known.
    kind
        Always ``"orbax"``.
    """

    path: storage.Location
    state: OrbaxState
    reason: str
    items: tuple[OrbaxItem, ...]
    time: float | None
    process_count: int | None
    kind: Literal["orbax"] = "orbax"

    @property
    def ocdbt(self) -> bool:
        """Whether any pytree item keeps its arrays in OCDBT."""
        return any(i.tree is not None and i.tree.ocdbt for i in self.items)

    @property
    def zarr3(self) -> bool:
        """Whether any pytree item keeps its arrays as zarr v3."""
        return any(i.tree is not None and i.tree.zarr3 for i in self.items)

    def pytree_items(self) -> list[OrbaxItem]:
        """The items that are pytrees (restorable by nbckpt)."""
        return [i for i in self.items if i.kind == "pytree"]

    def item(self, name: str | None = None) -> OrbaxItem:
        """Return the pytree item to restore.

        Parameters
        ----------
        name
            The item's name; None picks the only pytree item.

        Raises
        ------
        KeyError
            No item has that name (the message lists the items).
        ValueError
            ``name`` is None and the step has no pytree item, or several; or the named
            item is not a pytree; or the step directory is one pytree and ``name``
            was given.
        """
        pytrees = self.pytree_items()
        listing = _list_items(self.items)
        if name is None:
            if len(pytrees) == 1:
                return pytrees[0]
            if not pytrees:
                raise ValueError(
                    f"the Orbax step {self.path} holds no pytree item nbckpt can restore "
                    f"(items: {listing})"
                )
            names = ", ".join(repr(i.name) for i in pytrees)
            raise ValueError(
                f"the Orbax step {self.path} holds several pytree items ({names}); "
                "say which one to restore with item='<name>'"
            )
        if len(self.items) == 1 and self.items[0].name is None:
            raise ValueError(
                f"{self.path} is a single Orbax pytree, not a CheckpointManager step with "
                f"items; restore it without item= (got item={name!r})"
            )
        for it in self.items:
            if it.name == name:
                if it.kind != "pytree":
                    raise ValueError(
                        f"item {name!r} of the Orbax step {self.path} is not a pytree "
                        f"({it.handler or it.kind}); nbckpt restores pytree items only"
                    )
                return it
        raise KeyError(f"the Orbax step {self.path} has no item {name!r}; its items: {listing}")


def _list_items(items: tuple[OrbaxItem, ...]) -> str:
    if not items:
        return "none"
    return ", ".join(f"{i.label} ({i.kind})" for i in items)


def is_tmp_name(name: str) -> bool:
    """Tell whether a directory name is one of Orbax's temporary directories."""
    return _TMP_NAME.match(name) is not None


def tmp_target(name: str) -> str | None:
    """Return the final name an Orbax temporary directory stands for, or None.

    ``"7.orbax-checkpoint-tmp-1716"`` gives ``"7"``; a name that is no Orbax temporary
    directory gives None.
    """
    m = _TMP_NAME.match(name)
    return m.group("final") if m else None


def read_checkpoint_metadata(path: Where) -> dict[str, Any] | None:
    """Return Orbax's ``_CHECKPOINT_METADATA`` of a directory, or None.

    None when the file is absent, unreadable, or not Orbax's (nbckpt's own steps saved
    before 0.2 used that name for their metadata, with a ``format`` field).
    """
    data = storage.read_json(storage.location(path) / CHECKPOINT_METADATA)
    if not isinstance(data, dict) or "format" in data:
        return None
    return data if _STEP_METADATA_KEYS & data.keys() else None


def _has_tree_metadata(path: storage.Location) -> bool:
    data = storage.read_json(path / TREE_METADATA)
    return isinstance(data, dict) and "tree_metadata" in data


def _orbax_commit_file(path: storage.Location) -> bool:
    commit = path / COMMIT_SUCCESS
    try:
        if isinstance(commit, Path):
            with open(commit, encoding="utf-8", errors="replace") as f:
                return f.read(len(_COMMIT_TEXT)) == _COMMIT_TEXT
        head = commit.read_bytes()[: 4 * len(_COMMIT_TEXT)]
        return head.decode("utf-8", errors="replace").startswith(_COMMIT_TEXT)
    except StorageError:
        raise
    except OSError:
        return False


def _subdirs(path: storage.Location) -> list[storage.Location]:
    """The subdirectories of a directory, sorted; symlinks are not followed.

    On an object store, the prefixes one level below (one listing; no links exist).
    A directory that cannot be listed has none; a failing store raises.
    """
    if not isinstance(path, Path):
        names = {k.split("/", 1)[0] for k in path.list_keys() if "/" in k}
        return [path / n for n in sorted(names)]
    try:
        return sorted(Path(e.path) for e in os.scandir(path) if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def recognise(path: Where) -> bool:
    """Tell whether Orbax wrote a directory, from the records in it.

    Any one of these is enough: Orbax's ``_CHECKPOINT_METADATA``; a ``_METADATA`` with
    tree metadata; a ``commit_success.txt`` in Orbax's words; or a subdirectory (an
    item) holding Orbax's ``_CHECKPOINT_METADATA`` or tree metadata. Whether it is
    complete is :func:`is_complete`'s question; nbckpt's own records are not looked
    for here (:func:`nbckpt.formats.layout.step_format` asks about them first). On an object
    store, a prefix with none of these (or no objects at all) is not Orbax's.
    """
    p = storage.location(path)
    # A prefix "is a directory" only by having objects under it: its records are
    # read directly, and the one listing below comes last.
    if isinstance(p, Path) and not p.is_dir():
        return False
    if read_checkpoint_metadata(p) is not None or _has_tree_metadata(p):
        return True
    if _orbax_commit_file(p):
        return True
    return any(
        read_checkpoint_metadata(child) is not None or _has_tree_metadata(child)
        for child in _subdirs(p)
    )


def is_complete(path: Where) -> bool:
    """Tell whether an Orbax directory is complete, by the rule of this module.

    Parameters
    ----------
    path
        A step (or pytree) directory.

    Returns
    -------
    bool
        True if the directory is Orbax's (:func:`recognise`), is not one of Orbax's
        temporary directories, and holds ``commit_success.txt`` or an Orbax
        ``_CHECKPOINT_METADATA`` with ``commit_timestamp_nsecs``.
    """
    p = storage.location(path)
    if is_tmp_name(p.name) or not recognise(p):
        return False
    return _committed(p, read_checkpoint_metadata(p))


def _committed(p: storage.Location, meta: dict[str, Any] | None) -> bool:
    """The completion rule, for a recognised directory whose Orbax metadata is ``meta``."""
    if (p / COMMIT_SUCCESS).is_file():
        return True
    return meta is not None and isinstance(meta.get("commit_timestamp_nsecs"), int)


def _item(name: str | None, directory: storage.Location, handler: str | None) -> OrbaxItem:
    if not directory.is_dir():
        return OrbaxItem(name, directory, "other", handler, None, "its directory is missing")
    if (directory / TREE_METADATA).exists():
        try:
            tree = read_tree_metadata(directory)
        except OrbaxFormatError as e:
            return OrbaxItem(name, directory, "pytree", handler, None, str(e))
        return OrbaxItem(name, directory, "pytree", handler, tree, None)
    if handler is not None and "Json" in handler.rsplit(".", 1)[-1]:
        return OrbaxItem(name, directory, "json", handler, None, None)
    return OrbaxItem(name, directory, "other", handler, None, None)


def _items(path: storage.Location, meta: dict[str, Any] | None) -> list[OrbaxItem]:
    """The items of a step: the directory itself if it is a pytree, else its items."""
    handlers = meta.get("item_handlers") if meta is not None else None
    if (path / TREE_METADATA).exists():
        return [_item(None, path, handlers if isinstance(handlers, str) else None)]
    named: dict[str, str | None] = {}
    if isinstance(handlers, dict):
        named = {str(k): (str(v) if v else None) for k, v in handlers.items()}
    for child in _subdirs(path):
        # Items of steps whose metadata names no handlers (older Orbax).
        if child.name not in named and (
            (child / TREE_METADATA).exists() or read_checkpoint_metadata(child) is not None
        ):
            named[child.name] = None
    return [_item(n, path / n, h) for n, h in sorted(named.items())]


def _summary(items: list[OrbaxItem]) -> str:
    parts = []
    for it in items:
        if it.tree is not None:
            arrays = "OCDBT" if it.tree.ocdbt else "per-leaf arrays"
            zarr = "zarr v3" if it.tree.zarr3 else "zarr v2"
            n = len(it.tree.leaves)
            parts.append(f"{it.label}: {n} leaves, {arrays}, {zarr}")
        else:
            parts.append(f"{it.label}: {it.kind}")
    return "; ".join(parts)


def describe(step_dir: Where) -> OrbaxStep | None:
    """Describe an Orbax step or pytree directory; None if Orbax did not write it.

    Returns
    -------
    OrbaxStep or None
        Its state by the completion rule of this module (see :class:`OrbaxStep`), its
        items with their tree metadata, and a one-line reason.
    """
    p = storage.location(step_dir)
    if not recognise(p):
        return None
    meta = read_checkpoint_metadata(p)
    stamp = meta.get("commit_timestamp_nsecs") if meta is not None else None
    when = stamp / 1e9 if isinstance(stamp, int) else None
    items = _items(p, meta)
    first_tree = next((i for i in items if i.tree is not None), None)
    count = process_count(first_tree.directory) if first_tree is not None else None
    if is_tmp_name(p.name):
        state: OrbaxState = "incomplete"
        reason = "an Orbax save's temporary directory (in progress, or abandoned)"
    elif not _committed(p, meta):
        state = "incomplete"
        reason = (
            f"an Orbax save that did not finish (no {COMMIT_SUCCESS}, no commit time in "
            f"{CHECKPOINT_METADATA})"
        )
    elif (p / CHECKPOINT_METADATA).exists() and meta is None and not items:
        state, reason = "corrupt", f"Orbax step: its {CHECKPOINT_METADATA} cannot be read"
    elif not items:
        state, reason = "corrupt", "Orbax step with no items (no tree metadata, no item folders)"
    elif broken := [i for i in items if i.problem]:
        it = broken[0]
        more = f" (+{len(broken) - 1} more)" if len(broken) > 1 else ""
        state, reason = "corrupt", f"Orbax step: item {it.label}: {it.problem}{more}"
    else:
        state, reason = "complete", f"Orbax step ({_summary(items)})"
    return OrbaxStep(
        path=p, state=state, reason=reason, items=tuple(items), time=when, process_count=count
    )


def describe_unknown(path: Where) -> str:
    """Say in one line what a directory that is no step holds.

    Returns
    -------
    str
        ``"neither an nbckpt nor an Orbax step: found a, b, c"`` (the first few names,
        sorted), or ``"... found nothing"`` for an empty directory (or a prefix with no
        objects).

    Raises
    ------
    StorageError
        The store failed to list it.
    """
    try:
        names = sorted(p.name for p in storage.location(path).iterdir())
    except StorageError:
        raise
    except OSError as e:
        return f"neither an nbckpt nor an Orbax step: cannot list it ({e.strerror or e})"
    if not names:
        return "neither an nbckpt nor an Orbax step: found nothing (an empty directory)"
    shown = ", ".join(names[:_SHOWN])
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return f"neither an nbckpt nor an Orbax step: found {shown}{more}"
