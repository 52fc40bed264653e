"""Retention: carry out a root's :class:`~nbckpt.formats.retention.RetentionPolicy` after a save."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from nbckpt.engine.save.advice import reason
from nbckpt.engine.sync.barriers import Synchronizer, claim_key, next_sequence
from nbckpt.errors import JobError
from nbckpt.formats.layout import FORMAT, all_steps, read_metadata, remove_aside, step_dir
from nbckpt.formats.retention import RetentionPolicy, StepRecord
from nbckpt.storage import Location

__all__ = ["apply_retention", "prune_after", "prune_everywhere", "records"]


def records(root: Location, steps: Sequence[int] | None = None) -> list[StepRecord]:
    """The complete steps under ``root`` that nbckpt created, with their metrics.

    A step counts only if nbckpt's own metadata is in it: an Orbax step or a foreign
    folder in the same root is neither counted nor ever removed. ``steps``: look at
    these complete steps only (default: every one under ``root``).
    """
    out = []
    for step in all_steps(root) if steps is None else steps:
        meta = read_metadata(step_dir(root, step))
        if meta is None or meta.get("format") != FORMAT:
            continue
        metrics = meta.get("metrics")
        out.append(StepRecord(step, metrics if isinstance(metrics, dict) else {}))
    return out


def apply_retention(
    root: Location, policy: RetentionPolicy, *, keep: int | None = None
) -> list[int]:
    """Remove the steps under ``root`` that ``policy`` does not keep; return them.

    ``keep`` is the step the save just committed: whatever the policy says, it is never
    removed (a save reports "committed" only for a step that stays).

    Only complete steps nbckpt created are candidates, so a foreign, Orbax or corrupt
    directory is never removed. Each step is first renamed to
    ``<step>.nbckpt-deleting`` (atomically no longer a step), then deleted: a crash
    in between leaves no half-deleted step under a step's name.
    """
    doomed = [s for s in policy.doomed(records(root)) if s != keep]
    for step in doomed:
        remove_aside(step_dir(root, step))
    return doomed


def prune_after(root: Location, step: int) -> list[int]:
    """Remove every complete step nbckpt created that is newer than ``step``; return them.

    This is how a run rolls back: a save of a step older than the newest one is
    refused until the newer steps are gone. Each is removed as retention removes one
    (renamed aside, then deleted); Orbax's steps and foreign folders are never touched.
    """
    doomed = [r.step for r in records(root) if r.step > step]
    for s in doomed:
        remove_aside(step_dir(root, s))
    return doomed


def prune_everywhere(
    sync: Synchronizer,
    root: Location,
    primary: int,
    step: int,
    timeout_s: float,
    key: str | None = None,
) -> list[int]:
    """Every process: the primary runs :func:`prune_after`; all return what it removed.

    Every process of the job must call it (as with a save). The primary's outcome is
    shared, so that a failure raises on every process, and none goes on to save before
    the newer steps are gone. Given a ``key`` (unique to the call, the same on every
    process), the calls are matched by it, else by their order.
    """
    if key is not None:
        claim_key(sync.client, "rollback", key)
    seq = f"prune-key-{key}" if key is not None else f"prune{next_sequence()}"
    answer: dict[str, Any] = {}
    if sync.process_index == primary:
        try:
            answer["removed"] = prune_after(root, step)
        except Exception as e:
            answer["error"] = reason(e, root)
    answers = sync.gather(seq, "prune", json.dumps(answer), timeout_s=timeout_s)
    theirs = json.loads(answers[primary])
    if "error" in theirs:
        raise JobError(
            f"prune_after({step}) failed on process {primary}: {theirs['error']}",
            failures={primary: theirs["error"]},
        )
    return [int(s) for s in theirs["removed"]]
