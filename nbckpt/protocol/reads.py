"""What the notebook may ask of the engines' service, by function name.

Every engine runs a small service in a thread of its own
(:mod:`nbckpt.engine.remote.relay`), so it answers while a ``%%px`` cell (a training
loop) keeps the engine busy. On a cluster whose storage the notebook cannot see, it
answers the notebook's reads of checkpoint records (:data:`READS`, sent through
:mod:`nbckpt.session.reads`); on every cluster, the controls that must reach a busy
engine at once (:data:`CONTROLS`: arm, list or clear a fault; report the process's
status). Both sides agree on these lists, and the service runs these functions and
nothing else.
"""

from __future__ import annotations

__all__ = [
    "ALL_STEPS",
    "CONTROLS",
    "FAULT",
    "STATUS",
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

#: Arm, list or clear a fault in the process (``%ckpt_fault``), now, not after a cell.
FAULT = "nbckpt.engine.remote.agent:fault"
#: The process's report: host, pid, checkpointers, what is in flight, armed faults.
STATUS = "nbckpt.engine.remote.agent:status"
CONTROLS = frozenset({FAULT, STATUS})
