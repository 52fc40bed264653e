"""The ``%ckpt_*`` magics' arguments: declared once, split as a shell would, validated.

Each magic's arguments are one :class:`MagicArgs`. It decorates the magic, so that
``%ckpt_save?`` shows the help argparse builds from the declarations, and it parses a
line with the same declarations. A ``parse_*_args(line)`` function per magic splits the
line, parses it and checks every value, returning a small frozen dataclass or raising
:class:`~IPython.core.error.UsageError` (message, then the usage line). They need no
shell and no cluster, so every misuse can be tested on its own; the magics run only
what parsed. Argument groups that several magics share (``--dir``, ``--timeout``, an
operation and its ``--dir``) are declared here once.

The declarations are split by magic group: :mod:`.base` (declaring once, and the
checks every magic shares), :mod:`.cluster`, :mod:`.operations` (save, barrier,
restore, wait), :mod:`.inspect` (ls, fault, fsck, show, status, timeline, watch,
retention) and :mod:`.tiers`. Every name is importable from here.
"""

from __future__ import annotations

from nbckpt.magics.args.base import (
    DIR_ARG,
    MAX_IO_FACTOR,
    MAX_PROCESSES,
    MAX_STEP,
    MAX_TIMEOUT_S,
    OP_ARGS,
    MagicArgs,
    directory,
    factor,
    operation,
    processes,
    seconds,
    timeout_arg,
    variable,
    whole,
)
from nbckpt.magics.args.cluster import (
    CLUSTER,
    ClusterArgs,
    parse_cluster_args,
)
from nbckpt.magics.args.inspect import (
    FAULT,
    FSCK,
    LS,
    RETENTION,
    SHOW,
    STATUS,
    TIMELINE,
    WATCH,
    FaultArgs,
    FsckArgs,
    LsArgs,
    OpArgs,
    RetentionArgs,
    TimelineArgs,
    WatchArgs,
    parse_fault_args,
    parse_fsck_args,
    parse_ls_args,
    parse_retention_args,
    parse_show_args,
    parse_status_args,
    parse_timeline_args,
    parse_watch_args,
)
from nbckpt.magics.args.operations import (
    BARRIER,
    RESTORE,
    SAVE,
    WAIT,
    BarrierArgs,
    RestoreArgs,
    SaveArgs,
    parse_barrier_args,
    parse_restore_args,
    parse_save_args,
    parse_wait_args,
)
from nbckpt.magics.args.tiers import TIERS, TiersArgs, parse_tiers_args

__all__ = [
    "BARRIER",
    "BarrierArgs",
    "CLUSTER",
    "ClusterArgs",
    "DIR_ARG",
    "FAULT",
    "FSCK",
    "FaultArgs",
    "FsckArgs",
    "LS",
    "LsArgs",
    "MAX_IO_FACTOR",
    "MAX_PROCESSES",
    "MAX_STEP",
    "MAX_TIMEOUT_S",
    "MagicArgs",
    "OP_ARGS",
    "OpArgs",
    "RESTORE",
    "RETENTION",
    "RestoreArgs",
    "RetentionArgs",
    "SAVE",
    "SHOW",
    "STATUS",
    "SaveArgs",
    "TIERS",
    "TIMELINE",
    "TiersArgs",
    "TimelineArgs",
    "WatchArgs",
    "WAIT",
    "WATCH",
    "directory",
    "factor",
    "operation",
    "parse_barrier_args",
    "parse_cluster_args",
    "parse_fault_args",
    "parse_fsck_args",
    "parse_ls_args",
    "parse_restore_args",
    "parse_retention_args",
    "parse_save_args",
    "parse_show_args",
    "parse_status_args",
    "parse_tiers_args",
    "parse_timeline_args",
    "parse_wait_args",
    "parse_watch_args",
    "processes",
    "seconds",
    "timeout_arg",
    "variable",
    "whole",
]
