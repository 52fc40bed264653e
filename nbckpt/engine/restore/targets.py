"""What a restore target asks for, and the checks every layout's restore applies to it.

Both readers, nbckpt's own steps (:mod:`nbckpt.engine.restore.step`) and Orbax's
(:mod:`nbckpt.engine.restore.orbax_step`), take a target leaf apart the same way and
refuse the same mismatches with the same words.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

__all__ = [
    "check_dtype",
    "check_shape",
    "check_sharding",
    "check_x64",
    "convert",
    "default_sharding",
    "is_weak",
    "target_parts",
    "weaken",
]


def _is_key(dtype: Any) -> bool:
    try:
        return _is_key_dtype(dtype)
    except TypeError:  # a dtype that cannot be hashed
        return bool(jax.numpy.issubdtype(dtype, jax.dtypes.prng_key))


@functools.lru_cache(maxsize=256)
def _is_key_dtype(dtype: Any) -> bool:
    # Asked for every leaf of a restore's target, of a few dtypes: jax's answer costs
    # a few microseconds each time.
    return bool(jax.numpy.issubdtype(dtype, jax.dtypes.prng_key))


def target_parts(t: Any) -> tuple[jax.sharding.Sharding | None, Any, Any]:
    """Return (sharding, shape, dtype) a target leaf asks for; None where it is silent.

    A NumPy array asks for host values of its shape and dtype. A typed PRNG key array
    (or its ``ShapeDtypeStruct``) asks for its key data, which is what was stored.
    """
    if isinstance(t, jax.ShapeDtypeStruct):
        if t.sharding is None:
            raise ValueError(f"target {t} has no sharding; give ShapeDtypeStruct(sharding=...)")
        if _is_key(t.dtype):
            data = jax.eval_shape(jax.random.key_data, t)
            return t.sharding, tuple(data.shape), data.dtype
        return t.sharding, tuple(t.shape), t.dtype
    if isinstance(t, jax.sharding.Sharding):
        return t, None, None
    if isinstance(t, jax.Array):
        if _is_key(t.dtype):
            t = jax.random.key_data(t)
        return t.sharding, tuple(t.shape), t.dtype
    if isinstance(t, np.ndarray | np.generic):
        return None, tuple(t.shape), t.dtype
    return None, None, None


def check_shape(where: str, saved: Sequence[int], shape: Sequence[int] | None) -> None:
    """Refuse a target shape other than the saved one (None: the target names none).

    ``where`` names the leaf in the message (its tree path).
    """
    if shape is not None and tuple(shape) != tuple(saved):
        raise ValueError(
            f"target leaf {where} has shape {tuple(shape)}, saved shape is {tuple(saved)}"
        )


def is_weak(t: Any) -> bool:
    """Whether a target leaf is weakly typed, as ``jax.eval_shape`` makes a Python number."""
    # A typed PRNG key array has no ``weak_type`` at all: keys are never weak.
    weak = getattr(t, "weak_type", False)
    return isinstance(t, jax.ShapeDtypeStruct | jax.Array) and bool(weak)


def _family(dtype: np.dtype[Any]) -> str | None:
    for kind in (np.integer, np.floating, np.complexfloating):
        if jax.numpy.issubdtype(dtype, kind):
            return kind.__name__
    return None


def check_dtype(where: str, saved: Any, dtype: Any, cast: bool, weak: bool = False) -> bool:
    """Refuse a target dtype other than the saved one, unless ``cast`` allows it.

    A weakly typed target (``weak``; see :func:`is_weak`) of the saved dtype's family
    (integer, floating or complex) is not refused: its dtype is jax's default for a
    Python number, not a choice, so the saved values are converted to it if they fit
    exactly. Return True when they must be checked for that as they are read
    (:func:`convert`); False when nothing needs checking.
    """
    if dtype is None or saved is None:
        return False
    try:
        if _alike(dtype, saved):
            return False
    except TypeError:  # not a dtype, or one that cannot be hashed: said below
        pass
    try:
        want = np.dtype(dtype)
    except TypeError:
        raise ValueError(
            f"target leaf {where} has dtype {dtype}, which nbckpt cannot restore"
        ) from None
    saved = np.dtype(saved)
    # Byte order is how a value is held, not what it is: a '>i4' target of an int32
    # leaf (saved in native order) gets the same values in the order it asks for.
    if want.newbyteorder("=") == saved.newbyteorder("=") or cast:
        return False
    if weak and _family(want) is not None and _family(want) == _family(saved):
        return True
    raise ValueError(
        f"target leaf {where} asks for dtype {want}, but it was saved as {saved}; "
        "pass cast=True to convert it, or give a target of the saved dtype"
    )


@functools.lru_cache(maxsize=256)
def _alike(dtype: Any, saved: Any) -> bool:
    """Whether a target of ``dtype`` takes a leaf saved as ``saved`` as it is.

    Byte order aside (see :func:`check_dtype`); asked for every leaf of a restore, of
    a few pairs of dtypes.
    """
    return bool(np.dtype(dtype).newbyteorder("=") == np.dtype(saved).newbyteorder("="))


def convert(where: str, values: np.ndarray, dtype: np.dtype[Any], exact: bool) -> np.ndarray:
    """Return ``values`` as ``dtype``; with ``exact``, refuse values that change.

    ``exact`` is for a weakly typed target (:func:`check_dtype`): a value converts
    exactly if it converts back to itself (NaN to NaN); an int64 of 2**40 into int32
    does not, nor does a float64 that float32 rounds.
    """
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            out = values.astype(dtype)
            same = not exact or np.array_equal(
                out.astype(values.dtype), values, equal_nan=values.dtype.kind in "fc"
            )
    except OverflowError:  # a Python integer too large for any NumPy integer
        same = False
    if not same:
        raise ValueError(
            f"target leaf {where} is weakly typed {dtype}, but the saved {values.dtype} "
            "values do not fit it exactly; pass cast=True to convert anyway"
        )
    return out


def _weak(x: jax.Array) -> jax.Array:
    from jax._src.lax import lax as lax_internal

    out: jax.Array = lax_internal._convert_element_type(x, x.dtype, weak_type=True)
    return out


def _can_weaken() -> bool:
    try:
        from jax._src.lax import lax as lax_internal
    except ImportError:
        return False
    return callable(getattr(lax_internal, "_convert_element_type", None))


def weaken(value: jax.Array) -> jax.Array:
    """Return ``value`` weakly typed, as the target leaf it restores was.

    A restored state whose step is weakly typed, as the one ``init`` made, keeps jax's
    promotion rules for it and hits the same compiled training step. jax has no public
    way to mark an array weak (``make_array_from_single_device_arrays`` never does), so
    this uses the conversion jax's own ``jacrev`` uses: one small op on the devices.
    """
    if not _can_weaken():
        # A jax without that private conversion: the values are right, only the
        # weak mark is lost (a training step then compiles once more).
        return value
    # Under jit, with the leaf's own sharding out: the conversion's ``sharding`` argument
    # refuses specs over a mesh's Explicit axes (``jax.make_mesh``'s default).
    out: jax.Array = jax.jit(_weak, out_shardings=value.sharding)(value)
    return out


def check_x64(where: str, dtype: np.dtype[Any]) -> None:
    """Refuse to make a jax array of a 64-bit dtype when jax would truncate it to 32 bits.

    Without ``jax_enable_x64`` jax converts 64-bit values to 32 bits silently; a
    restore must not lose them. Host values (NumPy) hold 64 bits and are never refused.
    """
    canonical = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    if canonical != dtype:
        raise ValueError(
            f"leaf {where} was saved as {dtype}, and as a jax array it would be truncated "
            f"to {canonical}: this process runs without jax_enable_x64; enable it "
            "(jax.config.update('jax_enable_x64', True)) before restoring, restore the leaf "
            f"as a host value (target ...), or pass a target of dtype {canonical} with "
            "cast=True"
        )


def check_sharding(
    where: str, sharding: jax.sharding.Sharding | None, shape: Sequence[int]
) -> None:
    """Refuse a sharding that cannot split the leaf's shape evenly, naming both."""
    if sharding is None:
        return
    try:
        _splits(sharding, tuple(shape))
    except ValueError as e:
        if isinstance(sharding, jax.sharding.NamedSharding):
            layout = f"mesh {dict(sharding.mesh.shape)} with spec {sharding.spec}"
        else:
            layout = type(sharding).__name__
        detail = " ".join(str(e).split())
        raise ValueError(
            f"target leaf {where} of shape {tuple(shape)} cannot be split evenly by its "
            f"sharding ({layout}): {detail}; pick a spec whose mesh axes divide the shape"
        ) from None


def default_sharding(meta: dict[str, Any]) -> jax.sharding.Sharding:
    """Return the sharding a leaf gets when restored without a target.

    The saved ``NamedSharding`` is rebuilt over this job's devices when their number
    matches the saved mesh; otherwise the leaf is replicated on every device.
    """
    desc = meta.get("sharding") or {}
    devices = jax.devices()
    if desc.get("type") == "named" and math.prod(desc["mesh_shape"]) == len(devices):
        mesh = jax.sharding.Mesh(
            np.array(devices).reshape(desc["mesh_shape"]), tuple(desc["axis_names"])
        )
        spec = jax.sharding.PartitionSpec(
            *[tuple(p) if isinstance(p, list) else p for p in desc["spec"]]
        )
        return jax.sharding.NamedSharding(mesh, spec)
    if len(devices) == 1:
        return jax.sharding.SingleDeviceSharding(devices[0])
    mesh = jax.sharding.Mesh(np.array(devices), ("nbckpt_all",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


@functools.lru_cache(maxsize=1024)
def _splits_known(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> None:
    # Remembered when it splits: a state's leaves have a few dozen shapes and
    # shardings. (A refusal is not: lru_cache keeps results only.)
    sharding.shard_shape(shape)


def _splits(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> None:
    """Raise ValueError unless ``sharding`` splits ``shape`` evenly."""
    try:
        _splits_known(sharding, shape)
    except TypeError:  # a sharding that cannot be hashed
        sharding.shard_shape(shape)
