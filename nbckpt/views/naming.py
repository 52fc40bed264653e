"""Lists of processes in a view: a few named, the rest counted.

A view names whom a process waits for, who wrote its data, who reported it dead. In a
job of a thousand processes such a list can hold all the others, in every process's
row: a million names in one view, which took seconds to build and tens of megabytes to
send. A view names at most :data:`NAMED` of them and counts the rest, so its size grows
with the job, not with its square.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["NAMED", "listing", "who"]

#: How many processes one list of a view names; the others are counted.
NAMED = 8


def listing(
    shown: Sequence[int], total: int | None = None, marks: dict[int, str] | None = None
) -> str:
    """``"1, 2, 3"``, or ``"1, 2, 3 and 1,021 more"`` when ``total`` counts more.

    ``marks`` adds a word to some processes: ``{2: "dead"}`` shows ``2 (dead)``.
    """
    marks = marks or {}
    text = ", ".join(f"{p} ({marks[p]})" if p in marks else str(p) for p in shown)
    more = (len(shown) if total is None else total) - len(shown)
    return f"{text} and {more:,} more" if more > 0 else text


def who(processes: Sequence[int]) -> str:
    """``process 1``, ``processes 0, 1``, ``processes 0, 1, ... and 1,013 more``."""
    named = "process " if len(processes) == 1 else "processes "
    return named + listing(list(processes)[:NAMED], len(processes))
