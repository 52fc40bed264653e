"""The state the cluster tests build on their engines (``%%px``), and its check.

Shared by the ssh, MPI and Slurm tests: each starts engines its own way, then runs
:data:`BUILD` (a sharded array over every device, a collective across the processes,
the host each runs on) and, after a restore into ``restored``, :data:`CHECK`.
"""

from __future__ import annotations

__all__ = ["BUILD", "CHECK"]

#: Makes ``state`` (48 x 8 floats sharded over every device, and a step), ``gathered``
#: (every process's index, through a cross-process collective) and ``where``.
BUILD = """
import jax, numpy as np, socket
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax.experimental import multihost_utils
mesh = Mesh(np.array(jax.devices()), ("data",))
full = np.arange(48 * 8, dtype=np.float32).reshape(48, 8)
state = {"w": jax.make_array_from_callback((48, 8), NamedSharding(mesh, P("data")),
                                           lambda idx: full[idx]), "step": 1}
gathered = [int(x) for x in np.asarray(
    multihost_utils.process_allgather(np.array([jax.process_index()]))).ravel()]
where = socket.gethostname()
"""

#: Sets ``ok`` (``restored`` holds BUILD's state, bit for bit) and ``where``.
CHECK = """
import jax, numpy as np, socket
full = np.arange(48 * 8, dtype=np.float32).reshape(48, 8)
ok = all(np.array_equal(np.asarray(s.data), full[s.index])
         for s in restored["w"].addressable_shards) and restored["step"] == 1
where = socket.gethostname()
"""
