"""The records Orbax needs to restore an nbckpt step, built from nbckpt's leaf metadata.

Every nbckpt step carries, besides its own ``_NBCKPT_METADATA``, what Orbax's
``PyTreeCheckpointHandler`` (and so ``StandardCheckpointer``) reads before any array:

``_METADATA``
    The tree: for each leaf its key path (names and key types), its value type
    (``jax.Array``, ``np.ndarray`` or ``scalar``), and the array format of the step
    (``use_ocdbt``, ``use_zarr3``). ``store_array_data_equal_to_fill_value`` is true:
    every chunk of a complete step exists, and with that flag Orbax reads a missing
    chunk as an error instead of as the fill value.
``_sharding``
    Each ``jax.Array`` leaf's ``NamedSharding`` (or single device), keyed by the
    URL-safe base64 of its dotted name, so that Orbax restoring without a target can
    rebuild the sharding on the same devices.

Orbax finds a leaf's array under the leaf's key names joined by ``.``, unescaped;
nbckpt percent-encodes every character of a key other than ASCII letters, digits,
``_`` and ``-`` (:func:`nbckpt.engine.arrays.tree.leaf_name`). Orbax therefore restores the
leaves whose keys use only those characters; :func:`orbax_readable` tells which.
Python numbers are also stored as 0-d arrays (Orbax reads scalars from arrays);
:func:`scalar_array_dtype` gives their dtype, the one NumPy (and Orbax) gives them.

Orbax's per-process ``array_metadatas/`` are not written: Orbax reads them only while
saving, to check that the processes agree. Nor is Orbax's step-level
``_CHECKPOINT_METADATA``: Orbax's ``CheckpointManager`` lists nbckpt steps without it,
and cannot restore them with it (it reads each item from ``<step>/<item>/``).

Nothing here imports jax or tensorstore.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from nbckpt.formats.orbax_names import SHARDING, TREE_METADATA

__all__ = [
    "KEY_TYPE_DICT",
    "KEY_TYPE_SEQUENCE",
    "ORBAX_ARRAYS",
    "OrbaxFlags",
    "keypath",
    "orbax_param_name",
    "orbax_readable",
    "orbax_records",
    "scalar_array_dtype",
    "sharding_json",
    "sharding_records",
    "tree_metadata",
    "write_shape",
]

#: Orbax's ``KeyType`` of a sequence position (``SequenceKey``, ``FlattenedIndexKey``).
KEY_TYPE_SEQUENCE: Final = 1
#: Orbax's ``KeyType`` of a mapping key or an attribute (``DictKey``, ``GetAttrKey``).
KEY_TYPE_DICT: Final = 2

#: The ``arrays`` field of nbckpt's metadata for a step saved with ``format="orbax"``:
#: zarr v3 arrays in an OCDBT database at the step's root. A step without the field
#: holds one zarr v2 array directory per leaf (nbckpt's own layout).
ORBAX_ARRAYS: Final = "ocdbt+zarr3"

#: nbckpt leaf kind -> Orbax ``value_type`` (the name of its type handler).
_VALUE_TYPES: Final = {"jax": "jax.Array", "numpy": "np.ndarray", "scalar": "scalar"}
#: nbckpt's record of an empty node (``Snapshot.empty``) -> Orbax's ``value_type`` of it.
_EMPTY_TYPES: Final = {"none": "None", "list": "List", "dict": "Dict"}


@dataclass(frozen=True, kw_only=True)
class OrbaxFlags:
    """How a step's arrays are stored, in the words of Orbax's ``_METADATA``.

    Attributes
    ----------
    use_ocdbt
        The arrays live in an OCDBT database at the step's root (Orbax's default).
    use_zarr3
        They are zarr v3 arrays (else zarr v2).
    """

    use_ocdbt: bool
    use_zarr3: bool


def _path(leaf: Mapping[str, Any]) -> list[tuple[str, str | int]]:
    return [(str(k), v) for k, v in leaf.get("path", [])]


def keypath(path: Sequence[Sequence[Any]]) -> str:
    """Return Orbax's key of a leaf in ``tree_metadata``: the repr of its key names.

    Orbax spells it ``str(tuple(str(name) for each key))``: ``"('params', 'w')"``,
    ``"('lr',)"``, ``"('layers', '0')"``.
    """
    return str(tuple(str(entry[1]) for entry in path))


def _key_metadata(path: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    return [
        {
            "key": str(value),
            "key_type": KEY_TYPE_SEQUENCE if kind == "index" else KEY_TYPE_DICT,
        }
        for kind, value in path
    ]


def orbax_param_name(path: Sequence[Sequence[Any]]) -> str:
    """Return the name under which Orbax looks for a leaf's array: its keys joined by ``.``."""
    return ".".join(str(entry[1]) for entry in path)


def orbax_readable(leaf: Mapping[str, Any]) -> bool:
    """Tell whether Orbax finds this leaf's array: its nbckpt name is Orbax's name.

    True when no key needed percent-encoding: every key is a non-empty string of ASCII
    letters, digits, ``_`` and ``-``, or an index.
    """
    path = _path(leaf)
    return bool(path) and orbax_param_name(path) == leaf.get("name")


def scalar_array_dtype(value: Any) -> str | None:
    """Return the dtype of the 0-d array that stores a Python number, or None if none does.

    The dtype NumPy gives the number (``bool``, ``int64``, ``float64``,
    ``complex128``), which is what Orbax writes for a scalar leaf; an int too large
    for 64 bits has none, and only nbckpt (from its inline value) restores it.
    """
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        if -(2**63) <= value < 2**63:
            return "int64"
        return "uint64" if 0 <= value < 2**64 else None
    if isinstance(value, float):
        return "float64"
    if isinstance(value, complex):
        return "complex128"
    return None


def write_shape(leaf: Mapping[str, Any]) -> list[int] | None:
    """Return the shape of one shard of a ``jax.Array`` leaf (Orbax's ``write_shape``).

    Derived from the saved ``NamedSharding``: each dimension divided by the product
    of the mesh axes it is sharded over. None for a leaf that is not a jax array.
    """
    if leaf.get("kind") != "jax":
        return None
    shape = [int(s) for s in leaf.get("shape", [])]
    desc = leaf.get("sharding") or {}
    if desc.get("type") != "named":
        return shape
    sizes = dict(zip(desc.get("axis_names", []), desc.get("mesh_shape", []), strict=False))
    out = []
    for i, dim in enumerate(shape):
        entry = desc["spec"][i] if i < len(desc.get("spec", [])) else None
        axes = [] if entry is None else [entry] if isinstance(entry, str) else list(entry)
        parts = math.prod(int(sizes.get(a, 1)) for a in axes)
        out.append(-(-dim // parts) if parts else dim)
    return out


def _value_metadata(leaf: Mapping[str, Any]) -> dict[str, Any]:
    kind = str(leaf.get("kind"))
    # A number that no 0-d array holds (an int over 64 bits) has nothing to read.
    stored = kind != "scalar" or "dtype" in leaf
    value: dict[str, Any] = {
        "value_type": _VALUE_TYPES.get(kind, "np.ndarray"),
        "skip_deserialize": not stored,
    }
    shape = write_shape(leaf)
    if shape is not None:
        value["write_shape"] = shape
    return value


def tree_metadata(
    leaves: Iterable[Mapping[str, Any]],
    flags: OrbaxFlags,
    empty: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Return the content of Orbax's ``_METADATA`` for a step of these leaves.

    Parameters
    ----------
    leaves
        nbckpt's leaf metadata (``name``, ``path``, ``kind``, ``shape``, ``sharding``).
    flags
        The step's array format.
    empty
        The tree's empty nodes (``path``, ``node``: nbckpt's ``Snapshot.empty``),
        recorded as Orbax records them (``value_type`` ``None``, ``List`` or ``Dict``,
        nothing to deserialize), so that Orbax rebuilds them where they were.
    """
    entries = {
        keypath(_path(leaf)): {
            "key_metadata": _key_metadata(_path(leaf)),
            "value_metadata": _value_metadata(leaf),
        }
        for leaf in leaves
    }
    for node in empty:
        path = _path(node)
        entries[keypath(path)] = {
            "key_metadata": _key_metadata(path),
            "value_metadata": {
                "value_type": _EMPTY_TYPES.get(str(node.get("node")), "None"),
                "skip_deserialize": True,
            },
        }
    return {
        "tree_metadata": entries,
        "use_ocdbt": flags.use_ocdbt,
        "use_zarr3": flags.use_zarr3,
        # Every chunk is stored, so a missing one is damage: Orbax then refuses to
        # read it as zeros (its ``fill_missing_data_reads`` becomes false).
        "store_array_data_equal_to_fill_value": True,
        "custom_metadata": None,
    }


def sharding_json(desc: Mapping[str, Any] | None) -> str | None:
    """Return Orbax's serialized sharding for nbckpt's description of one, or None.

    A ``NamedSharding`` becomes ``{"sharding_type": "NamedSharding", "shape": ...,
    "axis_names": ..., "axis_types": ..., "partition_spec": ..., "device_mesh":
    {"mesh": [[{"id": 0}, ...]]}}`` (the device ids only when they were recorded);
    a single-device sharding ``{"sharding_type": "SingleDeviceSharding",
    "device_str": ...}`` when its device was recorded.
    """
    if not desc:
        return None
    if desc.get("type") == "named":
        data: dict[str, Any] = {
            "sharding_type": "NamedSharding",
            "shape": [int(s) for s in desc["mesh_shape"]],
            "axis_names": [str(a) for a in desc["axis_names"]],
        }
        if desc.get("axis_types"):
            data["axis_types"] = [f"AxisType.{t}" for t in desc["axis_types"]]
        data["partition_spec"] = [
            tuple(p) if isinstance(p, list) else p for p in desc.get("spec", [])
        ]
        ids = desc.get("device_ids")
        if ids is not None:
            data["device_mesh"] = {"mesh": _id_mesh(ids)}
        return json.dumps(data)
    if desc.get("type") == "single_device" and desc.get("device"):
        return json.dumps({"sharding_type": "SingleDeviceSharding", "device_str": desc["device"]})
    return None


def _id_mesh(ids: Any) -> Any:
    if isinstance(ids, list):
        return [_id_mesh(i) for i in ids]
    return {"id": int(ids)}


def sharding_records(leaves: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Return the content of Orbax's ``_sharding``: base64 of each name -> its sharding."""
    out = {}
    for leaf in leaves:
        if leaf.get("kind") != "jax":
            continue
        text = sharding_json(leaf.get("sharding"))
        if text is not None:
            key = base64.urlsafe_b64encode(str(leaf["name"]).encode()).decode("ascii")
            out[key] = text
    return out


def orbax_records(
    leaves: Sequence[Mapping[str, Any]],
    flags: OrbaxFlags,
    empty: Sequence[Mapping[str, Any]] = (),
) -> dict[str, str]:
    """Return every Orbax record of a step, as file name (in the step) -> file text.

    Parameters
    ----------
    leaves
        nbckpt's leaf metadata of the step.
    flags
        How its arrays are stored.
    empty
        The tree's empty nodes (see :func:`tree_metadata`).

    Returns
    -------
    dict
        ``{"_METADATA": ..., "_sharding": ...}`` (``_sharding`` only when some leaf
        is a ``jax.Array`` with a sharding Orbax can describe).
    """
    records = {TREE_METADATA: json.dumps(tree_metadata(leaves, flags, empty))}
    shardings = sharding_records(leaves)
    if shardings:
        records[SHARDING] = json.dumps(shardings)
    return records
