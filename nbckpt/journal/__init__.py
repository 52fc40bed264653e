"""The journal: one append-only JSON Lines file per process per operation.

Writers live on the engines (:class:`JournalWriter`); readers merge the files of one
operation into a single record (:func:`read_operation`). Nothing here needs jax.
"""

from nbckpt.journal._reader import (
    JournalReader,
    OperationRecord,
    PhaseSpan,
    ProcessRecord,
    list_operations,
    merge_events,
    read_matching,
    read_operation,
)
from nbckpt.journal._writer import EVENTS, JournalWriter

__all__ = [
    "EVENTS",
    "JournalReader",
    "JournalWriter",
    "OperationRecord",
    "PhaseSpan",
    "ProcessRecord",
    "list_operations",
    "merge_events",
    "read_matching",
    "read_operation",
]
