"""Orbax's tree metadata read without jax: every leaf of a pytree item, and its sharding.

``_METADATA`` holds one entry per leaf (its key path, its value type, whether it is
stored as an array); ``_sharding`` and ``_strings.json`` hold what Orbax keeps beside
it. :mod:`nbckpt.formats.orbax` says what a step holds and reads these through here.
"""

from __future__ import annotations

import ast
import base64
import binascii
import json
import os
from dataclasses import dataclass
from typing import Any

from nbckpt import storage
from nbckpt.errors import StorageError
from nbckpt.formats.orbax_names import (
    ARRAY_METADATAS_DIR,
    OCDBT_MANIFEST,
    SHARDING,
    STRINGS,
    TREE_METADATA,
)

#: A directory or file to read: a local path, a URL or a location.
Where = str | os.PathLike[str] | storage.Location


#: One step of a leaf's path, as :data:`nbckpt.engine.arrays.tree.PathEntry` (repeated here
#: because that module needs jax).
PathEntry = tuple[str, "str | int"]


#: The value types whose leaves are stored as arrays (a scalar is a 0-d array).
ARRAY_TYPES = frozenset({"jax.Array", "np.ndarray", "scalar"})
#: A leaf Orbax keeps in ``_strings.json``.
_STRING_TYPE = "string"
#: Empty nodes Orbax records as leaves with ``skip_deserialize`` (metadata/empty_values.py).
_EMPTY_VALUES: dict[str, Any] = {"None": None, "Dict": {}, "List": [], "Tuple": []}

#: Orbax's ``KeyType`` (metadata/tree.py): sequence keys, and dict (or attribute) keys.
_SEQUENCE_KEY = 1
_DICT_KEY = 2


class OrbaxFormatError(ValueError):
    """Orbax's records in a directory cannot be read; the message names the file."""


@dataclass(frozen=True)
class OrbaxLeaf:
    """One entry of a pytree item's tree metadata.

    Attributes
    ----------
    name
        The leaf's name as Orbax stores its array: its keys joined by ``.``.
    path
        The key path as nbckpt's path entries (``("key", k)``, ``("index", i)``).
    value_type
        Orbax's value type: ``"jax.Array"``, ``"np.ndarray"``, ``"scalar"``,
        ``"string"``, an empty node (``"None"``, ``"Dict"``, ...) or a custom type.
    write_shape
        The shape of the pieces each process wrote, where recorded.
    skip_deserialize
        True for empty nodes, which have nothing on disk.
    """

    name: str
    path: tuple[PathEntry, ...]
    value_type: str
    write_shape: tuple[int, ...] | None
    skip_deserialize: bool

    @property
    def is_array(self) -> bool:
        """Whether the leaf is an array on disk (scalars included)."""
        return self.value_type in ARRAY_TYPES and not self.skip_deserialize

    @property
    def is_string(self) -> bool:
        """Whether the leaf is a string kept in ``_strings.json``."""
        return self.value_type == _STRING_TYPE and not self.skip_deserialize

    @property
    def is_empty(self) -> bool:
        """Whether the leaf stands for an empty node (``None``, ``{}``, ``[]``)."""
        return self.skip_deserialize or self.value_type in _EMPTY_VALUES

    def empty_value(self) -> Any:
        """The value an empty node restores to: ``None``, ``{}`` or ``[]`` (a fresh one)."""
        value = _EMPTY_VALUES.get(self.value_type)
        return type(value)() if value is not None else None


@dataclass(frozen=True)
class TreeMetadata:
    """A pytree item's ``_METADATA``: its leaves and how their arrays are stored.

    Attributes
    ----------
    leaves
        Every entry, in the order of the file.
    ocdbt
        The arrays live in one OCDBT database at the item's top (else one zarr array
        directory per leaf).
    zarr3
        The arrays are zarr v3 (else zarr v2).
    store_equal_to_fill
        Orbax's ``store_array_data_equal_to_fill_value``: every chunk was written, so
        a missing one is damage. When False, a missing chunk cannot be told from a
        chunk of fill values.
    """

    leaves: tuple[OrbaxLeaf, ...]
    ocdbt: bool
    zarr3: bool
    store_equal_to_fill: bool


def leaf_name(keys: list[str] | tuple[str, ...]) -> str:
    """Return the name Orbax gives a leaf's array: its keys joined by ``.``."""
    return ".".join(keys)


def _key_path(
    where: storage.Location, tuple_key: str, entry: dict[str, Any]
) -> tuple[PathEntry, ...]:
    """Return the key path of one tree-metadata entry as nbckpt path entries."""
    key_meta = entry.get("key_metadata")
    if key_meta is None:
        # Tree metadata older than key types: only the tuple of key strings.
        try:
            keys = ast.literal_eval(tuple_key)
        except (ValueError, SyntaxError):
            raise OrbaxFormatError(f"{where}: cannot read the leaf key {tuple_key!r}") from None
        if not isinstance(keys, tuple):
            keys = (keys,)
        return tuple(("key", str(k)) for k in keys)
    path: list[PathEntry] = []
    for k in key_meta:
        if not isinstance(k, dict) or "key" not in k:
            raise OrbaxFormatError(f"{where}: leaf {tuple_key}: malformed key_metadata {k!r}")
        key, key_type = str(k["key"]), k.get("key_type")
        if key_type == _SEQUENCE_KEY:
            try:
                path.append(("index", int(key)))
            except ValueError:
                raise OrbaxFormatError(
                    f"{where}: leaf {tuple_key}: sequence key {key!r} is not an integer"
                ) from None
        elif key_type == _DICT_KEY:
            path.append(("key", key))
        else:
            raise OrbaxFormatError(f"{where}: leaf {tuple_key}: unknown key_type {key_type!r}")
    return tuple(path)


def read_tree_metadata(item_dir: Where) -> TreeMetadata:
    """Read a pytree item's ``_METADATA``.

    Parameters
    ----------
    item_dir
        The pytree's directory (a ``StandardCheckpointer`` save, or a manager item).

    Raises
    ------
    OrbaxFormatError
        The file is missing, is not JSON, or an entry is malformed.
    """
    d = storage.location(item_dir)
    where = d / TREE_METADATA
    data = storage.read_json(where)
    if not isinstance(data, dict) or not isinstance(data.get("tree_metadata"), dict):
        raise OrbaxFormatError(f"{where} is missing or is not Orbax tree metadata")
    leaves = []
    for tuple_key, entry in data["tree_metadata"].items():
        if not isinstance(entry, dict):
            raise OrbaxFormatError(f"{where}: leaf {tuple_key}: malformed entry")
        path = _key_path(where, tuple_key, entry)
        value = entry.get("value_metadata")
        if not isinstance(value, dict) or not isinstance(value.get("value_type"), str):
            raise OrbaxFormatError(f"{where}: leaf {tuple_key}: no value_type")
        shape = value.get("write_shape")
        leaves.append(
            OrbaxLeaf(
                name=leaf_name([str(v) for _, v in path]),
                path=path,
                value_type=value["value_type"],
                write_shape=tuple(int(s) for s in shape) if isinstance(shape, list) else None,
                skip_deserialize=bool(value.get("skip_deserialize", False)),
            )
        )
    use_ocdbt = data.get("use_ocdbt")
    return TreeMetadata(
        leaves=tuple(leaves),
        # Tree metadata from before the flag was recorded: the manifest tells.
        ocdbt=bool(use_ocdbt) if use_ocdbt is not None else (d / OCDBT_MANIFEST).is_file(),
        zarr3=bool(data.get("use_zarr3", False)),
        # Orbax has stored every chunk since the flag was introduced; older trees
        # cannot promise it.
        store_equal_to_fill=bool(data.get("store_array_data_equal_to_fill_value", False)),
    )


def tree_leaves(item_dir: Where) -> list[OrbaxLeaf]:
    """Return the leaves of a pytree item's tree metadata (see :func:`read_tree_metadata`)."""
    return list(read_tree_metadata(item_dir).leaves)


def read_shardings(item_dir: Where) -> dict[str, dict[str, Any]]:
    """Return the saved sharding of each jax.Array leaf, by the leaf's dotted name.

    ``_sharding`` maps the URL-safe base64 of each name to a JSON string such as
    ``{"sharding_type": "NamedSharding", "shape": [2, 2], "axis_names": [...],
    "partition_spec": [...]}``. An absent or unreadable file, or entry, is left out.
    """
    data = storage.read_json(storage.location(item_dir) / SHARDING)
    out: dict[str, dict[str, Any]] = {}
    if not isinstance(data, dict):
        return out
    for key, text in data.items():
        try:
            name = base64.urlsafe_b64decode(str(key)).decode("utf-8")
            desc = json.loads(text) if isinstance(text, str) else text
        except (binascii.Error, UnicodeDecodeError, ValueError):
            continue
        if isinstance(desc, dict):
            out[name] = desc
    return out


def read_strings(item_dir: Where) -> dict[str, str]:
    """Return the string leaves of a pytree item, by dotted name (empty if it has none)."""
    data = storage.read_json(storage.location(item_dir) / STRINGS)
    if not isinstance(data, dict):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, str)}


def process_count(item_dir: storage.Location) -> int | None:
    """How many processes wrote an item's arrays (their array-metadata files), or None."""
    try:
        names = [p.name for p in (item_dir / ARRAY_METADATAS_DIR).iterdir()]
    except StorageError:
        raise
    except OSError:
        return None
    return sum(1 for n in names if n.startswith("process_")) or None
