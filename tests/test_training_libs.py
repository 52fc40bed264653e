"""Training states of the real libraries round-trip, into concrete and abstract targets.

flax nnx, optax, flax.struct, ``jax.tree_util.register_dataclass`` and Equinox each
build their state their own way; each is saved, then restored into the live state and
into the abstract one ``jax.eval_shape`` gives (weakly typed where a Python number was).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx, struct

from nbckpt.engine import AsyncCheckpointer
from nbckpt.engine.restore.step import restore_step
from tests.test_training_state import _same

_ONE = jax.sharding.SingleDeviceSharding(jax.devices()[0])


def _abstract(make: Any) -> Any:
    """``jax.eval_shape(make)`` placed on one device: the target a resumed job builds."""

    def place(x: Any) -> Any:
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=_ONE, weak_type=x.weak_type)
        return x

    return jax.tree.map(place, jax.eval_shape(make))


def _round_trip(tmp_path: Path, state: Any, target: Any) -> Any:
    ck = AsyncCheckpointer(tmp_path)
    ck.save(1, state)
    ck.wait_until_finished()
    return ck.restore(1, target=target)


# -- weakly typed targets ----------------------------------------------------------------


def _init() -> dict[str, Any]:
    return {"step": 3, "lr": 0.5, "w": jnp.ones(3)}


def test_a_weak_target_takes_int64_and_float64_values_that_fit(tmp_path: Path) -> None:
    saved = {"step": np.array(3, np.int64), "lr": np.float64(0.5), "w": jnp.ones(3)}
    target = _abstract(_init)
    assert target["step"].weak_type and target["step"].dtype == jnp.int32
    restored = _round_trip(tmp_path, saved, target)
    want = jax.tree.map(jnp.asarray, _init())  # weak int32 3, weak float32 0.5
    assert _same(restored, want)
    assert restored["step"].weak_type and restored["lr"].weak_type
    assert not restored["w"].weak_type
    # A live weak array is a weak target too.
    again = AsyncCheckpointer(tmp_path).restore(1, target=want)
    assert _same(again, want) and again["step"].weak_type


@pytest.mark.parametrize(
    ("leaf", "value", "dtype"),
    [("step", np.int64(2**40), "int64"), ("lr", np.float64(0.1), "float64")],
)
def test_a_weak_target_refuses_values_that_do_not_fit(
    tmp_path: Path, leaf: str, value: Any, dtype: str
) -> None:
    saved = {"step": np.int64(3), "lr": np.float64(0.5), "w": jnp.ones(3)}
    saved[leaf] = value
    ck = AsyncCheckpointer(tmp_path)
    ck.save(1, saved)
    ck.wait_until_finished()
    with pytest.raises(ValueError) as e:
        ck.restore(1, target=_abstract(_init))
    want = "int32" if leaf == "step" else "float32"
    assert str(e.value) == (
        f"target leaf ['{leaf}'] is weakly typed {want}, but the saved {dtype} values do "
        "not fit it exactly; pass cast=True to convert anyway"
    )
    # cast=True converts anyway, as it does for any target.
    forced = ck.restore(1, target=_abstract(_init), cast=True)
    assert forced[leaf].dtype == want


def test_a_target_that_is_not_weak_is_still_refused_without_cast(tmp_path: Path) -> None:
    ck = AsyncCheckpointer(tmp_path)
    ck.save(1, {"step": np.int64(3)})
    ck.wait_until_finished()
    strong = {"step": jax.ShapeDtypeStruct((), jnp.int32, sharding=_ONE)}
    with pytest.raises(ValueError, match=r"saved as int64; pass cast=True"):
        ck.restore(1, target=strong)
    # A weak target of another family (a float for an integer) is refused the same way.
    weak_float = {"step": jax.ShapeDtypeStruct((), jnp.float32, sharding=_ONE, weak_type=True)}
    with pytest.raises(ValueError, match=r"saved as int64; pass cast=True"):
        ck.restore(1, target=weak_float)
    assert ck.restore(1, target=strong, cast=True)["step"] == 3


def test_an_orbax_step_restores_into_a_weak_target_alike(tmp_path: Path) -> None:
    ck = ocp.StandardCheckpointer()
    ck.save(tmp_path / "1", {"step": np.int64(3), "big": np.int64(2**40)})
    ck.wait_until_finished()
    weak = jax.ShapeDtypeStruct((), jnp.int32, sharding=_ONE, weak_type=True)
    restored = restore_step(tmp_path / "1", {"step": weak}, partial=True)
    assert _same(restored, {"step": jnp.asarray(3)}) and restored["step"].weak_type
    with pytest.raises(ValueError, match=r"leaf \['big'\] is weakly typed int32, but the saved"):
        restore_step(tmp_path / "1", {"big": weak})


_SHARDED = """
import jax, jax.numpy as jnp, numpy as np
from nbckpt.engine import AsyncCheckpointer
ck = AsyncCheckpointer({root!r})
ck.save(1, {{"step": np.int64(3), "v": np.arange(8, dtype=np.int64)}})
ck.wait_until_finished()
# make_mesh's axes are Explicit; a Mesh built by hand has Auto ones.
for mesh in (jax.make_mesh((4,), ("x",)), jax.sharding.Mesh(np.array(jax.devices()), ("x",))):
    def at(*spec):
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
    target = {{
        "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=at(), weak_type=True),
        "v": jax.ShapeDtypeStruct((8,), jnp.int32, sharding=at("x"), weak_type=True),
    }}
    out = ck.restore(1, target=target)
    for k, t in target.items():
        assert out[k].weak_type and out[k].dtype == jnp.int32, out[k]
        assert out[k].sharding == t.sharding, (out[k].sharding, t.sharding)
    assert int(out["step"]) == 3 and np.array_equal(out["v"], np.arange(8))
print("ok")
"""


def test_weak_leaves_keep_their_sharding_over_four_devices(tmp_path: Path) -> None:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    env["JAX_PLATFORMS"] = "cpu"
    run = subprocess.run(
        [sys.executable, "-c", _SHARDED.format(root=str(tmp_path))],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


# -- the libraries -----------------------------------------------------------------------


class _Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.lin = nnx.Linear(3, 4, rngs=rngs)
        self.bn = nnx.BatchNorm(4, rngs=rngs)
        self.rngs = rngs


def test_nnx_split_state_restores_into_itself_and_into_eval_shape(tmp_path: Path) -> None:
    model = _Net(nnx.Rngs(0, dropout=1))
    model.rngs.dropout()  # a stream's count is state too
    graphdef, state = nnx.split(model)
    restored = _round_trip(tmp_path, state, state)
    assert _same(restored, state)
    abstract = _abstract(lambda: nnx.split(_Net(nnx.Rngs(9, dropout=9)))[1])
    restored = AsyncCheckpointer(tmp_path).restore(1, target=abstract)
    assert _same(restored, state)
    x = jnp.arange(6.0).reshape(2, 3)
    back = nnx.merge(graphdef, restored)
    assert np.array_equal(back.bn(back.lin(x)), model.bn(model.lin(x)))


def test_nnx_optimizer_state_restores_into_eval_shape(tmp_path: Path) -> None:
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    opt.update(model, nnx.grad(lambda m: jnp.sum(m(jnp.ones((1, 3))) ** 2))(model))
    state = nnx.state(opt)

    def fresh() -> Any:
        m = nnx.Linear(3, 2, rngs=nnx.Rngs(1))
        return nnx.state(nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param))

    restored = _round_trip(tmp_path, state, _abstract(fresh))
    assert _same(restored, state)


def _optax_state() -> tuple[optax.GradientTransformation, Any, Any]:
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.zeros(3)}
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),  # EmptyState
        optax.masked(optax.adam(1e-2), {"w": True, "b": False}),  # MaskedState
        optax.add_decayed_weights(1e-4),
        optax.scale_by_schedule(optax.linear_schedule(1.0, 0.1, 10)),  # a count
    )
    return tx, params, tx.init(params)


def test_an_optax_masked_chain_restores_and_trains_on_alike(tmp_path: Path) -> None:
    tx, params, opt_state = _optax_state()
    grads = jax.tree.map(jnp.ones_like, params)
    _, opt_state = tx.update(grads, opt_state, params)
    assert any(isinstance(s, optax.MaskedState) for s in opt_state)
    restored = _round_trip(tmp_path, opt_state, opt_state)
    assert _same(restored, opt_state)
    abstract = _abstract(lambda: _optax_state()[2])
    restored = AsyncCheckpointer(tmp_path).restore(1, target=abstract)
    assert _same(restored, opt_state)
    assert _same(tx.update(grads, restored, params), tx.update(grads, opt_state, params))


@struct.dataclass
class _TrainState:
    step: jax.Array
    params: dict[str, jax.Array]
    name: str = struct.field(pytree_node=False, default="run")


def test_a_flax_struct_dataclass_restores(tmp_path: Path) -> None:
    state = _TrainState(step=jnp.asarray(5), params={"w": jnp.ones((2, 2))})
    abstract = _abstract(lambda: _TrainState(0, {"w": jnp.ones((2, 2))}))  # a weak step
    restored = _round_trip(tmp_path, state, abstract)
    assert isinstance(restored, _TrainState) and restored.name == "run"
    assert _same(restored, state)


@dataclasses.dataclass
class _Node:
    a: jax.Array
    b: Any
    tag: str


jax.tree_util.register_dataclass(_Node, data_fields=["a", "b"], meta_fields=["tag"])


def test_a_registered_dataclass_restores(tmp_path: Path) -> None:
    state = _Node(a=jnp.arange(3), b={"c": jnp.float32(2.0), "d": None}, tag="x")
    restored = _round_trip(tmp_path, state, state)
    assert _same(restored, state) and restored.tag == "x"
    fresh = {"c": jnp.float32(0), "d": None}
    abstract = _abstract(lambda: _Node(jnp.zeros(3, jnp.int32), fresh, "x"))
    assert _same(AsyncCheckpointer(tmp_path).restore(1, target=abstract), state)


def _mlp(seed: int) -> eqx.nn.MLP:
    return eqx.nn.MLP(3, 2, 4, 2, key=jax.random.key(seed))


def test_equinox_module_arrays_restore_into_an_abstract_model(tmp_path: Path) -> None:
    model = _mlp(0)
    arrays, static = eqx.partition(model, eqx.is_array)
    abstract = _abstract(lambda: eqx.filter(_mlp(1), eqx.is_array))
    restored = _round_trip(tmp_path, arrays, abstract)
    assert _same(restored, arrays)
    back = eqx.combine(restored, static)
    x = jnp.arange(3.0)
    assert np.array_equal(back(x), model(x))


def test_none_leaves_and_empty_nodes_keep_their_places(tmp_path: Path) -> None:
    state = {"a": None, "b": [None, jnp.ones(2)], "c": (), "d": {}, "e": (None, jnp.int32(1))}
    restored = _round_trip(tmp_path, state, state)
    assert _same(restored, state)
    bare = AsyncCheckpointer(tmp_path).restore(1)
    assert bare["a"] is None and bare["b"][0] is None and bare["e"][0] is None
    assert np.array_equal(bare["b"][1], np.ones(2))
