"""How long work reports its progress: in steps of bytes, for writes and reads alike."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ProgressReport"]


class ProgressReport:
    """Report bytes done in steps: every eighth of the total, or every interval.

    Parameters
    ----------
    report
        Called with the bytes done so far (strictly more than the last call's).
    total
        The bytes the work will do in all.
    interval_s
        The longest time between two reports while bytes keep getting done.
    steps
        Reports per whole, however fast the work runs: a report is due whenever
        another ``total / steps`` bytes are done since the last one.

    Notes
    -----
    Both rules together mean that a job of many pieces reports several times even when
    it runs faster than ``interval_s`` (a view then shows steps, not 0 then 100 %), and a
    slow one at least every ``interval_s`` once a piece completes. The last piece is not
    reported: the event that ends the phase carries the final count.
    """

    def __init__(
        self,
        report: Callable[[int], None] | None,
        total: int,
        *,
        interval_s: float = 0.2,
        steps: int = 8,
    ) -> None:
        self._report = report
        self.total = total
        self.interval_s = interval_s
        self._step = max(1, total // max(1, steps))
        self.done = 0
        self._reported = 0
        self._last = time.monotonic()
        #: How many reports were made.
        self.count = 0

    def add(self, nbytes: int) -> None:
        """Count ``nbytes`` more done; report if a report is due."""
        self.done += nbytes
        if self._report is None or self.done <= self._reported or self.done >= self.total:
            return
        now = time.monotonic()
        if self.done - self._reported >= self._step or now - self._last >= self.interval_s:
            self._report(self.done)
            self._reported, self._last = self.done, now
            self.count += 1
