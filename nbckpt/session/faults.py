"""Faults from the notebook: arm, list or clear them on the engines (``%ckpt_fault``).

:meth:`CheckpointClient.fault <nbckpt.session.client.CheckpointClient.fault>` runs
:func:`arm_fault`; the faults themselves are :mod:`nbckpt.engine.faults`. Nothing here
imports jax.
"""

from __future__ import annotations

import contextlib

from nbckpt.session.cluster import JaxCluster
from nbckpt.session.rpc import AGENT, engine_errors, remote

__all__ = ["arm_fault"]


def arm_fault(
    cluster: JaxCluster,
    kind: str,
    process: int | None,
    *,
    at: str | None,
    seconds: float | None,
    factor: float | None,
) -> dict[int, list[str]]:
    """:meth:`CheckpointClient.fault`, on ``cluster``."""
    import ipyparallel as ipp

    fault = remote(f"{AGENT}:fault")
    n = len(cluster.engine_ids)
    if kind in ("list", "clear"):
        res = cluster.apply(fault, kind, what=f"fault {kind}", timeout_s=30)
        return dict(enumerate(res))
    if process is None or not 0 <= process < n:
        raise ValueError(f"--process must be one of 0..{n - 1}, got {process}")
    cluster.check_alive()
    if kind == "preempt":
        # Through the engine's nanny, not a queued call: a loop keeps the engine busy.
        # An engine started without a nanny cannot take a signal request: it is asked
        # itself below, which reaches it only once its current cell is done.
        with contextlib.suppress(ipp.error.RemoteError, ipp.error.EngineError, OSError):
            engine_id = cluster.engine_ids[process]
            cluster.client.send_signal("SIGTERM", targets=[engine_id], block=True)
            return {process: ["preempt notice sent (SIGTERM)"]}
    engine = cluster.client[cluster.engine_ids[process]]
    ar = engine.apply_async(fault, kind, at=at, seconds=seconds, factor=factor)
    try:
        armed = ar.get(timeout=30)
    except (ipp.error.EngineError, ipp.error.RemoteError) as e:
        died = isinstance(e, ipp.error.EngineError) or getattr(e, "ename", "") == "EngineError"
        if kind == "kill" and at is None and died:
            return {process: ["killed"]}  # the answer we asked for
        raise engine_errors(e, cluster.ranks, f"fault {kind}") from None
    return {process: list(armed)}
