"""One owner per step: the working directory of a save is claimed atomically.

Two jobs that save the same step to one root (two notebooks on one folder, a job
restarted while its old copy still runs) must never mix their chunks, nor be told
"committed" for the other's data. The primary of a save therefore claims the step's
working directory in the preflight, before anything is written:

* locally, by ``os.mkdir`` of the working directory (it fails with ``EEXIST`` when the
  directory is there: exactly one claimer wins), then its owner record, written
  durably, naming the operation, host, pid and time;
* on an object store, by refusing a live owner record, then creating its own with a
  conditional write that succeeds only where no record is
  (:meth:`~nbckpt.storage.objects.ObjectPath.create_exclusive`: ``If-None-Match: *``
  where tensorstore sends it, AWS or ``TENSORSTORE_S3_USE_CONDITIONAL_WRITE=1``), and
  reading it back, for stores where tensorstore only checks first.

A claim left by a save that will never finish is *stale*, and the next claimer removes
it (see :func:`stale_reason`): its operation's journal says it ended (failed, or
committed: the directory is then a leftover), its pid is gone from this very host, or
its journal has been silent for :data:`~nbckpt.formats.inventory.STALE_AFTER_S` (the rule fsck
uses too). A live claim is refused with :class:`~nbckpt.errors.StepBusyError`, which
names its owner.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from nbckpt import storage
from nbckpt.errors import StorageError
from nbckpt.formats.inventory import STALE_AFTER_S
from nbckpt.formats.layout import (
    DELETING_SUFFIX,
    FORMAT,
    OWNER_FILE,
    entry_state,
    is_complete,
    ops_dir,
    read_owner,
    step_dir,
    tmp_dir,
)
from nbckpt.formats.saveops import SaveOps, journal_committed, own_op
from nbckpt.journal import read_operation
from nbckpt.netaddr import pid_alive
from nbckpt.protocol import COMMIT_FILE_MODE, Mode, Status
from nbckpt.storage import Location

__all__ = ["claim", "owner_record", "release", "stale_reason"]

#: An owner-less working directory younger than this (seconds) is being claimed.
_CLAIMING_S = 60.0


def owner_record(op: str, mode: Mode, step: int) -> dict[str, Any]:
    """The owner record a save writes into the directory it claims."""
    return {
        "format": FORMAT,
        "op": op,
        "mode": mode,
        "step": step,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "time": time.time(),
    }


def _mtime(path: Location) -> float:
    if isinstance(path, Path):
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0
    return 0.0


def stale_reason(root: Location, path: Location, now: float | None = None) -> str | None:
    """Why the claim on ``path`` will never finish, or None while its save may be live.

    The record's pid decides first where it can (same host): a gone pid is stale, a
    live pid is decided by the journal. The journal then says whether the save ended;
    a save that never journaled or went silent is stale after
    :data:`~nbckpt.formats.inventory.STALE_AFTER_S`.
    """
    now = time.time() if now is None else now
    owner = read_owner(path)
    if owner is None:
        age = now - _mtime(path)
        return f"no owner record for {age:.0f} s" if age > _CLAIMING_S else None
    pid, host = owner.get("pid"), owner.get("host")
    if host == socket.gethostname() and isinstance(pid, int) and not pid_alive(pid):
        return f"its process {pid} on this host is gone"
    op = owner.get("op")
    if not isinstance(op, str) or not (ops_dir(root) / op).is_dir():
        since = owner.get("time")
        age = now - (float(since) if isinstance(since, int | float) else _mtime(path))
        return f"its save journaled nothing for {age:.0f} s" if age > STALE_AFTER_S else None
    rec = read_operation(root, op)
    if rec.status != Status.RUNNING or journal_committed(rec):
        return f"its save {rec.status}"
    last = max(
        (float(e.get("t", 0.0)) for p in rec.processes.values() for e in p.events), default=0
    )
    if now - last > STALE_AFTER_S:
        return f"its save recorded nothing for {now - last:.0f} s"
    return None


def _committed_here(root: Location, step: int, path: Location) -> bool:
    """Whether ``path`` may hold the only copy of a step its journal says committed.

    So it is when it is ``<step>`` itself, or when ``<step>`` is not complete.
    """
    final = step_dir(root, step)
    if path != final and is_complete(final):
        return False  # a replaced step's leftover: the committed copy is in place
    ops = SaveOps(root)
    op = own_op(path, step, ops, newest=False)
    return op is not None and journal_committed(ops.record(op))


def _reclaim(root: Location, path: Location, seen: dict[str, Any] | None) -> None:
    """Remove a stale claim, unless someone else reclaimed it first."""
    if not isinstance(path, Path):
        storage.remove_tree(path)
        return
    aside = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{DELETING_SUFFIX}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another claimer removed it
    if read_owner(aside) != seen:
        # A fresh claim took its place between our look and our rename: give it back.
        os.rename(aside, path)
        return
    storage.remove_tree(aside)


def _refusal(path: Location, owner: dict[str, Any] | None) -> dict[str, Any]:
    return {"kind": "busy", "path": str(path), "owner": owner or {"op": "unknown (claiming)"}}


def _live_other(root: Location, step: int, mode: str) -> dict[str, Any] | None:
    """A refusal if the other commit mode's working directory holds a live claim."""
    if mode == COMMIT_FILE_MODE:
        other = tmp_dir(root, step)
    else:
        other = step_dir(root, step)
        # A committed step keeps its owner record: only an uncommitted one is a claim.
        if not other.is_dir() or entry_state(other) != "incomplete":
            return None
    if not other.is_dir() or read_owner(other) is None or stale_reason(root, other):
        return None
    return _refusal(other, read_owner(other))


def claim(
    root: Location, step: int, work: Location, record: dict[str, Any]
) -> dict[str, Any] | None:
    """Claim ``work`` for the save ``record`` describes; a refusal (a problem) or None.

    A stale claim in the way is removed first (see :func:`stale_reason`). The
    working directory of the other commit mode is checked too, so that a rename-mode
    and a commit-file-mode save of one step never run at once.
    """
    text = json.dumps(record)
    busy = _live_other(root, step, str(record["mode"]))
    if busy is not None:
        return busy
    for _ in range(2):
        if isinstance(work, Path):
            try:
                os.mkdir(work)
            except FileExistsError:
                seen = read_owner(work)
                if _committed_here(root, step, work):
                    # Its commit record is gone, but the journal says it committed:
                    # possibly the only copy of that step, never reclaimed.
                    return {"kind": "exists", "path": str(work)}
                if stale_reason(root, work) is None:
                    return _refusal(work, seen)
                _reclaim(root, work, seen)
                continue
            storage.write_all_durable({work / OWNER_FILE: text}, [work, work.parent])
            return None
        seen = read_owner(work)
        if seen is not None and _committed_here(root, step, work):
            return {"kind": "exists", "path": str(work)}
        if seen is not None:
            if stale_reason(root, work) is None:
                return _refusal(work, seen)
            _reclaim(root, work, seen)
        record_path = work / OWNER_FILE
        create = getattr(record_path, "create_exclusive", None)
        if create is not None:
            if not create(text.encode()):
                return _refusal(work, read_owner(work))
        else:
            storage.write_durable(record_path, text)
        # Where the store only emulates the condition, the last writer may still win:
        # read back who did.
        time.sleep(0.05)
        won = read_owner(work)
        if won is None or won.get("op") != record["op"]:
            return _refusal(work, won)
        return None
    return _refusal(work, read_owner(work))


def release(work: Location, op: str) -> None:
    """Remove the working directory ``op`` claimed, if it still is its own."""
    try:
        owner = read_owner(work)
        if owner is not None and owner.get("op") == op:
            storage.remove_tree(work)
    except (OSError, StorageError):
        pass  # left for fsck --clean, which sees the failed save's claim as stale
