"""Restore an Orbax step: nbckpt's rules over the arrays Orbax wrote.

An Orbax pytree (a ``StandardCheckpointer`` or ``PyTreeCheckpointer`` directory, or one
pytree item of a ``CheckpointManager`` step) is read the way nbckpt reads its own steps
(:mod:`nbckpt.engine.restore.reads`): every process reads only the regions its own devices
need, into any number of processes and any mesh. Orbax names each array by its keys
joined by ``.``; a target leaf is matched by the same rule, so attribute keys (a
dataclass, a flax struct) find their arrays too.

What cannot be verified: Orbax records no checksum of the data (zarr v2 chunks carry
none, and zarr v3's zstd frames are written with their checksum off; only a zarr v3
shard index has a CRC-32C), so chunks are not checked, and reads are not widened to
whole chunks (widening only serves the checks). A chunk that is missing fails the
restore when Orbax's ``_METADATA`` says every chunk was stored
(``store_array_data_equal_to_fill_value: true``, Orbax's default since 0.5); in older
checkpoints a missing chunk cannot be told from one of fill values, and reads as the
fill value, as it does in Orbax. The journal's ``read_done`` says ``verified: false``.

Without a target, the tree comes back as nested dicts and lists; a ``jax.Array`` leaf
gets the ``NamedSharding`` Orbax recorded in ``_sharding`` rebuilt over this job's
devices (in ``jax.devices()`` order) when their number matches the saved mesh, and is
replicated on every device otherwise; ``np.ndarray`` leaves come back as NumPy arrays,
scalars as Python numbers, strings as strings, empty nodes as ``None``, ``{}`` or ``[]``.
"""

from __future__ import annotations

from typing import Any

import jax
import tensorstore as ts

from nbckpt.engine.arrays.tree import PathEntry, path_entry, unflatten_paths
from nbckpt.engine.restore.reads import LeafRead
from nbckpt.engine.restore.schedule import read_all
from nbckpt.engine.restore.sources import ORBAX_UNVERIFIED, OrbaxSource
from nbckpt.engine.restore.targets import (
    check_dtype,
    check_shape,
    check_sharding,
    default_sharding,
    is_weak,
    target_parts,
)
from nbckpt.errors import CheckpointDataError, CorruptCheckpointError
from nbckpt.formats import orbax as _orbax
from nbckpt.journal import JournalWriter
from nbckpt.protocol import Event
from nbckpt.storage import Location

__all__ = ["orbax_default_sharding", "restore_orbax_step"]

#: How many saved leaf names an error about a missing target leaf lists.
_LISTED = 20


def orbax_default_sharding(desc: dict[str, Any] | None) -> jax.sharding.Sharding:
    """Return the sharding a ``jax.Array`` leaf of an Orbax step gets without a target.

    Orbax's recorded ``NamedSharding`` (mesh shape, axis names, partition spec) is
    rebuilt over this job's devices when their number matches the saved mesh; any
    other sharding, or a mismatch, replicates the leaf on every device.
    """
    nbckpt_desc: dict[str, Any] = {}
    if desc is not None and desc.get("sharding_type") == "NamedSharding":
        shape, names = desc.get("shape"), desc.get("axis_names")
        spec = desc.get("partition_spec", [])
        if (
            isinstance(shape, list)
            and isinstance(names, list)
            and isinstance(spec, list)
            and len(shape) == len(names)
        ):
            nbckpt_desc = {
                "type": "named",
                "mesh_shape": [int(s) for s in shape],
                "axis_names": [str(n) for n in names],
                "spec": spec,
            }
    return default_sharding({"sharding": nbckpt_desc})


def _orbax_name(path: tuple[PathEntry, ...]) -> str:
    """The name Orbax gives the array of a target leaf: its keys joined by ``.``."""
    return _orbax.leaf_name([str(v) for _, v in path])


def _opened(source: OrbaxSource, leaf: _orbax.OrbaxLeaf, future: Any) -> ts.TensorStore:
    """Wait for a leaf's array to open; a missing array is damage."""
    try:
        store: ts.TensorStore = future.result()
    except ValueError as e:
        if str(e).startswith("NOT_FOUND"):
            raise CorruptCheckpointError(
                source.location(leaf.name),
                f"leaf {leaf.name}: its array is missing ({e}); {ORBAX_UNVERIFIED}",
            ) from None
        raise
    return store


def _static(item: _orbax.OrbaxItem, leaf: _orbax.OrbaxLeaf, strings: dict[str, str]) -> Any:
    """The value of a leaf that has no array: an empty node or a string."""
    if leaf.is_empty:
        return leaf.empty_value()
    if leaf.is_string:
        if leaf.name not in strings:
            raise CorruptCheckpointError(
                str(item.directory), f"string leaf {leaf.name} is not in its strings file"
            )
        return strings[leaf.name]
    raise ValueError(
        f"leaf {leaf.name!r} of {item.directory} has Orbax value type {leaf.value_type!r}, "
        "which nbckpt cannot read; give a target that leaves it out"
    )


def restore_orbax_step(
    directory: Location,
    target: Any,
    journal: JournalWriter | None = None,
    *,
    cast: bool = False,
    item: str | None = None,
) -> Any:
    """Restore a complete Orbax step (see the module's description).

    Parameters
    ----------
    directory
        An Orbax ``CheckpointManager`` step, or a pytree directory.
    target
        As for ``AsyncCheckpointer.restore``: None for every leaf, or a pytree of
        shardings, ``jax.ShapeDtypeStruct``, ``jax.Array`` or host placeholders; a
        target covering part of the tree restores that part only.
    journal
        Where to record the read's events, if anywhere.
    cast
        Allow a target dtype other than the saved one (the values are converted).
    item
        The item of a manager step to restore; None picks its only pytree item.

    Raises
    ------
    KeyError
        A target leaf is not in the item (the message lists the saved leaves), or no
        item has the name ``item``.
    ValueError
        A target leaf's shape differs from the saved one, or its dtype does and
        ``cast`` is False; or the step has several pytree items and ``item`` is None,
        or the named item is not a pytree.
    CorruptCheckpointError
        Orbax's records cannot be read, an array is missing, or a chunk is missing
        (where every chunk was stored) or cannot be decoded. Damage that still decodes
        cannot be detected: Orbax records no checksums.
    CheckpointDataError
        The directory is not a complete Orbax step.
    """
    step = _orbax.describe(directory)
    if step is None:
        raise CheckpointDataError(f"{directory}: {_orbax.describe_unknown(directory)}")
    if step.state == "incomplete":
        raise CheckpointDataError(f"{directory}: {step.reason}; nothing was restored")
    chosen = step.item(item)
    if chosen.tree is None:
        raise CorruptCheckpointError(str(chosen.directory), chosen.problem or "no tree metadata")
    tree = chosen.tree
    source = OrbaxSource(
        chosen.directory,
        ocdbt=tree.ocdbt,
        zarr3=tree.zarr3,
        fill_missing=not tree.store_equal_to_fill,
    )
    by_name = {leaf.name: leaf for leaf in tree.leaves}
    if journal is not None:
        journal.emit(Event.READ_STARTED)

    # (leaf, its target or None) for every leaf to restore, in the result's order.
    wanted: list[tuple[_orbax.OrbaxLeaf, Any]] = []
    treedef: Any = None
    if target is None:
        wanted = [(leaf, None) for leaf in tree.leaves]
    else:
        flat, treedef = jax.tree_util.tree_flatten_with_path(target)
        for keys, t in flat:
            name = _orbax_name(tuple(path_entry(k) for k in keys))
            found = by_name.get(name)
            if found is None:
                have = sorted(n for n, lf in by_name.items() if not lf.is_empty)
                listed = ", ".join(have[:_LISTED]) + (", ..." if len(have) > _LISTED else "")
                raise KeyError(
                    f"target leaf {name!r} is not in the Orbax checkpoint {chosen.directory}; "
                    f"saved leaves: {listed or 'none'}"
                )
            wanted.append((found, t))

    # Open every array at once: each open reads metadata, and they overlap.
    openings = {lf.name: source.open(lf.name) for lf, _ in wanted if lf.is_array}
    has_strings = any(lf.is_string for lf, _ in wanted)
    strings = _orbax.read_strings(chosen.directory) if has_strings else {}
    shardings = _orbax.read_shardings(chosen.directory) if target is None else {}
    reads: list[LeafRead] = []
    values: list[Any] = []
    for leaf, t in wanted:
        if not leaf.is_array:
            values.append(_static(chosen, leaf, strings))
            continue
        store = _opened(source, leaf, openings[leaf.name])
        shape = tuple(int(s) for s in store.shape)
        saved = store.dtype.numpy_dtype
        if t is None:
            sharding = (
                orbax_default_sharding(shardings.get(leaf.name))
                if leaf.value_type == "jax.Array"
                else None
            )
            dtype, weak, exact = None, False, False
        else:
            sharding, want_shape, dtype = target_parts(t)
            # Orbax's own name for the leaf: its keys joined by '.'.
            check_shape(repr(leaf.name), shape, want_shape)
            weak = is_weak(t)
            exact = check_dtype(repr(leaf.name), saved, dtype, cast, weak)
            check_sharding(repr(leaf.name), sharding, shape)
        chunks = store.chunk_layout.read_chunk.shape
        meta = {
            "name": leaf.name,
            "path": leaf.path,
            "kind": "jax" if sharding is not None else "numpy",
            "shape": list(shape),
            "dtype": saved,
            "chunks": [int(c) if c else 1 for c in chunks] if chunks is not None else list(shape),
            # Orbax gives a scalar back as a Python number (``.item()``).
            "python_scalar": leaf.value_type == "scalar",
        }
        read = LeafRead(
            source, meta, sharding, dtype, None, openings[leaf.name], weak=weak, exact=exact
        )
        reads.append(read)
        values.append(read)
    read_all(reads)
    results = [v.result() if isinstance(v, LeafRead) else v for v in values]
    if treedef is None:
        out = unflatten_paths([(lf.path, r) for (lf, _), r in zip(wanted, results, strict=True)])
    else:
        out = jax.tree_util.tree_unflatten(treedef, results)
    if journal is not None:
        # Orbax records no checksums: nothing read here was checked against one.
        journal.emit(Event.READ_DONE, bytes=sum(r.nbytes for r in reads), verified=False)
    return out
