"""What every operation of one checkpointer shares: its root and its processes."""

from __future__ import annotations

from dataclasses import dataclass

from nbckpt.engine.save.preflight import Preflight
from nbckpt.engine.sync import health
from nbckpt.engine.sync.barriers import SignalingClient, Synchronizer, default_client
from nbckpt.storage import Location

__all__ = ["Context"]


@dataclass(frozen=True)
class Context:
    """The root, the synchronizer, the heartbeats and the preflight of one checkpointer.

    The save and restore entries (:mod:`nbckpt.engine.save.start`,
    :mod:`nbckpt.engine.restore_entry`) take it instead of the checkpointer, so they
    see only what an operation needs.

    Attributes
    ----------
    root
        The checkpoint root.
    primary
        The process that creates directories, finalizes and applies retention.
    sync
        Barriers and agreement over the key-value client.
    health
        The heartbeat monitor of that client.
    preflight
        The agreement that starts every save and restore.
    """

    root: Location
    primary: int
    sync: Synchronizer
    health: health.HealthMonitor
    preflight: Preflight

    @classmethod
    def connect(cls, root: Location, primary: int, client: SignalingClient | None) -> Context:
        """Join the processes through ``client`` (the job's default if None).

        Raises
        ------
        ValueError
            ``primary`` is not a process index of the job.
        """
        kv = client if client is not None else default_client()
        monitor = health.monitor_for(kv)
        sync = Synchronizer(kv, health=monitor.check)
        n = sync.process_count
        if not 0 <= primary < n:
            raise ValueError(f"primary must be a process index in 0..{n - 1}, got {primary}")
        return cls(root, primary, sync, monitor, Preflight(sync, root, primary))
