"""The lab's registry of running clusters: one record per cluster, naming its root.

A notebook that starts a cluster with ``--dir`` writes a :class:`ClusterRecord` into
:func:`clusters_dir` (:meth:`~nbckpt.session.cluster.JaxCluster.register_root`); the
Jupyter server that runs the kernel shares that runtime folder, and its sidebar offers
those roots (:mod:`nbckpt.server.roots`). Both sides go through this module, so the
record is written and read as one type.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nbckpt.netaddr import pid_alive

__all__ = [
    "ClusterRecord",
    "Registration",
    "clusters_dir",
    "read_records",
    "remove_record",
    "write_record",
]


@dataclass(frozen=True)
class ClusterRecord:
    """One running cluster's checkpoint root, as its notebook recorded it.

    Attributes
    ----------
    root
        The root: an absolute path or an object-store URL.
    pid
        The notebook kernel's process id.
    profile
        The ipyparallel profile, or None for the default one.
    cluster_id
        The cluster's id, or None.
    time
        When the root was registered (the cluster started), as a Unix time.
    host
        The name of the machine the kernel runs on: a pid means nothing on another
        machine that shares the runtime folder.
    """

    root: str
    pid: int
    profile: str | None
    cluster_id: str | None
    time: float
    host: str = field(default_factory=socket.gethostname)

    @classmethod
    def now(cls, root: str, profile: str | None, cluster_id: str | None) -> ClusterRecord:
        """The record of ``root`` for a cluster of this process, registered now."""
        return cls(
            root=root, pid=os.getpid(), profile=profile, cluster_id=cluster_id, time=time.time()
        )

    def to_json(self) -> str:
        """The record as the file holds it."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ClusterRecord:
        """Parse a record file's text.

        Raises
        ------
        ValueError, KeyError, TypeError
            If the text is not a whole record (half written, or not one of ours).
        """
        data: dict[str, Any] = json.loads(text)
        return cls(
            root=str(data["root"]),
            pid=int(data["pid"]),
            profile=None if data.get("profile") is None else str(data["profile"]),
            cluster_id=None if data.get("cluster_id") is None else str(data["cluster_id"]),
            time=float(data["time"]),
            host=str(data.get("host") or ""),
        )

    @property
    def file_name(self) -> str:
        """The record's file name in :func:`clusters_dir`: one per kernel and cluster."""
        return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{self.pid}-{self.cluster_id or ''}") + ".json"

    def running(self) -> bool:
        """Whether the kernel that wrote it runs: on this machine, and alive."""
        return self.host == socket.gethostname() and pid_alive(self.pid)


def clusters_dir() -> Path:
    """Where notebooks note the checkpoint roots of their running clusters.

    ``<Jupyter runtime dir>/nbckpt/clusters``, one JSON record per running cluster
    (:meth:`JaxCluster.register_root <nbckpt.session.cluster.JaxCluster.register_root>`).
    The Jupyter server that runs the kernel shares that runtime folder, and its sidebar
    offers those roots (:mod:`nbckpt.server.roots`).
    """
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / "nbckpt" / "clusters"


def write_record(record: ClusterRecord, folder: Path | None = None) -> Path | None:
    """Write ``record`` into ``folder`` (default :func:`clusters_dir`); its path.

    Best effort: a runtime folder that cannot be written returns None, which only
    leaves the sidebar without this root.
    """
    try:
        folder = clusters_dir() if folder is None else folder
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / record.file_name
        # Written aside and renamed, so the server never reads half a record.
        tmp = folder / f".{record.file_name.removesuffix('.json')}.tmp"
        tmp.write_text(record.to_json())
        os.replace(tmp, path)
    except OSError:
        return None
    return path


def remove_record(path: Path) -> None:
    """Remove a record :func:`write_record` wrote; one already gone is fine."""
    with contextlib.suppress(OSError):
        path.unlink()


class Registration:
    """The record a cluster of this kernel keeps in the registry: one at a time.

    Attributes
    ----------
    root
        The root registered now, or None.
    path
        The record's file, or None.
    """

    def __init__(self) -> None:
        self.root: str | None = None
        self.path: Path | None = None

    def write(self, root: str | None, profile: str | None, cluster_id: str | None) -> Path | None:
        """Replace the record with one of ``root`` (None: remove it only); its file.

        Best effort: None if the runtime folder cannot be written.
        """
        self.remove()
        if root is None:
            return None
        path = write_record(ClusterRecord.now(root, profile=profile, cluster_id=cluster_id))
        if path is not None:
            self.root, self.path = root, path
        return path

    def remove(self) -> None:
        """Remove the record written, if there is one."""
        if self.path is not None:
            remove_record(self.path)
        self.root = self.path = None


def read_records(folder: Path | None = None) -> list[ClusterRecord]:
    """The records of running clusters in ``folder`` (default :func:`clusters_dir`), oldest first.

    Records that do not parse (half written, or not ours), that another machine wrote
    into a shared runtime folder, or whose process is gone are left out.
    """
    folder = clusters_dir() if folder is None else folder
    try:
        paths = sorted(folder.glob("*.json"))
    except OSError:
        return []
    found = []
    for path in paths:
        try:
            record = ClusterRecord.from_json(path.read_text())
        except (OSError, ValueError, KeyError, TypeError):
            continue  # half written, or not ours: no root to offer
        if record.running():
            found.append(record)
    return sorted(found, key=lambda r: r.time)
