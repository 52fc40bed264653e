"""Replicated leaves are read and checked once per job, not once per process.

A leaf that several processes hold whole (data-parallel state: every process has the
full tree) would otherwise be read, and checked, by each of them. Two plans avoid it:

- **share** (the holders are on one host and the root is a local or shared POSIX
  path): each process reads and checks only its slab of the leaf's chunks, into one
  file in the host's shared memory, and after the barrier every process maps the
  whole file as its copy-on-write buffer (:mod:`nbckpt.engine.restore.hostshare`): one read
  and one copy of each byte per host, whatever the number of processes. Where the
  shared memory has no room, each process reads the whole leaf (the page cache
  serves it from one read of the disk) and still checks only its slab.
- **split** (the holders span hosts, or the root is an object store, where every GET
  is a request of its own): the leaf is read under a *split* sharding, the target's
  with its replicated mesh axes moved onto an array dimension, so that each device
  reads and checks a different piece; XLA then gathers the pieces into the target
  sharding (an all-gather over the job's collectives: gloo or MPI on CPU, NCCL on
  GPU). Each byte then leaves the store once per job.

A gather is a collective: it has no deadline and cannot name a missing process. So
both plans first meet at a barrier (``agree``) with a deadline, which gives up as soon
as a peer reports a failure: a damaged chunk found by one process fails the restore
on every process, and no process enters the collective alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax

__all__ = [
    "MIN_SPLIT_BYTES",
    "JobReads",
    "can_exchange",
    "gather",
    "split_sharding",
    "verify_shares",
]

#: Where a region of a leaf lies: ``(start, stop)`` per dimension.
Box = tuple[tuple[int, int], ...]

#: Leaves smaller than this per replica are read whole by every process: a few
#: kilobytes cost less to read again than to exchange.
MIN_SPLIT_BYTES = 1 << 20


def can_exchange() -> bool:
    """Whether this job can run collectives between its processes.

    Several processes, and on CPU a collectives implementation (nbckpt's clusters and
    process groups set gloo); GPUs and TPUs always have one.
    """
    if jax.process_count() < 2:
        return False
    if jax.default_backend() != "cpu":
        return True
    # jax's own default is gloo (since 0.4.36); "none" leaves CPU processes without one.
    chosen = getattr(jax.config, "jax_cpu_collectives_implementation", "gloo")
    return str(chosen or "none") in ("gloo", "mpi")


@dataclass(frozen=True)
class JobReads:
    """What a restore needs to read replicated leaves once per job.

    Attributes
    ----------
    agree
        A barrier of every process of the restore; it raises if one of them failed.
    hosts
        The host each process runs on, where known (``nbckpt/hosts`` records).
    local_root
        Whether the step is on a POSIX path (one page cache per host), not an object
        store.
    scratch
        A tag unique to this restore and the same on every process (its operation
        id): given, the holders of a region on one host read it together into the
        host's shared memory (:mod:`nbckpt.engine.restore.hostshare`); None, each reads it
        whole.
    """

    agree: Callable[[], None]
    hosts: dict[int, str] = field(default_factory=dict)
    local_root: bool = True
    scratch: str | None = None

    def one_host(self, processes: Iterable[int]) -> bool:
        """Whether every one of ``processes`` is known to run on the same host."""
        names = {self.hosts.get(p) for p in processes}
        return len(names) == 1 and None not in names


def holders(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> dict[Box, list[int]]:
    """The processes that hold each distinct region of an array, in process order."""
    found: dict[Box, set[int]] = {}
    for device, index in sharding.devices_indices_map(shape).items():
        box = tuple(sl.indices(d)[:2] for sl, d in zip(index, shape, strict=True))
        found.setdefault(box, set()).add(device.process_index)  # type: ignore[attr-defined]
    return {box: sorted(ps) for box, ps in found.items()}


def _processes_per_shard(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> int:
    held = holders(sharding, shape)
    return min(len(p) for p in held.values()) if held else 1


def verify_shares(held: dict[Box, list[int]], me: int) -> dict[Box, tuple[int, int]]:
    """For each region ``me`` holds with other processes: (its rank, their number).

    ``held`` is :func:`holders` of the leaf. The one of rank ``r`` among ``n`` holders
    reads (into the host's shared memory) or at least checks the chunks of its slab:
    :func:`nbckpt.engine.restore.hostshare.slab_rows`.
    """
    return {box: (ps.index(me), len(ps)) for box, ps in held.items() if me in ps and len(ps) > 1}


def split_sharding(
    sharding: jax.sharding.Sharding, shape: tuple[int, ...], itemsize: int
) -> jax.sharding.NamedSharding | None:
    """The sharding a replicated leaf is read under, or None to read it as it is.

    The target's mesh axes that replicate the leaf are added to the first dimension
    they divide evenly, so that every device of the job holds a distinct piece. None
    when the leaf is not replicated across processes, is too small to be worth it,
    no dimension divides, or the sharding is not a ``NamedSharding``.
    """
    if not isinstance(sharding, jax.sharding.NamedSharding) or not shape:
        return None
    if _processes_per_shard(sharding, shape) < 2:
        return None
    mesh = sharding.mesh
    spec = list(sharding.spec) + [None] * (len(shape) - len(sharding.spec))
    used = {a for p in spec if p is not None for a in ((p,) if isinstance(p, str) else p)}
    free = tuple(str(a) for a in mesh.axis_names if a not in used and mesh.shape[a] > 1)
    replicas = math.prod(mesh.shape[a] for a in free)
    if replicas < 2:
        return None
    shard = sharding.shard_shape(shape)
    if math.prod(shard) * itemsize < replicas * MIN_SPLIT_BYTES:
        return None
    for dim, length in enumerate(shard):
        if length % replicas:
            continue
        have = spec[dim]
        axes = () if have is None else ((have,) if isinstance(have, str) else tuple(have))
        spec[dim] = (*axes, *free)
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
    return None


def _identity(*xs: Any) -> tuple[Any, ...]:
    return xs


def gather(
    arrays: Sequence[jax.Array], shardings: Sequence[jax.sharding.Sharding]
) -> list[jax.Array]:
    """Return ``arrays`` resharded to ``shardings`` (one collective for all of them).

    Call it on every process, after :attr:`JobReads.agree`: a process that enters the
    collective alone waits without a deadline.
    """
    if not arrays:
        return []
    moved = jax.jit(_identity, out_shardings=tuple(shardings))(*arrays)
    return list(jax.block_until_ready(moved))
