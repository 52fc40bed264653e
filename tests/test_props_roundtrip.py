"""Property: every tree is either refused up front by ``save`` or comes back identical.

The trees are the ones people save: nested dicts with odd keys, lists and tuples with
None in them, NamedTuples, registered dataclasses, optax-like optimizer states; their
leaves NumPy arrays of every dtype nbckpt stores (both byte orders, 0-d and empty),
NumPy scalars, Python numbers, jax arrays and typed PRNG keys. A tree is generated as a
description (``tests/mh_props.py``) so that the same one can be built in this process
or in every process of a group.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from nbckpt.engine import AsyncCheckpointer
from nbckpt.formats.layout import all_steps
from nbckpt.procgroup import ProcessGroup
from tests.mh_props import (
    SPECS,
    EmptyState,
    JaxLeaf,
    KeyLeaf,
    Node,
    Pair,
    ScaleByAdamState,
    build,
    plain_problems,
    refusal_reason,
    target_problems,
)

M = "tests.mh_props"
# Hypothesis warns when it prints the strategy of a failing example: these are big.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")
FORMATS = [None, "orbax"]

# -- leaves ------------------------------------------------------------------------------

_ML = [
    ml_dtypes.bfloat16,
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e5m2,
    ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e5m2fnuz,
    ml_dtypes.float8_e4m3b11fnuz,
]
#: Every dtype nbckpt stores, as NumPy names it.
NUMPY_DTYPES = [
    np.dtype(t)
    for t in (
        np.bool_,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.float16,
        np.float32,
        np.float64,
        np.complex64,
        np.complex128,
        *_ML,
    )
]
#: Those a jax array holds without ``jax_enable_x64``.
JAX_DTYPES = [d for d in NUMPY_DTYPES if d.itemsize < 8 or d == np.complex64]
#: Those NumPy also has in the other byte order.
SWAPPABLE = [d for d in NUMPY_DTYPES if d.itemsize > 1 and d.type.__module__ == "numpy"]

_shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)


@st.composite
def arrays(
    draw: st.DrawFn,
    dtypes: list[np.dtype[Any]],
    swap: bool = True,
    layouts: bool = True,
    shapes: st.SearchStrategy[tuple[int, ...]] = _shapes,
) -> np.ndarray:
    """An array of any bit pattern (NaN payloads, infinities, -0.0), any layout."""
    dtype = draw(st.sampled_from(dtypes))
    if swap and dtype in SWAPPABLE and draw(st.booleans()):
        dtype = dtype.newbyteorder()  # non-native: '>i4' on this machine
    shape = draw(shapes)
    n = math.prod(shape)
    if dtype.kind == "b":
        flags = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        a = np.array(flags, dtype=bool).reshape(shape)
    else:
        raw = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
        a = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if layouts and a.ndim >= 2:
        layout = draw(st.sampled_from(["C", "F", "T", "strided"]))
        if layout == "F":
            a = np.asfortranarray(a)
        elif layout == "T":
            a = a.T  # a transposed view
        elif layout == "strided":
            a = np.repeat(a, 2, axis=-1)[..., ::2]  # a non-contiguous view
    return a


def _scalar(a: np.ndarray) -> Any:
    return a[()]  # a 0-d array's only element: a NumPy scalar


def numpy_scalars() -> st.SearchStrategy[Any]:
    return arrays(NUMPY_DTYPES, layouts=False, shapes=st.just(())).map(_scalar)


def jax_leaves() -> st.SearchStrategy[JaxLeaf]:
    return st.builds(JaxLeaf, arrays(JAX_DTYPES, swap=False, layouts=False), st.sampled_from(SPECS))


def prng_keys() -> st.SearchStrategy[KeyLeaf]:
    return st.builds(
        KeyLeaf,
        st.integers(0, 2**32 - 1),
        st.sampled_from(["threefry2x32", "rbg"]),
        st.none() | st.integers(0, 3),
    )


_BOUNDARY_INTS = [0, 1, -1, 2**31, 2**32 + 1, 2**53 + 1, 2**63 - 1, -(2**63), 2**63, 2**64 - 1]


def python_numbers() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.booleans(),
        st.sampled_from(_BOUNDARY_INTS) | st.integers(-(2**70), 2**70),
        st.floats(),  # NaN, infinities and -0.0 included
        st.complex_numbers(),
    )


def supported_leaves() -> st.SearchStrategy[Any]:
    return st.one_of(
        arrays(NUMPY_DTYPES),
        numpy_scalars(),
        python_numbers(),
        jax_leaves(),
        prng_keys(),
    )


#: Leaves nbckpt documents it refuses (TypeError naming the leaf).
_UNSUPPORTED = [
    "adam",
    b"bytes",
    np.array(["s"]),
    np.zeros(2, "datetime64[s]"),
    np.array([None], dtype=object),
]

# -- keys and containers -----------------------------------------------------------------

#: Keys people do use, and the awkward ones nbckpt must encode rather than refuse.
_ODD_KEYS = ["", ".", "..", "/", "a/b", "a.b", "%", "%25", "\x00", "é", "É", "中", "w", "b"]
#: Keys that make refusals: a case twin of another key, names the step directory uses.
_RESERVED_KEYS = ["_CHECKSUMS", "_NBCKPT_METADATA", "_CHECKPOINT_METADATA", "_nbckpt_owner"]
_REFUSED_KEYS = ["W", "B", "A", "a", "commit_success", *_RESERVED_KEYS]


def _text_keys() -> st.SearchStrategy[str]:
    return st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=4)


def _containers(
    children: st.SearchStrategy[Any], keys: st.SearchStrategy[str], refusable: bool
) -> st.SearchStrategy[Any]:
    slot = st.none() | children
    if refusable:
        dicts = st.one_of(
            st.dictionaries(keys, slot, max_size=4),
            # Case twins side by side (refused when both hold leaves), and reserved names.
            st.builds(lambda k, a, b: {k: a, k.upper(): b}, st.sampled_from("abw"), slot, slot),
            st.builds(lambda k, a: {k: a}, st.sampled_from(_RESERVED_KEYS), slot),
            st.builds(lambda a: {"commit_success": {"txt": a}}, slot),
        )
    else:
        # Sibling keys that differ only in case are refused: keep them apart.
        pairs = st.lists(st.tuples(keys, slot), max_size=4, unique_by=lambda kv: kv[0].lower())
        dicts = pairs.map(dict)
    return st.one_of(
        dicts,
        st.lists(slot, max_size=4),
        st.lists(slot, max_size=3).map(tuple),
        st.builds(Pair, slot, slot),
        st.builds(Node, slot, slot, st.sampled_from(["node", "other"])),
        st.builds(ScaleByAdamState, slot, slot, slot),
        # optax.chain(clip, adam): (EmptyState(), (ScaleByAdamState(...), EmptyState()))
        st.builds(
            lambda count, mu, nu: (EmptyState(), (ScaleByAdamState(count, mu, nu), EmptyState())),
            slot,
            slot,
            slot,
        ),
    )


def trees(refusable: bool = True, max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Descriptions of trees; with ``refusable``, some that ``save`` must refuse."""
    keys = st.sampled_from(_ODD_KEYS) | _text_keys()
    leaves = supported_leaves()
    if refusable:
        keys = keys | st.sampled_from(_REFUSED_KEYS)
        leaves = leaves | st.sampled_from(_UNSUPPORTED)
    else:
        keys = keys.filter(lambda k: k.lower() not in {r.lower() for r in _REFUSED_KEYS})
    descs = st.recursive(leaves, lambda c: _containers(c, keys, refusable), max_leaves=max_leaves)
    return descs if refusable else descs.filter(lambda d: refusal_reason(d) is None)


# -- the property, in this process ---------------------------------------------------------


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def check_round_trip(desc: Any, fmt: str | None) -> None:
    """Save the tree ``desc`` describes: refused up front, or restored identical."""
    reason = refusal_reason(desc)
    tree = build(desc)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ckptr = AsyncCheckpointer(root)
        before = _listing(root)
        try:
            try:
                ckptr.save(1, tree, format=fmt)
            except (TypeError, ValueError) as e:
                assert reason is not None, (
                    f"save refused a tree nbckpt documents as savable: {type(e).__name__}: {e}"
                )
                assert "\n" not in str(e), f"the refusal is not one line: {e!r}"
                event(f"refused: {type(e).__name__}")
                assert all_steps(root) == [] and _listing(root) == before, (
                    f"the refused save wrote {sorted(set(_listing(root)) - set(before))}"
                )
                return
            assert reason is None, f"save accepted a tree it must refuse: {reason}"
            event("saved")
            ckptr.wait_until_finished()
            assert all_steps(root) == [1]
            plain = plain_problems(ckptr.restore(1), desc)
            assert not plain, "restore without a target:\n" + "\n".join(plain)
            into = target_problems(ckptr.restore(1, target=tree), desc, tree)
            assert not into, "restore into the saved tree:\n" + "\n".join(into)
        finally:
            ckptr.close()


_SETTINGS = settings(
    deadline=None,
    database=None,  # write nothing into the checkout
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)


@pytest.mark.parametrize("fmt", FORMATS)
@settings(_SETTINGS, max_examples=150)
@given(desc=trees())
def test_any_tree_is_refused_up_front_or_restored_identical(desc: Any, fmt: str | None) -> None:
    check_round_trip(desc, fmt)


# The same property on one family of leaves at a time, in a flat list, so that a defect
# of one family neither hides nor is hidden by another's.
_FAMILIES: dict[str, st.SearchStrategy[Any]] = {
    "numpy_native": arrays(NUMPY_DTYPES, swap=False),
    "numpy_byte_swapped": arrays(SWAPPABLE).map(
        lambda a: a if not a.dtype.isnative else a.astype(a.dtype.newbyteorder())
    ),
    "numpy_ml_dtypes": arrays([np.dtype(t) for t in _ML]),
    "numpy_64bit": arrays(
        [np.dtype(t) for t in ("int64", "uint64", "float64", "complex128")], swap=False
    ),
    "numpy_scalars": numpy_scalars(),
    "python_numbers": python_numbers(),
    "jax_arrays": jax_leaves(),
    "prng_keys": prng_keys(),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", sorted(_FAMILIES))
@settings(_SETTINGS, max_examples=25)
@given(data=st.data())
def test_each_leaf_family_round_trips(data: st.DataObject, family: str, fmt: str | None) -> None:
    leaves = data.draw(st.lists(_FAMILIES[family], min_size=1, max_size=3), label="leaves")
    check_round_trip({"leaves": leaves}, fmt)


#: Nodes without leaves: they hold a place in their sequence all the same.
_EMPTY_NODES: st.SearchStrategy[Any] = st.sampled_from([None, [], {}, (), EmptyState()])


@pytest.mark.parametrize("fmt", FORMATS)
@settings(_SETTINGS, max_examples=40)
@given(
    desc=st.lists(
        _EMPTY_NODES | python_numbers() | arrays(NUMPY_DTYPES[:4], swap=False), max_size=5
    ).flatmap(lambda items: st.sampled_from([items, tuple(items), {"opt": (EmptyState(), items)}]))
)
def test_none_and_empty_nodes_keep_every_position(desc: Any, fmt: str | None) -> None:
    check_round_trip(desc, fmt)


# -- 64-bit jax arrays: kept, or refused, never truncated ----------------------------------


_X64 = ["int64", "uint64", "float64", "complex128"]


@pytest.mark.parametrize("fmt", FORMATS)
@settings(_SETTINGS, max_examples=15)
@given(
    values=st.lists(
        st.builds(
            JaxLeaf,
            arrays([np.dtype(t) for t in _X64], swap=False, layouts=False),
            st.sampled_from(SPECS),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_64bit_jax_arrays_are_never_truncated(values: list[JaxLeaf], fmt: str | None) -> None:
    """Saved with ``jax_enable_x64``, restored with and without it.

    With it, they come back identical. Without it jax can hold them only as 32-bit
    arrays: the restore must then give them back whole or refuse in one line, never
    hand back values cut to 32 bits.
    """
    desc = {"x64": values}
    with tempfile.TemporaryDirectory() as tmp:
        with jax.enable_x64(True), AsyncCheckpointer(tmp) as ckptr:
            tree = build(desc)
            ckptr.save(1, tree, format=fmt)
            ckptr.wait_until_finished()
            plain = plain_problems(ckptr.restore(1), desc)
            assert not plain, "with x64, restore without a target:\n" + "\n".join(plain)
            into = target_problems(ckptr.restore(1, target=tree), desc, tree)
            assert not into, "with x64, restore into the saved tree:\n" + "\n".join(into)
        with AsyncCheckpointer(tmp) as ckptr:
            try:
                restored = ckptr.restore(1)
            except ValueError as e:
                assert "\n" not in str(e), f"the refusal is not one line: {e!r}"
                return
            plain = plain_problems(restored, desc)
            assert not plain, "without x64, restore without a target:\n" + "\n".join(plain)


# -- the property across process counts ---------------------------------------------------

_MP_SETTINGS = settings(
    max_examples=1,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each example costs seconds
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def _across(save_in: ProcessGroup, restore_in: ProcessGroup, root: str, descs: list[Any]) -> str:
    """Save ``descs`` in one group and restore them in the other; describe what went wrong."""
    report = []
    for fmt in FORMATS:
        where = f"{root}/{fmt or 'nbckpt'}"
        saved = save_in.run(f"{M}:save_all", where, descs, fmt, timeout_s=60)
        steps = [i + 1 for i, error in enumerate(saved[0]) if error is None]
        for i, errors in enumerate(zip(*saved, strict=True)):
            if any(errors):
                report.append(f"format={fmt} tree {i}: save failed: {errors}")
        restored = restore_in.run(f"{M}:restore_all", where, descs, steps, timeout_s=60)
        for per_process in restored:
            for step, problems in per_process.items():
                report += [f"format={fmt} tree {step - 1}: {p}" for p in problems]
    return "\n".join(report)


def _sharded_trees() -> list[Any]:
    """Two trees every run saves too: arrays split and replicated over the devices."""
    w = np.arange(48, dtype=np.float32).reshape(6, 8) - 20.5
    params = {
        "w": JaxLeaf(w, "split"),
        "b": JaxLeaf(np.linspace(-1, 1, 8).astype(ml_dtypes.bfloat16), "replicated"),
        "e": JaxLeaf(np.zeros((4, 0), np.int8), "split"),
        "h": np.arange(6, dtype=np.int64) * 2**40,
    }
    moments = {"w": JaxLeaf(w * 0.5, "split"), "b": JaxLeaf(np.ones(8, np.float16), "split")}
    adam = ScaleByAdamState(JaxLeaf(np.array(3, np.int32), "replicated"), moments, moments)
    return [
        {"params": params, "step": 7},
        {
            "params": params,
            "opt": (EmptyState(), (adam, EmptyState())),
            "rng": KeyLeaf(0),
            "keys": KeyLeaf(1, count=4),
            "hist": [1.5, None, JaxLeaf(np.array([2.5, 3.5], np.float32), "split")],
        },
    ]


@pytest.mark.multihost
@_MP_SETTINGS
@given(descs=st.lists(trees(refusable=False, max_leaves=6), min_size=5, max_size=5))
def test_trees_saved_by_two_processes_restore_in_one_and_back(
    group1: ProcessGroup, group2: ProcessGroup, descs: list[Any]
) -> None:
    assert [r["devices"] for r in group2.run(f"{M}:sizes")] == [2, 2]
    assert group1.run(f"{M}:sizes")[0]["devices"] == 2
    # Hypothesis tries the simplest example first (five times array(False)): skip it.
    assume(len({repr(d) for d in descs}) == len(descs))
    descs = [*descs, *_sharded_trees()]
    with tempfile.TemporaryDirectory() as tmp:
        there = _across(group2, group1, f"{tmp}/from2", descs)
        back = _across(group1, group2, f"{tmp}/from1", descs)
    assert not there and not back, (
        "saved in 2 processes, restored in 1:\n"
        + (there or "ok")
        + "\nsaved in 1 process (2 devices), restored in 2:\n"
        + (back or "ok")
        + "\ntrees:\n"
        + "\n".join(f"{i}: {d!r}" for i, d in enumerate(descs))
    )
