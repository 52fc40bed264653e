"""Which processes are alive: heartbeats in the key-value store.

Every process that checkpoints runs one heartbeat thread. Each beat bumps its own
counter ``nbckpt/health/<process>`` and reads everybody's. A process whose counter has
not moved for ``dead_after_s`` seconds of *this* process's clock is taken for dead, so
clocks of different hosts never need to agree. ``jax_enable_recoverability`` must be on
for survivors to outlive a dead peer; then nbckpt aborts their waits within seconds
rather than at a barrier's deadline.

A stalled process (a long hook, a slow disk) keeps beating: its thread runs on. Only a
process that is gone stops.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from nbckpt.engine.sync import SignalingClient
from nbckpt.errors import PeerDeadError
from nbckpt.protocol import KEY_PREFIX

__all__ = ["HealthMonitor", "monitor_for"]

_KEY = f"{KEY_PREFIX}/health"


class HealthMonitor:
    """A heartbeat thread plus the resulting ``{process: alive | dead}`` view.

    Parameters
    ----------
    client
        The key-value client shared by the job's processes.
    interval_s
        Seconds between beats.
    dead_after_s
        Seconds without a beat after which a process counts as dead.
    """

    def __init__(
        self, client: SignalingClient, *, interval_s: float = 0.5, dead_after_s: float = 3.0
    ) -> None:
        self.client = client
        self.interval_s = interval_s
        self.dead_after_s = dead_after_s
        self._beats = 0
        self._seen: dict[int, tuple[str, float]] = {}  # process -> (last value, when it moved)
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error: str | None = None
        self._thread = threading.Thread(target=self._run, name="nbckpt-heartbeat", daemon=True)
        self._beat()
        self._thread.start()

    def _beat(self) -> None:
        self._beats += 1
        me = self.client.process_index
        try:
            self.client.key_value_set(f"{_KEY}/{me}", str(self._beats))
            values = self.client.key_value_dir_get(_KEY)
        except Exception as e:  # the service itself may be gone: keep the last view
            self._error = f"{type(e).__name__}: {e}"
            return
        now = time.monotonic()
        with self._lock:
            for key, value in values.items():
                p = int(key.rsplit("/", 1)[1])
                old = self._seen.get(p)
                if old is None or old[0] != value:
                    self._seen[p] = (value, now)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._beat()

    def stop(self) -> None:
        """Stop beating (the others will then see this process as dead)."""
        self._stop.set()

    def view(self) -> dict[int, str]:
        """Return ``{process: "alive" | "dead"}`` for every process of the job."""
        now = time.monotonic()
        out = {}
        with self._lock:
            for p in range(self.client.process_count):
                seen = self._seen.get(p)
                last = seen[1] if seen is not None else self._started
                out[p] = "dead" if now - last > self.dead_after_s else "alive"
        return out

    def silent_for(self, process: int) -> float:
        """Seconds since ``process``'s counter last moved, by this process's clock."""
        with self._lock:
            seen = self._seen.get(process)
        return time.monotonic() - (seen[1] if seen is not None else self._started)

    def check(self, phase: str, processes: Sequence[int] | None = None) -> None:
        """Raise :class:`PeerDeadError` if one of ``processes`` (default all) is dead."""
        view = self.view()
        wanted = range(self.client.process_count) if processes is None else processes
        dead = [p for p in wanted if view.get(p) == "dead" and p != self.client.process_index]
        if dead:
            raise PeerDeadError(dead, phase, self.silent_for(dead[0]))


_monitors: dict[int, HealthMonitor] = {}
_monitors_lock = threading.Lock()


def monitor_for(client: SignalingClient) -> HealthMonitor:
    """Return the heartbeat monitor of ``client``, starting it on first use."""
    with _monitors_lock:
        mon = _monitors.get(id(client))
        if mon is None:
            mon = _monitors[id(client)] = HealthMonitor(client)
        return mon
