"""Retention: carry out a root's :class:`~nbckpt.retention.RetentionPolicy` after a save."""

from __future__ import annotations

from nbckpt.layout import FORMAT, all_steps, read_metadata, remove_aside, step_dir
from nbckpt.retention import RetentionPolicy, StepRecord
from nbckpt.storage import Location

__all__ = ["apply_retention", "records"]


def records(root: Location) -> list[StepRecord]:
    """The complete steps under ``root`` that nbckpt created, with their metrics.

    A step counts only if nbckpt's own metadata is in it: an Orbax step or a foreign
    folder in the same root is neither counted nor ever removed.
    """
    out = []
    for step in all_steps(root):
        meta = read_metadata(step_dir(root, step))
        if meta is None or meta.get("format") != FORMAT:
            continue
        metrics = meta.get("metrics")
        out.append(StepRecord(step, metrics if isinstance(metrics, dict) else {}))
    return out


def apply_retention(root: Location, policy: RetentionPolicy) -> list[int]:
    """Remove the steps under ``root`` that ``policy`` does not keep; return them.

    Only complete steps nbckpt created are candidates, so a foreign, Orbax or corrupt
    directory is never removed. Each step is first renamed to
    ``<step>.nbckpt-deleting`` (atomically no longer a step), then deleted: a crash
    in between leaves no half-deleted step under a step's name.
    """
    doomed = policy.doomed(records(root))
    for step in doomed:
        remove_aside(step_dir(root, step))
    return doomed
