"""What the server routes answer, without any Tornado code.

:class:`CheckpointManager` resolves a root given relative to the server's root
directory, refuses anything that would leave it, and returns JSON-able data built from
:mod:`nbckpt.inventory` and :mod:`nbckpt.journal`, and the protocol's names from
:mod:`nbckpt.protocol`. The handlers only translate HTTP.

A root may also be an object-store URL (``s3://bucket/prefix``) when the server has
credentials for that store in its own environment (``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY``, or ``AWS_PROFILE``): it is then read with those credentials,
behind the same authentication as every route, and only read. A failure of the store
is answered 502 with the store's one-line message.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from nbckpt import storage
from nbckpt.errors import StorageURLError
from nbckpt.inventory import classify
from nbckpt.journal import list_operations, read_operation
from nbckpt.layout import ops_dir
from nbckpt.protocol import as_json
from nbckpt.storage import Location

__all__ = [
    "BadRequestError",
    "CheckpointManager",
    "ForbiddenPathError",
    "ManagerError",
    "NotFoundError",
    "StoreFailedError",
]


class ManagerError(Exception):
    """A request the manager refuses; ``status`` is the HTTP status that fits."""

    status = 400


class BadRequestError(ManagerError):
    """The request is malformed (no root given, a bad operation id)."""

    status = 400


class ForbiddenPathError(ManagerError):
    """The root resolves outside the server's root directory."""

    status = 403


class NotFoundError(ManagerError):
    """The root, or the operation, does not exist."""

    status = 404


class StoreFailedError(ManagerError):
    """The object store holding the root failed a request."""

    status = 502


def has_object_credentials() -> bool:
    """Whether this process's environment names credentials for an object store."""
    env = os.environ
    return bool(
        (env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"))
        or env.get("AWS_PROFILE")
    )


class CheckpointManager:
    """Answer questions about checkpoint roots under one directory.

    Parameters
    ----------
    root_dir
        The server's root directory. Every root is relative to it, and no root may
        resolve (after following symlinks) outside it.
    stale_after_s
        Passed to :func:`nbckpt.inventory.classify`.
    """

    def __init__(self, root_dir: str | os.PathLike[str], *, stale_after_s: float = 600.0) -> None:
        self.root_dir = Path(os.path.realpath(os.path.expanduser(root_dir)))
        self.stale_after_s = stale_after_s

    def resolve(self, root: str | None) -> Location:
        """Return the real path of ``root``, which must lie inside the root directory.

        Raises
        ------
        BadRequestError
            If ``root`` is missing.
        ForbiddenPathError
            If ``root`` is absolute, or resolves outside the root directory (through
            ``..`` or a symlink).
        NotFoundError
            If it resolves to nothing, or to something that is not a directory.
        """
        if root is None:
            raise BadRequestError("missing query parameter 'root'")
        if "\0" in root:
            raise BadRequestError("root contains a NUL character")
        rel = root.strip()
        if storage.is_url(rel):
            return self._object_root(rel)
        if os.path.isabs(rel) or rel.startswith("~"):
            raise ForbiddenPathError(f"root {root!r} must be relative to the server's root")
        real = Path(os.path.realpath(self.root_dir / rel))
        if not self._inside(real):
            raise ForbiddenPathError(f"root {root!r} is outside the server's root")
        if not real.is_dir():
            raise NotFoundError(f"no directory {root!r} under the server's root")
        return real

    def _object_root(self, url: str) -> Location:
        """An object-store root, if the server may read it."""
        try:
            where = storage.location(url)
        except StorageURLError as e:
            raise BadRequestError(str(e)) from None
        if isinstance(where, Path):  # file:// is a local path: confined like the rest
            return self.resolve(self.relative_or_refuse(where))
        if not has_object_credentials():
            raise ForbiddenPathError(
                f"the server has no credentials for {url}: start it with "
                "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE set"
            )
        return where

    def relative_or_refuse(self, path: Path) -> str:
        """``path`` relative to the root directory, or a 403 if it is outside."""
        if not self._inside(path):
            raise ForbiddenPathError(f"root {str(path)!r} is outside the server's root")
        return self.relative(path)

    def _inside(self, path: Location) -> bool:
        if not isinstance(path, Path):
            return True  # an object store's keys have no links to leave by
        real = Path(os.path.realpath(path))
        return real == self.root_dir or real.is_relative_to(self.root_dir)

    def _journal_of(self, real: Location) -> Location:
        """Return the root's journal directory, refusing one symlinked out of bounds."""
        journal = ops_dir(real)
        if not self._inside(journal):
            raise ForbiddenPathError(
                f"the journal of {self.relative(real)!r} links outside the server's root"
            )
        return journal

    def protocol(self) -> dict[str, Any]:
        """Return the protocol's names (phases, events, statuses, ...) for the lab extension.

        Returns
        -------
        dict
            :func:`nbckpt.protocol.as_json`, so the TypeScript side never retypes a name.
        """
        return as_json()

    def relative(self, path: Location) -> str:
        """Return ``path`` relative to the root directory, ``"."`` for itself; a URL as is."""
        if not isinstance(path, Path):
            return str(path)
        return str(path.relative_to(self.root_dir)) if path != self.root_dir else "."

    def checkpoints(self, root: str | None) -> dict[str, Any]:
        """List every step-like entry of ``root`` with its state.

        Entries that are symlinks are not followed (see :func:`nbckpt.inventory.classify`).
        A journal symlinked outside the root directory is refused.

        Returns
        -------
        dict
            ``root`` (relative), ``time`` (server time), ``entries`` (one dict per
            entry, see :class:`nbckpt.inventory.Entry`) and ``counts`` per state.
        """
        real = self.resolve(root)
        self._journal_of(real)
        now = time.time()
        entries = [e.to_dict() for e in classify(real, now=now, stale_after_s=self.stale_after_s)]
        counts: dict[str, int] = {}
        for e in entries:
            counts[e["state"]] = counts.get(e["state"], 0) + 1
        return {"root": self.relative(real), "time": now, "entries": entries, "counts": counts}

    def operations(self, root: str | None) -> dict[str, Any]:
        """List the journaled operations of ``root``, newest first, without events."""
        real = self.resolve(root)
        journal = self._journal_of(real)
        ops = []
        for op in reversed(list_operations(real)):
            if not self._inside(journal / op):
                continue
            rec = read_operation(real, op)
            ops.append(
                {
                    "op": rec.op,
                    "kind": rec.kind,
                    "step": rec.step,
                    "status": rec.status,
                    "start": rec.start,
                    "end": rec.end,
                    "process_count": rec.process_count,
                    "processes_seen": len(rec.processes),
                }
            )
        return {"root": self.relative(real), "time": time.time(), "operations": ops}

    def operation(self, root: str | None, op: str) -> dict[str, Any]:
        """Return one operation's merged journal: per process, per phase, start and end.

        Raises
        ------
        BadRequestError
            If ``op`` is not a plain operation id.
        NotFoundError
            If the root has no journal for ``op``.
        """
        real = self.resolve(root)
        if not op or op in (".", "..") or "/" in op or "\\" in op or "\0" in op:
            raise BadRequestError(f"{op!r} is not an operation id")
        folder = self._journal_of(real) / op
        if not self._inside(folder):
            raise ForbiddenPathError(f"operation {op!r} links outside the server's root")
        if not folder.is_dir():
            raise NotFoundError(f"no operation {op!r} under {self.relative(real)!r}")
        data = read_operation(real, op).to_dict()
        data["root"] = self.relative(real)
        data["time"] = time.time()
        return data
