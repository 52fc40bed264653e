"""Which checkpoint roots the sidebar offers: running clusters' roots, and roots on disk.

Two sources, neither of which needs Tornado:

- :func:`running_clusters`: the records that ``%ckpt_cluster start --dir D`` writes into
  the Jupyter runtime folder (:meth:`nbckpt.session.cluster.JaxCluster.register_root`),
  one :class:`~nbckpt.session.registry.ClusterRecord` each, written and read by
  :mod:`nbckpt.session.registry`. The server shares that folder with the kernels it
  runs, so these are the roots the notebooks use now. A record whose process is gone,
  or that another machine wrote into a shared runtime folder, is ignored.
- :func:`scan`: directories below the server's root that look like checkpoint roots
  (:func:`is_root`), found breadth first within a depth, a number of directories and
  a time budget, so a large home directory answers in bounded time, marked truncated.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from nbckpt.formats.layout import STATE_DIR, TMP_SUFFIX, parse_step, step_format
from nbckpt.session.registry import ClusterRecord, read_records

__all__ = [
    "SKIPPED_DIRS",
    "ClusterRecord",
    "ScanResult",
    "is_root",
    "running_clusters",
    "scan",
]

#: Directory names a scan never enters: tool caches, never roots. Python environments
#: (a ``pyvenv.cfg`` or ``conda-meta`` in them) are not entered either.
SKIPPED_DIRS = frozenset({"node_modules", "__pycache__", "site-packages"})
_ENVIRONMENT_MARKS = ("pyvenv.cfg", "conda-meta")

#: How many step-named subdirectories :func:`is_root` opens before giving up on a folder.
_STEP_PROBES = 3


@dataclass(frozen=True)
class ScanResult:
    """The roots a scan found, and whether it stopped at one of its bounds.

    Attributes
    ----------
    roots
        Absolute paths, in the order found (shallow first, then by name).
    truncated
        True if the scan stopped early (time budget or directory count) or left
        directories deeper than its depth unvisited.
    """

    roots: list[Path]
    truncated: bool


def running_clusters(folder: Path | None = None) -> list[ClusterRecord]:
    """Read the roots that running clusters registered, oldest first.

    Parameters
    ----------
    folder
        Where the records are (default :func:`nbckpt.session.registry.clusters_dir`).

    Returns
    -------
    list of ClusterRecord
        Records that parse, were written on this machine, and whose process is alive
        (:func:`nbckpt.session.registry.read_records`).
    """
    return read_records(folder)


def is_root(path: Path) -> bool:
    """Tell whether a local directory looks like a checkpoint root.

    It does if it holds nbckpt's state directory (``.nbckpt/``, the journal), a
    ``<step>.nbckpt-tmp`` directory, or a ``<step>`` directory with nbckpt's or Orbax's
    records in it (:func:`nbckpt.formats.layout.step_format`); only the first few step-named
    directories are opened, so a folder of plain numbered directories costs little.
    Symlinks are not followed.
    """
    try:
        if (path / STATE_DIR).is_dir() and not (path / STATE_DIR).is_symlink():
            return True
        probes = 0
        with os.scandir(path) as it:
            for entry in it:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                name = entry.name
                if name.endswith(TMP_SUFFIX) and parse_step(name[: -len(TMP_SUFFIX)]) is not None:
                    return True
                if parse_step(name) is None or probes >= _STEP_PROBES:
                    continue
                probes += 1
                if step_format(Path(entry.path)) is not None:
                    return True
    except OSError:
        return False
    return False


def scan(
    top: Path,
    *,
    max_depth: int = 4,
    budget_s: float = 1.0,
    max_dirs: int = 5000,
) -> ScanResult:
    """Find checkpoint roots below ``top``, breadth first, within bounds.

    Hidden directories (``.name``), :data:`SKIPPED_DIRS` and Python environments are not
    entered, symlinks are not followed, and a root's own subdirectories (its steps) are
    not searched.

    Parameters
    ----------
    top
        The directory to search (the server's root); it may itself be a root.
    max_depth
        How many levels below ``top`` to look at (``top`` is level 0).
    budget_s
        Wall-clock seconds the scan may take; it stops when they run out.
    max_dirs
        How many directories it may look at.

    Returns
    -------
    ScanResult
        The roots found, and whether a bound cut the scan short.
    """
    deadline = time.monotonic() + budget_s
    queue: deque[tuple[Path, int]] = deque([(top, 0)])
    roots: list[Path] = []
    seen = 0
    truncated = False
    while queue:
        if seen >= max_dirs or time.monotonic() >= deadline:
            truncated = True
            break
        path, depth = queue.popleft()
        seen += 1
        if is_root(path):
            roots.append(path)
            continue
        if any((path / mark).exists() for mark in _ENVIRONMENT_MARKS):
            continue
        children: list[str] = []
        with contextlib.suppress(OSError), os.scandir(path) as it:
            children = sorted(
                e.name
                for e in it
                if e.is_dir(follow_symlinks=False)
                and not e.name.startswith(".")
                and e.name not in SKIPPED_DIRS
            )
        if children and depth >= max_depth:
            truncated = True
            continue
        queue.extend((path / name, depth + 1) for name in children)
    return ScanResult(roots, truncated)
