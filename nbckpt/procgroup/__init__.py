"""Local groups of JAX processes joined by ``jax.distributed`` on 127.0.0.1.

The demo, the benchmarks and the multihost tests start their processes here: each
worker initializes ``jax.distributed`` once and then runs the functions it is sent,
so one group can serve many operations. The parent side never imports jax.
"""

from nbckpt.procgroup._group import ProcessGroup, RemoteError, free_port

__all__ = ["ProcessGroup", "RemoteError", "free_port"]
