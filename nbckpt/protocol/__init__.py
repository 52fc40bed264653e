"""The nbckpt protocol: its words and ids, and the shapes of the views it sends.

- :mod:`nbckpt.protocol.words`: every phase, event, status, kind, cause, mode, key
  and op id the engine journals and the views read back, with the name and timeout
  checks every entry point shares. A module that needs one imports it from here.
- :mod:`nbckpt.protocol.views`: the shapes (typed dicts) of what the server's routes
  and the progress widget send; :mod:`nbckpt.views` computes their values.
- :mod:`nbckpt.protocol.typescript`: writes the TypeScript types of both for the lab
  extension (``python -m nbckpt.protocol.typescript``), so the front end never retypes
  a word or a field.

The data path these names travel::

    notebook (magics -> client) --ipyparallel--> engine (agent -> checkpointer)
        -> storage (tensorstore arrays, metadata, commit)   <root>/<step>/...
        -> journal (one JSONL file per process per op)      <root>/.nbckpt/ops/<op>/
        -> views (monitor -> widgets, timeline, server -> lab sidebar)
"""

from __future__ import annotations

from nbckpt.protocol.views import ProtocolNames
from nbckpt.protocol.words import (
    BARRIER_PREFIX,
    BARRIERS,
    COMMIT_FILE_MODE,
    DECISION_KEY,
    DEFAULT_BARRIER_TIMEOUT_S,
    DEFAULT_SAVE_TIMEOUT_S,
    DIR_ENV,
    DIR_NAME,
    END_EVENT,
    END_STATUS,
    END_STATUSES,
    FAILED_KEY,
    FAULT_ACTIONS,
    FAULTS,
    FORMATS,
    HOST_BARRIER_ENV,
    KEY_PREFIX,
    MODES,
    NBCKPT_FORMAT,
    ORBAX_FORMAT,
    PHASES,
    PROCESS_PLACEHOLDER,
    READ_BARRIER,
    RENAME,
    SPANS,
    SPANS_BY_KIND,
    TIER_PHASES,
    Barrier,
    BarrierState,
    Cause,
    Event,
    Kind,
    Mode,
    OpId,
    Phase,
    SaveFormat,
    Status,
    Tier,
    TierBarrier,
    as_json,
    barrier_key,
    barrier_op_glob,
    barrier_op_id,
    barrier_phase,
    check_name,
    check_optional_timeout,
    check_timeout,
    new_op_id,
    parse_op_id,
)

__all__ = [
    "BARRIERS",
    "BARRIER_PREFIX",
    "COMMIT_FILE_MODE",
    "DECISION_KEY",
    "DEFAULT_BARRIER_TIMEOUT_S",
    "FAULTS",
    "FAULT_ACTIONS",
    "DEFAULT_SAVE_TIMEOUT_S",
    "DIR_ENV",
    "DIR_NAME",
    "END_EVENT",
    "END_STATUS",
    "END_STATUSES",
    "FAILED_KEY",
    "FORMATS",
    "HOST_BARRIER_ENV",
    "KEY_PREFIX",
    "MODES",
    "NBCKPT_FORMAT",
    "ORBAX_FORMAT",
    "PHASES",
    "PROCESS_PLACEHOLDER",
    "TIER_PHASES",
    "READ_BARRIER",
    "RENAME",
    "SPANS",
    "SPANS_BY_KIND",
    "Barrier",
    "BarrierState",
    "Cause",
    "Event",
    "Kind",
    "Mode",
    "OpId",
    "Phase",
    "ProtocolNames",
    "SaveFormat",
    "Status",
    "Tier",
    "TierBarrier",
    "as_json",
    "barrier_key",
    "barrier_op_glob",
    "barrier_op_id",
    "barrier_phase",
    "check_name",
    "check_optional_timeout",
    "check_timeout",
    "new_op_id",
    "parse_op_id",
]
