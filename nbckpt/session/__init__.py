"""The kernel side: the cluster, its launchers, the client and its handles (no jax).

Nothing in this package imports jax: the notebook's kernel stays light, and the engines
import their own side (:mod:`nbckpt.engine`) when they join. The magics reach nbckpt
through this package alone, so it also names what they need of the rest: where a root
lives (:func:`location`) and the retention policy a client applies.
"""

from nbckpt.formats.retention import RetentionPolicy, check_metrics
from nbckpt.session.client import CheckpointClient, SaveHandle
from nbckpt.session.cluster import JaxCluster
from nbckpt.storage import location

__all__ = [
    "CheckpointClient",
    "JaxCluster",
    "RetentionPolicy",
    "SaveHandle",
    "check_metrics",
    "location",
]
