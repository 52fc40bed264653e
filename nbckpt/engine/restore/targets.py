"""What a restore target asks for, and the checks every layout's restore applies to it.

Both readers, nbckpt's own steps (:mod:`nbckpt.engine.restore.step`) and Orbax's
(:mod:`nbckpt.engine.restore.orbax_step`), take a target leaf apart the same way and
refuse the same mismatches with the same words.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

__all__ = [
    "check_dtype",
    "check_shape",
    "check_sharding",
    "default_sharding",
    "target_parts",
]


def _is_key(dtype: Any) -> bool:
    return jax.numpy.issubdtype(dtype, jax.dtypes.prng_key)


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


def check_dtype(where: str, saved: Any, dtype: Any, cast: bool) -> None:
    """Refuse a target dtype other than the saved one, unless ``cast`` allows it."""
    if dtype is None or saved is None:
        return
    try:
        want = np.dtype(dtype)
    except TypeError:
        raise ValueError(
            f"target leaf {where} has dtype {dtype}, which nbckpt cannot restore"
        ) from None
    saved = np.dtype(saved)
    # Byte order is how a value is held, not what it is: a '>i4' target of an int32
    # leaf (saved in native order) gets the same values in the order it asks for.
    if want.newbyteorder("=") != saved.newbyteorder("=") and not cast:
        raise ValueError(
            f"target leaf {where} asks for dtype {want}, but it was saved as {saved}; "
            "pass cast=True to convert it, or give a target of the saved dtype"
        )


def check_sharding(
    where: str, sharding: jax.sharding.Sharding | None, shape: Sequence[int]
) -> None:
    """Refuse a sharding that cannot split the leaf's shape evenly, naming both."""
    if sharding is None:
        return
    try:
        sharding.shard_shape(tuple(shape))
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
