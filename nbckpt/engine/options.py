"""The options of an :class:`~nbckpt.engine.AsyncCheckpointer`."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from nbckpt.engine.tiers.options import TierOptions
from nbckpt.errors import NoRootError
from nbckpt.formats.packs import DEFAULT_PACK_BYTES
from nbckpt.formats.retention import RetentionPolicy
from nbckpt.protocol import DEFAULT_SAVE_TIMEOUT_S, DIR_ENV, RENAME, Mode
from nbckpt.storage import Location

__all__ = ["CheckpointerOptions", "check_pack_bytes", "check_step", "root_or_default"]


def root_or_default(
    root: str | os.PathLike[str] | Location | None,
) -> str | os.PathLike[str] | Location:
    """``root``, else the cluster's ``--dir``, which ``%ckpt_cluster start`` set here.

    Raises
    ------
    NoRootError
        Without ``root`` and without :data:`~nbckpt.protocol.DIR_ENV` in the environment.
    """
    if root is not None:
        return root
    found = os.environ.get(DIR_ENV)
    if not found:
        raise NoRootError(DIR_ENV)
    return found


@dataclass(frozen=True, kw_only=True)
class CheckpointerOptions:
    """How an :class:`AsyncCheckpointer` commits.

    Attributes
    ----------
    mode
        ``"rename"``: write into ``<step>.nbckpt-tmp`` and rename it to ``<step>``.
        ``"commit_file"``: write into ``<step>`` and mark it complete with a
        commit-success file, for stores whose rename is not atomic. The checkpointer
        picks rename on local file systems and commit-file on object stores
        (``s3://``, ``gs://``), where rename mode is refused.
    primary
        The process that creates directories, finalizes and applies retention.
    timeout_s
        Deadline of every barrier and agreement, in seconds.
    retention
        Which complete steps the primary keeps after each commit (see
        :class:`~nbckpt.formats.retention.RetentionPolicy`); the default keeps all.
    format
        How the arrays are stored: None or ``"nbckpt"``, nbckpt's own layout (an
        uncompressed zarr v2 array per leaf); ``"orbax"``, Orbax's OCDBT layout (zarr
        v3 arrays, zstd-compressed, in one OCDBT database per process, merged at the
        end). Orbax's ``StandardCheckpointer`` restores steps of either format, and
        nbckpt restores both.
    tiers
        The local tier (see :class:`~nbckpt.engine.tiers.local.TierOptions`): none by
        default, and then every save goes to the root.
    pack_bytes
        In nbckpt's own layout, leaves whose shards are each of at most this many
        bytes are packed, one file per process (:mod:`nbckpt.formats.packs`): a state
        of many small leaves, or of matrices split into small shards, is written and
        read with a few requests, not several per leaf. Orbax cannot read
        packed leaves: 0 packs none, and then Orbax restores every step. With a local
        tier, only leaves of at most 1 MiB in all are packed (peers send a pack whole,
        and a replaced host would fetch every pack holding a chunk it needs).
    keep_host_buffers
        Keep the host memory that a save copied into for the next save
        (:mod:`nbckpt.engine.save.hostmem`), so that each save's copy reuses it
        instead of faulting in new memory: NumPy leaves, offloaded shards, and CPU
        shards where XLA would donate a buffer the save holds (otherwise a CPU
        array is written from its own buffers, see
        :mod:`nbckpt.engine.save.snapshot`). False frees it once each save ends.
    """

    mode: Mode = RENAME
    primary: int = 0
    timeout_s: float = DEFAULT_SAVE_TIMEOUT_S
    retention: RetentionPolicy = dataclasses.field(default_factory=RetentionPolicy)
    format: str | None = None
    tiers: TierOptions = dataclasses.field(default_factory=TierOptions)
    pack_bytes: int = DEFAULT_PACK_BYTES
    keep_host_buffers: bool = True


def check_pack_bytes(value: object) -> int:
    """Return ``value`` if it is a non-negative int; raise ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"pack_bytes must be a non-negative int (0 packs nothing), got {value!r}")
    return value


def check_step(step: object) -> int:
    """Return ``step`` if it is a non-negative int; raise ValueError otherwise."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    return step
