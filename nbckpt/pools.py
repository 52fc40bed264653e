"""Thread pools made on first use, shared by every operation of a process.

A pool is made when first asked for, not at import: a process that never reads or
writes a step starts no threads. Once made, its threads serve one operation after
another: a restore used to make seven and a save's commit up to sixteen, and on a
2-core machine shared by 4 processes making four threads cost 1.5 ms of CPU, more
than the reads they were made for. A task given to a shared pool must not wait for
a task of its own pool, nor for anything another operation does: it would hold a
thread that what it waits for may need. (The restore's early reader of the
checksums files waits for the reads it gives another pool, whose tasks wait for
nothing.) A child made by ``fork`` has none of its parent's threads, so it forgets
the pool and makes its own.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["LazyPool"]


class LazyPool:
    """A :class:`ThreadPoolExecutor` of ``threads`` threads named ``prefix``, made on first use."""

    def __init__(self, threads: int, prefix: str) -> None:
        self.threads = threads
        self.prefix = prefix
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)

    def get(self) -> ThreadPoolExecutor:
        """The pool, made now if this process has none yet."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.prefix)
            return self._pool

    def _forget(self) -> None:
        self._pool = None
        self._lock = threading.Lock()
