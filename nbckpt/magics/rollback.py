"""``%ckpt_rollback``'s arguments: declared once, for its help and its parsing.

Kept beside :mod:`nbckpt.magics.args` (whose helpers it uses) rather than in it, so
that module does not grow further before the magics move to a folder of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from IPython.core.magic_arguments import argument

from nbckpt.magics.args import DIR_ARG, MagicArgs, directory, whole

__all__ = ["ROLLBACK", "RollbackArgs", "parse_rollback_args"]

ROLLBACK: Final = MagicArgs(
    "ckpt_rollback",
    argument("step", metavar="STEP", help="the step training goes on from; newer steps go"),
    DIR_ARG,
)


@dataclass(frozen=True, kw_only=True)
class RollbackArgs:
    """``%ckpt_rollback``: the step to keep as the newest, and the root."""

    step: int
    directory: str | None


def parse_rollback_args(line: str) -> RollbackArgs:
    """Parse and check ``%ckpt_rollback``'s line; raise UsageError if anything is wrong."""
    ns = ROLLBACK.parse(line)
    with ROLLBACK.checking():
        return RollbackArgs(step=whole(ns.step, "STEP"), directory=directory(ns.dir))
