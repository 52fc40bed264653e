"""The journal: one append-only JSON Lines file per process per operation.

On an object store, a finished operation's files become one summary object.

Writers live on the engines (:class:`JournalWriter`); readers merge the files of one
operation into a single record (:func:`read_operation`). Nothing here needs jax.
"""

from nbckpt.journal._failure import Failure, failure_of, gave_up_note
from nbckpt.journal._files import JournalReader, list_operations, read_matching, read_operation
from nbckpt.journal._reader import OperationRecord, PhaseSpan, ProcessRecord, merge_events
from nbckpt.journal._summary import SUMMARY_FILE, summarize, summarize_quietly
from nbckpt.journal._writer import EVENTS, JournalWriter

__all__ = [
    "EVENTS",
    "Failure",
    "JournalReader",
    "JournalWriter",
    "OperationRecord",
    "PhaseSpan",
    "SUMMARY_FILE",
    "ProcessRecord",
    "failure_of",
    "gave_up_note",
    "list_operations",
    "merge_events",
    "read_matching",
    "read_operation",
    "summarize",
    "summarize_quietly",
]
