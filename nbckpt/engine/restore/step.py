"""Restore: every process reads only the regions its own devices need, and checks them.

Every chunk a restore of an nbckpt step reads is checked against the checksum recorded
when it was saved (:mod:`nbckpt.formats.checksum`) before any of its values are used; how the
regions are read, widened to whole chunks and checked is :mod:`nbckpt.engine.restore.reads`.
The arrays come from the step's own layout (:mod:`nbckpt.engine.restore.sources`): plain zarr v2
arrays, or an OCDBT database of zarr v3 arrays for steps saved in Orbax's layout.

A deleted chunk file fails the read (``fill_missing=False``): every chunk of a complete
step exists on disk, so zarr's fill value would only hide the damage.

Which reader a step gets is the registry's answer (:func:`nbckpt.formats.registry.layout_of`),
the same one the listing and the lab ask: Orbax's steps are restored by
:mod:`nbckpt.engine.restore.orbax_step`, through the same reads; Orbax records no
checksums, so those reads are not checked. What a target asks for, and its checks, are
:mod:`nbckpt.engine.restore.targets`, shared by both readers.
"""

from __future__ import annotations

import math
from concurrent.futures import wait
from typing import Any, Protocol

import jax
import numpy as np

from nbckpt.engine.arrays.tree import (
    PathEntry,
    empty_value,
    leaf_name,
    legacy_leaf_name,
    path_entry,
    path_str,
    unflatten_paths,
)
from nbckpt.engine.restore.bulk import BulkLeaf, BulkReads
from nbckpt.engine.restore.exchange import (
    MIN_SPLIT_BYTES,
    JobReads,
    can_exchange,
    gather,
    holders,
    split_sharding,
    verify_shares,
)
from nbckpt.engine.restore.orbax_step import restore_orbax_step
from nbckpt.engine.restore.packed import PackedSource, read_ahead
from nbckpt.engine.restore.reads import LeafRead
from nbckpt.engine.restore.schedule import read_all
from nbckpt.engine.restore.sources import source_for
from nbckpt.engine.restore.targets import (
    check_dtype,
    check_shape,
    check_sharding,
    default_sharding,
    is_weak,
    target_parts,
)
from nbckpt.errors import CheckpointDataError, CorruptCheckpointError
from nbckpt.formats import checksum as _checksum
from nbckpt.formats.layout import CHECKSUMS_DIR, metadata_path, read_metadata
from nbckpt.formats.packs import PackIndex, is_packed
from nbckpt.formats.registry import StepFormat, layout_of
from nbckpt.journal import JournalWriter
from nbckpt.pools import LazyPool
from nbckpt.protocol import Event
from nbckpt.storage import Location

__all__ = ["restore_step"]


class _StepReader(Protocol):
    """How one layout's steps are read: :func:`restore_step`'s arguments, all given."""

    def __call__(
        self,
        directory: Location,
        target: Any,
        journal: JournalWriter | None,
        *,
        cast: bool,
        verify: bool,
        item: str | None,
        job: JobReads | None,
        partial: bool,
    ) -> Any: ...


#: Reads a step's checksums files while the restore reads its metadata; kept from one
#: restore to the next (see :mod:`nbckpt.pools`).
_early = LazyPool(1, "nbckpt-checksums")

#: How many leaves a message lists before it says how many more there are.
_LISTED = 8


def _paths(leaves: list[dict[str, Any]]) -> str:
    shown = [path_str(tuple((k, v) for k, v in m.get("path", []))) for m in leaves[:_LISTED]]
    more = len(leaves) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "") or "none"


def _listed(meta: dict[str, Any]) -> str:
    return _paths(list(meta["leaves"]))


def _check_covered(meta: dict[str, Any], wanted: set[str]) -> None:
    """Refuse a target that leaves out saved leaves: they would be dropped silently."""
    missing = [m for m in meta["leaves"] if m["name"] not in wanted]
    if missing:
        raise ValueError(
            f"the target lacks {len(missing)} saved leaf(s): {_paths(missing)}; restoring "
            "into it would drop them: add them to the target, or pass partial=True to "
            "restore only the target's leaves"
        )


def _recorded(directory: Location, packs: PackIndex) -> _checksum.Recorded | None:
    try:
        return _checksum.read_checksums(directory, packs)
    except (OSError, ValueError) as e:
        raise CorruptCheckpointError(
            str(directory / CHECKSUMS_DIR), f"its checksums cannot be read: {e}"
        ) from None


def restore_step(
    directory: Location,
    target: Any,
    journal: JournalWriter | None = None,
    *,
    cast: bool = False,
    verify: bool = True,
    item: str | None = None,
    job: JobReads | None = None,
    partial: bool = False,
) -> Any:
    """Restore the complete step in ``directory`` (see ``AsyncCheckpointer.restore``).

    An nbckpt step: every chunk read is checked against the checksum recorded for it at
    save time. A step saved without checksums (no ``_CHECKSUMS`` files: none were
    recorded) is restored without that check, and its reads are not widened to whole
    chunks; a deleted chunk file fails it all the same. An Orbax step (or pytree
    directory) is restored by :func:`nbckpt.engine.restore.orbax_step.restore_orbax_step`.

    The journal's ``read_done`` event records the bytes this process read and
    ``verified``: whether every chunk read was checked against a recorded checksum.

    Parameters
    ----------
    directory
        The step's directory.
    target
        As for ``AsyncCheckpointer.restore``.
    journal
        Where to record the read's events, if anywhere.
    cast
        Allow a target leaf whose dtype differs from the saved one (its values are
        converted); without it such a target is refused before anything is read.
    verify
        Check the chunks' checksums. Internal: only the benchmark turns it off, to
        measure what the check costs.
    item
        Which item of an Orbax ``CheckpointManager`` step to restore; None picks its
        only pytree item. An nbckpt step has one tree: it must be None.
    job
        Given, a leaf that several processes hold whole is read and checked once per
        job, not once per process (:mod:`nbckpt.engine.restore.exchange`); its ``agree`` runs
        on every process once the reads are checked and must raise if any process
        failed. None: every process reads and checks all it holds.
    partial
        Allow a target that leaves out saved leaves: only the target's leaves are
        restored. Without it such a target is refused (restoring into it would drop
        saved state silently), naming the leaves it lacks. An nbckpt step only.

    Returns
    -------
    The restored tree: shaped like ``target``; or, without one, nested dicts and lists
    in which every saved leaf and empty node (``None``, empty containers, recorded in
    the metadata's ``empty`` field) is at its saved position. Typed PRNG keys come back
    as typed keys, NumPy arrays in native byte order.

    Raises
    ------
    CorruptCheckpointError
        A chunk does not match its checksum, has none recorded, or is missing or
        unreadable; or the checksums themselves cannot be read. The message names the
        leaf, the chunk and its file under ``directory``; nothing is returned.
    ValueError
        A target leaf's shape differs from the saved one, or its dtype does and
        ``cast`` is False, or its sharding cannot split its shape evenly; the target
        lacks saved leaves and ``partial`` is False; a 64-bit leaf would become a jax
        array in a process without ``jax_enable_x64``; or ``item`` is given for an
        nbckpt step.
    KeyError
        A target leaf is not in the step.
    """
    layout = layout_of(directory)
    # Not a step of any layout: nbckpt's reader says what is missing (its metadata).
    read = _READERS[layout.name if layout is not None else "nbckpt"]
    return read(
        directory, target, journal, cast=cast, verify=verify, item=item, job=job, partial=partial
    )


def _restore_orbax(
    directory: Location,
    target: Any,
    journal: JournalWriter | None,
    *,
    cast: bool,
    verify: bool,
    item: str | None,
    job: JobReads | None,
    partial: bool,
) -> Any:
    """Orbax's steps: no checksums to verify, each process reads its own regions."""
    return restore_orbax_step(directory, target, journal, cast=cast, item=item)


def _restore_nbckpt(
    directory: Location,
    target: Any,
    journal: JournalWriter | None,
    *,
    cast: bool,
    verify: bool,
    item: str | None,
    job: JobReads | None,
    partial: bool,
) -> Any:
    """Read an nbckpt step: every chunk read is checked (see :func:`restore_step`)."""
    if item is not None:
        raise ValueError(
            f"{directory} is an nbckpt step, which holds one tree; item={item!r} applies to "
            "Orbax CheckpointManager steps only"
        )
    packs: PackIndex = {}
    # Checked, the checksums are read while the metadata is: two cold reads at once.
    sums_read = _early.get().submit(_recorded, directory, packs) if verify else None
    try:
        meta = read_metadata(directory)
        if meta is None:
            raise CheckpointDataError(
                f"cannot read {metadata_path(directory)}; run fsck on the root"
            )
        packed = any(is_packed(m) for m in meta["leaves"])
        if (
            packed
            and meta.get("arrays") is None
            and not partial
            and meta.get("process_count") == jax.process_count()
        ):
            # Restored by as many processes as saved it, each process reads the pack it
            # wrote: its small shards, and whole leaves that every process reads (a
            # host's processes share its page cache). The disk starts on its head now,
            # while the checksums are read and the leaves planned (20-40 ms of a
            # 256 MiB restore on 2 cores), not once the checksums are in: restores
            # took 0.93-0.97x as long so (see packed.READ_AHEAD_BYTES).
            read_ahead(directory, jax.process_index())
        # The checksums files also say where packed leaves lie: read even without checks.
        needed = verify or packed
        read = _recorded(directory, packs) if sums_read is None and needed else None
        if sums_read is not None:
            read = sums_read.result()
    finally:
        if sums_read is not None:
            wait([sums_read])  # a failed restore leaves no read of its step behind
    by_name = {m["name"]: m for m in meta["leaves"]}
    recorded = read if verify else None
    source = source_for(directory, meta, packs)
    if needed and read is None and meta.get("checksums"):
        # The save recorded checksums (its metadata says so): their absence is damage.
        raise CorruptCheckpointError(
            str(directory / CHECKSUMS_DIR), "its checksums are missing although the save wrote them"
        )

    def sums(m: dict[str, Any]) -> dict[str, tuple[str, int]] | None:
        return None if recorded is None else recorded.get(m["name"], {})

    me = jax.process_index()
    #: Where each leaf read in pieces goes once gathered, by its position in ``leaves``.
    gathered: dict[int, jax.sharding.Sharding] = {}
    shared: list[int] = []

    def plan(sharding: jax.sharding.Sharding | None, m: dict[str, Any]) -> tuple[Any, Any]:
        """How to read a leaf: the sharding to read it under, and the checks' shares."""
        if job is None or sharding is None or m["kind"] == "scalar":
            return sharding, None
        shape, itemsize = tuple(m["shape"]), np.dtype(m["dtype"]).itemsize
        if math.prod(shape) * itemsize < 2 * MIN_SPLIT_BYTES:
            return sharding, None  # too small to share: decided before holders' cost
        held = holders(sharding, shape)
        together = [ps for ps in held.values() if len(ps) > 1]
        if not together:
            return sharding, None
        if job.local_root and job.one_host(p for ps in together for p in ps):
            shared.append(len(leaves))
            return sharding, verify_shares(held, me)
        split = split_sharding(sharding, shape, itemsize) if can_exchange() else None
        if split is None:
            return sharding, None
        gathered[len(leaves)] = sharding
        return split, None

    # Regions held whole by several processes of this host are read together, once,
    # into the host's shared memory (see nbckpt.engine.restore.hostshare).
    tag = None if job is None or job.scratch is None else f"{job.scratch}|{directory}"
    if journal is not None:
        journal.emit(Event.READ_STARTED)
    leaves: list[LeafRead | BulkLeaf] = []
    # Small packed leaves are read together, without a LeafRead each (see bulk.py).
    bulk = BulkReads(source) if isinstance(source, PackedSource) else None

    def leaf_read(
        m: dict[str, Any], label: str | None, sharding: Any, dtype: Any, weak: bool, exact: bool
    ) -> LeafRead | BulkLeaf:
        read_as, shares = plan(sharding, m)
        if bulk is not None and shares is None and read_as is sharding and is_packed(m):
            label = label if label is not None else path_str(tuple((k, v) for k, v in m["path"]))
            taken = bulk.add(m, label, sharding, dtype, sums(m), weak)
            if taken is not None:
                return taken
        return LeafRead(source, m, read_as, dtype, sums(m), None, shares, tag, weak, exact)

    if target is None:
        paths: list[tuple[PathEntry, ...]] = []
        for m in meta["leaves"]:
            sharding = default_sharding(m) if m["kind"] == "jax" else None
            leaves.append(leaf_read(m, None, sharding, None, False, False))
            paths.append(tuple((k, v) for k, v in m["path"]))
    else:
        flat, treedef = jax.tree_util.tree_flatten_with_path(target)
        wanted: set[str] = set()
        for keys, t in flat:
            path = tuple(path_entry(k) for k in keys)
            label = path_str(path)
            name = leaf_name(path)
            # Steps saved before names were UTF-8 encoded name non-ASCII keys otherwise.
            m = by_name.get(name) or by_name.get(legacy_leaf_name(path))
            if m is None:
                raise KeyError(
                    f"target leaf {label} is not in {directory}; saved leaves: {_listed(meta)}"
                )
            wanted.add(m["name"])
            sharding, shape, dtype = target_parts(t)
            if m["kind"] == "scalar" and sharding is None:
                shape = dtype = None  # a Python number comes back as the number it was
            check_shape(label, m.get("shape", ()), shape)
            weak = is_weak(t)
            exact = check_dtype(label, m.get("dtype"), dtype, cast, weak)
            check_sharding(label, sharding, m.get("shape", ()))
            leaves.append(leaf_read(m, label, sharding, dtype, weak, exact))
        if not partial:
            _check_covered(meta, wanted)

    def progress(done: int, total: int) -> None:
        if journal is not None:
            journal.emit(Event.READ_PROGRESS, bytes=done, total=total)

    try:
        read_all(
            [leaf for leaf in leaves if isinstance(leaf, LeafRead)],
            progress if journal is not None else None,
            None if bulk is None else bulk.read,
            0 if bulk is None else bulk.nbytes,
        )
        if gathered or shared:
            # Every process plans alike (same target, metadata and hosts), so all meet here.
            assert job is not None
            job.agree()
        for i in shared:
            _general(leaves[i]).adopt()
        values = [leaf.result() for leaf in leaves]
    finally:
        for i in shared:
            _general(leaves[i]).release()
    if gathered:
        where = sorted(gathered)
        moved = gather([values[i] for i in where], [gathered[i] for i in where])
        for i, value in zip(where, moved, strict=True):
            values[i] = value
    if target is None:
        items = list(zip(paths, values, strict=True))
        for e in meta.get("empty", []):
            items.append((tuple((k, v) for k, v in e["path"]), empty_value(e["node"])))
        result = unflatten_paths(items)
    else:
        result = jax.tree_util.tree_unflatten(treedef, values)
    if journal is not None:
        journal.emit(
            Event.READ_DONE,
            bytes=sum(leaf.nbytes for leaf in leaves),
            verified=recorded is not None,
        )
    return result


def _general(leaf: LeafRead | BulkLeaf) -> LeafRead:
    """A leaf read together with other processes: never one read in bulk."""
    assert isinstance(leaf, LeafRead)
    return leaf


#: The reader of every layout in the registry (:data:`nbckpt.formats.registry.LAYOUTS`).
_READERS: dict[StepFormat, _StepReader] = {
    "nbckpt": _restore_nbckpt,
    "orbax": _restore_orbax,
}
