"""The trees of the round-trip properties, how they are checked, and their process side.

``tests/test_props_roundtrip.py`` generates *descriptions* of pytrees: ordinary
containers and leaves, except that a jax array is described by a :class:`JaxLeaf` (its
global value and how to place it) and a typed PRNG key by a :class:`KeyLeaf`. A
description pickles, so the same one can be built into a real tree in the test process
or in every process of a group (:func:`build`), and every restored tree is checked
against it (:func:`plain_problems`, :func:`target_problems`). The functions at the end
run inside the processes of a ``ProcessGroup`` (``tests.mh_props:save_all`` ...).
"""

from __future__ import annotations

import dataclasses
import math
import re
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from nbckpt.engine import AsyncCheckpointer
from nbckpt.engine.arrays.tree import NAME_MAX, RESERVED_NAMES

# -- containers people save ---------------------------------------------------------------


class Pair(NamedTuple):
    """A NamedTuple node, as models and data loaders return them."""

    a: Any
    b: Any


class EmptyState(NamedTuple):
    """``optax.EmptyState``: a node without children."""


class ScaleByAdamState(NamedTuple):
    """``optax.ScaleByAdamState``."""

    count: Any
    mu: Any
    nu: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Node:
    """A dataclass registered with jax (as ``flax.struct.dataclass`` does), one static field."""

    x: Any
    y: Any
    tag: str = dataclasses.field(default="node", metadata={"static": True})


# -- leaves that must be built where the tree is used -------------------------------------

#: How a :class:`JaxLeaf` is placed: on this process's first device only (a process-local
#: array, the same on every process), replicated over every device of the job, or split
#: along its first dimension over every device (replicated when that does not divide).
SPECS = ("local", "replicated", "split")


@dataclasses.dataclass(frozen=True, eq=False)
class JaxLeaf:
    """A ``jax.Array`` of global value ``value``, placed as ``spec`` says."""

    value: np.ndarray
    spec: str = "local"

    def __repr__(self) -> str:
        return f"JaxLeaf({self.value!r}, {self.spec!r})"


@dataclasses.dataclass(frozen=True)
class KeyLeaf:
    """A typed PRNG key ``jax.random.key(seed, impl=impl)``, split ``count`` ways if given."""

    seed: int
    impl: str = "threefry2x32"
    count: int | None = None


def make_key(leaf: KeyLeaf) -> jax.Array:
    """Build the typed key array ``leaf`` describes, on this process's first device."""
    key = jax.random.key(leaf.seed, impl=leaf.impl)
    if leaf.count is not None:
        key = jax.random.split(key, leaf.count)
    placed: jax.Array = jax.device_put(key, jax.local_devices()[0])
    return placed


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()), ("d",))


def make_jax(leaf: JaxLeaf) -> jax.Array:
    """Build the ``jax.Array`` ``leaf`` describes (a global array for the shared specs)."""
    value = leaf.value
    if leaf.spec == "local":
        placed: jax.Array = jax.device_put(value, jax.local_devices()[0])
        return placed
    mesh = _mesh()
    n = mesh.devices.size
    split = leaf.spec == "split" and value.ndim > 0 and value.shape[0] % n == 0
    sharding = NamedSharding(mesh, P("d") if split else P())
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def _is_marker(x: Any) -> bool:
    return isinstance(x, JaxLeaf | KeyLeaf)


def build(desc: Any) -> Any:
    """Turn a description into the tree it describes (markers become jax arrays)."""

    def one(x: Any) -> Any:
        if isinstance(x, JaxLeaf):
            return make_jax(x)
        if isinstance(x, KeyLeaf):
            return make_key(x)
        return x

    return jax.tree_util.tree_map(one, desc)


# -- which trees save() must refuse ----------------------------------------------------------

_SCALAR_TYPES = (bool, int, float, complex)
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-]")


def _encoded(key: str) -> str:
    """A key as it appears in its leaf's name on disk (nbckpt.engine.arrays.tree.leaf_name)."""
    text = _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), key)
    return text or "%"


def _key_value(entry: Any) -> Any:
    tu = jax.tree_util
    if isinstance(entry, tu.DictKey):
        return entry.key
    if isinstance(entry, tu.SequenceKey):
        return entry.idx
    if isinstance(entry, tu.GetAttrKey):
        return entry.name
    if isinstance(entry, tu.FlattenedIndexKey):
        return entry.key
    raise AssertionError(f"unexpected key path entry {entry!r}")


def supported_leaf(x: Any) -> bool:
    """Tell whether nbckpt documents ``x`` as a leaf it saves (markers included)."""
    if _is_marker(x) or isinstance(x, jax.Array) or type(x) in _SCALAR_TYPES:
        return True
    if isinstance(x, np.ndarray | np.generic):
        dtype = x.dtype
        return not (dtype.hasobject or dtype.kind in "USMm" or dtype.type is np.void)
    return False


def refusal_reason(desc: Any) -> str | None:
    """Why ``save`` must refuse the tree ``desc`` describes, or None if it must save it.

    The documented refusals (``AsyncCheckpointer.save``, ``nbckpt.engine.arrays.tree.flatten``):
    a leaf that is not an array or a number (or has a string, object or datetime
    dtype); a key other than str or int; two leaves whose names on disk differ at most
    in case; a name reserved by the step directory; a name over 255 bytes.
    """
    try:
        flat, _ = jax.tree_util.tree_flatten_with_path(desc, is_leaf=_is_marker)
    except (TypeError, ValueError) as e:
        return f"cannot be flattened: {e}"
    seen: dict[str, Any] = {}
    for path, leaf in flat:
        where = jax.tree_util.keystr(path)
        if not supported_leaf(leaf):
            return f"leaf {where} is a {type(leaf).__name__} (dtype {getattr(leaf, 'dtype', '')})"
        values = [_key_value(k) for k in path]
        if any(not isinstance(v, str | int) for v in values):
            return f"leaf {where} has a key that is not a str or int"
        name = ".".join(_encoded(str(v)) for v in values) or "_root"
        if len(name) > NAME_MAX:
            return f"leaf {where} has a name of {len(name)} bytes"
        folded = name.lower()
        if folded in RESERVED_NAMES:
            return f"leaf {where} has the reserved name {name!r}"
        if folded in seen:
            return f"leaves {seen[folded]} and {where} share the name {name!r} (case folded)"
        seen[folded] = where
    return None


# -- what a restored leaf must be -------------------------------------------------------------


def _show(x: Any) -> str:
    if isinstance(x, jax.Array | np.ndarray | np.generic):
        return f"{type(x).__name__}[{x.dtype}, shape {tuple(x.shape)}]"
    return f"{type(x).__name__} {x!r}"


def _native(dtype: Any) -> np.dtype[Any]:
    native: np.dtype[Any] = np.dtype(dtype).newbyteorder("=")
    return native


def _bits(a: Any) -> bytes:
    a = np.asarray(a)
    if not a.dtype.isnative:
        a = a.astype(_native(a.dtype))
    return np.ascontiguousarray(a).tobytes()


def _same_bits(got: Any, want: Any) -> str | None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if _bits(got) != _bits(want):
        return f"values differ: got {got.ravel()[:6]!r}, expected {want.ravel()[:6]!r}"
    return None


def _shards(got: jax.Array, value: np.ndarray) -> str | None:
    """Compare every shard this process holds of ``got`` with its part of ``value``."""
    for shard in got.addressable_shards:
        problem = _same_bits(np.asarray(shard.data), value[shard.index])
        if problem is not None:
            return f"shard {shard.index}: {problem}"
    return None


def _sharding(got: jax.Array, want: Any) -> str | None:
    if want is None or got.sharding.is_equivalent_to(want, got.ndim):
        return None
    return f"sharding {got.sharding}, the target asked for {want}"


def _same_float(got: float, want: float) -> bool:
    """Equal as bits (-0.0 is not 0.0), NaN equal to NaN whatever its payload.

    A Python float has no dtype of its own to keep a payload in: JSON, where nbckpt
    records a number, writes every NaN as ``NaN``.
    """
    if math.isnan(want):
        return math.isnan(got)
    return struct.pack("<d", got) == struct.pack("<d", want)


def leaf_problem(got: Any, want: Any, sharding: Any = None) -> str | None:
    """What is wrong with restored leaf ``got``, whose description is ``want``; or None.

    Values must be bitwise identical (for arrays NaN payloads included; signed zeros
    everywhere), dtypes
    equal (a non-native byte order may come back native), shapes equal, and the kind of
    leaf kept: a jax array comes back a jax array (with ``sharding`` if given), a NumPy
    array a NumPy array (a NumPy scalar may come back 0-d), a Python number a number of
    the same type.
    """
    if isinstance(want, KeyLeaf):
        key = make_key(want)
        if not isinstance(got, jax.Array) or not jax.numpy.issubdtype(
            got.dtype, jax.dtypes.prng_key
        ):
            return f"expected a typed PRNG key array {key.dtype}{key.shape}, got {_show(got)}"
        if got.dtype != key.dtype or got.shape != key.shape:
            return f"got {_show(got)}, expected {key.dtype} of shape {key.shape}"
        return _sharding(got, sharding) or _shards(
            jax.random.key_data(got), np.asarray(jax.random.key_data(key))
        )
    if isinstance(want, JaxLeaf):
        if not isinstance(got, jax.Array):
            return f"expected a jax.Array, got {_show(got)}"
        if got.dtype != want.value.dtype:
            return f"dtype {got.dtype}, expected {want.value.dtype}"
        if got.shape != want.value.shape:
            return f"shape {got.shape}, expected {want.value.shape}"
        return _sharding(got, sharding) or _shards(got, want.value)
    if type(want) in _SCALAR_TYPES:
        if type(got) is not type(want):
            return f"expected a Python {type(want).__name__} {want!r}, got {_show(got)}"
        if isinstance(want, complex):
            same = _same_float(got.real, want.real) and _same_float(got.imag, want.imag)
        elif isinstance(want, float):
            same = _same_float(got, want)
        else:
            same = got == want
        return None if same else f"got {got!r}, expected {want!r}"
    if isinstance(want, np.ndarray | np.generic):
        if isinstance(want, np.ndarray) and type(got) is not np.ndarray:
            return f"expected a numpy array {_show(want)}, got {_show(got)}"
        if not isinstance(got, np.ndarray | np.generic):
            return f"expected a numpy scalar {_show(want)}, got {_show(got)}"
        if _native(got.dtype) != _native(want.dtype):
            return f"dtype {got.dtype}, expected {want.dtype}"
        return _same_bits(got, want)
    raise AssertionError(f"unexpected leaf in a description: {want!r}")


# -- what a restored tree must be -------------------------------------------------------------

#: A leaf's place in a tree restored without a target: ("key", k) or ("index", i).
Path = tuple[tuple[str, Any], ...]


def expected_paths(desc: Any) -> dict[Path, Any]:
    """Each leaf of ``desc`` by the place it must have in a restore without a target.

    Mappings and attributes (NamedTuple fields, dataclass fields) become dict keys,
    sequences become lists; a leaf keeps its position in its sequence (a None before it
    is an empty place, never skipped).
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(desc, is_leaf=_is_marker)
    tu = jax.tree_util
    out: dict[Path, Any] = {}
    for keys, leaf in flat:
        path: list[tuple[str, Any]] = []
        for k in keys:
            if isinstance(k, tu.SequenceKey | tu.FlattenedIndexKey):
                path.append(("index", _key_value(k)))
            else:
                path.append(("key", _key_value(k)))
        out[tuple(path)] = leaf
    return out


def _plain_leaves(tree: Any, path: Path, out: dict[Path, Any], bad: list[str]) -> None:
    if type(tree) is dict:
        for k, v in tree.items():
            _plain_leaves(v, (*path, ("key", k)), out, bad)
    elif type(tree) is list:
        for i, v in enumerate(tree):
            _plain_leaves(v, (*path, ("index", i)), out, bad)
    elif tree is None:
        pass  # an empty place in a list, or an empty subtree
    elif isinstance(tree, jax.Array | np.ndarray | np.generic) or type(tree) in _SCALAR_TYPES:
        out[path] = tree
    else:
        bad.append(f"{_fmt(path)} is a {type(tree).__name__}: only dicts and lists expected")


def _fmt(path: Path) -> str:
    return "".join(f"[{v!r}]" for _, v in path) or "<root>"


def plain_problems(got: Any, desc: Any) -> list[str]:
    """Compare a restore without a target with the tree ``desc`` describes."""
    want = expected_paths(desc)
    have: dict[Path, Any] = {}
    problems: list[str] = []
    _plain_leaves(got, (), have, problems)
    missing = [p for p in want if p not in have]
    extra = [p for p in have if p not in want]
    if missing or extra:
        problems.append(
            "leaves misplaced: expected at "
            + ", ".join(map(_fmt, missing))
            + "; found at "
            + ", ".join(map(_fmt, extra))
        )
    for path, leaf in want.items():
        if path in have:
            problem = leaf_problem(have[path], leaf)
            if problem is not None:
                problems.append(f"{_fmt(path)}: {problem}")
    return problems


def target_problems(got: Any, desc: Any, target: Any) -> list[str]:
    """Compare a restore into ``target`` (the tree ``desc`` describes, built) with ``desc``."""
    want_def: Any = jax.tree_util.tree_structure(target)  # PyTreeDef's __eq__ is untyped
    got_def: Any = jax.tree_util.tree_structure(got)
    if got_def != want_def:
        return [f"structure {got_def}, expected {want_def}"]
    problems = []
    descs, _ = jax.tree_util.tree_flatten_with_path(desc, is_leaf=_is_marker)
    targets = jax.tree_util.tree_leaves(target)
    for (keys, want), g, t in zip(descs, jax.tree_util.tree_leaves(got), targets, strict=True):
        problem = leaf_problem(g, want, t.sharding if isinstance(t, jax.Array) else None)
        if problem is not None:
            problems.append(f"{jax.tree_util.keystr(keys)}: {problem}")
    return problems


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _guard(what: str, fn: Callable[[], list[str]]) -> list[str]:
    try:
        return fn()
    except Exception as e:
        return [f"{what} raised {_error(e)}"]


# -- the process side (tests.mh_props:save_all, tests.mh_props:restore_all) -------------


def save_all(root: str, descs: list[Any], fmt: str | None) -> list[str | None]:
    """Save the tree of ``descs[i]`` as step ``i + 1``; return each save's error or None."""
    out: list[str | None] = []
    ckptr = AsyncCheckpointer(root)
    try:
        for i, desc in enumerate(descs):
            try:
                ckptr.save(i + 1, build(desc), format=fmt)
                ckptr.wait_until_finished()
                out.append(None)
            except Exception as e:
                out.append(_error(e))
    finally:
        ckptr.close()
    return out


def _restore_one(ckptr: AsyncCheckpointer, step: int, desc: Any) -> list[str]:
    problems = _guard("restore without a target", lambda: plain_problems(ckptr.restore(step), desc))
    target = build(desc)
    return problems + _guard(
        "restore into the saved tree",
        lambda: target_problems(ckptr.restore(step, target=target), desc, target),
    )


def restore_all(root: str, descs: list[Any], steps: list[int]) -> dict[int, list[str]]:
    """Restore ``steps`` without and with a target; return each one's problems."""
    out: dict[int, list[str]] = {}
    ckptr = AsyncCheckpointer(root)
    try:
        for step in steps:
            problems = _restore_one(ckptr, step, descs[step - 1])
            out[step] = [f"process {jax.process_index()}: {p}" for p in problems]
    finally:
        ckptr.close()
    return out


def sizes() -> dict[str, int]:
    """This process's index, the job's process count and its device count."""
    return {
        "process": jax.process_index(),
        "processes": jax.process_count(),
        "devices": jax.device_count(),
    }
