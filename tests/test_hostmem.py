"""The host buffers a save copies into are lent again only once that save ended well.

A CPU device's arrays are not copied at all: the save holds their buffers (tested
here too); NumPy arrays are, and so are CPU arrays where XLA would donate a held buffer.
"""

from __future__ import annotations

import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nbckpt.engine import AsyncCheckpointer, hooks
from nbckpt.engine.save.hostmem import MIN_BYTES, SLAB_BYTES, HostBuffers
from nbckpt.errors import CheckpointError

ROWS = 1024  # 1024 x 512 float32: 2 MiB a leaf, above MIN_BYTES


def _state(seed: int) -> dict[str, jax.Array]:
    keys = jax.random.split(jax.random.key(seed), 2)
    return {
        "w": jax.random.normal(keys[0], (ROWS, 512), jnp.float32),
        "v": jax.random.normal(keys[1], (ROWS, 512), jnp.float32),
        "b": jnp.ones(16, jnp.float32),  # small: cut from a slab
    }


def _np_state(seed: int) -> dict[str, np.ndarray]:
    """The same shapes as NumPy arrays, which the primary copies."""
    return {k: np.array(v) for k, v in _state(seed).items()}


def test_a_loan_gives_back_the_same_memory_and_a_failed_one_never() -> None:
    pool = HostBuffers()
    loan = pool.loan()
    a = loan.empty((ROWS, 512), np.float32)
    loan.empty((4,), np.float32)  # below MIN_BYTES: cut from a slab
    loan.taken()
    address = a.__array_interface__["data"][0]
    loan.end(ok=True)
    assert pool.nbytes == a.nbytes + SLAB_BYTES
    again = pool.loan()
    b = again.empty((ROWS, 512), np.float32)
    assert b.__array_interface__["data"][0] == address
    again.end(ok=False)  # a write it gave up on may still read b
    assert pool.nbytes == SLAB_BYTES  # only the slab it did not borrow is left
    pool.clear()
    third = pool.loan()
    assert third.empty((ROWS, 512), np.float32).__array_interface__["data"][0] != address
    third.end(ok=True)
    # A save of another shape frees the old sizes once its copies are made.
    fourth = pool.loan()
    fourth.empty((MIN_BYTES,), np.uint8)
    fourth.taken()
    assert pool.nbytes == 0
    fourth.end(ok=True)
    assert pool.nbytes == MIN_BYTES


def test_small_copies_are_cut_from_slabs_kept_for_the_next_save() -> None:
    """Aligned, apart, in as few slabs as fit them, and the same memory next time."""
    pool = HostBuffers()
    sizes = [1, 3, 4096, 500_000, 1000, 7] * 20  # 10.1 MB: 2.4 slabs of 4 MiB

    def cut() -> list[np.ndarray]:
        loan = pool.loan()
        out = [loan.copy_of(np.full(n, i % 251, np.uint8)) for i, n in enumerate(sizes)]
        loan.taken()
        loan.end(ok=True)
        return out

    first = cut()
    starts = [a.__array_interface__["data"][0] for a in first]
    assert all(s % 64 == 0 for s in starts)
    assert all(np.all(a == i % 251) for i, a in enumerate(first))  # none overlaps another
    assert pool.nbytes == 3 * SLAB_BYTES
    second = cut()
    assert [a.__array_interface__["data"][0] for a in second] == starts
    assert pool.nbytes == 3 * SLAB_BYTES


def test_saves_into_reused_buffers_each_restore_what_was_saved(tmp_path: Path) -> None:
    """Three saves of NumPy states changed in place at once: each reuses the last's buffers."""
    state = _np_state(0)
    expected = {}
    ck = AsyncCheckpointer(tmp_path)
    try:
        for step in range(3):
            expected[step] = {k: v.copy() for k, v in state.items()}
            ck.save(step, state)
            for v in state.values():  # what the save copied, the caller may change
                v *= 2
                v += 1
            ck.wait_until_finished()
            assert ck._buffers.nbytes == 2 * ROWS * 512 * 4 + SLAB_BYTES  # "b": a slab
        for step, want in expected.items():
            out = ck.restore(step)
            assert all(np.array_equal(np.asarray(out[k]), want[k]) for k in want), step
    finally:
        ck.close()
    assert ck._buffers.nbytes == 0


def test_cpu_arrays_are_held_in_place_through_donation_and_deletion(tmp_path: Path) -> None:
    """No copy: the save writes from the arrays' own buffers, which nothing can take."""
    from nbckpt.engine.save import snapshot

    assert snapshot.views_hold_buffers(jax.devices()[0])  # what this XLA does
    assert snapshot._probed == [True]  # asked once a process, whichever device
    state = _state(6)
    want = {k: np.array(v) for k, v in state.items()}
    step_fn = jax.jit(lambda s: jax.tree.map(lambda a: a * 0 - 1, s), donate_argnums=0)
    held: list[bool] = []
    go = threading.Event()

    def hold(_: object) -> None:
        job = ck._inflight.job
        assert job is not None
        views = {w.leaf: w.data for w in job.snap.writes}
        held.append(np.shares_memory(views["w"], np.asarray(state["w"])))
        go.wait(30)

    hooks.set_hook("prepare", hold)
    try:
        with AsyncCheckpointer(tmp_path) as ck:
            ck.save(1, state)
            new = step_fn(state)  # asks to donate: the step gets new buffers
            assert not state["w"].is_deleted()
            state["v"].delete()  # its buffer lives on in the save's view
            filler = [jnp.full((ROWS, 512), 7.0) for _ in range(8)]
            go.set()
            ck.wait_until_finished()
            assert ck._buffers.nbytes == 0  # nothing copied into nbckpt's own buffers
            out = ck.restore(1)
    finally:
        hooks.clear_hooks()
    assert held == [True]
    assert all(np.array_equal(np.asarray(out[k]), want[k]) for k in want)
    assert float(new["w"][0, 0]) == -1.0 and float(filler[0][0, 0]) == 7.0


def test_cpu_arrays_are_copied_where_xla_would_donate_a_held_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbckpt.engine.save import snapshot

    monkeypatch.setattr(snapshot, "views_hold_buffers", lambda device: False)
    ck = AsyncCheckpointer(tmp_path)
    try:
        ck.save(1, _state(7))
        ck.wait_until_finished()
        assert ck._buffers.nbytes == 2 * ROWS * 512 * 4 + SLAB_BYTES
    finally:
        ck.close()


def test_a_failed_save_keeps_no_buffer_and_the_next_save_is_whole(tmp_path: Path) -> None:
    ck = AsyncCheckpointer(tmp_path, timeout_s=30)
    try:
        ck.save(1, _np_state(1))
        ck.wait_until_finished()
        kept = ck._buffers.nbytes
        assert kept > 0

        def boom(_: object) -> None:
            raise OSError("injected: the disk went away")

        hooks.set_hook("write", boom)
        try:
            ck.save(2, _np_state(2))
            with pytest.raises(CheckpointError, match="disk went away"):
                ck.wait_until_finished()
        finally:
            hooks.clear_hooks()
        assert ck._buffers.nbytes == 0
        want = _np_state(3)
        ck.save(3, _np_state(3))
        ck.wait_until_finished()
        out = ck.restore(3)
        assert all(np.array_equal(np.asarray(out[k]), want[k]) for k in want)
    finally:
        ck.close()


def test_keep_host_buffers_false_holds_nothing_between_saves(tmp_path: Path) -> None:
    ck = AsyncCheckpointer(tmp_path, keep_host_buffers=False)
    try:
        ck.save(1, _np_state(4))
        ck.wait_until_finished()
        assert ck._buffers.nbytes == 0
        # The finished job the checkpointer keeps holds no copy either.
        job = ck._inflight.job
        assert job is not None and all(w.data is None for w in job.snap.writes)
    finally:
        ck.close()


def test_shards_copied_to_pinned_host_memory_survive_their_donation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU path, run on CPU devices, which have pinned host memory too."""
    from nbckpt.engine.save import snapshot

    monkeypatch.setattr(snapshot, "PINNED_PLATFORMS", frozenset({"cpu"}))
    snapshot.has_pinned_host.cache_clear()
    taken: list[str | None] = []
    start = snapshot._start_host_copy
    monkeypatch.setattr(
        snapshot,
        "_start_host_copy",
        lambda data, device, loan: (
            taken.append((out := start(data, device, loan)).sharding.memory_kind) or out
        ),
    )
    try:
        state = _state(5)
        want = {k: np.array(v) for k, v in state.items()}
        step_fn = jax.jit(lambda s: jax.tree.map(lambda a: a - 1, s), donate_argnums=0)
        with AsyncCheckpointer(tmp_path) as ck:
            ck.save(1, state)
            state = step_fn(state)
            ck.wait_until_finished()
            assert ck._buffers.nbytes == 0  # nothing copied into nbckpt's own buffers
            out = ck.restore(1)
        assert taken and set(taken) == {snapshot.PINNED}
        assert all(np.array_equal(np.asarray(out[k]), want[k]) for k in want)
    finally:
        snapshot.has_pinned_host.cache_clear()


def test_a_shard_already_in_host_memory_is_copied_not_aliased(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An accelerator's offloaded shard, played by a CPU array in pinned host memory."""
    from nbckpt.engine.arrays.tree import flatten
    from nbckpt.engine.save import snapshot

    monkeypatch.setattr(snapshot, "_offloaded", lambda data, device: True)
    device = jax.devices()[0]
    host = jax.device_put(
        jnp.arange(ROWS * 512, dtype=jnp.float32),
        jax.sharding.SingleDeviceSharding(device, memory_kind=snapshot.PINNED),
    )
    snap = snapshot.take_snapshot(flatten({"x": host}), process=0, process_count=1, primary=0)
    (w,) = snap.writes
    assert isinstance(w.data, np.ndarray)
    assert not np.shares_memory(w.data, np.asarray(host))
    assert np.array_equal(w.data, np.asarray(host))


def test_the_memory_held_between_saves_is_what_copies_wrote() -> None:
    """A slab's tail that no copy reached takes no memory: ``resident`` leaves it out."""
    pool = HostBuffers()

    def save(small: int) -> None:
        loan = pool.loan()
        loan.copy_of(np.ones(MIN_BYTES, np.uint8))  # a buffer of its own, all written
        loan.copy_of(np.ones(small, np.uint8))  # cut from a slab of SLAB_BYTES
        loan.taken()
        loan.end(ok=True)

    save(1000)
    assert pool.nbytes == MIN_BYTES + SLAB_BYTES
    assert pool.resident == MIN_BYTES + 1000
    save(3000)  # the same slab, further in
    assert pool.resident == MIN_BYTES + 3000
    save(10)  # what an earlier save wrote is still memory taken
    assert pool.resident == MIN_BYTES + 3000
    pool.clear()
    assert pool.resident == pool.nbytes == 0
