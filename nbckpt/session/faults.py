"""Faults from the notebook: arm, list or clear them on the engines (``%ckpt_fault``).

:meth:`CheckpointClient.fault <nbckpt.session.client.CheckpointClient.fault>` runs
:func:`arm_fault`; the faults themselves are :mod:`nbckpt.engine.faults`. A fault is
sent to the engine's own service (:mod:`nbckpt.engine.remote.relay`), which answers
from a thread of its own: it is armed at once, even while a ``%%px --noblock`` loop
keeps the engine busy, never queued behind the loop to arm later. Nothing here
imports jax.
"""

from __future__ import annotations

import contextlib
from typing import Any

from nbckpt.errors import ClusterError
from nbckpt.protocol.reads import FAULT
from nbckpt.session.cluster import JaxCluster
from nbckpt.session.rpc import AGENT, engine_errors, remote

__all__ = ["arm_fault"]


def _through_service(
    cluster: JaxCluster, process: int, kind: str, options: dict[str, Any]
) -> list[str]:
    """Arm ``kind`` on ``process`` through its service; the faults armed there after."""
    assert cluster.relay is not None
    try:
        return list(cluster.relay.ask(process, FAULT, kind, **options))
    except EOFError:
        if kind == "kill" and options.get("at") is None:
            return ["killed"]  # the answer we asked for: it died before it could say so
        raise ClusterError(
            f"fault {kind}: process {process} ended before it answered", [process]
        ) from None
    except (OSError, TimeoutError) as e:
        raise ClusterError(
            f"fault {kind}: process {process}'s engine did not answer ({e}); nothing was "
            "armed there: %ckpt_status says whether it is alive",
            [process],
        ) from None


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

    options = {"at": at, "seconds": seconds, "factor": factor}
    fault = remote(f"{AGENT}:fault")
    n = len(cluster.engine_ids)
    if kind in ("list", "clear"):
        if cluster.relay is not None:
            cluster.check_alive()
            return {p: _through_service(cluster, p, kind, {}) for p in range(n)}
        res = cluster.apply(fault, kind, what=f"fault {kind}", timeout_s=30)
        return dict(enumerate(res))
    if process is None or not 0 <= process < n:
        raise ValueError(f"--process must be one of 0..{n - 1}, got {process}")
    cluster.check_alive()
    if kind == "preempt":
        # Through the engine's nanny, as a real notice comes: a signal, not a call.
        # An engine started without a nanny is asked through its service below.
        with contextlib.suppress(ipp.error.RemoteError, ipp.error.EngineError, OSError):
            engine_id = cluster.engine_ids[process]
            cluster.client.send_signal("SIGTERM", targets=[engine_id], block=True)
            return {process: ["preempt notice sent (SIGTERM)"]}
    if cluster.relay is not None:
        return {process: _through_service(cluster, process, kind, options)}
    engine = cluster.client[cluster.engine_ids[process]]
    ar = engine.apply_async(fault, kind, **options)
    try:
        armed = ar.get(timeout=30)
    except (ipp.error.EngineError, ipp.error.RemoteError) as e:
        died = isinstance(e, ipp.error.EngineError) or getattr(e, "ename", "") == "EngineError"
        if kind == "kill" and at is None and died:
            return {process: ["killed"]}  # the answer we asked for
        raise engine_errors(e, cluster.ranks, f"fault {kind}") from None
    return {process: list(armed)}
