"""The options of a checkpointer's local tier (issue 28), without its machinery."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from nbckpt.storage import Location

__all__ = ["TierOptions", "root_key", "tier_options"]


@dataclass(frozen=True)
class TierOptions:
    """How a checkpointer keeps its local tier.

    Attributes
    ----------
    local_dir
        This host's local directory (None: no local tier).
    local_replicas
        How many other hosts keep a copy of each host's shards.
    persistent_every
        Every how many steps a save also goes to the persistent root: a step that is a
        multiple of it does (1: every save).
    local_keep
        How many of the newest local steps each host keeps.
    """

    local_dir: str | None = None
    local_replicas: int = 1
    persistent_every: int = 1
    local_keep: int = 2

    def __post_init__(self) -> None:
        for name, low in (("local_replicas", 0), ("persistent_every", 1), ("local_keep", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int of at least {low}, got {value!r}")
        if self.local_dir is not None and not str(self.local_dir).strip():
            raise ValueError("local_dir must be a directory, got an empty string")

    def persistent(self, step: int) -> bool:
        """Whether a save of ``step`` also goes to the persistent root by default."""
        return self.local_dir is None or step % self.persistent_every == 0


def root_key(root: Location) -> str:
    """A short name for ``root`` under a local directory (one per persistent root)."""
    return hashlib.sha256(str(root).encode()).hexdigest()[:16]


def tier_options(
    local_dir: str | os.PathLike[str] | None,
    local_replicas: int,
    persistent_every: int,
    local_keep: int,
) -> TierOptions:
    """Check and bundle the checkpointer's tier keywords."""
    return TierOptions(
        local_dir=None if local_dir is None else os.fspath(local_dir),
        local_replicas=local_replicas,
        persistent_every=persistent_every,
        local_keep=local_keep,
    )
