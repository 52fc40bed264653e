"""A restored leaf is assembled from its host parts in one call, and packs keep them aligned."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from nbckpt.engine import AsyncCheckpointer
from nbckpt.engine.restore import assemble
from nbckpt.formats.layout import CHECKSUMS_DIR
from nbckpt.formats.packs import PACK_ALIGN, PACK_KEY

T = "tests.test_assemble"

#: (shape, spec over a ("a", "b") mesh of two devices, dtype).
_CASES: list[tuple[tuple[int, ...], tuple[Any, ...], str]] = [
    ((6, 4), (), "float32"),
    ((6, 4), ("a",), "float32"),
    ((4, 6), (None, "b"), "bfloat16"),
    ((8,), ("a",), "bool"),
    ((3, 2, 2), (None, None, "a"), "int8"),
    ((), (), "uint32"),
    ((0, 4), (None, "b"), "float32"),
]


def assembled_both_ways(mesh_shape: tuple[int, int]) -> list[str]:
    """In a process of two devices: each case assembled by the batched call and the public
    way, from parts given in reversed device order; returns what differed."""
    devices = np.array(jax.local_devices()).reshape(mesh_shape)
    mesh = Mesh(devices, ("a", "b"))
    problems = []
    rng = np.random.default_rng(0)
    for shape, spec, name in _CASES:
        dtype = np.dtype(jax.numpy.bfloat16 if name == "bfloat16" else name)
        value = rng.integers(0, 100, shape).astype(dtype)
        sharding = NamedSharding(mesh, P(*spec))
        where = sharding.addressable_devices_indices_map(shape)
        devs = list(where)[::-1]
        # Each part its own array, as a restore's buffers are.
        parts = [np.array(value[where[d]]) for d in devs]
        for weak in (False, True):
            got = []
            for batched in (True, False):
                saved = assemble._BATCHED
                if not batched:
                    assemble._BATCHED = None
                try:
                    got.append(assemble.assemble(shape, dtype, sharding, devs, parts, weak))
                finally:
                    assemble._BATCHED = saved
            fast, public = got
            if assemble._BATCHED is None:
                problems.append("no batched call in this jax")
            for label, out in (("batched", fast), ("public", public)):
                if not np.array_equal(np.asarray(out), value) or out.dtype != dtype:
                    problems.append(f"{label} {shape} {spec} {name}: wrong values")
                if out.sharding != sharding or not out.committed:
                    problems.append(f"{label} {shape} {spec} {name}: wrong sharding")
                for shard in out.addressable_shards:
                    if not np.array_equal(np.asarray(shard.data), value[shard.index]):
                        problems.append(f"{label} {shape} {spec}: shard on {shard.device}")
            if bool(fast.weak_type) != weak:
                problems.append(f"batched {shape} {spec} {name}: weak_type {fast.weak_type}")
            # A layout's maker, its checks made once, makes the same array.
            make = assemble.maker(shape, dtype, sharding, devs, weak)
            if make is None:
                problems.append(f"maker {shape} {spec} {name}: none")
            else:
                made = make(parts)
                if not np.array_equal(np.asarray(made), value) or made.dtype != dtype:
                    problems.append(f"maker {shape} {spec} {name}: wrong values")
                if made.sharding != sharding or bool(made.weak_type) != weak:
                    problems.append(f"maker {shape} {spec} {name}: wrong sharding or type")
                for shard in made.addressable_shards:
                    if not np.array_equal(np.asarray(shard.data), value[shard.index]):
                        problems.append(f"maker {shape} {spec}: shard on {shard.device}")
            # A part of the wrong shape is refused, not assembled into a wrong array.
            try:
                assemble.assemble(shape, dtype, sharding, devs, [p.reshape(-1, 1) for p in parts])
                problems.append(f"{shape} {spec} {name}: a wrong shape was taken")
            except ValueError:
                pass
            # A device part among the host ones takes the public way, and is the same.
            mixed = [jax.device_put(parts[0], devs[0]), *parts[1:]]
            out = assemble.assemble(shape, dtype, sharding, devs, mixed, weak)
            if not np.array_equal(np.asarray(out), value) or out.sharding != sharding:
                problems.append(f"mixed {shape} {spec} {name}: wrong")
    return problems


@pytest.mark.multihost
@pytest.mark.parametrize("mesh_shape", [(2, 1), (1, 2)])
def test_the_batched_call_and_the_public_way_assemble_the_same_array(group1, mesh_shape):
    assert group1.run(f"{T}:assembled_both_ways", mesh_shape) == [[]]


def test_a_batched_call_of_another_signature_gives_way_to_the_public_one(monkeypatch):
    def other(*args: object) -> None:
        raise TypeError("batched_device_put(): incompatible function arguments")

    monkeypatch.setattr(assemble, "_BATCHED", other)
    device = jax.local_devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    part = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = assemble.assemble((2, 3), part.dtype, sharding, [device], [part])
    assert np.array_equal(np.asarray(out), part) and out.sharding == sharding
    assert assemble._BATCHED is None  # not tried again


def test_a_dtype_jax_would_narrow_is_assembled_the_public_way():
    assert assemble._keeps(np.dtype(np.float32), False)
    assert not assemble._keeps(np.dtype(np.int64), False)  # jax_enable_x64 is off here
    device = jax.local_devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    assert assemble.maker((3,), np.dtype(np.int64), sharding, [device]) is None
    assert assemble.maker((3,), np.dtype(np.int32), sharding, [device]) is not None


def test_a_maker_given_other_devices_than_its_shardings_is_refused():
    device = jax.local_devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    assert assemble.maker((3,), np.dtype(np.float32), sharding, []) is None


def test_a_maker_whose_batched_call_fails_gives_way_to_the_public_one(monkeypatch):
    device = jax.local_devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    make = assemble.maker((2, 3), np.dtype(np.float32), sharding, [device])
    assert make is not None

    def other(*args: object) -> None:
        raise TypeError("batched_device_put(): incompatible function arguments")

    monkeypatch.setattr(assemble, "_BATCHED", other)
    part = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = make([part])
    assert np.array_equal(np.asarray(out), part) and out.sharding == sharding
    assert assemble._BATCHED is None  # not tried again


def _leaves() -> dict[str, Any]:
    rng = np.random.default_rng(3)
    # Sizes that are not multiples of 64 bytes: chunks end to end would be misaligned.
    return {
        f"v{i}": jax.numpy.asarray(rng.standard_normal(n).astype(np.float32))
        for i, n in enumerate([3, 17, 250, 1001, 7])
    } | {"b": jax.numpy.asarray(rng.integers(0, 2, 13).astype(bool))}


def test_packed_chunks_start_aligned_and_restored_leaves_are_views_of_one_read(tmp_path: Path):
    state = _leaves()
    ck = AsyncCheckpointer(tmp_path)
    ck.save(1, state)
    ck.wait_until_finished()
    sums = json.loads((tmp_path / "1" / CHECKSUMS_DIR / "process_0.json").read_text())
    spans = {leaf: keys["0"] for leaf, keys in sums[PACK_KEY]["chunks"].items()}
    assert len(spans) == len(state)
    assert all(offset % PACK_ALIGN == 0 for offset, _ in spans.values())
    assert len({offset for offset, _ in spans.values()}) == len(state)

    out = ck.restore(1, target=jax.tree.map(lambda x: x, state))
    for name, value in state.items():
        assert np.array_equal(np.asarray(out[name]), np.asarray(value))
    # The leaves were read with one stretch of the pack, and a CPU device took each
    # leaf's view of it as it is: their buffers lie as their chunks lie in the pack.
    base = {name: out[name].unsafe_buffer_pointer() for name in state}
    names = sorted(state)
    for a, b in itertools.pairwise(names):
        assert base[b] - base[a] == spans[b][0] - spans[a][0], (a, b)
