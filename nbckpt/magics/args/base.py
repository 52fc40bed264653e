"""Declaring a magic's arguments once, and the checks every magic's values share.

Read :mod:`nbckpt.magics.args` for how the parts fit.
"""

from __future__ import annotations

import argparse
import keyword
import math
import os
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic_arguments import ArgDecorator, argument, magic_arguments

from nbckpt.magics.checks import repeated_option
from nbckpt.protocol import (
    check_timeout,
)

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
    help="checkpoint directory, or s3:// or gs://bucket/prefix (default: the cluster's --dir); "
    "quote a path with spaces",
)
#: An operation and its root, for the magics that read one operation's journal.
OP_ARGS: Final = (
    argument(
        "op",
        nargs="?",
        metavar="OP",
        help="operation id or its journal folder (default: the newest operation, of "
        "any kind, in the directory)",
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
