"""Checks shared by the magics' parsers: repeated options, and ``--metric`` values.

argparse keeps the last value of a repeated option: ``%ckpt_save x --step 1 --step 2``
would save step 2 without a word. :func:`repeated_option` finds such an option (also
written ``--step=2`` or abbreviated ``--st 2``, as argparse accepts), so that the line
is refused with a UsageError naming it. Options declared ``action="append"`` are meant
to repeat (``--metric``). :func:`metrics` reads ``--metric NAME=VALUE`` items.
"""

from __future__ import annotations

import argparse

from nbckpt.session import check_metrics

__all__ = ["metrics", "repeated_option"]


def _action_of(parser: argparse.ArgumentParser, token: str) -> argparse.Action | None:
    """The option ``token`` stands for, as argparse would read it; None for a value."""
    known = parser._option_string_actions
    if token.startswith("--"):
        name = token.split("=", 1)[0]
        if name in known:
            return known[name]
        if not parser.allow_abbrev:
            return None
        matches = {a for s, a in known.items() if s.startswith("--") and s.startswith(name)}
        return next(iter(matches)) if len(matches) == 1 else None
    if len(token) >= 2 and token[0] == "-" and token[1] != "-":
        return known.get(token[:2])  # -n4, -n=4 and -n 4 alike
    return None


def repeated_option(parser: argparse.ArgumentParser, tokens: list[str]) -> str | None:
    """The first option of ``tokens`` given more than once (its first spelling), or None."""
    seen: set[argparse.Action] = set()
    for token in tokens:
        if token == "--":  # everything after is a positional value
            break
        action = _action_of(parser, token)
        if action is None or isinstance(action, argparse._AppendAction):
            continue
        if action in seen:
            return max(action.option_strings, key=len)
        seen.add(action)
    return None


def metrics(items: list[str] | None) -> dict[str, float]:
    """Return ``["loss=0.31", "acc=0.9"]`` as ``{"loss": 0.31, "acc": 0.9}``, checked."""
    out: dict[str, float] = {}
    for item in items or []:
        name, eq, text = item.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"--metric takes NAME=VALUE, such as loss=0.31; got {item!r}")
        try:  # float() reads non-ASCII digits too
            value = float(text if text.isascii() else "not ASCII")
        except ValueError:
            raise ValueError(f"--metric {name}: {text!r} is not a number") from None
        if name in out:
            raise ValueError(f"--metric {name} is given twice")
        out[name] = value
    try:
        return check_metrics(out)
    except ValueError as e:
        raise ValueError(f"--metric: {e}") from None
