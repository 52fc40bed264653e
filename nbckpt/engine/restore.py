"""Restore: every process reads only the regions its own devices need."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jax
import numpy as np

from nbckpt.engine.storage import open_array
from nbckpt.engine.tree import PathEntry, leaf_name, path_entry, unflatten_paths
from nbckpt.errors import NbckptError
from nbckpt.journal import JournalWriter
from nbckpt.layout import read_metadata

__all__ = ["default_sharding", "restore_step"]


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


def _target_parts(t: Any) -> tuple[jax.sharding.Sharding | None, Any, Any]:
    """Return (sharding, shape, dtype) a target leaf asks for; None where it is silent."""
    if isinstance(t, jax.ShapeDtypeStruct):
        if t.sharding is None:
            raise ValueError(f"target {t} has no sharding; give ShapeDtypeStruct(sharding=...)")
        return t.sharding, tuple(t.shape), t.dtype
    if isinstance(t, jax.sharding.Sharding):
        return t, None, None
    if isinstance(t, jax.Array):
        return t.sharding, tuple(t.shape), t.dtype
    return None, None, None


def _index_key(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple(sl.indices(d)[:2] for sl, d in zip(index, shape, strict=True))


class _Pending:
    """Reads issued for one leaf, assembled once they complete."""

    def __init__(
        self,
        directory: Path,
        meta: dict[str, Any],
        sharding: jax.sharding.Sharding | None,
        dtype: Any,
    ) -> None:
        self.meta = meta
        self.sharding = sharding
        self.dtype = dtype
        self.shape = tuple(meta.get("shape", ()))
        self.nbytes = 0
        self.futures: dict[tuple[tuple[int, int], ...], Any] = {}
        self.devices: list[tuple[Any, tuple[tuple[int, int], ...]]] = []
        if meta["kind"] == "scalar":
            return
        store = open_array(directory / meta["name"])
        itemsize = np.dtype(meta["dtype"]).itemsize
        if sharding is None:
            self.futures[()] = store.read()
            self.nbytes = math.prod(self.shape) * itemsize
            return
        whole = tuple(slice(None) for _ in self.shape)
        for device, index in sharding.addressable_devices_indices_map(self.shape).items():
            key = _index_key(index or whole, self.shape)
            if key not in self.futures:
                self.futures[key] = store[index or whole].read()
                self.nbytes += math.prod(b - a for a, b in key) * itemsize
            self.devices.append((device, key))

    def result(self) -> Any:
        meta = self.meta
        if meta["kind"] == "scalar":
            value = meta["value"]
            py_type = meta.get("py_type")
            if py_type == "complex":
                return complex(value[0], value[1])
            return {"bool": bool, "int": int, "float": float}.get(py_type or "", lambda v: v)(value)
        if self.sharding is None:
            host = self.futures[()].result()
            if self.dtype is not None:
                host = host.astype(self.dtype, copy=False)
            return host
        bufs = []
        for device, key in self.devices:
            host = self.futures[key].result()
            if self.dtype is not None and host.dtype != np.dtype(self.dtype):
                host = host.astype(self.dtype)
            bufs.append(jax.device_put(host, device))
        return jax.make_array_from_single_device_arrays(self.shape, self.sharding, bufs)


def restore_step(directory: Path, target: Any, journal: JournalWriter | None = None) -> Any:
    """Restore the complete step in ``directory`` (see ``AsyncCheckpointer.restore``)."""
    meta = read_metadata(directory)
    if meta is None:
        raise NbckptError(f"cannot read {directory}/_CHECKPOINT_METADATA; run fsck on the root")
    by_name = {m["name"]: m for m in meta["leaves"]}
    if journal is not None:
        journal.emit("read_started")
    pending: list[_Pending] = []
    if target is None:
        paths: list[tuple[PathEntry, ...]] = []
        for m in meta["leaves"]:
            sharding = default_sharding(m) if m["kind"] == "jax" else None
            pending.append(_Pending(directory, m, sharding, None))
            paths.append(tuple((k, v) for k, v in m["path"]))
        values = [p.result() for p in pending]
        result = unflatten_paths(list(zip(paths, values, strict=True)))
    else:
        flat, treedef = jax.tree_util.tree_flatten_with_path(target)
        for keys, t in flat:
            name = leaf_name(tuple(path_entry(k) for k in keys))
            m = by_name.get(name)
            if m is None:
                have = ", ".join(sorted(by_name)) or "none"
                raise KeyError(f"target leaf {name!r} is not in {directory}; saved leaves: {have}")
            sharding, shape, dtype = _target_parts(t)
            if shape is not None and tuple(shape) != tuple(m.get("shape", ())):
                raise ValueError(
                    f"target leaf {name!r} has shape {tuple(shape)}, saved shape is "
                    f"{tuple(m.get('shape', ()))}"
                )
            pending.append(_Pending(directory, m, sharding, dtype))
        values = [p.result() for p in pending]
        result = jax.tree_util.tree_unflatten(treedef, values)
    if journal is not None:
        journal.emit("read_done", bytes=sum(p.nbytes for p in pending))
    return result
