"""Flatten a pytree into named leaves, and rebuild one from saved leaf paths."""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from nbckpt.engine.arrays.zarr import dtype_supported
from nbckpt.formats.layout import (
    CHECKSUMS_DIR,
    COMMIT_FILE,
    LEGACY_METADATA_FILE,
    METADATA_FILE,
    OWNER_FILE,
)
from nbckpt.formats.orbax_names import ARRAY_METADATAS_DIR, SHARDING, TREE_METADATA
from nbckpt.formats.packs import PACK_DIR

__all__ = [
    "EMPTY",
    "NAME_MAX",
    "RESERVED_NAMES",
    "Leaf",
    "PathEntry",
    "dtype_name",
    "flatten",
    "empty_value",
    "leaf_name",
    "legacy_leaf_name",
    "path_entry",
    "path_str",
    "unflatten_paths",
]

#: The kind of a :class:`Leaf` that stands for an empty node of the tree (``None``, an
#: empty tuple, list, dict or NamedTuple), which jax's flatten drops: recorded so that a
#: restore without a target puts it, and every leaf after it, back where it was.
EMPTY = "empty"

#: One step of a leaf's path: ``("key", k)`` for a mapping key, ``("index", i)`` for a
#: sequence position, ``("attr", name)`` for an attribute of a registered node.
PathEntry = tuple[str, "str | int"]

_SCALARS = (bool, int, float, complex)


@dataclass(frozen=True)
class Leaf:
    """One leaf of a saved tree.

    ``kind`` is ``"jax"`` (a ``jax.Array``), ``"numpy"`` (a NumPy array or NumPy
    scalar), ``"scalar"`` (a Python bool, int, float or complex), or :data:`EMPTY`
    (an empty node: ``value`` is ``"none"``, ``"list"`` or ``"dict"``, what a restore
    without a target puts there). A typed PRNG key array is a ``"jax"`` leaf whose
    ``value`` is its key data and ``key_impl`` the name of its implementation.
    """

    name: str
    path: tuple[PathEntry, ...]
    kind: str
    value: Any
    key_impl: str | None = None


def path_entry(key: Any) -> PathEntry:
    """Convert one jax key-path entry into a JSON-able :data:`PathEntry`."""
    tu = jax.tree_util
    kind = type(key)
    # The common kinds by their exact type first: a restore converts every key of its
    # target's thousands of leaves.
    if kind is tu.DictKey and type(key.key) is str:
        return ("key", key.key)
    if kind is tu.GetAttrKey:
        return ("attr", key.name)
    if isinstance(key, tu.DictKey):
        k = key.key
        if not isinstance(k, str | int):
            raise TypeError(f"dict key {k!r} is not a str or int; nbckpt cannot name it")
        return ("key", k)
    if isinstance(key, tu.SequenceKey):
        return ("index", key.idx)
    if isinstance(key, tu.GetAttrKey):
        return ("attr", key.name)
    if isinstance(key, tu.FlattenedIndexKey):
        return ("index", key.key)
    raise TypeError(f"unsupported pytree key {key!r}")


_UNSAFE = re.compile(r"[^A-Za-z0-9_\-]")

#: The longest file name (one path component) common filesystems accept, in bytes.
NAME_MAX = 255

#: Names a step directory already uses for its own files (``nbckpt.formats.layout``), lower
#: case: a leaf by one of these names would overwrite them, or be overwritten.
RESERVED_NAMES = frozenset(
    n.lower()
    for n in (
        METADATA_FILE,
        LEGACY_METADATA_FILE,
        CHECKSUMS_DIR,
        PACK_DIR,
        OWNER_FILE,
        COMMIT_FILE,
        # Orbax's records, which every step carries too (nbckpt.formats.orbax_write).
        # Nothing else needs reserving: in Orbax's format (format="orbax") the arrays
        # are keys in an OCDBT database, never directories beside manifest.ocdbt, d/
        # and ocdbt.process_<i>/.
        TREE_METADATA,
        SHARDING,
        ARRAY_METADATAS_DIR,
    )
)


def _encode_utf8(m: re.Match[str]) -> str:
    return "".join(f"%{b:02X}" for b in m.group().encode("utf-8", "surrogatepass"))


def leaf_name(path: tuple[PathEntry, ...]) -> str:
    """Return the directory name of a leaf: its path entries joined by ``.``.

    Characters other than ASCII letters, digits, ``_`` and ``-`` are percent-encoded
    as their UTF-8 bytes (``.``, ``%``, ``/`` and NUL included), as in a URL. So the
    name is one safe path component of ASCII characters that reads like the tree
    path: never empty, ``.`` or ``..``, never holding ``/`` or NUL; and distinct
    sequences of keys get distinct names (an empty key becomes ``%``, which no other
    key does).
    """
    if not path:
        return "_root"
    return ".".join([_name_part(v) for _, v in path])


@functools.lru_cache(maxsize=4096, typed=True)
def _name_part(key: str | int) -> str:
    # A state's thousands of leaves share a few dozen keys ("params", "layer_003",
    # "kernel"); a restore names every leaf of its target.
    return _UNSAFE.sub(_encode_utf8, str(key)) or "%"


def legacy_leaf_name(path: tuple[PathEntry, ...]) -> str:
    """Return the name :func:`leaf_name` gave before it encoded UTF-8 bytes.

    It encoded each code point's number instead (``"%E9"`` for ``é``, ``"%4E2D"`` for
    ``中``), which two different keys could share; steps saved then still hold such
    names, and restore looks a target's leaf up by this name when the other misses.
    The two differ only for keys with non-ASCII characters.
    """
    if not path:
        return "_root"
    parts = []
    for _, v in path:
        s = str(v)
        parts.append(_UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", s) or "%")
    return ".".join(parts)


def path_str(path: tuple[PathEntry, ...]) -> str:
    """Return a leaf's tree path as an error message shows it: ``['opt'][1].mu``."""
    return "".join([_path_part(k, v) for k, v in path]) or "<root>"


@functools.lru_cache(maxsize=4096, typed=True)
def _path_part(kind: str, key: str | int) -> str:
    # Remembered, as leaf names' parts are (see _name_part).
    return f"[{key!r}]" if kind != "attr" else f".{key}"


def _leaf_path(keys: tuple[Any, ...]) -> tuple[PathEntry, ...]:
    """Convert a jax key path, naming the leaf in the error if a key cannot be named."""
    path: list[PathEntry] = []
    for key in keys:
        try:
            path.append(path_entry(key))
        except TypeError as e:
            where = (path_str(tuple(path)) if path else "") + str(key)
            raise TypeError(f"leaf {where}: {e}") from None
    return tuple(path)


def _plain_void(dtype: np.dtype[Any]) -> bool:
    """Tell whether a dtype of kind ``V`` is raw bytes or a record, not an ml_dtypes number.

    ``bfloat16``, ``float8_*`` and ``int4`` (ml_dtypes, what jax's own dtypes are) are of
    kind ``V`` too, but their scalar type is their own, not ``np.void``.
    """
    return dtype.kind == "V" and issubclass(dtype.type, np.void)


@functools.lru_cache(maxsize=256)
def dtype_name(dtype: Any) -> str:
    """Return ``np.dtype(dtype).name``, remembered.

    NumPy builds the name in Python each time: a state of thousands of leaves paid for
    it thousands of times per save.
    """
    return str(np.dtype(dtype).name)


@functools.lru_cache(maxsize=256)
def _extended(dtype: Any) -> bool:
    """Whether ``dtype`` is one of jax's extended dtypes (asked once per dtype)."""
    return bool(jax.numpy.issubdtype(dtype, jax.dtypes.extended))


@functools.lru_cache(maxsize=256)
def _prng_key(dtype: Any) -> bool:
    """Whether ``dtype`` is a typed PRNG key's (asked once per dtype)."""
    return bool(jax.numpy.issubdtype(dtype, jax.dtypes.prng_key))


def _kind(value: Any, path: tuple[PathEntry, ...]) -> str:
    """Return the kind of a leaf, or raise TypeError if nbckpt cannot store it."""
    if isinstance(value, jax.Array):
        if _extended(value.dtype):
            raise TypeError(
                f"leaf {path_str(path)} is a jax array of dtype {value.dtype}, which nbckpt cannot "
                "store; convert it to a numeric array before saving"
            )
        kind = "jax"
    elif isinstance(value, np.ndarray | np.generic):
        if value.dtype.hasobject or value.dtype.kind in "US" or _plain_void(value.dtype):
            raise TypeError(
                f"leaf {path_str(path)} has dtype {value.dtype}; nbckpt saves numeric and "
                "bool arrays only"
            )
        kind = "numpy"
    elif isinstance(value, _SCALARS):
        return "scalar"
    else:
        raise TypeError(
            f"leaf {path_str(path)} is a {type(value).__name__}; nbckpt saves jax.Array, numpy "
            "arrays and Python numbers (convert it, or leave it out of the tree)"
        )
    if not dtype_supported(np.dtype(value.dtype)):
        raise TypeError(
            f"leaf {path_str(path)} has dtype {value.dtype}, which a zarr array cannot hold; "
            "convert it (for example to an integer count) before saving"
        )
    return kind


@functools.lru_cache(maxsize=256)
def _plain_jax(dtype: Any) -> bool:
    """Whether :func:`_kind` takes a jax array of ``dtype`` as it is (no key, no refusal)."""
    return not _extended(dtype) and dtype_supported(np.dtype(dtype))


#: The exact types met so far whose values are leaves (a jax array's, NumPy's): asked
#: of a value's type first, a state's thousands of leaves being of a few types.
_LEAF_TYPES: set[type] = {np.ndarray, *_SCALARS}
#: The exact types met so far whose values are jax arrays.
_JAX_TYPES: set[type] = set()


def _empty_node(value: Any) -> str | None:
    """Return what an empty node is restored as (``"none"``, ``"list"``, ``"dict"``), or None.

    None when ``value`` is not an empty node: a leaf, or a node with children.
    """
    if type(value) in _LEAF_TYPES:
        return None
    if value is None:
        return "none"
    if isinstance(value, (jax.Array, np.ndarray, np.generic, *_SCALARS)):
        _LEAF_TYPES.add(type(value))  # whether a value is an instance is its type's say
        return None
    kind = type(value)
    if kind is dict or kind is list or kind is tuple:
        # A built-in container is empty when it holds nothing, as jax's flattening
        # below would say, at a jax call for every node of the tree.
        return None if value else ("dict" if kind is dict else "list")
    children = jax.tree_util.tree_leaves(value, is_leaf=lambda child: child is not value)
    if children:
        return None
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return "dict"  # a NamedTuple: restored as a dict, like one with fields
    return "list" if isinstance(value, list | tuple) else "dict"


def _is_empty(value: Any) -> bool:
    return _empty_node(value) is not None


def flatten(tree: Any) -> list[Leaf]:
    """Flatten ``tree`` into classified, uniquely named leaves.

    Everything that would make the save fail later, or lose a leaf, is refused here,
    before anything is written. Empty nodes (``None``, ``()``, ``[]``, ``{}``, an empty
    NamedTuple) come back as :data:`EMPTY` leaves, so that their positions are kept.
    A typed PRNG key array becomes a ``"jax"`` leaf of its key data. Every refusal
    names the leaf's tree path. Keys that are empty, ``.`` or ``..``, or hold ``/`` or
    NUL are not refused: :func:`leaf_name` percent-encodes them into safe names that no
    other key gets.

    Raises
    ------
    TypeError
        If a leaf is not a ``jax.Array``, NumPy array or scalar, or a Python number,
        or has a dtype a zarr array cannot hold (strings, objects, datetimes), or a
        dict key is not a str or int.
    ValueError
        If the tree cannot be flattened (a dict mixes key types), if a leaf's on-disk
        name is longer than :data:`NAME_MAX` bytes or is one the step directory uses
        itself (``_NBCKPT_METADATA``, ``_METADATA``, ...), or if two leaves get names that differ
        at most in letter case: they would be one directory on a case-insensitive
        filesystem (macOS, Windows, SMB shares), or once the step is copied to one,
        and one leaf would silently replace the other.
    """
    try:
        values, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_empty)
    except (TypeError, ValueError) as e:
        # jax says only "Comparator raised exception while sorting pytree dictionary keys".
        raise ValueError(
            f"cannot flatten the tree ({e}); does a dict mix key types, such as 1 and '1'?"
        ) from e
    empties = [_empty_node(v) for v in values]
    names = _names(tree, treedef, tuple(e is not None for e in empties))
    leaves: list[Leaf] = []
    for i, (value, empty) in enumerate(zip(values, empties, strict=True)):
        path, name = names.paths[i], names.names[i]
        if empty is not None:
            leaves.append(Leaf(name=name, path=path, kind=EMPTY, value=empty))
            continue
        key_impl = None
        dtype = value.dtype if type(value) in _JAX_TYPES else None
        if dtype is not None and _plain_jax(dtype):
            kind = "jax"  # what _kind says of it, asked of its type and dtype alone
        else:
            if isinstance(value, jax.Array) and _prng_key(value.dtype):
                # Stored as its key data; restore wraps it again with the same implementation.
                key_impl = str(jax.random.key_impl(value))
                value = jax.random.key_data(value)
            kind = _kind(value, path)
            if kind == "jax" and key_impl is None:
                _JAX_TYPES.add(type(value))
        if names.refused is not None and names.refused[0] == i:
            raise names.refused[1]
        leaves.append(Leaf(name=name, path=path, kind=kind, value=value, key_impl=key_impl))
    return leaves


class _NameError(ValueError):
    """A leaf's name that the step directory cannot hold (see :func:`_names`)."""


@dataclass(frozen=True)
class _Names:
    """The leaves' paths and names for one tree structure, and the first name refused."""

    paths: list[tuple[PathEntry, ...]]
    names: list[str]
    #: The position of the first leaf whose name is refused, and the error to raise.
    refused: tuple[int, _NameError] | None


#: Names worked out per tree structure (and which of its leaves are empty nodes): a
#: training loop saves the same structure every time, and a leaf's name costs some
#: microseconds of Python, which a state of thousands of leaves paid at every save.
_known_names: dict[tuple[Any, tuple[bool, ...]], _Names] = {}
_KNOWN_MAX = 16


def _names(tree: Any, treedef: Any, empty: tuple[bool, ...]) -> _Names:
    """The paths and names of ``tree``'s leaves (``treedef`` its structure).

    A name is checked unless its leaf is an empty node (nothing is stored for one):
    at most :data:`NAME_MAX` bytes, none the step directory uses for its own records,
    no two that differ at most in letter case.
    """
    key = (treedef, empty)
    known = _known_names.get(key)
    if known is not None:
        return known
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_empty)
    paths = [_leaf_path(keys) for keys, _ in flat]
    names = [leaf_name(path) for path in paths]
    refused = None
    # Lower-cased name -> the path of the leaf that has it.
    seen: dict[str, tuple[PathEntry, ...]] = {}
    for i, (path, name) in enumerate(zip(paths, names, strict=True)):
        if empty[i]:
            continue
        problem = _name_problem(path, name, seen.get(name.lower()))
        if problem is not None:
            refused = (i, problem)
            break
        seen[name.lower()] = path
    known = _Names(paths, names, refused)
    if len(_known_names) >= _KNOWN_MAX:
        _known_names.clear()
    _known_names[key] = known
    return known


def _name_problem(
    path: tuple[PathEntry, ...], name: str, other: tuple[PathEntry, ...] | None
) -> _NameError | None:
    """Why the leaf at ``path`` cannot be stored as ``name``, or None.

    ``other`` is the path of an earlier leaf whose name folds to the same, if any.
    """
    size = len(name)  # ASCII: characters are bytes
    if size > NAME_MAX:
        where = path_str(path)
        short = where if len(where) <= 100 else where[:97] + "..."
        return _NameError(
            f"leaf {short} would be stored under a name of {size} bytes (its keys "
            f"joined by '.', non-ASCII characters and punctuation percent-encoded), "
            f"over the {NAME_MAX}-byte limit of a file name; shorten its keys or nest "
            "the tree less deeply"
        )
    if name.lower() in RESERVED_NAMES:
        return _NameError(
            f"leaf {path_str(path)} would be stored as {name!r}, a name the step "
            "directory uses for its own records; rename that key"
        )
    if other is not None:
        where, before = path_str(path), path_str(other)
        same = "the same name" if before == where else "names that differ only in case"
        return _NameError(
            f"leaves {before} and {where} would be stored under {same} ({name!r}): "
            "one would replace the other on a case-insensitive filesystem; rename one"
        )
    return None


#: What a restore without a target puts where an empty node was.
_EMPTY_VALUES: dict[str, Any] = {"none": None, "list": [], "dict": {}}


def empty_value(node: str) -> Any:
    """Return a fresh value for an :data:`EMPTY` leaf recorded as ``node``.

    Raises
    ------
    ValueError
        If ``node`` is not one this version of nbckpt writes.
    """
    if node not in _EMPTY_VALUES:
        raise ValueError(f"unknown empty node {node!r}; upgrade nbckpt")
    return copy.copy(_EMPTY_VALUES[node])


def unflatten_paths(items: list[tuple[tuple[PathEntry, ...], Any]]) -> Any:
    """Rebuild nested dicts and lists from ``(path, value)`` pairs.

    Used when restoring without a target: mappings and attributes become dicts,
    sequences become lists. A position of a sequence that no pair names is ``None``
    (an empty node of a step saved before empty nodes were recorded): every value
    stays at its index.
    """
    if len(items) == 1 and not items[0][0]:
        return items[0][1]
    root: dict[Any, Any] = {}
    kinds: dict[int, str] = {}
    for path, value in items:
        node = root
        for depth, (kind, key) in enumerate(path):
            kinds.setdefault(id(node), kind)
            if depth == len(path) - 1:
                node[key] = value
            else:
                node = node.setdefault(key, {})

    def finish(node: Any) -> Any:
        if not isinstance(node, dict) or id(node) not in kinds:
            return node
        if kinds[id(node)] == "index":
            size = max(int(k) for k in node) + 1
            return [finish(node[k]) if k in node else None for k in range(size)]
        return {k: finish(v) for k, v in node.items()}

    return finish(root)
