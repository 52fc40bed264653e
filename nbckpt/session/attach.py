"""Attaching to a running ipyparallel cluster: its controller, its engines, one JAX job.

:meth:`JaxCluster.attach <nbckpt.session.cluster.JaxCluster.attach>` calls
:func:`attach`; ``%ckpt_cluster attach --cluster-id ID`` is the same from a notebook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbckpt.errors import ClusterError
from nbckpt.netaddr import is_loopback
from nbckpt.session.profiles import find_controller

if TYPE_CHECKING:
    from nbckpt.session.cluster import JaxCluster

__all__ = ["attach"]


def attach(
    cls: type[JaxCluster],
    *,
    cluster_id: str | None = None,
    profile: str | None = None,
    devices_per_process: int = 1,
    coordinator_host: str | None = None,
    timeout_s: float = 120.0,
) -> JaxCluster:
    """Connect to a running ipyparallel cluster; join its engines if not done yet.

    Engines that already run JAX must have been joined by nbckpt (or by your own
    ``jax.distributed.initialize`` with ranks in engine-id order).

    Parameters
    ----------
    cls
        The class to make (:class:`~nbckpt.session.cluster.JaxCluster`, or a subclass).
    cluster_id
        The cluster's id, as ``%ckpt_cluster start`` prints it (``""`` for one
        started without an id, as plain ``ipcontroller`` does). Required: on a
        shared machine the profile may hold other people's clusters, so none is
        picked by default; the error lists the ids found.
    coordinator_host
        As for :class:`~nbckpt.session.options.ClusterOptions`; None: 127.0.0.1 when
        the controller listens on loopback, else process 0's address on the route to
        the controller.

    Raises
    ------
    ClusterError
        Without ``cluster_id``, or if no cluster of that id runs in the profile.
    """
    import ipyparallel as ipp

    controller = find_controller(profile, cluster_id)
    client = ipp.Client(profile=profile, cluster_id=cluster_id or None, timeout=timeout_s)
    cluster = cls(
        n=len(client.ids),
        devices_per_process=devices_per_process,
        coordinator_host=coordinator_host,
        profile=profile,
        client=client,
        cluster_id=cluster_id,
        controller_ip=controller,
        engines="local" if controller is None or is_loopback(controller) else "ssh",
    )
    if cluster.n == 0:
        raise ClusterError("the ipyparallel cluster has no engines; start some first")
    cluster.join_engines(timeout_s, probe=True)
    return cluster
