"""How a save becomes complete: two small strategies behind one interface.

``RenameCommit`` writes into ``<step>.nbckpt-tmp`` and publishes it by renaming it to
``<step>`` (atomic on POSIX file systems). ``CommitFileCommit`` writes into ``<step>``
itself and publishes it by writing ``commit_success.txt`` last, for stores whose rename
is not atomic (object stores: there the commit object is written after every process's
PUTs were acknowledged). The checkpointer never branches on the mode: it asks the
strategy, and :func:`nbckpt.storage.commit_mode` picks the mode a root's store allows.

Both keep the promise of DESIGN.md: a committed step stays restorable until its
replacement commits, and nothing nbckpt did not create is written over or deleted.
Every method here runs on the primary process only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
from pathlib import Path
from typing import Any, Protocol

from nbckpt import storage
from nbckpt.errors import ForeignEntryError, RenameUnavailableError, StepExistsError
from nbckpt.formats.layout import (
    COMMIT_FILE,
    DELETING_SUFFIX,
    fsync_dir,
    step_dir,
    tmp_dir,
    write_durable,
)
from nbckpt.formats.layout import entry_state as _entry_state
from nbckpt.formats.registry import remember_published
from nbckpt.protocol import COMMIT_FILE_MODE, RENAME, Mode
from nbckpt.storage import Location

__all__ = ["CommitFileCommit", "CommitStrategy", "RenameCommit", "strategy_for"]


class CommitStrategy(Protocol):
    """Where a save writes, what it may replace, and how it publishes."""

    mode: Mode

    def work_dir(self, root: Location, step: int) -> Location:
        """The directory the processes write their shards into."""
        ...

    def problem(self, root: Location, step: int, force: bool) -> dict[str, str] | None:
        """Why this save must not start, as ``{"kind": ..., "path": ...}``, or None.

        Checked by the primary in the preflight, before anyone writes.
        """
        ...

    def prepare(self, root: Location, step: int) -> Location:
        """Return the working directory the preflight claimed (see :mod:`.ownership`)."""
        ...

    def finalize(self, root: Location, step: int, op: str, force: bool = False) -> None:
        """Publish the working directory, whose contents are already durable.

        Without ``force`` a ``<step>`` that appeared since the preflight (another job
        committed it) is never replaced: :class:`~nbckpt.errors.StepExistsError`.
        """
        ...


def _final_problem(final: Location, force: bool) -> dict[str, str] | None:
    """What stands at ``<step>`` that a save must not replace, if anything."""
    if not final.exists() and not final.is_symlink():
        return None
    if final.is_symlink() or not final.is_dir():
        return {"kind": "foreign", "path": str(final)}
    state = _entry_state(final)
    if state == "foreign":
        return {"kind": "foreign", "path": str(final)}
    if state in ("complete", "corrupt") and not force:
        return {"kind": "exists", "path": str(final)}
    return None


def _raise_final_problem(final: Location, force: bool) -> None:
    """Raise if ``<step>`` now holds what this save must not replace (checked at finalize)."""
    found = _final_problem(final, force)
    if found is None:
        return
    if found["kind"] == "foreign":
        raise ForeignEntryError(found["path"])
    raise StepExistsError(found["path"])


_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@functools.cache
def _libc() -> Any:
    """The C library, looked up once: ``find_library`` runs ``ldconfig`` (2 ms a commit)."""
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name else None


def _renameat2(a: Path, b: Path, flags: int) -> bool:
    """``renameat2(a, b, flags)`` (Linux); False where the system cannot do it."""
    fn = getattr(_libc(), "renameat2", None)
    if fn is None:
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        raise FileExistsError(err, os.strerror(err), str(b))
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: the file system cannot swap
        return False
    raise OSError(err, os.strerror(err), str(a))


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False if unsupported."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def _publish(work: Path, final: Path) -> None:
    """Rename ``work`` to ``final``, failing if ``final`` appeared meanwhile."""
    try:
        if _renameat2(work, final, _RENAME_NOREPLACE):
            return
    except FileExistsError:
        raise StepExistsError(str(final)) from None
    # No renameat2: os.rename would replace an empty directory, so look first.
    if final.exists() or final.is_symlink():
        raise StepExistsError(str(final))
    os.rename(work, final)


class RenameCommit:
    """Write into ``<step>.nbckpt-tmp``; publish by renaming it to ``<step>``.

    A forced re-save swaps the new directory with the old one in one atomic exchange
    where the file system offers it (Linux), so ``<step>`` is complete at every instant;
    elsewhere the old step is renamed aside for the moment between two renames.
    """

    mode: Mode = RENAME

    def work_dir(self, root: Location, step: int) -> Location:
        """``<step>.nbckpt-tmp``."""
        return tmp_dir(root, step)

    def problem(self, root: Location, step: int, force: bool) -> dict[str, str] | None:
        """A foreign ``<step>``, or a committed one without ``force``."""
        return _final_problem(step_dir(root, step), force)

    def prepare(self, root: Location, step: int) -> Location:
        """Return ``<step>.nbckpt-tmp``, which the preflight claimed for this save."""
        work = self.work_dir(root, step)
        if not isinstance(work, Path):
            raise RenameUnavailableError(str(root))
        return work

    def finalize(self, root: Location, step: int, op: str, force: bool = False) -> None:
        """Rename the working directory to ``<step>``; with ``force``, swap out an old one."""
        work, final = self.work_dir(root, step), step_dir(root, step)
        if not isinstance(work, Path) or not isinstance(final, Path):
            raise RenameUnavailableError(str(root))
        # Another job may have committed <step> since the preflight: only force replaces.
        _raise_final_problem(final, force)
        if not final.exists():
            _publish(work, final)
        elif _exchange(work, final):
            fsync_dir(root)
            storage.remove_tree(work)  # now the old step, no longer under a step name
        else:
            old = final.with_name(f"{step}{DELETING_SUFFIX}")
            if old.exists():
                storage.remove_tree(old)
            os.rename(final, old)
            os.rename(work, final)
            fsync_dir(root)
            storage.remove_tree(old)
        fsync_dir(root)
        remember_published(final)


class CommitFileCommit:
    """Write into ``<step>`` itself; publish by writing the commit-success file last.

    Writing in place means a committed step cannot be replaced without a moment in
    which it is gone, so a forced re-save of a committed step is refused: save under a
    new step, or use rename mode.
    """

    mode: Mode = COMMIT_FILE_MODE

    def work_dir(self, root: Location, step: int) -> Location:
        """``<step>`` itself."""
        return step_dir(root, step)

    def problem(self, root: Location, step: int, force: bool) -> dict[str, str] | None:
        """As for rename mode, and refuse to replace a committed step in place."""
        final = step_dir(root, step)
        found = _final_problem(final, force)
        if found is None and force and _entry_state(final) in ("complete", "corrupt"):
            return {"kind": "replace_in_place", "path": str(final)}
        return found

    def prepare(self, root: Location, step: int) -> Location:
        """Return ``<step>``, which the preflight claimed for this save."""
        return self.work_dir(root, step)

    def finalize(self, root: Location, step: int, op: str, force: bool = False) -> None:
        """Write the commit-success file, durably."""
        final = step_dir(root, step)
        write_durable(final / COMMIT_FILE, f"{op}\n")
        fsync_dir(final)
        fsync_dir(root)


def strategy_for(mode: str) -> CommitStrategy:
    """Return the strategy of ``mode`` (``"rename"`` or ``"commit_file"``)."""
    if mode == RENAME:
        return RenameCommit()
    if mode == COMMIT_FILE_MODE:
        return CommitFileCommit()
    raise ValueError(f"mode must be 'rename' or 'commit_file', got {mode!r}")
