"""Restore: every process reads only the regions its own devices need."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jax
import numpy as np
import tensorstore as ts

from nbckpt.engine.storage import open_array_async
from nbckpt.engine.tree import PathEntry, leaf_name, path_entry, unflatten_paths
from nbckpt.errors import NbckptError
from nbckpt.journal import JournalWriter
from nbckpt.layout import read_metadata

__all__ = ["aligned_empty", "default_sharding", "restore_step"]

#: XLA's CPU client adopts a host buffer without copying it only if it is aligned to
#: this many bytes; tensorstore's own read buffers are aligned to 16 only.
_ALIGNMENT = 64


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """Return an uninitialized C-ordered array whose data is ``_ALIGNMENT``-aligned.

    A restore reads each region into such a buffer, so that ``jax.device_put`` on a
    CPU device takes it as it is instead of copying it once more.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGNMENT, np.uint8)
    offset = -raw.ctypes.data % _ALIGNMENT
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


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
    """The reads of one leaf: opened, issued, then assembled.

    ``__init__`` starts opening the array, ``issue`` issues the reads and ``result``
    assembles them once they complete.

    The three steps are separate so that a restore opens every leaf, then issues
    every read, before it waits for any: tensorstore overlaps them all.
    """

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
        self._opening: Any = None
        if meta["kind"] != "scalar":
            self._opening = open_array_async(directory / meta["name"])

    def issue(self) -> None:
        """Issue the reads of every region this process's devices need."""
        if self._opening is None:
            return
        store = self._opening.result()
        itemsize = np.dtype(self.meta["dtype"]).itemsize
        if self.sharding is None:
            self.futures[()] = store.read()
            self.nbytes = math.prod(self.shape) * itemsize
            return
        whole = tuple(slice(None) for _ in self.shape)
        dtype = np.dtype(self.meta["dtype"])
        for device, index in self.sharding.addressable_devices_indices_map(self.shape).items():
            key = _index_key(index or whole, self.shape)
            if key not in self.futures:
                buf = aligned_empty(tuple(b - a for a, b in key), dtype)
                dst = ts.array(buf, copy=False, write=True)
                self.futures[key] = (buf, dst.write(store[index or whole]))
                self.nbytes += buf.nbytes
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
            host, done = self.futures[key]
            done.result()
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
        for p in pending:
            p.issue()
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
        for p in pending:
            p.issue()
        values = [p.result() for p in pending]
        result = jax.tree_util.tree_unflatten(treedef, values)
    if journal is not None:
        journal.emit("read_done", bytes=sum(p.nbytes for p in pending))
    return result
