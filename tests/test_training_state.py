"""Real training states (optax, flax nnx) round-trip exactly, donated or not."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from nbckpt.engine import AsyncCheckpointer, hooks


def _same(a: Any, b: Any) -> bool:
    """Equal structure, dtypes and values (typed keys compared by their data)."""

    def data(x: Any) -> Any:
        if not hasattr(x, "dtype"):
            return (type(x), x)  # a Python number
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            return ("key", np.asarray(jax.random.key_data(x)))
        return (x.dtype, np.asarray(x))

    def equal(x: Any, y: Any) -> bool:
        (kx, vx), (ky, vy) = data(x), data(y)
        return bool(kx == ky and np.array_equal(vx, vy))

    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b) and all(
        equal(x, y) for x, y in zip(la, lb, strict=True)
    )


def test_an_optax_chain_saved_then_donated_restores_as_it_was(tmp_path: Path) -> None:
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
    params = {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.zeros(4)}
    state = {"params": params, "opt": opt.init(params), "step": 0}

    @jax.jit
    def loss(p: Any) -> jax.Array:
        return jnp.sum((p["w"] @ jnp.ones(4) + p["b"].sum()) ** 2)

    def train(p: Any, o: Any) -> tuple[Any, Any]:
        updates, o = opt.update(jax.grad(loss)(p), o, p)
        return optax.apply_updates(p, updates), o

    step = jax.jit(train, donate_argnums=(0, 1))
    params, opt_state = step(state["params"], state["opt"])
    state = {"params": params, "opt": opt_state, "step": 1}
    expected = jax.tree.map(lambda x: np.array(x) if hasattr(x, "dtype") else x, state)
    ck = AsyncCheckpointer(tmp_path)
    # The write waits until the next training step, which donates its arguments, ran.
    donated = threading.Event()
    hooks.set_hook("prepare", lambda _p: donated.wait(30))
    try:
        ck.save(1, state)
        params, opt_state = step(state["params"], state["opt"])  # asks to donate them
        # On CPU the save holds the saved buffers, so the step got new ones for its
        # results (the copying path is tested in test_identity and test_hostmem).
        assert not state["params"]["w"].is_deleted()
        donated.set()
        ck.wait_until_finished()
    finally:
        donated.set()
        hooks.clear_hooks()
    restored = ck.restore(1, target=expected)
    assert _same(restored, expected)
    # Without a target, the chain keeps its positions: (EmptyState, (Adam, EmptyState)).
    bare = ck.restore(1)
    assert bare["opt"][0] == {} and bare["opt"][1][1] == {}
    assert np.array_equal(bare["opt"][1][0]["mu"]["w"], expected["opt"][1][0].mu["w"])
    # Training resumes from the restored state exactly as from the saved one.
    again, _ = jax.jit(train)(restored["params"], restored["opt"])
    want, _ = jax.jit(train)(expected["params"], expected["opt"])
    assert _same(again, want)


def test_nnx_model_and_rngs_restore_and_draw_the_same_numbers(tmp_path: Path) -> None:
    rngs = nnx.Rngs(0, dropout=1)
    model = nnx.Linear(3, 2, rngs=rngs)
    rngs.dropout()  # advance a stream: its count is state too
    state = {"model": nnx.state(model), "rngs": nnx.state(rngs)}
    ck = AsyncCheckpointer(tmp_path)
    ck.save(7, state)
    ck.wait_until_finished()
    restored = ck.restore(7, target=state)
    assert _same(restored, state)
    fresh = nnx.Rngs(5, dropout=6)
    nnx.update(fresh, restored["rngs"])
    assert np.array_equal(jax.random.key_data(fresh.dropout()), jax.random.key_data(rngs.dropout()))
    assert np.array_equal(jax.random.key_data(fresh()), jax.random.key_data(rngs()))
