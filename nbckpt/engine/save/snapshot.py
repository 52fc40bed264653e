"""The blocking part of a save: decide what this process writes and keep it safe.

What a save writes must outlive the call: training goes on once ``save`` returns, and
a jitted step that donates the saved arrays (``donate_argnums``) deletes them and
reuses their buffers. Where the device has pinned host memory (GPUs, TPUs) a shard is
copied there (``jax.device_put``), at the bus's speed: on one H200, 1 GiB in 0.02 s,
against 0.6 s for ``copy_to_host_async``, whose copy lands in pageable memory.
Elsewhere the copy is ``copy_to_host_async``'s; the copies of all shards are started at
once and then awaited.

A CPU device's shard is host memory already, and is not copied: the save holds a host
view of it (``np.asarray``, read-only), and a buffer with such a view is one that XLA's
CPU client does not donate. A jitted step that donates the saved arrays while the save
writes them gets new buffers for its results instead, and the arrays stay as they were
until the save lets go of them; a deleted array's buffer lives on in the view. So the
blocking part of a save on CPU is its agreement and its bookkeeping (for a jax leaf,
worked out once per layout: :mod:`.leafplan`), and the one copy a write needs is
made while writing (:mod:`.direct`). Measured on the 2-core test
machine (4 processes, ``benchmarks/compare.py``'s states, A/B against copying, 4
groups of 5-6 saves each way): the ``transformer`` state at 256 MiB blocked 29 ms
against 56 and was durable in 196 ms against 224; at 1 GiB 30 ms against 134 and
661 ms against 781. That XLA keeps such a buffer is checked once per process
(:func:`views_hold_buffers`); where it would not, the shard is copied as before.

NumPy arrays can be mutated by the caller, so the process that writes them copies
them, in native byte order (what the checksums and the stored dtype describe).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from nbckpt.engine.arrays.tree import EMPTY, Leaf, path_str
from nbckpt.engine.arrays.zarr import Region, chunk_shape
from nbckpt.engine.save.hostmem import HostBuffers, Loan
from nbckpt.engine.save.leafplan import (
    SPLIT_MIN_BYTES,
    LeafPlan,
    array_meta,
    describe_sharding,
    pack_if_small,
    plan_jax_leaf,
    replica_count,
)
from nbckpt.formats.orbax_write import scalar_array_dtype
from nbckpt.formats.packs import DEFAULT_PACK_BYTES

__all__ = [
    "SPLIT_MIN_BYTES",
    "ShardWrite",
    "Snapshot",
    "describe_sharding",
    "has_pinned_host",
    "replica_count",
    "take_snapshot",
    "views_hold_buffers",
]


#: The memory kind a shard is copied into where its device has it.
PINNED = "pinned_host"

#: The platforms whose shards are copied to pinned host memory where their device has
#: it. A CPU device's shards are host memory already (see :func:`views_hold_buffers`).
PINNED_PLATFORMS = frozenset({"gpu", "cuda", "rocm", "tpu"})


@dataclass
class ShardWrite:
    """One region of one leaf that this process writes.

    A shard replicated on ``parts`` devices is written by all of them: the replica
    ``part`` writes the chunks whose position among the shard's chunks (in
    :func:`nbckpt.engine.arrays.zarr.chunk_regions` order) is ``part`` modulo ``parts``.
    """

    leaf: str
    index: tuple[slice, ...]
    data: Any  # a numpy array (a single-device jax.Array until the snapshot took it)
    nbytes: int
    part: int = 0
    parts: int = 1
    #: The chunks it writes, where the leaf's plan has them already (None: the writer
    #: works them out, :func:`~nbckpt.engine.arrays.zarr.replica_regions`).
    regions: tuple[Region, ...] | None = None


@dataclass
class Snapshot:
    """What this process saves: every leaf's metadata, and its own writes.

    ``empty`` records the tree's empty nodes (``None``, empty containers), which have
    no leaf: ``{"path": [[kind, key], ...], "node": "none" | "list" | "dict"}`` each,
    written as the ``empty`` field of the step's metadata, so that a restore without
    a target puts them, and every leaf after them, back where they were.
    """

    leaves: list[dict[str, Any]] = field(default_factory=list)
    writes: list[ShardWrite] = field(default_factory=list)
    empty: list[dict[str, Any]] = field(default_factory=list)
    #: Per leaf, its kept plan, which renders its metadata's JSON once (None: none).
    plans: list[LeafPlan | None] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Bytes this process will write."""
        return sum(w.nbytes for w in self.writes)


def _scalar_json(value: bool | int | float | complex) -> Any:
    if isinstance(value, complex):
        return [value.real, value.imag]
    return value


def take_snapshot(
    leaves: list[Leaf],
    *,
    process: int,
    process_count: int,
    primary: int,
    pack_bytes: int = DEFAULT_PACK_BYTES,
    loan: Loan | None = None,
    pack_by_shard: bool = True,
) -> Snapshot:
    """Build this process's snapshot of ``leaves``.

    A replicated shard of a global ``jax.Array`` is written exactly once: its replicas
    split its chunks among them, or, where it is too small to split (or packed), one
    replica writes it whole, picked by the leaf's position, so that the small
    replicated leaves of a state are spread over the processes. Arrays that are local
    to each process (NumPy arrays, fully addressable jax arrays when several processes
    run) are taken to be the same everywhere and are written by the primary only.
    Leaves whose shards are each of at most ``pack_bytes`` are packed
    (:mod:`nbckpt.formats.packs`); 0 packs none. With ``pack_by_shard=False``, only
    leaves of at most ``pack_bytes`` in all: a local tier's peers send a pack whole,
    so a host replaced there would fetch every shard that shares a pack with one it
    needs.

    Every shard of a jax array this process writes is copied to host memory, or on a
    CPU device held there, before it returns (see the module's description): the
    arrays may be donated or deleted as soon as it has. The copies made here (of NumPy
    arrays, of offloaded shards, and on CPU devices where a view would not hold the
    buffer) go into buffers borrowed from ``loan`` (:mod:`nbckpt.engine.save.hostmem`;
    fresh ones if None).

    Raises
    ------
    ValueError
        If a jax array was already deleted (for example donated to a jitted call).
    """
    snap = Snapshot()
    if loan is None:
        loan = HostBuffers(keep=False).loan()
    for ordinal, leaf in enumerate(leaves):
        if leaf.kind == EMPTY:
            snap.empty.append({"path": [list(p) for p in leaf.path], "node": leaf.value})
            continue
        try:
            _snapshot_leaf(
                snap,
                leaf,
                (process, process_count, primary),
                ordinal,
                pack_bytes,
                loan,
                pack_by_shard,
            )
        except (ValueError, RuntimeError) as e:
            raise type(e)(f"cannot snapshot leaf {path_str(leaf.path)}: {e}") from e
    # Every copy to host was started above; waiting for them one by one overlaps them.
    for w in snap.writes:
        if isinstance(w.data, jax.Array):
            w.data = _host_copy(w, loan)
    loan.taken()
    return snap


def _host_copy(w: ShardWrite, loan: Loan) -> np.ndarray:
    """Return host memory holding ``w``'s shard that no later use of the array can change.

    On a CPU device ``np.asarray`` is a view of the device buffer, which the view keeps
    from any donation (:func:`views_hold_buffers`): the view itself. Where XLA would
    donate it anyway, the chunks this process writes are copied out of it (of a shard
    split among its replicas, only this replica's share; the rest of the copy is never
    touched, so it takes no memory). Elsewhere it is the host copy that
    ``copy_to_host_async`` made, which the array's deletion leaves alone.
    """
    data = w.data
    pinned = getattr(data.sharding, "memory_kind", None) == PINNED
    devices = data.devices()
    if pinned or not all(d.platform == "cpu" for d in devices):
        return np.asarray(data)  # waits for the copy; a pinned one is read in place
    view = np.asarray(data)
    if all(views_hold_buffers(d) for d in devices):
        return view
    if w.parts == 1:
        return loan.copy_of(view)
    # Only this replica's chunks are copied: the rest of a fresh array takes no memory
    # (a borrowed buffer would hold the whole shard's).
    if w.regions is None:  # a jax leaf's writes come from its plan, with their chunks
        raise AssertionError(f"leaf {w.leaf}: a shard split among replicas has no chunks")
    out = np.empty_like(view)
    for _, local, _ in w.regions:
        out[local] = view[local]
    return out


def views_hold_buffers(device: jax.Device) -> bool:
    """Whether a host view of an array on CPU ``device`` keeps its buffer from donation.

    Tried once per process (what XLA's CPU client does, not a device's property): a
    small array with a view of it is donated to a jitted call, which must leave the
    array alive and the view's values as they were. XLA's CPU client does (it does not
    donate a buffer that something outside it refers to); a version that did not would
    make the snapshot copy the shards again. A process's first save pays for one
    small compilation (0.09-0.12 s on the 2-core test machine).
    """
    if device.platform != "cpu":
        return False
    with _probe_lock:
        if _probed:
            return _probed[0]
        _probed.append(_probe(device))
        return _probed[0]


def _probe(device: jax.Device) -> bool:
    want = np.arange(_PROBE_ITEMS, dtype=np.float32)
    array = jax.device_put(want, device)
    view = np.asarray(array)
    try:
        _negate_donated(array).block_until_ready()
    except Exception:  # a client that refuses the donation outright holds the buffer too
        return np.array_equal(view, want)
    return not array.is_deleted() and np.array_equal(view, want)


#: The probe's answer, once it ran (see :func:`views_hold_buffers`).
_probed: list[bool] = []
_probe_lock = threading.Lock()

#: The probe's array: large enough that XLA gives it a buffer of its own.
_PROBE_ITEMS = 1 << 12

#: The probe's call, which would write its result into the donated buffer.
_negate_donated = jax.jit(lambda a: -a, donate_argnums=0)


@functools.cache
def has_pinned_host(device: jax.Device) -> bool:
    """Whether the snapshot copies ``device``'s shards to pinned host memory."""
    return device.platform in PINNED_PLATFORMS and any(
        m.kind == PINNED for m in device.addressable_memories()
    )


#: Memory kinds on the host: a shard there (offloaded, say) is host memory already.
HOST_KINDS = frozenset({PINNED, "unpinned_host"})


def _offloaded(data: jax.Array, device: jax.Device) -> bool:
    """Whether ``data`` is an accelerator's shard that lives in host memory."""
    return device.platform != "cpu" and data.sharding.memory_kind in HOST_KINDS


def _start_host_copy(data: jax.Array, device: jax.Device, loan: Loan) -> jax.Array | np.ndarray:
    """Start copying one shard, on ``device``, to host memory; return what to wait on.

    To pinned host memory where the device has it: a buffer of its own, which a
    donation of the shard leaves alone. If the device refuses the transfer there (out
    of pinned memory), ``copy_to_host_async``'s copy, as everywhere else. A shard of
    an accelerator's array that lives in host memory already (offloaded) is copied at
    once: a transfer to the memory it is in may hand back the same buffer. A CPU
    device's shard is host memory already: :func:`_host_copy` holds it.
    """
    if _offloaded(data, device):
        return loan.copy_of(np.asarray(data))
    if has_pinned_host(device):
        try:
            pinned: jax.Array = jax.device_put(
                data, jax.sharding.SingleDeviceSharding(device, memory_kind=PINNED)
            )
            return pinned
        except (RuntimeError, ValueError):
            pass
    if device.platform != "cpu":
        data.copy_to_host_async()
    return data


def _snapshot_leaf(
    snap: Snapshot,
    leaf: Leaf,
    job: tuple[int, int, int],
    ordinal: int,
    pack_bytes: int,
    loan: Loan,
    by_shard: bool = True,
) -> None:
    """Add one leaf's metadata, and this process's writes of it, to ``snap``.

    ``job`` is (this process, the process count, the primary); ``ordinal`` the leaf's
    position in the tree, the same on every process; ``by_shard`` as
    :func:`take_snapshot`'s ``pack_by_shard``.
    """
    if leaf.kind == "jax":
        value = leaf.value
        if value.is_deleted():
            raise ValueError(
                "it was deleted before the save (donated to a jitted call?); save "
                "before donating, or donate a copy"
            )
        plan = plan_jax_leaf(leaf, job, ordinal, pack_bytes, by_shard)
        if plan.writes:
            data = {s.device: s.data for s in value.addressable_shards}
            for w in plan.writes:
                taken = _start_host_copy(data[w.device], w.device, loan)
                snap.writes.append(
                    ShardWrite(leaf.name, w.index, taken, w.nbytes, w.part, w.parts, w.regions)
                )
        snap.leaves.append(plan.meta)
        snap.plans.append(plan)
        return
    process, _, primary = job
    if leaf.kind == "scalar":
        meta: dict[str, Any] = {
            "name": leaf.name,
            "path": [list(p) for p in leaf.path],
            "kind": leaf.kind,
            "py_type": type(leaf.value).__name__,
            "value": _scalar_json(leaf.value),
        }
        # Stored as a 0-d array too, which is where Orbax reads a scalar from; nbckpt
        # restores the inline value.
        scalar_dtype = scalar_array_dtype(leaf.value)
        if scalar_dtype is not None:
            meta.update(shape=[], dtype=scalar_dtype, chunks=[])
            if pack_bytes > 0:
                meta["packed"] = True
            if process == primary:
                value = np.asarray(leaf.value, dtype=scalar_dtype)
                snap.writes.append(ShardWrite(leaf.name, (), value, value.nbytes))
        snap.leaves.append(meta)
        snap.plans.append(None)
        return
    value = leaf.value
    meta, dtype, shape = array_meta(leaf)
    meta["sharding"] = None
    pack_if_small(meta, shape, dtype.itemsize, pack_bytes)
    if process == primary:
        copy = loan.copy_of(np.asarray(value), dtype)
        snap.writes.append(
            ShardWrite(leaf.name, tuple(slice(None) for _ in shape), copy, copy.nbytes)
        )
    meta["chunks"] = chunk_shape(shape, dtype.itemsize)
    snap.leaves.append(meta)
    snap.plans.append(None)
