"""The clusters running in an ipyparallel profile, as ``attach`` finds them.

A profile holds one client connection file per running controller. On a shared machine
they may be other people's, so ``attach`` never picks one: it needs an id, and its
errors list the ids found (:func:`which_cluster`).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path

from nbckpt.errors import ClusterError

__all__ = [
    "connection_files",
    "controller_address",
    "find_controller",
    "listing",
    "which_cluster",
]

_CONNECTION_FILE = re.compile(r"^ipcontroller-(?:(.+)-)?client\.json$")


def connection_files(profile: str | None = None) -> dict[str, Path]:
    """The clusters whose client connection files are in ``profile``: id -> file.

    ``""`` is the id of a cluster started without one (plain ``ipcontroller``).
    """
    from IPython.paths import locate_profile

    try:
        security = Path(locate_profile(profile or "default")) / "security"
    except OSError:
        return {}
    found: dict[str, Path] = {}
    for path in sorted(security.glob("ipcontroller-*client.json")):
        match = _CONNECTION_FILE.match(path.name)
        if match is not None:
            found[match.group(1) or ""] = path
    return found


def listing(found: dict[str, Path]) -> str:
    """The clusters of :func:`connection_files` in one clause, oldest first."""
    if not found:
        return "none runs there (no connection file); start one with %ckpt_cluster start"
    items = []
    for cid, path in sorted(found.items(), key=lambda kv: kv[1].stat().st_mtime):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
        items.append(f"{cid!r} (started {when})" if cid else f'"" (no id, started {when})')
    return "clusters there: " + ", ".join(items)


def which_cluster(profile: str | None = None) -> str:
    """Why ``attach`` needs a cluster id, with the ids of the clusters in ``profile``."""
    return (
        "attach needs --cluster-id, so that it never joins engines another notebook or "
        f"user started in profile {profile or 'default'!r}; "
        f"{listing(connection_files(profile))} (%ckpt_cluster start prints its id)"
    )


def controller_address(path: Path) -> str | None:
    """The address the controller of a connection file listens on.

    Its ``interface`` when that is one address, else its ``location`` (by default the
    controller machine's name, which the hosts may not resolve).
    """
    with contextlib.suppress(OSError, ValueError):
        info = json.loads(path.read_text())
        interface = str(info.get("interface", "")).rpartition("/")[2]
        if interface and interface not in ("*", "0.0.0.0", "::"):
            return interface
        return str(info.get("location") or "") or None
    return None


def find_controller(profile: str | None, cluster_id: str | None) -> str | None:
    """The address the controller of cluster ``cluster_id`` in ``profile`` listens on.

    None if its connection file does not say (:func:`controller_address`).

    Raises
    ------
    ClusterError
        Without ``cluster_id`` (none is picked by default), or if no cluster of that
        id runs in the profile; the message lists the clusters that do.
    """
    found = connection_files(profile)
    if cluster_id is None:
        raise ClusterError(which_cluster(profile))
    if cluster_id not in found:
        raise ClusterError(
            f"no cluster with id {cluster_id!r} in profile {profile or 'default'!r}; "
            + listing(found)
        )
    return controller_address(found[cluster_id])
