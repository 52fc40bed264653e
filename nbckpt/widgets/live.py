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
from typing import Any

from nbckpt.monitor import JournalTailer, OperationView
from nbckpt.protocol import Status

__all__ = ["LiveUpdater", "kernel_loop"]


def kernel_loop() -> Any | None:
    """The running ipykernel's IO loop (a tornado ``IOLoop``), or None outside a kernel."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    kernel = getattr(get_ipython(), "kernel", None)
    return getattr(kernel, "io_loop", None)


class LiveUpdater:
    """Poll a :class:`~nbckpt.monitor.JournalTailer` and apply each new view.

    Parameters
    ----------
    tailer
        The journal to follow.
    apply
        Called with each new :class:`~nbckpt.monitor.OperationView` (e.g. a widget's
        ``update_from``), never twice at once.
    interval_s
        How often to poll the journal.
    loop
        An object with a thread-safe ``add_callback`` (the kernel's IO loop) on which
        to apply views; None applies them from the polling thread. Default: the
        running kernel's loop, if any.
    busy_after_s
        How long a scheduled callback may wait on a busy loop before the thread
        applies the view itself.
    idle_stop_s
        Stop when the journal has not grown for this long (processes killed before
        they could record a failure leave an operation running forever).
    """

    def __init__(
        self,
        tailer: JournalTailer,
        apply: Callable[[OperationView], object],
        *,
        interval_s: float = 0.25,
        loop: Any | None = ...,
        busy_after_s: float = 0.5,
        idle_stop_s: float = 900.0,
    ) -> None:
        self.tailer = tailer
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
        self._pending: OperationView | None = None
        self._scheduled_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbckpt-live", daemon=True)

    def start(self) -> LiveUpdater:
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

    def _offer(self, view: OperationView) -> None:
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

    def _settled(self) -> bool:
        with self._lock:
            return self._pending is None

    def _run(self) -> None:
        last_growth = time.monotonic()
        first = True
        try:
            while True:
                if self.tailer.poll() or first:
                    first = False
                    last_growth = time.monotonic()
                    self._offer(self.tailer.view())
                self._apply_if_loop_busy()
                finished = self.tailer.record().status != Status.RUNNING
                idle = time.monotonic() - last_growth > self.idle_stop_s
                if (finished or idle) and self._settled():
                    return
                if self._stop.wait(self.interval_s):
                    return
        except Exception as e:  # an observer must never take the kernel down
            self.error = e
            warnings.warn(f"nbckpt: live view stopped: {e}", RuntimeWarning, stacklevel=1)
