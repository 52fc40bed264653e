"""The arguments of the magics that look, and of fault and retention.

ls, fault, fsck, show, status, timeline, watch and retention.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

from IPython.core.magic_arguments import argument

from nbckpt.magics.args.base import (
    DIR_ARG,
    MAX_IO_FACTOR,
    MAX_PROCESSES,
    OP_ARGS,
    MagicArgs,
    directory,
    factor,
    operation,
    seconds,
    whole,
)
from nbckpt.protocol import (
    FAULT_ACTIONS,
    FAULTS,
    PHASES,
    TIER_PHASES,
)
from nbckpt.session import RetentionPolicy

LS: Final = MagicArgs(
    "ckpt_ls",
    argument(
        "dir", nargs="?", metavar="DIR", help="checkpoint directory (default: the cluster's --dir)"
    ),
)


@dataclass(frozen=True, kw_only=True)
class LsArgs:
    """``%ckpt_ls``: the directory to list (None: the cluster's)."""

    directory: str | None


def parse_ls_args(line: str) -> LsArgs:
    """Parse and check ``%ckpt_ls``'s line; raise UsageError if anything is wrong."""
    ns = LS.parse(line)
    with LS.checking():
        return LsArgs(directory=directory(ns.dir, "DIR"))


FAULT: Final = MagicArgs(
    "ckpt_fault",
    argument(
        "action",
        choices=list(FAULT_ACTIONS),
        help=f"what to inject ({', '.join(FAULTS)}), or list / clear",
    ),
    argument("--process", metavar="P", help="the process to act on (not for list / clear)"),
    argument(
        "--at",
        choices=[str(p) for p in (*PHASES, *TIER_PHASES)],  # values, not reprs, in errors
        metavar="PHASE",
        help=f"the phase at which the fault fires: {', '.join((*PHASES, *TIER_PHASES))}",
    ),
    argument(
        "--seconds",
        metavar="S",
        help="how long a stall lasts (stall only; above 0, at most a week)",
    ),
    argument(
        "--factor",
        metavar="F",
        help=f"how many times slower slow-io writes (slow-io only; 1 to {MAX_IO_FACTOR:g})",
    ),
)

# Which options each fault takes; the others are refused rather than ignored.
_FAULT_OPTIONS: Final = {
    "kill": {"process", "at"},
    "stall": {"process", "at", "seconds"},
    "slow-io": {"process", "factor"},
    "fail-io": {"process", "at"},
    "preempt": {"process"},
    "list": set(),
    "clear": set(),
}


@dataclass(frozen=True, kw_only=True)
class FaultArgs:
    """``%ckpt_fault``: which fault, on which process, at which phase, how strong."""

    action: str
    process: int | None
    at: str | None
    seconds: float | None
    factor: float | None


def parse_fault_args(line: str) -> FaultArgs:
    """Parse and check ``%ckpt_fault``'s line; raise UsageError if anything is wrong."""
    ns = FAULT.parse(line)
    action = ns.action
    with FAULT.checking():
        given = {k for k in ("process", "at", "seconds", "factor") if getattr(ns, k) is not None}
        extra = sorted(given - _FAULT_OPTIONS[action])
        if extra:
            raise ValueError(f"%ckpt_fault {action} takes no --{extra[0]}")
        if action not in ("list", "clear") and ns.process is None:
            raise ValueError(f"%ckpt_fault {action} needs --process P")
        if action == "stall" and (ns.at is None or ns.seconds is None):
            raise ValueError("%ckpt_fault stall needs --at PHASE and --seconds S > 0")
        if action == "slow-io" and ns.factor is None:
            raise ValueError(
                f"%ckpt_fault slow-io needs --factor F >= 1 (at most {MAX_IO_FACTOR:g})"
            )
        return FaultArgs(
            action=action,
            process=None
            if ns.process is None
            else whole(ns.process, "--process", high=MAX_PROCESSES - 1),
            at=ns.at,
            seconds=None if ns.seconds is None else seconds(ns.seconds, "--seconds"),
            factor=None if ns.factor is None else factor(ns.factor),
        )


#: A plain decimal number of seconds, as ``--stale-after`` takes it.
_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")

FSCK: Final = MagicArgs(
    "ckpt_fsck",
    argument(
        "dir", nargs="?", metavar="DIR", help="checkpoint directory (default: the cluster's --dir)"
    ),
    argument("--clean", action="store_true", help="remove abandoned entries (only those)"),
    argument(
        "--verify",
        action="store_true",
        help="read every array of complete steps and check shapes and checksums",
    ),
    argument(
        "--stale-after",
        metavar="S",
        help="take an unfinished save silent for S seconds as abandoned (default 600; "
        "0 when you know its job is dead)",
    ),
)


@dataclass(frozen=True, kw_only=True)
class FsckArgs:
    """``%ckpt_fsck``: the directory (None: the cluster's) and what to do beyond reporting."""

    directory: str | None
    clean: bool
    verify: bool
    stale_after_s: float | None = None


def parse_fsck_args(line: str) -> FsckArgs:
    """Parse and check ``%ckpt_fsck``'s line; raise UsageError if anything is wrong."""
    ns = FSCK.parse(line)
    with FSCK.checking():
        stale = None
        if ns.stale_after is not None:
            text = ns.stale_after.strip()
            stale = float(text) if text.isascii() and _NUMBER.fullmatch(text) else math.nan
            if not math.isfinite(stale) or stale < 0:
                raise ValueError(f"--stale-after must be a number of seconds >= 0, got {text!r}")
        return FsckArgs(
            directory=directory(ns.dir, "DIR"),
            clean=ns.clean,
            verify=ns.verify,
            stale_after_s=stale,
        )


SHOW: Final = MagicArgs("ckpt_show", *OP_ARGS)
STATUS: Final = MagicArgs("ckpt_status", *OP_ARGS)


@dataclass(frozen=True, kw_only=True)
class OpArgs:
    """One operation (None: the default one) and its root (None: the default one)."""

    op: str | None
    directory: str | None


def _op_args(spec: MagicArgs, line: str) -> OpArgs:
    ns = spec.parse(line)
    with spec.checking():
        return OpArgs(op=operation(ns.op), directory=directory(ns.dir))


def parse_show_args(line: str) -> OpArgs:
    """Parse and check ``%ckpt_show``'s line; raise UsageError if anything is wrong."""
    return _op_args(SHOW, line)


def parse_status_args(line: str) -> OpArgs | None:
    """Parse ``%ckpt_status``'s line: None for the cluster's status, else one operation."""
    args = _op_args(STATUS, line)
    return None if args.op is None and args.directory is None else args


TIMELINE: Final = MagicArgs(
    "ckpt_timeline",
    *OP_ARGS,
    argument(
        "--last",
        metavar="N",
        help="draw the newest N saves of the directory on one time axis (instead of OP)",
    ),
    argument("--save", metavar="FILE.png", help="also write the figure to this PNG file"),
)


@dataclass(frozen=True, kw_only=True)
class TimelineArgs:
    """``%ckpt_timeline``: one operation or the newest ``last`` saves, and the PNG file."""

    op: str | None
    directory: str | None
    save: str | None
    last: int | None = None


def parse_timeline_args(line: str) -> TimelineArgs:
    """Parse and check ``%ckpt_timeline``'s line; raise UsageError if anything is wrong."""
    ns = TIMELINE.parse(line)
    with TIMELINE.checking():
        if ns.save is not None and not ns.save.lower().endswith(".png"):
            raise ValueError(f"--save writes PNG: give a file ending in .png, got {ns.save!r}")
        last = None if ns.last is None else whole(ns.last, "--last", low=1, high=100)
        if last is not None and ns.op is not None:
            raise ValueError("give OP (one operation) or --last N (several saves), not both")
        return TimelineArgs(
            op=operation(ns.op), directory=directory(ns.dir), save=ns.save, last=last
        )


WATCH: Final = MagicArgs(
    "ckpt_watch",
    argument(
        "dir", nargs="?", metavar="DIR", help="checkpoint directory (default: the cluster's --dir)"
    ),
    argument("--last", metavar="N", default="20", help="show the newest N saves (default 20)"),
    argument("--stop", action="store_true", help="stop watching (the table keeps its rows)"),
)


@dataclass(frozen=True, kw_only=True)
class WatchArgs:
    """``%ckpt_watch``: the root (None: the cluster's), how many saves, or stop."""

    directory: str | None
    last: int
    stop: bool


def parse_watch_args(line: str) -> WatchArgs:
    """Parse and check ``%ckpt_watch``'s line; raise UsageError if anything is wrong."""
    ns = WATCH.parse(line)
    with WATCH.checking():
        if ns.stop and ns.dir is not None:
            raise ValueError("--stop stops the watch there is; give it alone")
        last = whole(ns.last, "--last", low=1, high=1000)
        return WatchArgs(directory=directory(ns.dir, "DIR"), last=last, stop=ns.stop)


RETENTION: Final = MagicArgs(
    "ckpt_retention",
    DIR_ARG,
    argument("--max-to-keep", metavar="N", help="keep the newest N steps"),
    argument("--keep-period", metavar="K", help="also keep every multiple of K, for good"),
    argument("--best", metavar="N", help="also keep the best N steps by --metric"),
    argument("--metric", metavar="NAME", help="the metric recorded with %%ckpt_save --metric"),
    argument(
        "--best-mode",
        choices=["min", "max"],
        default="min",
        help="min: smaller is better (a loss); max: larger is better (default min)",
    ),
    argument("--interval", metavar="K", help="should_save(step) says yes every K steps"),
    argument("--keep-all", action="store_true", help="remove the policy: keep every step"),
)


@dataclass(frozen=True, kw_only=True)
class RetentionArgs:
    """``%ckpt_retention``: the root, and its new policy (None: only show the current one)."""

    directory: str | None
    policy: RetentionPolicy | None


def parse_retention_args(line: str) -> RetentionArgs:
    """Parse and check ``%ckpt_retention``'s line; raise UsageError if anything is wrong."""
    ns = RETENTION.parse(line)
    with RETENTION.checking():
        counts = {
            "max_to_keep": ns.max_to_keep,
            "keep_period": ns.keep_period,
            "best_n": ns.best,
            "save_interval_steps": ns.interval,
        }
        flags = {"max_to_keep": "--max-to-keep", "keep_period": "--keep-period"}
        flags.update(best_n="--best", save_interval_steps="--interval")
        given = {k: whole(v, flags[k], low=1) for k, v in counts.items() if v is not None}
        if ns.keep_all and (given or ns.metric is not None):
            raise ValueError("--keep-all removes the policy; give it alone")
        if ns.keep_all:
            return RetentionArgs(directory=directory(ns.dir), policy=RetentionPolicy())
        if not given and ns.metric is None:
            return RetentionArgs(directory=directory(ns.dir), policy=None)
        if (ns.best is None) != (ns.metric is None):
            raise ValueError("--best N and --metric NAME go together (e.g. --best 3 --metric loss)")
        policy = RetentionPolicy(**given, best_metric=ns.metric, best_mode=ns.best_mode)
        return RetentionArgs(directory=directory(ns.dir), policy=policy)
