"""What ``%ckpt_cluster`` checks before it starts anything, and what it sets up after.

A cluster is many processes: a start that fails after the controller and engines run
must not leave them where ``%ckpt_cluster stop`` cannot see them. So the checkpoint
root is checked before anything starts (:func:`check_start_root`), and a start that
fails after its processes run stops them (:func:`start_cluster`, and
:func:`open_session` for the client made after it). :func:`guard_px`
makes ``%px`` say which process died, and how to go on, instead of ipyparallel's
``KeyError`` for an engine it no longer knows.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError

from nbckpt.magics import args as a
from nbckpt.session import location
from nbckpt.session.client import CheckpointClient, announce_root
from nbckpt.session.cluster import JaxCluster, which_cluster

__all__ = [
    "check_start_root",
    "guard_px",
    "hosts_text",
    "open_session",
    "start_cluster",
    "status_text",
]


def _local_root_problem(path: Path) -> str | None:
    """Why this machine cannot create or write the local root ``path`` (None: it can)."""
    if path.exists():
        if not path.is_dir():
            return f"{path} exists and is not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{path} is not writable"
        return None
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory, so {path} cannot be made"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{path} cannot be created: {parent} is not writable"
    return None


def check_start_root(directory: str | None, engines: str) -> str | None:
    """Check ``--dir`` of ``%ckpt_cluster start`` before any process starts.

    The root must be a location nbckpt can store at (a local path, ``file://``,
    ``s3://`` or ``gs://``). A local root must also be writable here when the engines
    are local ones (``engines == "local"``): they run on this machine. Engines elsewhere (or
    attached ones, ``""``) check it themselves when they save (this machine may not
    even have that directory).

    Returns
    -------
    str or None
        The root as the client will use it (``~`` expanded, absolute), or None.

    Raises
    ------
    UsageError
        One line: what is wrong with the root; nothing was started.
    """
    if directory is None:
        return None
    try:
        root = location(directory)
    except ValueError as e:  # a URL nbckpt cannot store at, or an empty path
        raise UsageError(f"{e}; no cluster was started") from None
    if isinstance(root, Path) and engines == "local":
        problem = _local_root_problem(root)
        if problem is not None:
            raise UsageError(
                f"--dir {directory}: {problem}; pick a directory you can write, "
                "no cluster was started"
            )
    return str(root)


def start_cluster(args: a.ClusterArgs) -> JaxCluster:
    """Start a new cluster, or attach to a running one, as ``%ckpt_cluster`` asked.

    :meth:`JaxCluster.start` stops what it started when it fails, so nothing outlives
    a failed start.
    """
    if args.action == "start":
        return JaxCluster(options=args.options).start(timeout_s=args.timeout_s, report=print)
    if args.cluster_id is None:  # never picked by default: it may be someone else's
        raise UsageError(which_cluster(args.options.profile))
    return JaxCluster.attach(
        profile=args.options.profile,
        cluster_id=args.cluster_id,
        devices_per_process=args.options.devices_per_process,
        coordinator_host=args.options.coordinator_host,
        timeout_s=args.timeout_s,
    )


def open_session(args: a.ClusterArgs) -> tuple[JaxCluster, CheckpointClient]:
    """Check the root, start or attach to the cluster, and make its client.

    Raises what failed; a cluster this call started is stopped first, so that nbckpt
    never loses track of processes it started.
    """
    # Checked before anything starts: a bad root must not leave processes behind.
    # Attached engines may run elsewhere: their root is theirs to check.
    engines = args.options.engines if args.action == "start" else ""
    root = check_start_root(args.directory, engines)
    cluster = start_cluster(args)  # stops what it started if it fails
    try:
        client = CheckpointClient(cluster, root)
        cluster.register_root(client.directory)  # the lab sidebar offers this root
        if client.directory is not None:  # %%px loops save where the notebook looks
            announce_root(cluster, client.directory)
        cluster.activate_px()  # %px waits for the engines and shows their output
    except BaseException:
        if args.action == "start":
            cluster.stop()
        raise
    return cluster, client


def guard_px(shell: Any, cluster_of: Callable[[], JaxCluster | None]) -> None:
    """Make ``%px`` and ``%%px`` refuse, in one line, to run on a cluster with a dead process.

    ipyparallel's magics would fail with ``KeyError: <engine id>`` (the engine left its
    view). The guard asks the controller first, which knows within a second of a
    death, and raises :meth:`JaxCluster.check_alive`'s error instead: which process
    died, and that ``%ckpt_cluster restart`` starts a fresh job. Call it again after
    every ``activate_px`` (which puts ipyparallel's own magics back).
    """
    for kind in ("line", "cell"):
        original = shell.magics_manager.magics[kind].get("px")
        if original is None or getattr(original, "_nbckpt_guard", False):
            continue

        @functools.wraps(original)
        def guarded(*args: Any, _original: Callable[..., Any] = original) -> Any:
            cluster = cluster_of()
            if cluster is None or cluster.client is None:
                return _original(*args)
            cluster.check_alive()
            try:
                return _original(*args)
            except (KeyError, IndexError):
                # An engine that died while the cell was being sent.
                cluster.check_alive()
                raise

        guarded._nbckpt_guard = True  # type: ignore[attr-defined]
        shell.magics_manager.magics[kind]["px"] = guarded


def hosts_text(cluster: JaxCluster) -> str:
    """``h0, h1 (2), h2``: where the processes run, in process order."""
    counts: dict[str, int] = {}
    for host in cluster.engine_hosts:
        counts[host] = counts.get(host, 0) + 1
    return ", ".join(f"{h} ({c})" if c > 1 else h for h, c in counts.items()) or "no host"


def status_text(st: dict[str, Any]) -> str:
    """``%ckpt_status``'s report from :meth:`CheckpointClient.status`."""
    health = st["health"]
    lines = [
        f"default directory: {st['directory'] or '(none)'}",
        "health: " + ", ".join(f"process {p} {h}" for p, h in sorted(health.items())),
    ]
    dead = sorted(p for p, h in health.items() if h == "dead")
    if 0 in dead:
        lines.append(
            "the JAX cluster is gone (process 0 hosted the coordination service): "
            "%ckpt_cluster restart"
        )
    elif dead:
        who = ", ".join(str(p) for p in dead)
        lines.append(
            f"process{'es' if len(dead) > 1 else ''} {who} died, and a JAX job cannot take a "
            "process back: %ckpt_cluster restart, then %ckpt_restore VAR"
        )
    for e in st["engines"]:
        flying = [c["last_op"] for c in e["checkpointers"] if c["in_flight"]]
        doing = ["running a cell"] if e.get("busy") else []
        doing += [f"saving {', '.join(flying)}"] if flying else []
        armed = e.get("faults") or []
        lines.append(
            f"process {e['process']}: host {e['host']}, pid {e['pid']}, "
            + (", ".join(doing) if doing else "idle")
            + (f"; faults armed: {', '.join(armed)}" if armed else "")
        )
    lines += [f"step {s['step']} -> {s['root']}: {s['status']} ({s['op']})" for s in st["saves"]]
    return "\n".join(lines)
