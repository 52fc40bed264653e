"""What the server routes answer, without any Tornado code.

:class:`CheckpointManager` resolves a root given relative to the server's root
directory, refuses anything that would leave it, and returns the view models of
:mod:`nbckpt.views.answers` (built from :mod:`nbckpt.formats.inventory` and
:mod:`nbckpt.journal`), and the protocol's names from :mod:`nbckpt.protocol`. The
handlers only translate HTTP.

A root may be given relative to the server's root or as an absolute path under it (what
a notebook prints). :meth:`CheckpointManager.roots` offers the roots the running
clusters use and those found below the server's root (:mod:`nbckpt.server.roots`), and
:meth:`CheckpointManager.activity` what is in flight or failed in the former.

A root may also be an object-store URL (``s3://`` or ``gs://bucket/prefix``) when the
server has credentials for that store in its own environment (``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE`` or a credentials file for S3;
``GOOGLE_APPLICATION_CREDENTIALS`` or gcloud's application default credentials for
GCS): it is then read with those credentials,
behind the same authentication as every route, and only read. A failure of the store
is answered 502 with the store's one-line message.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from nbckpt import storage
from nbckpt.errors import StorageError, StorageURLError
from nbckpt.formats.inventory import classify
from nbckpt.formats.layout import ops_dir
from nbckpt.gcpause import paused_gc
from nbckpt.journal import list_operations, read_operation
from nbckpt.protocol import ProtocolNames, as_json
from nbckpt.protocol.views import Activity, ClusterRoot, FoundRoot, Operations, Roots
from nbckpt.server.roots import ClusterRecord, running_clusters, scan
from nbckpt.storage import Location, ObjectPath
from nbckpt.views.answers import (
    Checkpoints,
    RecentOperations,
    checkpoints_answer,
    operation_answer,
    operation_summary,
)

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


def has_object_credentials(where: ObjectPath) -> bool:
    """Whether this process's environment names credentials for ``where``'s store."""
    return where.credential_source is not None


def _unread_cluster(record: ClusterRecord) -> ClusterRoot:
    """A running cluster's root as listed before (or without) reading it."""
    return {
        "root": record.root,
        "path": record.root,
        "openable": False,
        "reason": None,
        "pid": record.pid,
        "profile": record.profile,
        "cluster_id": record.cluster_id,
        "since": record.time,
        "in_flight": [],
        "failed": [],
    }


def _outside(root: str, root_dir: Path) -> str:
    """Why ``root`` is refused: it lies outside the server's root ``root_dir``."""
    return (
        f"root {root!r} is outside the server's root {str(root_dir)!r}: open a "
        "root under it, or start JupyterLab from a directory that holds this one"
    )


class CheckpointManager:
    """Answer questions about checkpoint roots under one directory.

    Parameters
    ----------
    root_dir
        The server's root directory. Every root is relative to it (or an absolute path
        under it), and no root may resolve (after following symlinks) outside it.
    stale_after_s
        Passed to :func:`nbckpt.formats.inventory.classify`.
    clusters_dir
        Where running clusters register their roots (default:
        :func:`nbckpt.session.cluster.clusters_dir`, read at each request).
    scan_depth, scan_budget_s
        How deep below ``root_dir``, and for how long, :meth:`roots` looks for roots.
    """

    def __init__(
        self,
        root_dir: str | os.PathLike[str],
        *,
        stale_after_s: float = 600.0,
        clusters_dir: Path | None = None,
        scan_depth: int = 4,
        scan_budget_s: float = 1.0,
    ) -> None:
        self.root_dir = Path(os.path.realpath(os.path.expanduser(root_dir)))
        self.stale_after_s = stale_after_s
        self.clusters_dir = clusters_dir
        self.scan_depth = scan_depth
        self.scan_budget_s = scan_budget_s
        self._recent = RecentOperations()

    def resolve(self, root: str | None) -> Location:
        """Return the real path of ``root``, which must lie inside the root directory.

        Raises
        ------
        BadRequestError
            If ``root`` is missing.
        ForbiddenPathError
            If ``root`` resolves outside the root directory (an absolute path or ``~``
            elsewhere, ``..``, or a symlink).
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
        # A notebook prints absolute paths: one under the root directory is the relative
        # root it names; one elsewhere is refused like a way out through "..".
        path = Path(os.path.expanduser(rel))
        real = Path(os.path.realpath(path if path.is_absolute() else self.root_dir / path))
        if not self._inside(real):
            raise ForbiddenPathError(_outside(root, self.root_dir))
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
        if not has_object_credentials(where):
            # A store that runs inside a kernel (a lesson's) is not the cloud's: say
            # where this server would send its requests, and how to point it elsewhere.
            raise ForbiddenPathError(
                f"the server has no credentials for {url}: start JupyterLab with "
                f"{where.credentials_hint} set, and {where.endpoint_variable} if the store "
                f"is not the cloud's (this server would ask {where.endpoint})"
            )
        return where

    def relative_or_refuse(self, path: Path) -> str:
        """``path`` relative to the root directory, or a 403 if it is outside."""
        if not self._inside(path):
            raise ForbiddenPathError(_outside(str(path), self.root_dir))
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

    def protocol(self) -> ProtocolNames:
        """The protocol's names for the lab extension (:func:`nbckpt.protocol.as_json`)."""
        return as_json()

    def relative(self, path: Location) -> str:
        """Return ``path`` relative to the root directory, ``"."`` for itself; a URL as is."""
        if not isinstance(path, Path):
            return str(path)
        return str(path.relative_to(self.root_dir)) if path != self.root_dir else "."

    def checkpoints(self, root: str | None) -> Checkpoints:
        """List every step-like entry of ``root`` with its state.

        Entries that are symlinks are not followed (see :func:`nbckpt.formats.inventory.classify`).
        A journal symlinked outside the root directory is refused.

        Returns
        -------
        Checkpoints
            ``root`` (relative), ``time`` (server time), ``entries`` (one dict per
            entry, see :func:`nbckpt.views.answers.entry_answer`) and ``counts`` per state.
        """
        real = self.resolve(root)
        self._journal_of(real)
        now = time.time()
        found = classify(real, now=now, stale_after_s=self.stale_after_s)
        return checkpoints_answer(self.relative(real), now, found)

    def operations(self, root: str | None) -> Operations:
        """List the journaled operations of ``root``, newest first, without events.

        Each has ``name``: a user barrier's name (None for saves and restores, and
        ``step`` is None for a barrier), by which a list should name it.
        """
        real = self.resolve(root)
        journal = self._journal_of(real)
        ops = [
            operation_summary(read_operation(real, op))
            for op in reversed(list_operations(real))
            if self._inside(journal / op)
        ]
        return {"root": self.relative(real), "time": time.time(), "operations": ops}

    def operation(self, root: str | None, op: str, process: str | None = None) -> dict[str, Any]:
        """Return one operation's merged journal and its timeline's decisions.

        Of a job of many processes, only the processes that matter, and ``process``
        (an index, from the query) when asked for.

        See :func:`nbckpt.views.answers.operation_answer`: per process, per phase,
        start and end, and ``view`` (:func:`nbckpt.views.timeline.timeline_view`).

        Raises
        ------
        BadRequestError
            If ``op`` is not a plain operation id, or ``process`` not an integer.
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
        try:
            asked = None if process is None else int(process)
        except ValueError:
            raise BadRequestError(f"process={process!r} is not a process index") from None
        with paused_gc():  # a thousand journals: the collector's scans were a third of it
            record = read_operation(real, op)
            return operation_answer(record, self.relative(real), time.time(), asked)

    # -- which roots to offer, and what runs in them ----------------------------------

    def roots(self) -> Roots:
        """List the roots to offer: the running clusters' roots, then those found on disk.

        Returns
        -------
        dict
            ``time``; ``server_root`` (the root directory's absolute path);
            ``clusters`` as in :meth:`activity`; ``found``: ``{"root", "path"}`` for
            each directory below the root directory that looks like a checkpoint root
            (:func:`nbckpt.server.roots.scan`) and is not a cluster's; ``truncated``:
            whether the scan stopped at its depth or time bound.
        """
        clusters = self.activity()["clusters"]
        taken = {c["root"] for c in clusters}
        found = scan(self.root_dir, max_depth=self.scan_depth, budget_s=self.scan_budget_s)
        listed: list[FoundRoot] = [
            {"root": self.relative(p), "path": str(p)}
            for p in found.roots
            if self.relative(p) not in taken
        ]
        return {
            "time": time.time(),
            "server_root": str(self.root_dir),
            "clusters": clusters,
            "found": listed,
            "truncated": found.truncated,
        }

    def activity(self) -> Activity:
        """Say, for each running cluster's root, what is in flight and what failed.

        Only operations the cluster's notebook could have started count: those that
        began after it registered the root. A root outside the root directory is
        listed, not read.

        Returns
        -------
        Activity
            ``time``, and ``clusters``: one :class:`~nbckpt.protocol.views.ClusterRoot`
            per running cluster, oldest first, with its saves and restores still
            running (``in_flight``) and its operations that failed.
        """
        records = running_clusters(self.clusters_dir)
        return {"time": time.time(), "clusters": [self._cluster(r) for r in records]}

    def _cluster(self, record: ClusterRecord) -> ClusterRoot:
        entry = _unread_cluster(record)
        real: Location
        try:
            if storage.is_url(record.root):
                real = self.resolve(record.root)
            else:
                # realpath, not resolve: a root nothing was saved to yet has no
                # directory, and can still be opened (it shows its first save).
                real = Path(os.path.realpath(record.root))
                if not self._inside(real):
                    raise ForbiddenPathError(_outside(record.root, self.root_dir))
            entry["root"], entry["openable"] = self.relative(real), True
            if isinstance(real, Path) and not real.is_dir():
                entry["reason"] = "nothing saved there yet"
                return entry
            journal = self._journal_of(real)
            entry["in_flight"], entry["failed"] = self._recent(
                real, record.time, lambda op: self._inside(journal / op)
            )
        except (ManagerError, StorageError) as e:
            entry["reason"] = str(e)
        return entry
