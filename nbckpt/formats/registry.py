"""Which layout a step directory is: one registry, asked by save, restore and the views.

Every layout nbckpt can read is one :class:`StepLayout`: a name, how to recognise a
directory written in it from its records, and its rule for a complete step. The
registry (:data:`LAYOUTS`) asks them in order, nbckpt's own first, since an nbckpt
step also carries Orbax's records so that Orbax can read it. Restore picks its reader
by the name :func:`layout_of` returns (:mod:`nbckpt.engine.restore.step`), and
:func:`nbckpt.formats.layout.step_format`, ``is_complete``, the inventory and the lab
server ask the same question here. A new layout is one more entry in :data:`LAYOUTS`
and one more reader on the engine side; nothing else branches on it.

This module needs neither jax nor tensorstore.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Literal, Protocol, get_args

from nbckpt import storage
from nbckpt.formats import orbax as _orbax
from nbckpt.formats.records import (
    COMMIT_FILE,
    METADATA_FILE,
    Where,
    read_metadata,
    read_owner,
)
from nbckpt.protocol import RENAME
from nbckpt.storage import Location

__all__ = [
    "LAYOUTS",
    "STEP_FORMATS",
    "NbckptLayout",
    "OrbaxLayout",
    "StepFormat",
    "StepLayout",
    "layout_of",
    "remember_published",
]

#: Who wrote a step directory: the name of its layout.
StepFormat = Literal["nbckpt", "orbax"]
#: Every :data:`StepFormat`, in the order the registry asks.
STEP_FORMATS: tuple[StepFormat, ...] = get_args(StepFormat)


class StepLayout(Protocol):
    """One on-disk layout of a step directory.

    Attributes
    ----------
    name
        What :func:`layout_of` calls a directory written in this layout.
    """

    name: StepFormat

    def recognise(self, path: Location) -> bool:
        """Tell, from the records in ``path``, whether it was written in this layout.

        Complete or not: a half-written step is still recognised.
        """
        ...

    def is_complete(self, path: Location) -> bool:
        """Tell whether a directory this layout recognised is a complete step."""
        ...


class NbckptLayout:
    """nbckpt's own steps: an owner record or nbckpt metadata (see :mod:`.records`)."""

    name: StepFormat = "nbckpt"

    def recognise(self, path: Location) -> bool:
        """An owner record, or nbckpt's metadata file (also when it is damaged)."""
        return (
            read_owner(path) is not None
            or (path / METADATA_FILE).exists()
            or read_metadata(path) is not None
        )

    def is_complete(self, path: Location) -> bool:
        """The commit file, or metadata of a rename-mode save (only finalized ones exist)."""
        if (path / COMMIT_FILE).is_file():
            return True
        if isinstance(path, Path):
            try:
                st = (path / METADATA_FILE).stat()
            except OSError:
                pass  # none (an older step's name for it is read below), or unreadable
            else:
                return _renamed(str(path), st.st_ino, st.st_size, st.st_mtime_ns)
        return _renamed_save(path)


def _renamed_save(path: Location) -> bool:
    """Whether ``path`` holds the readable metadata of a rename-mode save."""
    meta = read_metadata(path)
    return meta is not None and meta.get("mode") == RENAME


#: Local rename-mode steps whose completeness is known, by their metadata file's
#: (path, inode, size, mtime_ns): see :func:`_renamed`.
_known: dict[tuple[str, int, int, int], bool] = {}
#: How many it remembers before it starts again.
_KNOWN_MAX = 4096


def _renamed(path: str, inode: int, size: int, mtime_ns: int) -> bool:
    """:func:`_renamed_save` of a local step, remembered while its metadata file is unchanged.

    The metadata of a state of thousands of leaves is megabytes of JSON: listing the
    steps of a root (``all_steps``, which a save's preflight and ``should_save`` call)
    parsed each step's in full every time. A file changed in any way (rewritten,
    replaced, cut short) has another inode, size or time, and is read again.
    """
    key = (path, inode, size, mtime_ns)
    found = _known.get(key)
    if found is None:
        found = _remember(key, _renamed_save(Path(path)))
    return found


def _remember(key: tuple[str, int, int, int], complete: bool) -> bool:
    if len(_known) >= _KNOWN_MAX:
        _known.clear()
    _known[key] = complete
    return complete


def remember_published(path: Path) -> None:
    """Note that this process has just published the rename-mode step at ``path``.

    Its metadata is the one the save wrote and made durable before the rename: the next
    listing of the root (the next save's preflight) takes the step for complete without
    parsing it again, which for a state of thousands of leaves took the primary some
    20 ms while every process waited. Changed afterwards in any way, it is read again.
    """
    with contextlib.suppress(OSError):
        st = (path / METADATA_FILE).stat()
        _remember((str(path), st.st_ino, st.st_size, st.st_mtime_ns), True)


class OrbaxLayout:
    """Steps Orbax wrote, which nbckpt lists and restores but never writes."""

    name: StepFormat = "orbax"

    def recognise(self, path: Location) -> bool:
        """See :func:`nbckpt.formats.orbax.recognise`."""
        return _orbax.recognise(path)

    def is_complete(self, path: Location) -> bool:
        """See :func:`nbckpt.formats.orbax.is_complete`."""
        return _orbax.is_complete(path)


#: The registry, in the order it asks: the first layout that recognises a directory
#: names it.
LAYOUTS: tuple[StepLayout, ...] = (NbckptLayout(), OrbaxLayout())


def layout_of(path: Where) -> StepLayout | None:
    """Return the layout a directory was written in, by its records; None if nobody's.

    A missing local directory is nobody's. On an object store a prefix "is a
    directory" only by having objects under it, so the records are looked up directly,
    which is cheaper than listing them all.
    """
    p = storage.location(path)
    if isinstance(p, Path) and not p.is_dir():
        return None
    return next((layout for layout in LAYOUTS if layout.recognise(p)), None)
