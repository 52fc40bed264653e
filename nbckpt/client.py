"""Old import path of :class:`~nbckpt.session.client.CheckpointClient`, kept for one release.

Write ``from nbckpt.session import CheckpointClient`` in new code.
"""

from nbckpt.session.client import CheckpointClient

__all__ = ["CheckpointClient"]
