"""The one save a checkpointer runs in the background, and the error it leaves."""

from __future__ import annotations

import threading

from nbckpt.engine.save.background import SaveJob, cut_off
from nbckpt.engine.sync.barriers import Synchronizer
from nbckpt.engine.sync.health import HealthMonitor

__all__ = ["InFlight"]


class InFlight:
    """Runs one :class:`SaveJob` at a time on a thread; its error is raised once.

    Parameters
    ----------
    sync
        The checkpointer's synchronizer (its poll interval paces the waits).
    health
        The heartbeat monitor: a waiter stops waiting once this process lost the
        coordination service, since the save's own thread then hangs too.
    """

    def __init__(self, sync: Synchronizer, health: HealthMonitor) -> None:
        self._sync = sync
        self._health = health
        self.thread: threading.Thread | None = None
        self.job: SaveJob | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def start(self, job: SaveJob) -> None:
        """Run ``job`` on a new thread (the previous one must have finished)."""
        self.job = job
        self.thread = threading.Thread(
            target=self._run, args=(job,), name=f"nbckpt-save-{job.step}", daemon=True
        )
        self.thread.start()

    def _run(self, job: SaveJob) -> None:
        error = job.run()
        with self._lock:
            if not job.abandoned:
                self._error = error

    def running(self) -> bool:
        """Whether a save is still running."""
        return self.thread is not None and self.thread.is_alive()

    def wait(self) -> None:
        """Block until the save, if any, ends; then raise its error, once.

        Raises
        ------
        CheckpointError
            The save failed, or this process lost the coordination service while it
            waited (the save then cannot finish).
        """
        thread, job = self.thread, self.job
        if thread is not None:
            while thread.is_alive():
                thread.join(self._sync.poll_s)
                cut = None
                if thread.is_alive():
                    cut = cut_off(job, self._health.check_service, self._sync.process_index)
                if cut is not None:
                    # Its thread may finish once the network is back; its error is this.
                    with self._lock:
                        cut[0].abandoned, self._error = True, None
                    raise cut[1]
            self.thread = None
        self.raise_error()

    def raise_error(self) -> None:
        """Raise the error of a failed save, once; return otherwise."""
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error
