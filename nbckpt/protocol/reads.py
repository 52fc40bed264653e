"""The reads the notebook may ask of the engines' read service, by function name.

On a cluster whose storage the notebook cannot see, the engines answer the notebook's
reads of checkpoint records (:mod:`nbckpt.engine.remote.relay`); the notebook sends
them through :mod:`nbckpt.session.reads`. Both sides agree on this list, and the
service runs these functions and nothing else.
"""

from __future__ import annotations

__all__ = [
    "ALL_STEPS",
    "FSCK",
    "IS_COMPLETE",
    "LIST_OPERATIONS",
    "LIST_STEPS",
    "READS",
    "READ_MATCHING",
    "READ_METADATA",
    "READ_OPERATION",
]

READ_OPERATION = "nbckpt.journal:read_operation"
READ_MATCHING = "nbckpt.journal:read_matching"
LIST_OPERATIONS = "nbckpt.journal:list_operations"
IS_COMPLETE = "nbckpt.formats.layout:is_complete"
READ_METADATA = "nbckpt.formats.layout:read_metadata"
LIST_STEPS = "nbckpt.formats.inventory:list_steps"
#: The complete steps alone, without classifying the rest (``%ckpt_tiers``).
ALL_STEPS = "nbckpt.formats.layout:all_steps"
#: fsck reads, and removes only with the ``clean=True`` the user asked for.
FSCK = "nbckpt.formats.fsck:fsck"
READS = frozenset(
    {
        READ_OPERATION,
        READ_MATCHING,
        LIST_OPERATIONS,
        IS_COMPLETE,
        READ_METADATA,
        LIST_STEPS,
        ALL_STEPS,
        FSCK,
    }
)
