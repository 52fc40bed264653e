"""The local tier from the notebook: set it on every engine, and see which host holds what.

:meth:`CheckpointClient.tiers <nbckpt.session.client.CheckpointClient.tiers>` runs
here: :func:`tier_fields` checks its keywords before anything is sent,
:func:`apply_tiers` gives them to every engine (``set_tiers`` in
:mod:`nbckpt.engine.remote.agent`) and merges the engines' reports with the root's
steps into a :class:`~nbckpt.protocol.views.TiersView` (:mod:`nbckpt.views.tiers`).
:func:`tiers_text` is re-exported for the magic, which reaches nbckpt through the
session only. Nothing here imports jax.
"""

from __future__ import annotations

import os
from typing import Any

from nbckpt.errors import ClusterError, StorageError
from nbckpt.protocol import PROCESS_PLACEHOLDER
from nbckpt.protocol.views import TiersView
from nbckpt.session import reads
from nbckpt.session.cluster import JaxCluster
from nbckpt.session.rpc import AGENT
from nbckpt.views.tiers import tiers_text, tiers_view

__all__ = ["PROCESS_PLACEHOLDER", "TiersView", "apply_tiers", "tier_fields", "tiers_text"]


def _count(value: int, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be a whole number of at least {low}, got {value!r}")
    return value


def tier_fields(
    local: str | os.PathLike[str] | None,
    replicas: int | None,
    persistent_every: int | None,
    keep: int | None,
    off: bool,
) -> dict[str, Any] | None:
    """Check the client's tier keywords; return the engines' ``set_tiers`` fields.

    None means report only: no ``local`` and not ``off``.

    Raises
    ------
    ValueError
        ``off`` with anything else; a count without ``local``; a relative or empty
        ``local`` (each engine reads it on its own host, so it must not depend on a
        working directory); a count out of range.
    """
    counts = {"replicas": replicas, "persistent_every": persistent_every, "keep": keep}
    given = sorted(k for k, v in counts.items() if v is not None)
    if off:
        if local is not None or given:
            raise ValueError("off turns the local tier off; give it alone")
        return {"local_dir": None}
    if local is None:
        if given:
            raise ValueError(f"{', '.join(given)} need a local directory (local=DIR)")
        return None
    text = os.fspath(local)
    if not text.strip():
        raise ValueError("the local directory is empty; name one, such as /dev/shm/ckpt")
    if not (os.path.isabs(text) or text.startswith("~")):
        raise ValueError(
            f"the local directory must be absolute (or start with ~): each process reads "
            f"it on its own host, got {text!r}"
        )
    return {
        "local_dir": text,
        "local_replicas": _count(1 if replicas is None else replicas, "replicas", 0),
        "persistent_every": _count(
            1 if persistent_every is None else persistent_every, "persistent_every", 1
        ),
        "local_keep": _count(2 if keep is None else keep, "keep", 1),
    }


def persistent_steps(reader: reads.Reader, root: str) -> list[int] | None:
    """The root's complete steps, read where the storage is seen; None if it cannot be."""
    try:
        steps: list[int] = reader.run(reads.ALL_STEPS, root)
    except (OSError, StorageError, ClusterError):
        return None
    return [int(s) for s in steps]


def apply_tiers(
    cluster: JaxCluster, reader: reads.Reader, root: str, fields: dict[str, Any] | None
) -> TiersView:
    """Give every engine ``fields`` for ``root`` (None: only ask), and merge the reports.

    Raises
    ------
    ClusterError
        If a process is dead (before anything is sent) or refused the options.
    """
    cluster.check_alive()
    what = "local tier" if fields is None else "setting the local tier"
    answers = cluster.apply(f"{AGENT}:set_tiers", root, fields, what=what, timeout_s=120)
    return tiers_view(root, answers, persistent_steps(reader, root))
