"""Hosts, as the local tier sees them: the processes that share one local directory.

A local copy of a step is only as safe as the machine it lives on, and a machine is
not its host name: a replaced machine may come back under the same name with an
empty ``/dev/shm``, and two test processes on one machine may each be given their own
local directory. So a host is identified by its local directory itself: the first
process to use it writes an id file there (an exclusive create, so concurrent first
users agree on one id), and every process that reads the same id is on the same host.
A wiped directory gets a new id, and so is a new host, with none of the old copies.

:func:`host_map` gathers every process's host id; :func:`replica_hosts` picks, for a
host, the other hosts that keep its replicas, never itself. Issue 28 builds the local
tier on these; nothing else uses them yet.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path

from nbckpt.engine.sync.barriers import Synchronizer

__all__ = ["HOST_ID_FILE", "host_id", "host_map", "replica_hosts"]

#: The file in a local directory that names its host.
HOST_ID_FILE = ".nbckpt-host"


def host_id(local_dir: str | os.PathLike[str]) -> str:
    """Return the id of the host whose local directory is ``local_dir``, making one if new.

    The directory is created if missing. A new id is written whole and made durable
    under a name of its own, then linked to :data:`HOST_ID_FILE`, which fails if the
    file exists: so the id file is never seen half written, and every process that
    shares the directory reads the one id that won, whichever process made it.

    Raises
    ------
    OSError
        The directory cannot be created, or the id file cannot be written or read.
    ValueError
        The id file holds something that is not an id (it was not written by nbckpt).
    """
    folder = Path(local_dir).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / HOST_ID_FILE
    if path.exists():
        return _read_id(path)
    fresh = uuid.uuid4().hex
    mine = folder / f"{HOST_ID_FILE}.{fresh}"
    fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, fresh.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(mine, path)
    except FileExistsError:
        return _read_id(path)  # another process of this host won
    finally:
        mine.unlink()
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return fresh


def _read_id(path: Path) -> str:
    text = path.read_text().strip()
    try:
        return uuid.UUID(hex=text).hex
    except ValueError:
        raise ValueError(f"{path} does not hold a host id ({text[:40]!r})") from None


def host_map(
    sync: Synchronizer, local_dir: str | os.PathLike[str], *, op: str, timeout_s: float
) -> dict[int, str]:
    """Return every process's host id, on every process (one gather).

    ``op`` names the gather (unique per use, as every barrier's).
    """
    ids = sync.gather(op, "hosts", host_id(local_dir), timeout_s=timeout_s)
    return dict(sorted(ids.items()))


def replica_hosts(hosts: Mapping[int, str], host: str, replicas: int) -> list[str]:
    """Return the ``replicas`` hosts that keep copies of ``host``'s shards.

    Hosts are ordered by their lowest process index, and each host's replicas are the
    next ones around that ring: every process computes the same answer, the copies of
    one host are spread over others, and never land on ``host`` itself. Fewer than
    ``replicas`` come back when there are not that many other hosts.

    Raises
    ------
    ValueError
        ``host`` is not in ``hosts``, or ``replicas`` is negative.
    """
    if replicas < 0:
        raise ValueError(f"replicas must be 0 or more, got {replicas}")
    ring: list[str] = []
    for _process, h in sorted(hosts.items()):
        if h not in ring:
            ring.append(h)
    if host not in ring:
        raise ValueError(f"host {host!r} is not one of this job's hosts")
    at = ring.index(host)
    others = ring[at + 1 :] + ring[:at]
    return others[:replicas]
