"""Data errors: what the root holds is corrupt, missing, foreign or owned by another save."""

from __future__ import annotations

from collections.abc import Mapping

from nbckpt.errors._base import CheckpointDataError

__all__ = ["CorruptCheckpointError", "ForeignEntryError", "StepBusyError", "StepNotFoundError"]


class StepNotFoundError(CheckpointDataError, FileNotFoundError):
    """The step to restore is not a complete checkpoint under the root."""

    def __init__(self, root: str, step: int | None, existing: list[int]) -> None:
        self.root = root
        self.step = step
        self.existing = existing
        have = ", ".join(str(s) for s in existing) if existing else "none"
        what = "no complete checkpoint" if step is None else f"no complete step {step}"
        # GCS answers 404 for a missing bucket as for a missing object, and tensorstore
        # lists both as empty: the one case where a typo in a bucket's name is silent.
        typo = (
            "; a bucket that does not exist also reads as empty on gs://"
            if (not existing and root.startswith("gs://"))
            else ""
        )
        super().__init__(f"{what} in {root}; complete steps there: {have}{typo}")


class ForeignEntryError(CheckpointDataError, FileExistsError):
    """A path nbckpt would write holds something nbckpt did not create."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"{path} exists and was not created by nbckpt, which never writes over or "
            "deletes it (even with force); nothing was written: move it away or pick "
            "another step"
        )


class CorruptCheckpointError(CheckpointDataError, ValueError):
    """A chunk read back does not match the checksum recorded when it was saved."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(
            f"checkpoint data at {path} is damaged ({detail}); nothing was restored: "
            "restore another step, and run %ckpt_fsck --verify to see what else is hurt"
        )


class StepBusyError(CheckpointDataError, FileExistsError):
    """Another job (or another save of this one) owns the step this save would write.

    Attributes
    ----------
    path
        The working directory the other save holds.
    owner
        Its owner record: ``op``, ``host``, ``pid`` and ``time`` (when it claimed it).
    """

    def __init__(self, path: str, owner: Mapping[str, object]) -> None:
        self.path = path
        self.owner = dict(owner)
        since = owner.get("time")
        when = ""
        if isinstance(since, int | float):
            import datetime

            stamp = datetime.datetime.fromtimestamp(float(since), datetime.UTC)
            when = f" since {stamp:%Y-%m-%d %H:%M:%S} UTC"
        super().__init__(
            f"{path} is being written by another save (op {owner.get('op')}, host "
            f"{owner.get('host')}, pid {owner.get('pid')}{when}); two jobs must not save "
            "one step to one root: wait for it to end, or if that job is dead remove its "
            "claim with %ckpt_fsck --clean --stale-after 0 (in a shell: nbckpt fsck "
            "ROOT --clean --stale-after 0)"
        )
