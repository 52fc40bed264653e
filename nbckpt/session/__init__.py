"""The kernel side: the cluster, its launchers, the client and its handles (no jax).

Nothing in this package imports jax: the notebook's kernel stays light, and the engines
import their own side (:mod:`nbckpt.engine`) when they join.
"""

from nbckpt.session.client import CheckpointClient, SaveHandle
from nbckpt.session.cluster import JaxCluster

__all__ = ["CheckpointClient", "JaxCluster", "SaveHandle"]
