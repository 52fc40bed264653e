"""Pausing Python's cyclic garbage collector while nbckpt does per-leaf bookkeeping.

A save or restore of a state with thousands of leaves makes a few objects per leaf
(plans, reads, futures, parsed metadata) that live until it ends. Every few hundred
new survivors the collector runs, and now and then it scans the whole heap, which in
a JAX process holds millions of objects: measured here on a 4,006-leaf state, the
collector took half of a restore (0.9 s against 0.42 s with it paused) and a quarter
of a save. The objects nbckpt makes hold no reference cycles it relies on the
collector to free, so pausing it costs nothing but a later collection.

The pause is process-wide (the collector has no other switch): it nests, and it
restores the collector only if it was running when the first pause began, so that a
program that turned the collector off keeps it off.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused_gc"]

_lock = threading.Lock()
_depth = 0
_resume = False


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector for the ``with`` block (nests, thread-safe)."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()
