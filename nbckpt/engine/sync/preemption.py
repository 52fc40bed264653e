"""Preemption: when any process is told to go, every process agrees on one step to save.

A process is *told* by SIGTERM (what a spot or preemptible machine gets before it is
taken, and what ``%ckpt_fault preempt`` sends), or by :meth:`PreemptionWatch.notify`.
Agreement goes through the coordination service's key-value store, the same one the
barriers use:

1. The told process publishes the notice (``nbckpt/preempt/notice``).
2. Every process has a watcher thread that waits on that key. When it appears, the
   thread reports the last step this process passed to :meth:`~PreemptionWatch.reached`
   (``nbckpt/preempt/step/<i>``). Reporting and passing a step take one lock, so a
   step is either reported or answered ``False``, never both out of order.
3. The agreed step is the largest reported step plus one: the first step boundary
   every process can still reach, since none has answered it yet. ``reached(step)``
   is then True on every process at that step, and only there.

So before a notice a check costs one uncontended lock and a flag (no message), and
after it one read of each process's report, once: about 1 us per step here, against
0.2-0.8 us for JAX's own preemption sync point (``reached_preemption_sync_point``,
which does the same through the service's preemption notifier; see
``benchmarks/RESULTS.md``). nbckpt does not use JAX's: its service is switched off in
the processes nbckpt joins (:mod:`nbckpt.engine.sync.process`), and this way the
notice is journaled with the save, the grace period is nbckpt's to enforce, and
``%ckpt_fault preempt`` and a plain SIGTERM take the same path.

The told process does not die of its SIGTERM: the handler records the notice, and
restores the default action, so a second SIGTERM ends it at once. A deadline
(``grace_s`` after the notice, 30 s by default, the usual grace period) ends it too:
with exit code 0 if the agreed step was committed by then, 143 (killed by SIGTERM)
otherwise. A training loop normally exits well before, once its save is durable.
The handler is installed by the first call to :meth:`~PreemptionWatch.reached` on
the main thread: a process that never checks for preemption keeps SIGTERM's default.
It stays until the process leaves the job (:func:`stop_all`, which
:func:`nbckpt.engine.sync.process.shutdown` and interpreter exit call).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from nbckpt.engine.sync.barriers import SignalingClient
from nbckpt.errors import BarrierTimeoutError
from nbckpt.protocol.views import PreemptionNotice

__all__ = [
    "DEFAULT_GRACE_S",
    "NOTICE_KEY",
    "PreemptionWatch",
    "notice_for",
    "stop_all",
    "watch_for",
]

#: The usual grace period between a preemption notice and the machine's end.
DEFAULT_GRACE_S = 30.0
#: Where the first notice is published (JSON: process, host, pid, reason, time).
NOTICE_KEY = "nbckpt/preempt/notice"
#: Where each process reports the last step it passed: ``<prefix>/<process>``.
STEP_PREFIX = "nbckpt/preempt/step"
#: How long the watcher waits on the notice key per request, so that it can stop.
_POLL_S = 0.5
#: Exit code of a process the deadline ends before its agreed step was committed.
_KILLED = 128 + signal.SIGTERM


class PreemptionWatch:
    """One process's view of preemption: the notice, its report, the agreed step.

    Parameters
    ----------
    client
        The job's key-value client (the coordination service of ``jax.distributed``).
    grace_s
        From the notice to the end of this process, at the latest.
    committed
        Asked at the deadline whether a step was committed (then the exit code is 0).
    end
        Ends the process with an exit code at the deadline (``os._exit``; a test
        that runs watches as threads records the code instead).
    """

    def __init__(
        self,
        client: SignalingClient,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        committed: Callable[[int], bool] | None = None,
        end: Callable[[int], object] = os._exit,
    ) -> None:
        self.client = client
        self._exit = end
        self.grace_s = grace_s
        self.committed = committed
        self._lock = threading.Lock()
        self._last = -1  # the last step passed to reached()
        self._reported = False
        self._noticed = threading.Event()
        self._stop = threading.Event()
        self._agreed: int | None = None
        self._notice: dict[str, Any] | None = None
        self._told_at: float | None = None
        self._watcher: threading.Thread | None = None
        self._installed = False
        self._deadline: threading.Timer | None = None

    # -- what a training loop calls ----------------------------------------------------

    def reached(self, step: int) -> bool:
        """Tell whether ``step`` is the agreed step to save before stopping.

        Call it at every step boundary, with increasing steps, on every process. It is
        False until a notice reaches this process and the processes agree, then True
        at the agreed step (and at any later step, should a loop skip it). A process
        that has never called it has no watcher to report its step: until its first
        call the others wait for it, up to the grace period.

        Raises
        ------
        BarrierTimeoutError
            Some process did not report its step before the deadline (it is likely
            gone already): the step cannot be agreed.
        """
        with self._lock:
            self._last = max(self._last, step)
            noticed = self._noticed.is_set()
        # Started after this step is recorded: a notice already waiting is then
        # answered with this step passed, never with a step before it.
        self.start()
        if not noticed:
            return False
        return step >= self.agreed()

    def agreed(self) -> int:
        """The agreed step: one past the largest step any process had passed.

        Blocks until every process reported (they report from their watcher threads,
        whatever their loops are doing), at most until the deadline.
        """
        if self._agreed is not None:
            return self._agreed
        n = self.client.process_count
        end = (self._told_at or time.monotonic()) + self.grace_s
        steps: dict[int, int] = {}
        for p in range(n):
            value = self.client.blocking_key_value_get(
                f"{STEP_PREFIX}/{p}", max(0.001, end - time.monotonic())
            )
            if value is None:
                missing = [q for q in range(n) if q not in steps]
                raise BarrierTimeoutError(STEP_PREFIX, missing, self.grace_s)
            steps[p] = int(value)
        self._agreed = max(steps.values()) + 1
        return self._agreed

    @property
    def noticed(self) -> bool:
        """Whether a notice reached this process."""
        return self._noticed.is_set()

    @property
    def notice(self) -> dict[str, Any] | None:
        """The published notice (who was told, where, why), once seen."""
        return self._notice

    # -- telling ----------------------------------------------------------------------

    def notify(self, reason: str = "notice") -> None:
        """Tell the job that this process must go (what SIGTERM does)."""
        if self._told_at is None:
            self._told_at = time.monotonic()
            self._arm_deadline()
        notice = {
            "process": self.client.process_index,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "reason": reason,
            "time": time.time(),
        }
        # Not from the signal handler's frame: the set is a network call.
        threading.Thread(target=self._publish, args=(notice,), daemon=True).start()

    def _publish(self, notice: dict[str, Any]) -> None:
        try:
            self.client.key_value_set(NOTICE_KEY, json.dumps(notice))
        except Exception:  # the service is gone: there is nobody left to tell
            return

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # A second SIGTERM ends the process at once, as it would without nbckpt.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self.notify("SIGTERM")

    def _arm_deadline(self) -> None:
        timer = threading.Timer(self.grace_s, self._end)
        timer.daemon = True
        timer.start()
        self._deadline = timer

    def _end(self) -> None:
        agreed = self._agreed
        done = agreed is not None and self.committed is not None and self.committed(agreed)
        self._exit(0 if done else _KILLED)

    # -- the watcher ------------------------------------------------------------------

    def start(self) -> None:
        """Install the SIGTERM handler (main thread only) and start the watcher, once."""
        if self._watcher is not None:
            return
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True
        self._watcher = threading.Thread(target=self._watch, name="nbckpt-preempt", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        """Stop watching (waiting for the watcher's last request to end).

        SIGTERM gets its default action back, and a deadline already running is left
        to run: a process that heard of a preemption still ends within its grace.
        """
        self._stop.set()
        if self._installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._installed = False
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout=2 * _POLL_S + 1)

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                value = self.client.blocking_key_value_get(NOTICE_KEY, _POLL_S)
            except Exception:  # the service is gone; the heartbeats report that
                return
            if value is not None:
                self._report(value)
                return

    def _report(self, value: str) -> None:
        with self._lock:
            if self._reported:
                return
            self.client.key_value_set(f"{STEP_PREFIX}/{self.client.process_index}", str(self._last))
            self._reported = True
            try:
                self._notice = json.loads(value)
            except ValueError:
                self._notice = {"reason": value}
            if self._told_at is None:
                self._told_at = time.monotonic()
                self._arm_deadline()
            self._noticed.set()


_watches: dict[int, PreemptionWatch] = {}
_watches_lock = threading.Lock()


def watch_for(client: SignalingClient, **options: Any) -> PreemptionWatch:
    """Return the preemption watch of ``client`` (one per job in a process)."""
    with _watches_lock:
        watch = _watches.get(id(client))
        if watch is None:
            if not _watches:
                # Before jax.distributed's own exit handler (handlers run last first):
                # no watcher request may be in flight while the client is torn down.
                atexit.register(stop_all)
            watch = _watches[id(client)] = PreemptionWatch(client, **options)
        return watch


def notice_for(client: SignalingClient, step: int) -> PreemptionNotice | None:
    """What a save of ``step`` journals when it is the agreed preemption step, else None."""
    with _watches_lock:
        watch = _watches.get(id(client))
    if watch is None or watch._agreed != step or watch.notice is None:
        return None
    told = watch.notice
    return {
        "process": int(told.get("process", -1)),
        "host": str(told.get("host", "")),
        "reason": str(told.get("reason", "")),
        "time": float(told.get("time", 0.0)),
        "agreed": step,
    }


def stop_all() -> None:
    """Stop every watch of this process (before it leaves the job)."""
    with _watches_lock:
        watches = list(_watches.values())
        _watches.clear()
    for watch in watches:
        watch.stop()
