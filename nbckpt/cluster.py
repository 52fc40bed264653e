"""Old import path of :class:`~nbckpt.session.cluster.JaxCluster`, kept for one release.

Write ``from nbckpt.session import JaxCluster`` in new code.
"""

from nbckpt.session.cluster import JaxCluster

__all__ = ["JaxCluster"]
