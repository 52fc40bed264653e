"""Which journaled operation a command means: by id, by its folder, or the newest.

``%ckpt_show``, ``%ckpt_timeline`` and the other commands that look at one operation
take an id, the path of its journal folder, or nothing; this resolves that to a root
and an operation id, through the session's reader (the relay, when the notebook cannot
see the storage).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nbckpt import storage
from nbckpt.session import reads

if TYPE_CHECKING:
    from nbckpt.session.client import CheckpointClient

__all__ = ["resolve_operation"]


def resolve_operation(
    op: str | None, directory: str | None, client: CheckpointClient | None
) -> tuple[str, str]:
    """Find one journaled operation: return its ``(root, op)``.

    Parameters
    ----------
    op
        An operation id, or the path of its journal folder ``<root>/.nbckpt/ops/<op>``
        (which names its root too). None: the newest operation, whatever its kind
        (the failure that just happened, not the session's last save): in the
        directory, or in the client's directory and the root of its last save.
    directory
        The checkpoint root (default: ``client``'s directory).
    client
        The session's client, if a cluster was started.

    Raises
    ------
    ValueError
        If no directory is known, it holds no operation, or it has no ``op`` (the
        message lists the latest three).
    """
    folder = None if op is None else Path(op).expanduser()
    if folder is not None and folder.is_dir() and folder.parent.name == "ops":
        folder = folder.absolute()
        return str(folder.parents[2]), folder.name
    roots: list[str] = []
    if directory is not None:
        roots.append(str(storage.location(directory)))
    elif client is not None:
        roots += [client.directory] if client.directory is not None else []
        # A save to another root than the cluster's: its operations count too.
        roots += [h.root for h in client.handles[-1:] if op is None]
    roots = list(dict.fromkeys(roots))
    if not roots:
        raise ValueError("which checkpoint directory? pass --dir D (or start the cluster)")
    reader = client.reader if client is not None else reads.LOCAL
    found = {root: list(reader.run(reads.LIST_OPERATIONS, root)) for root in roots}
    root = roots[0]
    known = found[root]
    if op is None:
        # Op ids begin with their start time: the greatest is the newest.
        newest = [(ops[-1], r) for r, ops in found.items() if ops]
        if not newest:
            raise ValueError(f"no journaled operations in {', '.join(roots)}")
        op, root = max(newest)
        known = found[root]
    # An op is a folder name: nothing that could lead out of the journal's folder.
    if op in (".", "..") or "/" in op or "\\" in op or "\0" in op or op not in known:
        latest = ", ".join(known[-3:]) or "none"
        raise ValueError(f"no operation {op!r} in {root}; latest: {latest}")
    return root, op
