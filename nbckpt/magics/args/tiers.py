"""The arguments of ``%ckpt_tiers``: a root's local tier, shown or set."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from IPython.core.magic_arguments import argument

from nbckpt.magics.args.base import MAX_PROCESSES, MAX_STEP, MagicArgs, directory, whole
from nbckpt.protocol import PROCESS_PLACEHOLDER

__all__ = ["TIERS", "TiersArgs", "parse_tiers_args"]

TIERS: Final = MagicArgs(
    "ckpt_tiers",
    argument(
        "root",
        nargs="?",
        metavar="ROOT",
        help="checkpoint directory, or s3:// or gs://bucket/prefix (default: the cluster's --dir)",
    ),
    argument(
        "--local",
        metavar="DIR",
        help=f"each host's local directory, absolute or from ~ (each host's home), such as "
        f"/dev/shm/ckpt; {PROCESS_PLACEHOLDER} in it becomes each process's index, so that "
        f"processes on one machine are hosts of their own (write {{{PROCESS_PLACEHOLDER}}} "
        "if the notebook has a variable 'process')",
    ),
    argument(
        "--replicas",
        metavar="R",
        help="how many other hosts keep a copy of each host's shards (default 1; 0: none)",
    ),
    argument(
        "--persistent-every",
        metavar="M",
        help="the steps divisible by M also go to ROOT (default 1: every save)",
    ),
    argument("--keep", metavar="K", help="each host keeps its newest K local steps (default 2)"),
    argument("--off", action="store_true", help="turn the local tier off: saves go to ROOT only"),
)


@dataclass(frozen=True, kw_only=True)
class TiersArgs:
    """``%ckpt_tiers``: the root, and its new local tier (none given: only show it)."""

    directory: str | None
    local: str | None
    replicas: int | None
    persistent_every: int | None
    keep: int | None
    off: bool

    @property
    def report_only(self) -> bool:
        """Whether the line only asks to see the tier."""
        return self.local is None and not self.off


def _local(text: str | None) -> str | None:
    """A local directory as every engine reads it: absolute, or from each host's ~."""
    if text is None:
        return None
    if not text.strip():
        raise ValueError("--local needs a directory, got an empty one")
    if not (os.path.isabs(text) or text.startswith("~")):
        raise ValueError(
            f"--local must be absolute (or start with ~): each host reads it, got {text!r}"
        )
    return text


def parse_tiers_args(line: str) -> TiersArgs:
    """Parse and check ``%ckpt_tiers``'s line; raise UsageError if anything is wrong."""
    ns = TIERS.parse(line)
    with TIERS.checking():
        counts = {
            "replicas": (ns.replicas, "--replicas", 0, MAX_PROCESSES - 1),
            "persistent_every": (ns.persistent_every, "--persistent-every", 1, MAX_STEP),
            "keep": (ns.keep, "--keep", 1, MAX_STEP),
        }
        given = {
            name: whole(text, flag, low=low, high=high)
            for name, (text, flag, low, high) in counts.items()
            if text is not None
        }
        if ns.off and (given or ns.local is not None):
            raise ValueError("--off turns the local tier off; give it alone")
        if given and ns.local is None:
            raise ValueError("--replicas, --persistent-every and --keep go with --local DIR")
        return TiersArgs(
            directory=directory(ns.root, "ROOT"),
            local=_local(ns.local),
            replicas=given.get("replicas"),
            persistent_every=given.get("persistent_every"),
            keep=given.get("keep"),
            off=ns.off,
        )
