"""A jax leaf's save plan is worked out once per layout; its data is taken at every save.

The plans are kept between saves (:mod:`nbckpt.engine.save.leafplan`): what could go
wrong is a plan kept for a leaf whose layout changed (its metadata would then describe
the old array), or data kept with the plan (a save would then write the old values).
Flattening the tree remembers which types are jax arrays in the same spirit; a leaf
it then classifies by its type must still be refused or unwrapped as before.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nbckpt.engine import AsyncCheckpointer
from nbckpt.engine.arrays.tree import flatten
from nbckpt.engine.save import leafplan, snapshot
from nbckpt.errors import CheckpointError


def _snap(tree: dict[str, object]) -> snapshot.Snapshot:
    return snapshot.take_snapshot(flatten(tree), process=0, process_count=1, primary=0)


def _written(snap: snapshot.Snapshot) -> np.ndarray:
    (write,) = snap.writes
    return np.asarray(write.data)


def test_a_leaf_saved_alike_reuses_its_plan_and_writes_its_new_values() -> None:
    first = _snap({"w": jnp.zeros((8, 4), jnp.float32)})
    second = _snap({"w": jnp.ones((8, 4), jnp.float32)})
    assert second.leaves[0] is first.leaves[0]  # planned once
    np.testing.assert_array_equal(_written(second), np.ones((8, 4), np.float32))
    np.testing.assert_array_equal(_written(first), np.zeros((8, 4), np.float32))


def test_a_leaf_whose_layout_changed_is_planned_anew() -> None:
    before = _snap({"w": jnp.zeros((8, 4), jnp.float32)}).leaves[0]
    changed = {
        "dtype": {"w": jnp.zeros((8, 4), jnp.bfloat16)},
        "shape": {"w": jnp.zeros((4, 8), jnp.float32)},
        "path": {"v": {"w": jnp.zeros((8, 4), jnp.float32)}},
        "position": {"a": jnp.zeros(2), "w": jnp.zeros((8, 4), jnp.float32)},
    }
    for what, tree in changed.items():
        after = _snap(tree).leaves[-1]
        assert after is not before, what
    assert _snap(changed["dtype"]).leaves[0]["dtype"] == "bfloat16"
    assert _snap(changed["shape"]).leaves[0]["shape"] == [4, 8]
    assert _snap(changed["path"]).leaves[0]["path"] == [["key", "v"], ["key", "w"]]
    # Another packing option is another plan: the leaf is no longer packed.
    flat = flatten({"w": jnp.zeros((8, 4), jnp.float32)})
    unpacked = snapshot.take_snapshot(flat, process=0, process_count=1, primary=0, pack_bytes=0)
    assert "packed" not in unpacked.leaves[0]
    assert before.get("packed") is True


def test_a_kept_plan_is_what_planning_anew_gives() -> None:
    tree = {"w": jnp.arange(32.0).reshape(8, 4), "b": jnp.ones(3, jnp.int32)}
    kept = _snap(tree)
    leafplan._PLANS.clear()
    fresh = _snap(tree)
    assert fresh.leaves == kept.leaves
    assert [(w.leaf, w.index, w.nbytes) for w in fresh.writes] == [
        (w.leaf, w.index, w.nbytes) for w in kept.writes
    ]


def test_steady_saves_restore_what_each_saved(tmp_path: Path) -> None:
    ckptr = AsyncCheckpointer(tmp_path)
    for step in range(3):
        tree = {"w": jnp.full((8, 4), step, jnp.float32), "b": jnp.full(3, -step)}
        ckptr.save(step, tree)
        ckptr.wait_until_finished()
    for step in range(3):
        got = ckptr.restore(step)
        np.testing.assert_array_equal(np.asarray(got["w"]), np.full((8, 4), step, np.float32))
        np.testing.assert_array_equal(np.asarray(got["b"]), np.full(3, -step))
    # A deleted array is still refused, plan or no plan.
    gone = jnp.ones((8, 4), jnp.float32)
    gone.delete()
    with pytest.raises(CheckpointError, match="deleted before the save"):
        ckptr.save(9, {"w": gone, "b": jnp.zeros(3, jnp.int32)})


def test_kinds_remembered_by_type_still_refuse_and_unwrap_keys() -> None:
    # flatten remembers which types are jax arrays; a later leaf of that type is still
    # refused for a dtype no array can hold, and a PRNG key is still stored as its data.
    plain = flatten({"w": jnp.zeros(3)})
    assert plain[0].kind == "jax" and plain[0].key_impl is None
    with pytest.raises(TypeError, match=r"leaf \['x'\] has dtype uint4"):
        flatten({"w": jnp.zeros(3), "x": jnp.zeros(3, jnp.uint4)})
    (key,) = flatten({"k": jax.random.key(0)})
    assert key.kind == "jax" and key.key_impl is not None
    assert key.value.dtype == np.uint32
    empties = flatten({"a": None, "b": {}, "c": [], "w": jnp.zeros(2)})
    assert [(leaf.kind, leaf.value) for leaf in empties[:3]] == [
        ("empty", "none"),
        ("empty", "dict"),
        ("empty", "list"),
    ]


def split_copied_task(root: str) -> str:
    """Save a replicated 4 MiB leaf split between 2 devices' replicas, copied out."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("x",))
    value = np.arange(1024 * 1024, dtype=np.float32).reshape(1024, 1024)
    whole = jax.device_put(value, NamedSharding(mesh, P()))
    snap = snapshot.take_snapshot(
        flatten({"w": whole}), process=0, process_count=1, primary=0, pack_bytes=0
    )
    parts = sorted((w.part, w.parts, len(w.regions or ())) for w in snap.writes)
    held = snapshot.views_hold_buffers
    # Where XLA would donate a held buffer, each replica copies out its own chunks.
    snapshot.views_hold_buffers = lambda device: False
    try:
        ck = AsyncCheckpointer(root, pack_bytes=0)
        for step in (1, 2):  # the second with the plan kept from the first
            ck.save(step, {"w": whole})
            ck.wait_until_finished()
    finally:
        snapshot.views_hold_buffers = held
    for step in (1, 2):
        assert np.array_equal(np.asarray(ck.restore(step)["w"]), value), step
    return str(parts)


@pytest.mark.multihost
def test_a_split_replicated_leaf_copied_out_restores_whole(group1, tmp_path: Path) -> None:
    # Two replicas, each writing one of the shard's two 2 MiB chunks.
    [parts] = group1.run("tests.test_leafplan:split_copied_task", str(tmp_path))
    assert parts == "[(0, 2, 1), (1, 2, 1)]"


def test_kept_metadata_texts_render_the_leaves_as_json_does() -> None:
    from nbckpt.engine.save.metadata import leaves_json

    tree = {
        "w": jnp.zeros((8, 4), jnp.float32),
        "n": np.arange(5, dtype=np.int16),
        "step": 7,
        "key": jax.random.key(0),
        "é": jnp.ones((3,), jnp.bfloat16),
    }
    for _ in range(2):  # planned, then kept
        snap = _snap(tree)
        assert json.dumps(snap.leaves) == leaves_json(snap)
    assert [p is None for p in snap.plans] == [m["kind"] != "jax" for m in snap.leaves]
    snap.plans.clear()  # a snapshot without plans is rendered whole
    assert json.dumps(snap.leaves) == leaves_json(snap)
