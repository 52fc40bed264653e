"""Retention: keep the newest complete steps, remove the oldest beyond a count."""

from __future__ import annotations

from pathlib import Path

from nbckpt.layout import all_steps, remove_aside, step_dir

__all__ = ["apply_retention"]


def apply_retention(root: Path, keep: int) -> list[int]:
    """Remove the oldest complete steps under ``root`` beyond the newest ``keep``.

    Only complete steps are candidates (see :func:`nbckpt.layout.all_steps`), so a
    foreign or corrupt directory is never removed. Each step is first renamed to
    ``<step>.nbckpt-deleting`` (atomically no longer a step), then deleted.

    Returns
    -------
    list of int
        The steps removed.
    """
    steps = all_steps(root)
    doomed_steps = steps[: max(0, len(steps) - keep)]
    for step in doomed_steps:
        remove_aside(step_dir(root, step))
    return doomed_steps
