"""What a save commits is what a restore gives back: values, dtypes, positions, keys."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from nbckpt.engine import AsyncCheckpointer, hooks
from nbckpt.engine.arrays.tree import flatten
from nbckpt.engine.restore.step import restore_step
from nbckpt.errors import CheckpointError
from nbckpt.formats.fsck import fsck
from nbckpt.formats.layout import step_dir

T = "tests.mh_identity"
REPO = Path(__file__).resolve().parent.parent


def _save(root: Path, step: int, tree: Any, **kw: Any) -> AsyncCheckpointer:
    ck = AsyncCheckpointer(root)
    ck.save(step, tree, **kw)
    ck.wait_until_finished()
    return ck


def _verified(root: Path) -> list[tuple[str, str, str]]:
    return [(e.path, e.state, e.reason) for e in fsck(root, verify=True).entries]


# 1. Donated buffers -----------------------------------------------------------------


@pytest.mark.parametrize("held", [True, False], ids=["held", "copied"])
def test_arrays_donated_right_after_save_are_saved_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: bool
) -> None:
    """On CPU the save holds the arrays' buffers, or (where XLA would donate them) copies."""
    from nbckpt.engine.save import snapshot

    if not held:
        monkeypatch.setattr(snapshot, "views_hold_buffers", lambda device: False)
    w = jnp.arange(64 * 64, dtype=jnp.float32).reshape(64, 64)
    state = {"w": w, "b": jnp.ones(64, jnp.float32), "n": jnp.int32(7)}
    expected = {k: np.array(v) for k, v in state.items()}
    train = jax.jit(lambda s: jax.tree.map(lambda a: a * 3 + 1, s), donate_argnums=0)
    donated = threading.Event()
    # The background save waits until the donating step ran, as a slow disk would.
    hooks.set_hook("prepare", lambda _: donated.wait(30))
    try:
        ck = AsyncCheckpointer(tmp_path)
        ck.save(1, state)
        new = train(state)  # donates the saved arrays, or gets new buffers while held
        # Held, the donation gives the step new buffers; copied, it takes the old ones.
        assert state["w"].is_deleted() is not held
        new = train(new)
        donated.set()
        ck.wait_until_finished()
    finally:
        hooks.clear_hooks()
    out = ck.restore(1)
    assert all(np.array_equal(np.asarray(out[k]), expected[k]) for k in expected)
    assert np.array_equal(np.asarray(new["w"]), expected["w"] * 9 + 4)
    if held:
        # Once the save let go of them, the arrays are the caller's to donate again.
        train(state)
        assert state["w"].is_deleted()


@pytest.mark.multihost
def test_donation_after_save_in_two_processes(group2: Any, tmp_path: Path) -> None:
    assert group2.run(f"{T}:save_then_donate", str(tmp_path), 4) == [[1.0, 4.0], [1.0, 4.0]]


# 2. Byte order ----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [None, "orbax"])
def test_non_native_byte_order_restores_the_same_values(tmp_path: Path, fmt: str | None) -> None:
    tree = {
        "i": np.arange(6, dtype=">i4"),
        "f": np.linspace(0, 1, 5).astype(">f8"),
        "s": np.array(3, dtype=">u2"),
    }
    ck = _save(tmp_path, 1, tree, format=fmt)
    out = ck.restore(1)
    for k, v in tree.items():
        assert np.array_equal(out[k], v)
        # Restored in native byte order: same values, the native spelling of the dtype.
        assert out[k].dtype == v.dtype.newbyteorder("=")
    assert _verified(tmp_path)[0][1] == "complete"


def test_a_step_saved_from_big_endian_arrays_before_the_fix_still_restores(
    tmp_path: Path,
) -> None:
    """Such a step stored native values but recorded the checksums of swapped bytes."""
    import json

    from nbckpt.formats.checksum import ALGORITHM_KEY, checksum

    values = np.arange(6, dtype=np.int32)
    _save(tmp_path, 1, {"i": values})
    sums_file = next((tmp_path / "1" / "_CHECKSUMS").glob("*.json"))
    sums = json.loads(sums_file.read_text())
    sums["i"] = {"0": checksum(values.astype(">i4"), sums[ALGORITHM_KEY])}
    sums_file.write_text(json.dumps(sums))
    assert np.array_equal(AsyncCheckpointer(tmp_path).restore(1)["i"], values)


# 3. None and empty nodes keep their positions ----------------------------------------


class EmptyState(NamedTuple):
    pass


class ScaleByAdamState(NamedTuple):
    count: Any
    mu: Any
    nu: Any


def _optax_like() -> dict[str, Any]:
    adam = ScaleByAdamState(np.int32(2), np.ones(3), np.zeros(3))
    return {
        "l": [np.arange(3), None, np.arange(4.0)],
        "opt": (EmptyState(), (adam, EmptyState())),
        "tail": [np.arange(3), None],
        "d": {"none": None, "empty": {}},
    }


def test_none_leaves_do_not_move_other_leaves(tmp_path: Path) -> None:
    tree = _optax_like()
    out = _save(tmp_path, 1, tree).restore(1)
    assert out["l"][1] is None and np.array_equal(out["l"][2], tree["l"][2])
    assert np.array_equal(out["opt"][1][0]["mu"], tree["opt"][1][0].mu)
    assert out["opt"][1][0]["count"] == 2
    # With a target the structure is the target's.
    again = AsyncCheckpointer(tmp_path).restore(1, target=tree)
    assert jax.tree.structure(again) == jax.tree.structure(tree)
    assert again["l"][1] is None and isinstance(again["opt"][1][0], ScaleByAdamState)


def test_empty_nodes_come_back_where_they_were_without_a_target(tmp_path: Path) -> None:
    out = _save(tmp_path, 1, _optax_like()).restore(1)
    # Sequences come back as lists, NamedTuples and other nodes as dicts.
    assert out["opt"][0] == {} and out["opt"][1][1] == {}
    assert len(out["tail"]) == 2 and out["tail"][1] is None
    assert out["d"] == {"none": None, "empty": {}}
    assert _save(tmp_path, 2, [None, ()]).restore(2) == [None, []]
    # Orbax's own records say where the empty nodes are too.
    import orbax.checkpoint as ocp

    tree = {"l": [np.ones(2), None, np.zeros(2)], "e": {}, "n": None}
    _save(tmp_path, 3, tree, pack_bytes=0)  # a step Orbax can read
    by_orbax = ocp.StandardCheckpointer().restore(tmp_path / "3")
    assert by_orbax["l"][1] is None and np.array_equal(by_orbax["l"][2], np.zeros(2))
    assert by_orbax["e"] == {} and by_orbax["n"] is None


def test_an_old_step_without_empty_records_keeps_index_positions(tmp_path: Path) -> None:
    import json

    from nbckpt.formats.layout import METADATA_FILE

    _save(tmp_path, 1, {"l": [np.arange(2), None, np.arange(3)]})
    meta_file = tmp_path / "1" / METADATA_FILE
    meta = json.loads(meta_file.read_text())
    meta.pop("empty", None)
    meta_file.write_text(json.dumps(meta))
    out = AsyncCheckpointer(tmp_path).restore(1)
    assert out["l"][1] is None and np.array_equal(out["l"][2], np.arange(3))


# 4. 64-bit values in a process without x64 -------------------------------------------


def test_64_bit_values_are_refused_where_jax_would_truncate_them(tmp_path: Path) -> None:
    assert not jax.config.jax_enable_x64
    script = f"""
        import jax, jax.numpy as jnp, numpy as np
        from nbckpt.engine import AsyncCheckpointer
        assert jax.config.jax_enable_x64
        ck = AsyncCheckpointer({str(tmp_path)!r})
        ck.save(1, {{"big": jnp.arange(3, dtype=jnp.int64) + 2**40,
                     "f": jnp.full(2, 1 + 2**-40, jnp.float64),
                     "host": np.arange(3, dtype=np.int64) + 2**40}})
        ck.wait_until_finished()
    """
    env = {**os.environ, "JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", textwrap.dedent(script)], check=True, env=env)
    ck = AsyncCheckpointer(tmp_path)
    with pytest.raises(ValueError, match=r"leaf \['big'\] .*int64.*jax_enable_x64") as err:
        ck.restore(1)
    assert "\n" not in str(err.value)
    dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with pytest.raises(ValueError, match=r"leaf \['f'\] .*float64.*jax_enable_x64"):
        ck.restore(1, target={"big": ..., "f": dev, "host": ...})
    # Host values hold 64 bits: nothing is lost.
    out = ck.restore(1, target={"big": ..., "f": ..., "host": ...})
    assert out["big"].dtype == np.int64 and out["big"][0] == 2**40
    assert out["f"].dtype == np.float64 and out["f"][0] == 1 + 2**-40
    # Asking for 32 bits explicitly converts.
    sds = jax.ShapeDtypeStruct((3,), jnp.int32, sharding=dev)
    small = ck.restore(1, target={"big": sds, "f": ..., "host": ...}, cast=True)
    assert small["big"].dtype == jnp.int32


# 5. Typed PRNG keys -------------------------------------------------------------------


def test_typed_prng_keys_round_trip(tmp_path: Path) -> None:
    tree = {
        "k": jax.random.key(0),
        "ks": jax.random.split(jax.random.key(1), 4),
        "rbg": jax.random.key(2, impl="rbg"),
        "raw": jax.random.PRNGKey(3),
    }
    ck = _save(tmp_path, 1, tree)
    for out in (ck.restore(1), ck.restore(1, target=tree)):
        for k in ("k", "ks", "rbg"):
            assert jnp.issubdtype(out[k].dtype, jax.dtypes.prng_key)
            assert jax.random.key_impl(out[k]) == jax.random.key_impl(tree[k])
            assert out[k].shape == tree[k].shape
            assert np.array_equal(jax.random.key_data(out[k]), jax.random.key_data(tree[k]))
        assert out["raw"].dtype == jnp.uint32
        assert np.array_equal(out["raw"], tree["raw"])
    restored = ck.restore(1)["k"]
    assert np.array_equal(jax.random.normal(restored, (3,)), jax.random.normal(tree["k"], (3,)))


# 6. ml_dtypes NumPy arrays ------------------------------------------------------------

_ML_DTYPES = ["bfloat16", "float8_e4m3fn", "float8_e5m2", "int4", "uint4"]


@pytest.mark.parametrize("name", _ML_DTYPES)
def test_ml_dtypes_numpy_arrays_save_where_their_jax_form_does(tmp_path: Path, name: str) -> None:
    dtype = np.dtype(getattr(ml_dtypes, name))
    host = np.arange(6).astype(dtype)
    try:
        flatten({"x": jnp.asarray(host)})
    except TypeError:
        # What tensorstore cannot hold (uint4) is refused alike in both forms, in one
        # line that names the leaf, before anything is written.
        with pytest.raises(TypeError, match=r"leaf \['x'\]") as err:
            _save(tmp_path, 1, {"x": host})
        assert "\n" not in str(err.value) and not any(tmp_path.iterdir())
        return
    out = _save(tmp_path, 1, {"x": host}).restore(1)
    assert out["x"].dtype == dtype and np.array_equal(out["x"], host)


# 7. Tree paths, not on-disk names, in messages ----------------------------------------


def test_messages_about_a_single_array_tree_say_root_not_its_file_name(tmp_path: Path) -> None:
    gone = jnp.ones(3)
    gone.delete()
    with pytest.raises(CheckpointError) as err:
        AsyncCheckpointer(tmp_path).save(1, gone)
    assert "<root>" in str(err.value) and "_root" not in str(err.value)
    ck = _save(tmp_path, 2, jnp.ones(3))
    dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    for target in (
        jax.ShapeDtypeStruct((4,), jnp.float32, sharding=dev),
        jax.ShapeDtypeStruct((3,), jnp.int32, sharding=dev),
    ):
        with pytest.raises(ValueError) as bad:
            ck.restore(2, target=target)
        assert "<root>" in str(bad.value) and "_root" not in str(bad.value)


# 8. Targets that would lose saved leaves, or convert them silently ---------------------


def test_a_target_lacking_saved_leaves_is_refused_unless_partial(tmp_path: Path) -> None:
    tree = {"params": {"w": np.ones(3), "b": np.zeros(2)}, "step": 3}
    _save(tmp_path, 1, tree)
    where = step_dir(tmp_path, 1)
    with pytest.raises(ValueError, match=r"\['params'\]\['b'\].*\['step'\].*partial=True") as err:
        restore_step(where, {"params": {"w": ...}})
    assert "\n" not in str(err.value)
    out = restore_step(where, {"params": {"w": ...}}, partial=True)
    assert set(out) == {"params"} and set(out["params"]) == {"w"}
    full = restore_step(where, {"params": {"w": ..., "b": ...}, "step": ...})
    assert full["step"] == 3


def test_a_target_of_another_dtype_is_refused_naming_the_leaf(tmp_path: Path) -> None:
    _save(tmp_path, 1, {"w": np.arange(3.0), "n": np.arange(2, dtype=np.int32)})
    where = step_dir(tmp_path, 1)
    with pytest.raises(ValueError, match=r"\['w'\] asks for dtype float32.*cast=True"):
        restore_step(where, {"w": np.zeros(3, np.float32), "n": ...})
    out = restore_step(where, {"w": np.zeros(3, np.float32), "n": ...}, cast=True)
    assert out["w"].dtype == np.float32 and np.array_equal(out["w"], np.arange(3.0))


@pytest.mark.multihost
def test_sharded_targets_are_laid_out_as_asked_and_indivisible_ones_named(
    group1: Any, tmp_path: Path
) -> None:
    [got] = group1.run(f"{T}:resharded_restore", str(tmp_path))
    assert got["is_array"] and got["same_sharding"] and got["values"]
    # 9. The leaf, its shape and the mesh it cannot be split over.
    text = got["indivisible"]
    assert text is not None and "\n" not in text
    assert "['odd']" in text and "(5,)" in text and "2" in text, text


# 10. A forced re-save in Orbax's format, restored in the same process ------------------


def test_a_forced_orbax_resave_restores_the_new_values_in_the_same_process(
    tmp_path: Path,
) -> None:
    ck = AsyncCheckpointer(tmp_path, format="orbax")
    ck.save(3, {"w": np.arange(6.0), "n": np.arange(2)})
    ck.wait_until_finished()
    assert np.array_equal(ck.restore(3)["w"], np.arange(6.0))
    ck.save(3, {"w": np.arange(6.0) + 10, "n": np.arange(2) + 1}, force=True)
    ck.wait_until_finished()
    out = ck.restore(3)
    assert np.array_equal(out["w"], np.arange(6.0) + 10)
    assert np.array_equal(out["n"], np.arange(2) + 1)


# 11. Zero-size leaves -----------------------------------------------------------------


@pytest.mark.parametrize("fmt", [None, "orbax"])
def test_a_step_of_zero_size_leaves_is_healthy(tmp_path: Path, fmt: str | None) -> None:
    tree = {"e": np.zeros((0,)), "m": np.zeros((3, 0), np.int32), "j": jnp.zeros((0, 4))}
    out = _save(tmp_path, 1, tree, format=fmt).restore(1)
    assert {k: v.shape for k, v in out.items()} == {"e": (0,), "m": (3, 0), "j": (0, 4)}
    assert [e[:2] for e in _verified(tmp_path)] == [("1", "complete")]
