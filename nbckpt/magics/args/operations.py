"""The arguments of the magics that act: save, barrier, restore, wait."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from IPython.core.magic_arguments import argument

from nbckpt.magics.args.base import (
    DIR_ARG,
    MagicArgs,
    directory,
    processes,
    seconds,
    timeout_arg,
    variable,
    whole,
)
from nbckpt.magics.checks import metrics
from nbckpt.protocol import (
    DEFAULT_BARRIER_TIMEOUT_S,
    DEFAULT_SAVE_TIMEOUT_S,
    FORMATS,
    MODES,
    Mode,
    check_name,
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
        "(default: rename on a local disk, commit_file on an object store, s3:// or gs://)",
    ),
    argument("--wait", action="store_true", help="block until the step is committed"),
    argument("--force", action="store_true", help="replace the step if it exists"),
    timeout_arg(DEFAULT_SAVE_TIMEOUT_S, "barrier deadline"),
    argument("--quiet", action="store_true", help="do not show the live per-process progress"),
    argument(
        "--format",
        choices=list(FORMATS),
        default="nbckpt",
        help="on-disk format: nbckpt's zarr arrays and packs, or Orbax's "
        "default OCDBT database, as Orbax itself writes it",
    ),
    argument(
        "--pack-bytes",
        metavar="N",
        help="pack leaves whose shards are each of at most N bytes (default 4 MiB; with a "
        "local tier, leaves of at most 1 MiB) into "
        "one file per process; 0 stores every leaf as its own zarr array, which Orbax "
        "restores too",
    ),
    argument(
        "--metric",
        action="append",
        metavar="NAME=VALUE",
        help="a number to record with the step, e.g. loss=0.31 (repeatable); "
        "%%ckpt_retention --best keeps the best steps by one",
    ),
    argument(
        "--persistent",
        action="store_true",
        help="also save to the root, whatever %%ckpt_tiers --persistent-every says",
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
    #: Force a save to the root (True), or follow the local tier's rule (None).
    persistent: bool | None = None
    #: Leaves whose shards are at most this many bytes are packed (None: 4 MiB).
    pack_bytes: int | None = None


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
            persistent=True if ns.persistent else None,
            pack_bytes=None
            if ns.pack_bytes is None
            else whole(ns.pack_bytes, "--pack-bytes", high=1 << 40),
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
