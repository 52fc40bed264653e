"""Process-side tasks of the local tier's tests (one call per process)."""

from __future__ import annotations

import jax

from nbckpt.engine import Synchronizer, default_client
from nbckpt.engine.tiers.hosts import host_map, replica_hosts


def hosts(local_dirs: list[str], replicas: int) -> dict[str, object]:
    """This process's view of the job's hosts, its local directory ``local_dirs[i]``."""
    me = jax.process_index()
    found = host_map(Synchronizer(default_client()), local_dirs[me], op="tiers-hosts", timeout_s=60)
    return {"hosts": found, "replicas": replica_hosts(found, found[me], replicas)}
