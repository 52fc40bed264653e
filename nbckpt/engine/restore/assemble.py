"""One jax array from the parts a restore read for this process's devices.

jax's public way costs two calls a leaf: ``jax.device_put`` of each host part (which
wraps the NumPy array, derives its abstract value and picks a handler for it), then
``jax.make_array_from_single_device_arrays`` (which checks the parts and puts them in
the sharding's order). For a state of thousands of small leaves that is a large part
of a restore's CPU time: 21-27 µs a leaf on one process here, against 3-4 µs for jaxlib's
``batched_device_put``, the call ``device_put`` itself ends in, which makes the global
array from the host parts at once. That call is not public, so it is taken only where it
is found, for host parts of a dtype jax keeps as it is; the public way does the rest,
and is what a jax without it gets.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

__all__ = ["assemble", "maker"]


def _find_batched() -> Callable[..., Any] | None:
    try:
        from jax._src.lib import xla_client  # type: ignore[attr-defined]
    except ImportError:
        return None
    found = getattr(xla_client, "batched_device_put", None)
    return found if callable(found) else None


#: jaxlib's ``batched_device_put(aval, sharding, xs, devices, committed)``, or None.
_BATCHED = _find_batched()


def assemble(
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    sharding: jax.sharding.Sharding,
    devices: Sequence[Any],
    parts: Sequence[Any],
    weak: bool = False,
) -> jax.Array:
    """The global array of ``shape`` and ``sharding`` from this process's parts.

    Parameters
    ----------
    shape, dtype
        The global array's.
    sharding
        Its sharding; ``devices`` are its addressable devices, each exactly once.
    devices
        The device of each part.
    parts
        Per device, a NumPy array of that device's shard, or a jax array already on it.
    weak
        Whether the array is weakly typed. Only the batched call can make it so; the
        public way returns it strongly typed (see
        :func:`~nbckpt.engine.restore.targets.weaken`).

    Returns
    -------
    jax.Array
        The array, committed to ``sharding``.
    """
    global _BATCHED
    on_host = [i for i, p in enumerate(parts) if not isinstance(p, jax.Array)]
    if _BATCHED is not None and len(on_host) == len(parts) and _keeps(dtype, _x64()):
        order, shard = _layout(sharding, shape)
        by_device = dict(zip(devices, parts, strict=True))
        # The batched call checks none of this; the public way names what is wrong.
        if (
            len(order) == len(by_device) == len(parts)
            and all(d in by_device for d in order)
            and all(p.shape == shard and p.dtype == dtype for p in parts)
        ):
            aval = _aval(shape, dtype, weak)
            ordered = [by_device[d] for d in order]
            try:
                out: jax.Array = _BATCHED(aval, sharding, ordered, order, True)
                return out
            except TypeError:
                # A jaxlib whose call takes other arguments: the public way from now on.
                _BATCHED = None
    placed = list(parts)
    if on_host:
        # One call for every host part: one by one, the calls' own cost adds up.
        put = jax.device_put([parts[i] for i in on_host], [devices[i] for i in on_host])
        for i, value in zip(on_host, put, strict=True):
            placed[i] = value
    return jax.make_array_from_single_device_arrays(shape, sharding, placed)


def maker(
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    sharding: jax.sharding.Sharding,
    devices: Sequence[Any],
    weak: bool = False,
) -> Callable[[Sequence[np.ndarray]], jax.Array] | None:
    """What makes the arrays of one layout from host parts, with the checks made once.

    For a restore's many leaves of one shape, dtype and sharding (a state's biases,
    say): :func:`assemble` checks each leaf's parts and layout before its one batched
    call, a third of its cost. The returned function takes, per device of
    ``devices``, a host array of the shard's shape and of ``dtype`` (the caller's
    guarantee: nothing is checked) and returns what :func:`assemble` would, weakly
    typed if ``weak``. None where only :func:`assemble` can make the array (no batched
    call, a dtype jax changes, devices that are not the sharding's own).
    """
    if _BATCHED is None or not _keeps(dtype, _x64()):
        return None
    order, _ = _layout(sharding, shape)
    if len(order) != len(devices) or set(order) != set(devices):
        return None
    aval = _aval(shape, dtype, weak)
    at = {d: i for i, d in enumerate(devices)}
    perm = [at[d] for d in order]
    in_order = perm == list(range(len(perm)))

    def make(parts: Sequence[np.ndarray]) -> jax.Array:
        ordered = parts if in_order else [parts[i] for i in perm]
        if _BATCHED is not None:
            try:
                out: jax.Array = _BATCHED(aval, sharding, ordered, order, True)
                return out
            except TypeError:
                pass  # assemble finds the call unusable, and stops asking it
        return assemble(shape, dtype, sharding, devices, parts, weak)

    return make


@functools.lru_cache(maxsize=256)
def _layout(
    sharding: jax.sharding.Sharding, shape: tuple[int, ...]
) -> tuple[list[Any], tuple[int, ...]]:
    """The sharding's addressable devices and the shape of a shard.

    The devices are in the order the sharding's arrays hold their shards.
    """
    return list(sharding.addressable_devices_indices_map(shape)), sharding.shard_shape(shape)


@functools.lru_cache(maxsize=1024)
def _aval(shape: tuple[int, ...], dtype: np.dtype[Any], weak: bool) -> Any:
    """The abstract value of an array of ``shape`` and ``dtype``, made once for each.

    Avals are values jax never changes, shared by every array of their shape; a
    state's thousands of leaves have a few dozen shapes, and making one costs more
    than the rest of a small leaf's assembly.
    """
    return jax.core.ShapedArray(shape, dtype, weak_type=weak)


def _x64() -> bool:
    return bool(jax.config.read("jax_enable_x64"))


@functools.lru_cache(maxsize=64)
def _keeps(dtype: np.dtype[Any], x64: bool) -> bool:
    """Whether jax keeps host values of ``dtype`` as they are (no 64 to 32 bits).

    ``x64`` is the ``jax_enable_x64`` it was asked under: the answer depends on it.
    """
    return bool(np.dtype(jax.dtypes.canonicalize_dtype(dtype)) == dtype)
