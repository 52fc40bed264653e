"""Flatten a pytree into named leaves, and rebuild one from saved leaf paths."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

__all__ = ["Leaf", "PathEntry", "flatten", "leaf_name", "path_entry", "unflatten_paths"]

#: One step of a leaf's path: ``("key", k)`` for a mapping key, ``("index", i)`` for a
#: sequence position, ``("attr", name)`` for an attribute of a registered node.
PathEntry = tuple[str, "str | int"]

_SCALARS = (bool, int, float, complex)


@dataclass(frozen=True)
class Leaf:
    """One leaf of a saved tree.

    ``kind`` is ``"jax"`` (a ``jax.Array``), ``"numpy"`` (a NumPy array or NumPy
    scalar) or ``"scalar"`` (a Python bool, int, float or complex).
    """

    name: str
    path: tuple[PathEntry, ...]
    kind: str
    value: Any


def path_entry(key: Any) -> PathEntry:
    """Convert one jax key-path entry into a JSON-able :data:`PathEntry`."""
    tu = jax.tree_util
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


def leaf_name(path: tuple[PathEntry, ...]) -> str:
    """Return the directory name of a leaf: its path entries joined by ``.``.

    Characters other than letters, digits, ``_`` and ``-`` are percent-encoded (``.``
    and ``%`` included), so the name is a safe single path component that reads like
    the tree path, and distinct paths get distinct names.
    """
    if not path:
        return "_root"
    parts = []
    for _, v in path:
        s = str(v)
        parts.append(_UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", s) or "%")
    return ".".join(parts)


def _path_str(path: tuple[PathEntry, ...]) -> str:
    return "".join(f"[{v!r}]" if k != "attr" else f".{v}" for k, v in path) or "<root>"


def flatten(tree: Any) -> list[Leaf]:
    """Flatten ``tree`` into classified, uniquely named leaves.

    Raises
    ------
    TypeError
        If a leaf is not a ``jax.Array``, NumPy array or scalar, or a Python number;
        the message names the leaf's tree path.
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    leaves: list[Leaf] = []
    for keys, value in flat:
        path = tuple(path_entry(k) for k in keys)
        where = _path_str(path)
        if isinstance(value, jax.Array):
            kind = "jax"
        elif isinstance(value, np.ndarray | np.generic):
            if value.dtype.hasobject or value.dtype.kind in "USV":
                raise TypeError(
                    f"leaf {where} has dtype {value.dtype}; nbckpt saves numeric and bool "
                    "arrays only"
                )
            kind = "numpy"
        elif isinstance(value, _SCALARS):
            kind = "scalar"
        else:
            raise TypeError(
                f"leaf {where} is a {type(value).__name__}; nbckpt saves jax.Array, numpy "
                "arrays and Python numbers (convert it, or leave it out of the tree)"
            )
        leaves.append(Leaf(name=leaf_name(path), path=path, kind=kind, value=value))
    return leaves


def unflatten_paths(items: list[tuple[tuple[PathEntry, ...], Any]]) -> Any:
    """Rebuild nested dicts and lists from ``(path, value)`` pairs.

    Used when restoring without a target: mappings and attributes become dicts,
    sequences become lists.
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
            return [finish(node[k]) for k in sorted(node)]
        return {k: finish(v) for k, v in node.items()}

    return finish(root)
