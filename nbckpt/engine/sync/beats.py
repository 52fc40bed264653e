"""Who has stopped beating: read by process 0, reported to the others.

Every process bumps its own counter ``nbckpt/health/<process>`` once per beat. Reading
them all is one request whose answer grows with the job, so if every process read every
counter each beat the service would answer N requests of N counters per interval: at
1,024 processes, two million counters a second, which it cannot (simulated here: the
heartbeats alone kept 1,024 processes from even finishing their start). So only process
0, which hosts the service, reads them all (:class:`Watch`); it publishes, once per
beat, which processes have been silent longer than :data:`REPORT_AFTER_BEATS` beats and
for how long, by its own clock, under ``nbckpt/silence``. The others read that one small
record (:class:`Reports`). Per interval the service answers N small writes, N small
reads and one full read.

Silence is measured on one clock (process 0's), so the hosts' clocks never need to
agree. A process that reads the report learns how long each silent peer had been silent
when it was published, and counts on from there by its own clock. When the report stops
changing, process 0 itself has stopped beating: its silence is counted from the last
change, and nothing is assumed of the others (no report, no news). A process that lost
the service and came back says it ``left``; the report carries that too.
"""

from __future__ import annotations

import json
import threading
import time

from nbckpt.engine.sync.clients import SignalingClient
from nbckpt.protocol import KEY_PREFIX

__all__ = ["BEAT_KEY", "LEFT", "REPORT_AFTER_BEATS", "REPORT_KEY", "Reports", "Watch", "beats_for"]

#: Each process's beat counter lives under this prefix.
BEAT_KEY = f"{KEY_PREFIX}/health"
#: The report of silent processes; not under :data:`BEAT_KEY`, which process 0 reads whole.
REPORT_KEY = f"{KEY_PREFIX}/silence"
#: The heartbeat value of a process that lost the service and left the job.
LEFT = "left"
#: Processes silent this many beats or longer are reported (fewer: one late beat).
REPORT_AFTER_BEATS = 2
#: The process that reads every counter: the one that hosts the service.
WATCHER = 0


class Watch:
    """Process 0's view: every process's counter, read each beat, and the report."""

    def __init__(self, count: int, interval_s: float) -> None:
        self.count = count
        self.interval_s = interval_s
        self._started = time.monotonic()
        self._seen: dict[int, tuple[str, float]] = {}  # process -> (last value, when it moved)
        self._lock = threading.Lock()

    def read(self, client: SignalingClient, beat: int) -> None:
        """Read every counter, then publish who is silent (one write)."""
        values = client.key_value_dir_get(BEAT_KEY)
        now = time.monotonic()
        with self._lock:
            for key, value in values.items():
                p = int(key.rsplit("/", 1)[1])
                old = self._seen.get(p)
                if old is None or old[0] != value:
                    self._seen[p] = (value, now)
        after = REPORT_AFTER_BEATS * self.interval_s
        silent = {p: round(s, 3) for p in range(self.count) if (s := self.silent_for(p)) >= after}
        left = [p for p in range(self.count) if self.left(p)]
        client.key_value_set(REPORT_KEY, json.dumps({"seq": beat, "silent": silent, "left": left}))

    def silent_for(self, process: int) -> float:
        """Seconds since ``process``'s counter last moved (since this view began if never)."""
        with self._lock:
            seen = self._seen.get(process)
        return time.monotonic() - (seen[1] if seen is not None else self._started)

    def left(self, process: int) -> bool:
        """Whether ``process`` said it left the job."""
        with self._lock:
            seen = self._seen.get(process)
        return seen is not None and seen[0] == LEFT

    def silent(self, longer_than_s: float) -> list[int]:
        """The processes silent longer than ``longer_than_s``, or that left."""
        return [p for p in range(self.count) if self.left(p) or self.silent_for(p) > longer_than_s]


class Reports:
    """The view of every other process: process 0's report, read each beat."""

    def __init__(self, count: int, interval_s: float) -> None:
        self.count = count
        self.interval_s = interval_s
        self._seq: object = None
        self._changed = time.monotonic()  # when the report last changed
        self._since: dict[int, float] = {}  # process -> when it fell silent, by this clock
        self._left: set[int] = set()
        self._lock = threading.Lock()

    def read(self, client: SignalingClient, beat: int) -> None:
        """Read process 0's latest report, if it wrote one yet."""
        raw = client.key_value_try_get(REPORT_KEY)
        if raw is None:
            return
        report = json.loads(raw)
        now = time.monotonic()
        with self._lock:
            if report.get("seq") == self._seq:
                return  # process 0 has not beaten since: its own silence grows
            self._seq = report.get("seq")
            self._changed = now
            silent = {int(p): float(s) for p, s in report.get("silent", {}).items()}
            # A report is read some time after it was written, which makes a silence look
            # shorter than it is, never longer: the earliest start seen is the closest.
            # One that beats again is dropped.
            self._since = {p: min(self._since.get(p, now), now - s) for p, s in silent.items()}
            self._left = {int(p) for p in report.get("left", [])}

    def silent_for(self, process: int) -> float:
        """Seconds ``process`` has been silent, as process 0 saw it and counted on since."""
        now = time.monotonic()
        with self._lock:
            if process == WATCHER:
                return now - self._changed
            since = self._since.get(process)
        return 0.0 if since is None else now - since

    def left(self, process: int) -> bool:
        """Whether ``process`` said it left the job."""
        with self._lock:
            return process in self._left

    def silent(self, longer_than_s: float) -> list[int]:
        """The processes silent longer than ``longer_than_s``, or that left."""
        with self._lock:
            known = sorted({WATCHER, *self._since, *self._left})
        return [p for p in known if self.left(p) or self.silent_for(p) > longer_than_s]


def beats_for(process: int, count: int, interval_s: float) -> Watch | Reports:
    """Process 0 watches every counter; every other process reads its report."""
    return (Watch if process == WATCHER else Reports)(count, interval_s)
