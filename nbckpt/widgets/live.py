"""Keep a view live: poll the journal in a thread, apply coalesced updates on the kernel loop.

ipykernel 7 moved the shell channel to its own thread and no longer routes output from
user threads for them (ipywidgets#4001, #4020), so widget state is best changed on the
kernel's own event loop. :class:`LiveUpdater` therefore polls the journal in a daemon
thread and hands only the newest view to ``kernel.io_loop.add_callback`` (thread-safe),
with at most one callback pending: updates that arrive meanwhile replace the pending
view rather than queue up. While a cell runs, the loop is blocked (a blocking ``%%px``
training loop, ``%ckpt_wait``); if a scheduled callback has not run within
``busy_after_s``, the thread applies the view itself, under the same lock, so the
widget keeps moving. Comm messages sent from a thread go out on ipykernel's thread-safe
IOPub socket with the shell's current parent, which is what a widget update needs.
Outside a kernel (a plain IPython shell, the demo), there is no loop and the thread
applies every view directly.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, Generic, Protocol, Self, TypeVar

from nbckpt.protocol import Status
from nbckpt.views.monitor import JournalTailer, OperationView, settled

__all__ = ["Follower", "LiveUpdater", "Source", "kernel_loop"]

V = TypeVar("V")
V_co = TypeVar("V_co", covariant=True)


class Source(Protocol[V_co]):
    """What a :class:`Follower` polls: a journal tailer, or several (``%ckpt_watch``)."""

    def poll(self) -> bool:
        """Read what is new; tell whether anything was."""

    def view(self) -> V_co:
        """What to show, as of the last poll."""


def kernel_loop() -> Any | None:
    """The running ipykernel's IO loop (a tornado ``IOLoop``), or None outside a kernel."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    kernel = getattr(get_ipython(), "kernel", None)
    return getattr(kernel, "io_loop", None)


class Follower(Generic[V]):
    """Poll a :class:`Source` in a thread and apply each new view, coalesced.

    Parameters
    ----------
    source
        What to poll.
    apply
        Called with each new view (e.g. a widget's ``update_from``), never twice at once.
    interval_s
        How often to poll.
    loop
        An object with a thread-safe ``add_callback`` (the kernel's IO loop) on which
        to apply views; None applies them from the polling thread. Default: the
        running kernel's loop, if any.
    busy_after_s
        How long a scheduled callback may wait on a busy loop before the thread
        applies the view itself.
    idle_stop_s
        Stop when nothing new has been read for this long.
    """

    def __init__(
        self,
        source: Source[V],
        apply: Callable[[V], object],
        *,
        interval_s: float = 0.25,
        loop: Any | None = ...,
        busy_after_s: float = 0.5,
        idle_stop_s: float = 900.0,
    ) -> None:
        self.source = source
        self._apply_fn = apply
        self.interval_s = interval_s
        self.loop = kernel_loop() if loop is ... else loop
        self.busy_after_s = busy_after_s
        self.idle_stop_s = idle_stop_s
        #: How many views were applied, and how many of them from the polling thread.
        self.applied = 0
        self.applied_from_thread = 0
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._pending: V | None = None
        self._scheduled_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbckpt-live", daemon=True)

    def start(self) -> Self:
        """Start polling in a daemon thread; return self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling (what was read so far stays shown)."""
        self._stop.set()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the thread to end; tell whether it has."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def running(self) -> bool:
        """Whether the polling thread is alive."""
        return self._thread.is_alive()

    # -- internals ----------------------------------------------------------------------

    def _apply_locked(self) -> None:
        view, self._pending = self._pending, None
        if view is None:
            return
        self._apply_fn(view)
        self.applied += 1

    def _on_loop(self) -> None:
        with self._lock:
            self._scheduled_at = None
            self._apply_locked()

    def _offer(self, view: V) -> None:
        with self._lock:
            self._pending = view  # coalesce: only the newest view is ever applied
            if self.loop is None:
                self._apply_locked()
            elif self._scheduled_at is None:
                self._scheduled_at = time.monotonic()
                self.loop.add_callback(self._on_loop)

    def _apply_if_loop_busy(self) -> None:
        with self._lock:
            waited = self._scheduled_at is not None and (
                time.monotonic() - self._scheduled_at > self.busy_after_s
            )
            if waited and self._pending is not None:
                self._apply_locked()
                self.applied_from_thread += 1

    def _applied(self) -> bool:
        with self._lock:
            return self._pending is None

    def _done(self, view: V, quiet_s: float) -> bool:
        """Whether to stop following: when nothing new came for ``idle_stop_s``."""
        return quiet_s > self.idle_stop_s

    def _run(self) -> None:
        last_growth = time.monotonic()
        view: V | None = None
        try:
            while True:
                if self.source.poll() or view is None:
                    last_growth = time.monotonic()
                    view = self.source.view()
                    self._offer(view)
                self._apply_if_loop_busy()
                if self._done(view, time.monotonic() - last_growth) and self._applied():
                    return
                if self._stop.wait(self.interval_s):
                    return
        except Exception as e:  # an observer must never take the kernel down
            self.error = e
            warnings.warn(f"nbckpt: live view stopped: {e}", RuntimeWarning, stacklevel=1)


class LiveUpdater(Follower[OperationView]):
    """Poll a :class:`~nbckpt.views.monitor.JournalTailer` and apply each new view.

    Parameters
    ----------
    tailer
        The journal to follow.
    apply
        Called with each new :class:`~nbckpt.views.monitor.OperationView` (e.g. a widget's
        ``update_from``), never twice at once.
    interval_s, loop, busy_after_s
        As for :class:`Follower`.
    settle_s
        Once the operation has failed, stop when the journal has not grown for this
        long, even if some process has not recorded how it ended.
    idle_stop_s
        Stop when the journal has not grown for this long (processes killed before
        they could record a failure leave an operation running forever).

    Notes
    -----
    The updater follows the journal until the view is settled
    (:func:`nbckpt.views.monitor.settled`): the operation is over *and* every process that
    recorded anything has reached an end of its own, or is reported dead. The first
    failure is not the end: the other processes give up a moment later and journal
    it (at once for a peer's recorded failure; within the heartbeat's
    ``dead_after_s``, or up to 20 s while a silent peer's host still answers, for a
    dead one), and the view must show that too. Only if a survivor records nothing
    for ``settle_s`` (default 60 s, three times the longest of those waits) after the
    failure does the updater stop without its end; a running operation whose journal
    stays silent for ``idle_stop_s`` is given up as well.
    """

    def __init__(
        self,
        tailer: JournalTailer,
        apply: Callable[[OperationView], object],
        *,
        interval_s: float = 0.25,
        loop: Any | None = ...,
        busy_after_s: float = 0.5,
        settle_s: float = 60.0,
        idle_stop_s: float = 900.0,
    ) -> None:
        super().__init__(
            tailer,
            apply,
            interval_s=interval_s,
            loop=loop,
            busy_after_s=busy_after_s,
            idle_stop_s=idle_stop_s,
        )
        self.tailer = tailer
        self.settle_s = settle_s

    def _done(self, view: OperationView, quiet_s: float) -> bool:
        """Whether to stop following (see the class's notes)."""
        if settled(view):
            return True
        if view.status != Status.RUNNING and quiet_s > self.settle_s:
            return True
        return quiet_s > self.idle_stop_s
