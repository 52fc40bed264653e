"""Usage errors: the call asked for something nbckpt refuses; fix the call."""

from __future__ import annotations

from nbckpt.errors._base import CallError

__all__ = [
    "CommitRefusedError",
    "DisagreementError",
    "RenameUnavailableError",
    "RollbackRefusedError",
    "StepExistsError",
    "StorageURLError",
]


class StepExistsError(CallError, FileExistsError):
    """The step to save is already committed under the root."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"step already committed at {path}; pick a new step, or pass force=True to replace it"
        )


class RollbackRefusedError(CallError, ValueError):
    """A save of a step older than the newest complete step under the root."""

    def __init__(self, root: str, step: int, newer: list[int]) -> None:
        self.root = root
        self.step = step
        self.newer = list(newer)
        shown = ", ".join(str(s) for s in newer[:5]) + (" ..." if len(newer) > 5 else "")
        super().__init__(
            f"step {step} is older than steps {shown} under {root}: retention would delete it "
            f"and a restore would pick step {newer[-1]}; to roll back, delete the newer steps "
            f"first (ckptr.prune_after({step}), or %ckpt_rollback {step} in a notebook), then "
            "save; nothing was written"
        )


class DisagreementError(CallError, ValueError):
    """The processes of a save asked for different things; nothing was written."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(
            f"the processes disagree on this save: {detail}; every process must save the "
            "same tree with the same options; nothing was written"
        )


class CommitRefusedError(CallError, FileExistsError):
    """A forced re-save in commit-file mode would have to delete the committed step first."""

    def __init__(self, path: str) -> None:
        self.path = path
        local = "://" not in path
        super().__init__(
            f"step already committed at {path}, and commit-file mode writes in place, so "
            "replacing it would lose it if the new save failed; nothing was written: save "
            + (
                "under a new step, or use mode='rename' to replace it safely"
                if local
                else "under a new step (object stores have no rename, so a committed step "
                "there is never replaced)"
            )
        )


class StorageURLError(CallError, ValueError):
    """A root given as a URL whose scheme nbckpt cannot store checkpoints at."""

    def __init__(self, url: str, supported: str) -> None:
        self.url = url
        super().__init__(
            f"cannot store checkpoints at {url}: nbckpt supports {supported}; nothing was "
            "written (a URL is never taken for a local path)"
        )


class RenameUnavailableError(CallError, ValueError):
    """Rename mode was asked of a root whose store has no atomic rename."""

    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__(
            f"rename mode is not available at {url}: object stores have no atomic rename, "
            "so steps there are published by a commit object written last; leave mode "
            "unset (or pass mode='commit_file')"
        )


class NoRootError(CallError, ValueError):
    """A checkpointer was made without a root, and none was set for this process."""

    def __init__(self, variable: str) -> None:
        super().__init__(
            "no checkpoint root: pass one (AsyncCheckpointer('/shared/ckpt')), or start "
            f"the cluster with %ckpt_cluster start --dir D, which sets {variable} on every "
            "engine"
        )
