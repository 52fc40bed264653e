"""The ``%ckpt_*`` magics' arguments: declared once, split as a shell would, validated.

Each magic's arguments are one :class:`MagicArgs`. It decorates the magic, so that
``%ckpt_save?`` shows the help argparse builds from the declarations, and it parses a
line with the same declarations. A ``parse_*_args(line)`` function per magic splits the
line, parses it and checks every value, returning a small frozen dataclass or raising
:class:`~IPython.core.error.UsageError` (message, then the usage line). They need no
shell and no cluster, so every misuse can be tested on its own; the magics run only
what parsed. Argument groups that several magics share (``--dir``, ``--timeout``, an
operation and its ``--dir``) are declared here once.
"""

from __future__ import annotations

import argparse
import keyword
import math
import os
import re
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic_arguments import ArgDecorator, argument, magic_arguments

from nbckpt.formats.retention import RetentionPolicy
from nbckpt.magics.checks import metrics, repeated_option
from nbckpt.protocol import (
    DEFAULT_BARRIER_TIMEOUT_S,
    DEFAULT_SAVE_TIMEOUT_S,
    FORMATS,
    MODES,
    PHASES,
    Mode,
    check_name,
    check_timeout,
)
from nbckpt.session.cluster import LAUNCHERS

__all__ = [
    "BARRIER",
    "CLUSTER",
    "DIR_ARG",
    "FAULT",
    "FSCK",
    "LS",
    "OP_ARGS",
    "RESTORE",
    "SAVE",
    "SHOW",
    "STATUS",
    "TIMELINE",
    "WATCH",
    "WAIT",
    "BarrierArgs",
    "ClusterArgs",
    "FaultArgs",
    "FsckArgs",
    "LsArgs",
    "MagicArgs",
    "OpArgs",
    "RETENTION",
    "RestoreArgs",
    "RetentionArgs",
    "SaveArgs",
    "TimelineArgs",
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
    "parse_timeline_args",
    "parse_watch_args",
    "parse_wait_args",
]

F = TypeVar("F", bound=Callable[..., Any])

#: The longest deadline a magic accepts. Every layer below takes a finite deadline, but
#: not every one takes any: threading refuses waits beyond ``threading.TIMEOUT_MAX`` and
#: the coordination service counts milliseconds. A deadline past a week is a typo.
MAX_TIMEOUT_S: Final = 7 * 24 * 3600.0
#: The largest step: the lab sidebar reads steps as JSON numbers, exact up to 2**53 - 1.
MAX_STEP: Final = 2**53 - 1
#: Bounds on counts and indices of processes and devices, so that a typo such as
#: ``-n 40000`` is refused instead of launching engines until the machine gives up.
MAX_PROCESSES: Final = 4096
#: How much slower ``slow-io`` may make writes: beyond this a save only looks hung.
MAX_IO_FACTOR: Final = 1000.0


# -- declaring arguments once --------------------------------------------------------


def _stub(name: str) -> Callable[..., None]:
    def stub(line: str) -> None:
        """Parse only; the magic method carries the help text."""

    stub.__name__ = name
    return stub


class MagicArgs:
    """One magic's arguments: they decorate the magic and parse its lines.

    Parameters
    ----------
    name
        The magic's name (``ckpt_save``), shown in the usage line.
    *decorators
        IPython ``argument`` decorators, in the order they appear in the help; shared
        groups are tuples of them, spliced in with ``*``.

    Notes
    -----
    The magic method gets its own parser from the same decorators (that is where
    ``%magic?`` reads its help), and :meth:`parse` uses one built on a stub, so that
    lines parse without an IPython shell. Both come from one declaration.
    """

    def __init__(self, name: str, *decorators: ArgDecorator) -> None:
        self.name = name
        self.decorators = decorators
        self.parser: argparse.ArgumentParser = self(_stub(name)).parser  # type: ignore[attr-defined]
        # Usage as one line: IPython formats it as an RST block for the docs.
        self.usage = "usage: " + " ".join(self.parser.format_usage().removeprefix("::").split())

    def __call__(self, func: F) -> F:
        """Declare the arguments on ``func`` and build its parser and help text."""
        for deco in reversed(self.decorators):
            func = deco(func)
        decorated: F = magic_arguments()(func)
        return decorated

    def error(self, message: str) -> UsageError:
        """A UsageError: ``message``, then this magic's usage line."""
        return UsageError(f"{message}\n{self.usage}")

    @contextmanager
    def checking(self) -> Iterator[None]:
        """Turn a check's one-line ValueError into this magic's UsageError."""
        try:
            yield
        except ValueError as e:
            raise self.error(str(e)) from None

    def split(self, line: str) -> list[str]:
        """Split ``line`` as a POSIX shell would: quotes removed, escapes applied.

        IPython's own splitting keeps quotes in the values (``--dir "/a b"`` would name
        a directory with quote characters) and raises a bare ValueError on an
        unbalanced quote; here that is a UsageError.
        """
        try:
            tokens = shlex.split(line, posix=True)
        except ValueError as e:
            raise self.error(f"cannot split the arguments as a shell would: {e}") from None
        if any("\0" in t for t in tokens):
            raise self.error("arguments cannot contain NUL characters")
        return tokens

    def parse(self, line: str) -> argparse.Namespace:
        """Split ``line`` (:meth:`split`) and parse it with the declared arguments."""
        tokens = self.split(line)
        if (flag := repeated_option(self.parser, tokens)) is not None:
            raise self.error(f"{flag} is given twice; give it once")
        try:
            return self.parser.parse_args(tokens)
        except UsageError as e:  # what argparse found wrong, without the usage line
            raise self.error(str(e)) from None


#: ``--dir``: shared by every magic that reads or writes a checkpoint root.
DIR_ARG: Final = argument(
    "--dir",
    help="checkpoint directory, or s3://bucket/prefix (default: the cluster's --dir); "
    "quote a path with spaces",
)
#: An operation and its root, for the magics that read one operation's journal.
OP_ARGS: Final = (
    argument(
        "op",
        nargs="?",
        metavar="OP",
        help="operation id or its journal folder (default: this session's last save, "
        "else the newest operation in the directory)",
    ),
    DIR_ARG,
)


def timeout_arg(default: float, what: str) -> ArgDecorator:
    """``--timeout``: a deadline in seconds, checked like every other one."""
    # A string default goes through the same check as a typed value.
    return argument(
        "--timeout",
        metavar="SECONDS",
        default=f"{default:g}",
        help=f"{what} in seconds, finite and above 0, at most a week (default {default:g})",
    )


# -- checks (one-line ValueErrors; MagicArgs.checking makes them UsageErrors) -----------


def whole(text: str, what: str, *, low: int = 0, high: int = MAX_STEP) -> int:
    """Return ``text`` as an int in ``[low, high]``; only ASCII digits count.

    ``int()`` also reads other scripts' digits (``int("٣") == 3``), ``+3``, `` 3`` and
    ``3_0``; a step names a folder and an index a process, so only the digits 0-9 are
    taken, and a number is what it looks like.
    """
    if not (text.isascii() and text.isdigit()):
        raise ValueError(
            f"{what} takes a whole number ({low} or more, in digits 0-9), got {text!r}"
        )
    # Compare lengths first: int() of thousands of digits is slow or refused.
    if len(text.lstrip("0")) > len(str(high)) or not low <= int(text) <= high:
        raise ValueError(f"{what} must be from {low} to {high}, got {text}")
    return int(text)


def seconds(text: str, what: str) -> float:
    """Return a deadline: a finite number of seconds above 0, at most :data:`MAX_TIMEOUT_S`."""
    if not text.isascii():  # float() reads non-ASCII digits too
        raise ValueError(f"{what} must be a number of seconds, got {text!r}")
    value = check_timeout(text.strip(), what)
    if value > MAX_TIMEOUT_S:
        raise ValueError(f"{what} must be at most {MAX_TIMEOUT_S:g} s (a week), got {text}")
    return value


def factor(text: str) -> float:
    """Return a slow-down factor: a finite number from 1 to :data:`MAX_IO_FACTOR`."""
    try:
        value = float(text) if text.isascii() else math.nan
    except ValueError:
        value = math.nan
    if not 1 <= value <= MAX_IO_FACTOR:  # also refuses nan
        raise ValueError(
            f"%ckpt_fault slow-io needs --factor F >= 1 (at most {MAX_IO_FACTOR:g}), got {text!r}"
        )
    return value


def processes(text: str) -> list[int]:
    """Return ``0,2`` as ``[0, 2]``: at least one index, each in digits; sorted, unique."""
    parts = text.split(",")
    if any(not p.strip() for p in parts):
        raise ValueError(f"--processes takes indices like 0,2; got {text!r}")
    try:
        return sorted({whole(p.strip(), "--processes", high=MAX_PROCESSES - 1) for p in parts})
    except ValueError as e:
        raise ValueError(f"--processes takes indices like 0,2; {e}") from None


def directory(text: str | None, what: str = "--dir") -> str | None:
    """Return a directory argument, ``~`` expanded; refuse an empty one (the cwd)."""
    if text is not None and not text.strip():
        raise ValueError(f"{what} needs a directory, got an empty one")
    return None if text is None else os.path.expanduser(text)


def operation(text: str | None) -> str | None:
    """Return an OP argument, ``~`` expanded; refuse an empty one (the ops folder)."""
    if text is not None and not text.strip():
        raise ValueError("OP needs an operation id or a journal folder, got an empty one")
    return None if text is None else os.path.expanduser(text)


def variable(text: str) -> str:
    """Return ``text`` if it can name a variable in the engines' namespace."""
    if not text.isidentifier() or keyword.iskeyword(text):
        raise ValueError(f"VAR must be a Python variable name, got {text!r}")
    return text


# -- the magics' arguments -----------------------------------------------------------

CLUSTER: Final = MagicArgs(
    "ckpt_cluster",
    argument(
        "action",
        choices=["start", "stop", "status", "attach", "restart"],
        help="start a new cluster, attach to a running one, show it, stop it, or "
        "restart it with fresh engines",
    ),
    argument(
        "-n",
        default=None,
        help=f"number of engines / JAX processes, 1 to {MAX_PROCESSES} (start; default 4, "
        "or one per --hosts entry)",
    ),
    argument(
        "--devices-per-process",
        default="1",
        help=f"CPU devices per process, 1 to {MAX_PROCESSES} (default 1)",
    ),
    argument("--dir", help="default checkpoint directory for the other magics"),
    argument(
        "--engines",
        choices=list(LAUNCHERS),
        default="local",
        help="how engines start (start): on this machine, or with ipyparallel's ssh, "
        "mpi (mpiexec) or slurm (sbatch) launcher (default local)",
    ),
    argument(
        "--hosts",
        metavar="H0,H1,...",
        help="ssh hosts, one per engine in process order; process 0 runs on the first "
        "(start --engines ssh)",
    ),
    argument(
        "--controller-ip",
        metavar="ADDR",
        help="where the controller listens (start; default 127.0.0.1 for local "
        "engines, this machine's address toward the first host for ssh, the address "
        "of this machine's name for mpi and slurm)",
    ),
    argument(
        "--coordinator-host",
        metavar="ADDR",
        help="address of process 0's coordination service (default 127.0.0.1 for "
        "local engines, else process 0's address toward the controller)",
    ),
    argument("--ssh-config", metavar="FILE", help="ssh config file, as ssh -F (start)"),
    argument(
        "--python",
        metavar="PATH",
        help="Python with nbckpt on the ssh hosts (start; default this kernel's)",
    ),
    argument("--profile", help="ipyparallel profile (start, attach)"),
    timeout_arg(120.0, "deadline for engines to register and join (start, attach)"),
    argument(
        "--cluster-id",
        help="id of the cluster to attach to, as start prints it (required by attach)",
    ),
)


@dataclass(frozen=True, kw_only=True)
class ClusterArgs:
    """``%ckpt_cluster``: the action and, for start / attach, how to build the cluster."""

    action: str
    n: int
    devices_per_process: int
    directory: str | None
    engines: str
    hosts: list[str]
    controller_ip: str | None
    coordinator_host: str | None
    ssh_config: str | None
    python: str | None
    profile: str | None
    cluster_id: str | None
    timeout_s: float


#: What only ``start`` takes, by its flag and the name argparse gives it.
_START_ONLY = {
    "-n": "n",
    "--engines": "engines",
    "--hosts": "hosts",
    "--controller-ip": "controller_ip",
    "--ssh-config": "ssh_config",
    "--python": "python",
}


def _address(text: str | None, flag: str) -> str | None:
    if text is None:
        return None
    if not text.strip() or any(c.isspace() for c in text):
        raise ValueError(f"{flag} needs a host name or address, got {text!r}")
    return text


def _hosts(text: str | None, engines: str) -> list[str]:
    if text is None:
        if engines == "ssh":
            raise ValueError("--engines ssh needs --hosts H0,H1,... (one per engine)")
        return []
    if engines != "ssh":
        raise ValueError(f"--hosts is for --engines ssh; {engines} engines are placed otherwise")
    hosts = [h.strip() for h in text.split(",")]
    if not all(hosts) or any(any(c.isspace() for c in h) for h in hosts):
        raise ValueError(f"--hosts takes names separated by commas, got {text!r}")
    return hosts


def parse_cluster_args(line: str) -> ClusterArgs:
    """Parse and check ``%ckpt_cluster``'s line; raise UsageError if anything is wrong."""
    ns = CLUSTER.parse(line)
    with CLUSTER.checking():
        if ns.action != "start":
            given = [
                f for f, name in _START_ONLY.items() if getattr(ns, name) not in (None, "local")
            ]
            if given:
                raise ValueError(f"{', '.join(given)} only go with start, not {ns.action}")
        hosts = _hosts(ns.hosts, ns.engines)
        n = whole(ns.n, "-n", low=1, high=MAX_PROCESSES) if ns.n is not None else None
        if hosts and n is not None and n != len(hosts):
            raise ValueError(
                f"-n {n} but {len(hosts)} --hosts: with ssh every engine has its host "
                "(repeat a host to run several engines there)"
            )
        for path, flag in ((ns.ssh_config, "--ssh-config"), (ns.python, "--python")):
            if path is not None and (ns.engines != "ssh" or not path.strip()):
                raise ValueError(f"{flag} needs a path, and is for --engines ssh")
        return ClusterArgs(
            action=ns.action,
            n=n if n is not None else len(hosts) or 4,
            devices_per_process=whole(
                ns.devices_per_process, "--devices-per-process", low=1, high=MAX_PROCESSES
            ),
            directory=directory(ns.dir),
            engines=ns.engines,
            hosts=hosts,
            controller_ip=_address(ns.controller_ip, "--controller-ip"),
            coordinator_host=_address(ns.coordinator_host, "--coordinator-host"),
            ssh_config=None if ns.ssh_config is None else os.path.expanduser(ns.ssh_config),
            python=ns.python,
            profile=ns.profile,
            cluster_id=ns.cluster_id,
            timeout_s=seconds(ns.timeout, "--timeout"),
        )


SAVE: Final = MagicArgs(
    "ckpt_save",
    argument("var", metavar="VAR", help="name of the pytree in every engine's namespace"),
    argument("--step", required=True, metavar="N", help="step number (digits 0-9, 0 or more)"),
    DIR_ARG,
    argument(
        "--mode",
        choices=list(MODES),
        default=None,
        help="finalize by renaming a temporary directory, or with a commit file "
        "(default: rename on a local disk, commit_file on an object store, s3://)",
    ),
    argument("--wait", action="store_true", help="block until the step is committed"),
    argument("--force", action="store_true", help="replace the step if it exists"),
    timeout_arg(DEFAULT_SAVE_TIMEOUT_S, "barrier deadline"),
    argument("--quiet", action="store_true", help="do not show the live per-process progress"),
    argument(
        "--format",
        choices=list(FORMATS),
        default="nbckpt",
        help="on-disk format: nbckpt's zarr arrays (Orbax reads them too), or Orbax's "
        "default OCDBT database, as Orbax itself writes it",
    ),
    argument(
        "--metric",
        action="append",
        metavar="NAME=VALUE",
        help="a number to record with the step, e.g. loss=0.31 (repeatable); "
        "%%ckpt_retention --best keeps the best steps by one",
    ),
)


@dataclass(frozen=True, kw_only=True)
class SaveArgs:
    """``%ckpt_save``: what to save as which step, where, and how."""

    var: str
    step: int
    directory: str | None
    mode: Mode | None
    wait: bool
    force: bool
    timeout_s: float
    quiet: bool
    format: str = "nbckpt"
    metrics: dict[str, float] = field(default_factory=dict)


def parse_save_args(line: str) -> SaveArgs:
    """Parse and check ``%ckpt_save``'s line; raise UsageError if anything is wrong."""
    ns = SAVE.parse(line)
    with SAVE.checking():
        return SaveArgs(
            var=variable(ns.var),
            step=whole(ns.step, "--step"),
            directory=directory(ns.dir),
            mode=ns.mode,
            wait=ns.wait,
            force=ns.force,
            timeout_s=seconds(ns.timeout, "--timeout"),
            quiet=ns.quiet,
            format=ns.format,
            metrics=metrics(ns.metric),
        )


BARRIER: Final = MagicArgs(
    "ckpt_barrier",
    argument(
        "name",
        metavar="NAME",
        help="barrier name: 1 to 64 letters, digits, '_' or '.' (not first); "
        "the key is made unique per use",
    ),
    timeout_arg(DEFAULT_BARRIER_TIMEOUT_S, "deadline"),
    argument(
        "--processes", metavar="P,Q", help="comma-separated process indices, e.g. 0,2 (default all)"
    ),
)


@dataclass(frozen=True, kw_only=True)
class BarrierArgs:
    """``%ckpt_barrier``: the name, deadline and processes (None: all) of one barrier."""

    name: str
    timeout_s: float
    processes: list[int] | None


def parse_barrier_args(line: str) -> BarrierArgs:
    """Parse and check ``%ckpt_barrier``'s line; raise UsageError if anything is wrong."""
    ns = BARRIER.parse(line)
    with BARRIER.checking():
        return BarrierArgs(
            # The name becomes part of a key and of a journal folder's name.
            name=check_name(ns.name, "barrier name"),
            timeout_s=seconds(ns.timeout, "--timeout"),
            processes=None if ns.processes is None else processes(ns.processes),
        )


RESTORE: Final = MagicArgs(
    "ckpt_restore",
    argument("var", metavar="VAR", help="name to restore into, in every engine's namespace"),
    argument("--step", default="latest", metavar="N", help="step number, or 'latest' (default)"),
    DIR_ARG,
    timeout_arg(DEFAULT_SAVE_TIMEOUT_S, "deadline of each wait between engines"),
    argument(
        "--item",
        metavar="NAME",
        help="the item of an Orbax CheckpointManager step (default: its only pytree item)",
    ),
)


@dataclass(frozen=True, kw_only=True)
class RestoreArgs:
    """``%ckpt_restore``: into which variable, which step (None: latest), from where."""

    var: str
    step: int | None
    directory: str | None
    timeout_s: float
    item: str | None = None


def parse_restore_args(line: str) -> RestoreArgs:
    """Parse and check ``%ckpt_restore``'s line; raise UsageError if anything is wrong."""
    ns = RESTORE.parse(line)
    with RESTORE.checking():
        return RestoreArgs(
            var=variable(ns.var),
            step=None if ns.step == "latest" else whole(ns.step, "--step (or 'latest')"),
            directory=directory(ns.dir),
            timeout_s=seconds(ns.timeout, "--timeout"),
            item=None if ns.item is None else check_name(ns.item, "--item"),
        )


WAIT: Final = MagicArgs("ckpt_wait")


def parse_wait_args(line: str) -> None:
    """Check that ``%ckpt_wait`` got no arguments; raise UsageError if it did."""
    if WAIT.split(line):
        raise WAIT.error("%ckpt_wait takes no arguments")


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
        choices=["kill", "stall", "slow-io", "fail-io", "list", "clear"],
        help="what to inject (kill, stall, slow-io, fail-io), or list / clear",
    ),
    argument("--process", metavar="P", help="the process to act on (not for list / clear)"),
    argument(
        "--at",
        choices=[str(p) for p in PHASES],  # values, not reprs, in errors
        metavar="PHASE",
        help=f"the phase at which the fault fires: {', '.join(PHASES)}",
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
