"""The states ``benchmarks/gpu.py`` saves: made afresh on the device, checked after a restore.

``fsdp``: 8 leaves of ``(rows, 1024)``, float32 and bfloat16 alternating, sharded on
their first axis over a 1-D mesh of all devices. ``small``: compare.py's optimizer-like
tree (params, mu and nu: each an embedding and a head kernel, sharded, and 64 layers of
bias and scale of 1-64 KiB, replicated), two 0-d arrays and two Python scalars.
``transformer``: compare.py's (:mod:`_states`), 442 leaves, matrices sharded.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from _states import TRANSFORMER_LAYERS, nest, param_shapes, width_for

#: path, shape, dtype, sharded (else replicated)
Spec = tuple[tuple[str, ...], tuple[int, ...], np.dtype[Any], bool]
COLS, SMALL_LAYERS, POOL_MAX_BYTES = 1024, 64, 2**20


def fmt_size(n: int) -> str:
    """Bytes as ``4GiB``, ``256MiB`` (two decimals at most)."""
    for unit, m in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= m:
            return f"{f'{n / m:.2f}'.rstrip('0').rstrip('.')}{unit}"
    return f"{n}B"


def leaf_bytes(spec: Spec) -> int:
    """A leaf's bytes."""
    return math.prod(spec[1]) * spec[2].itemsize


def fsdp_specs(nbytes: int, n: int) -> list[Spec]:
    """8 large leaves, float32 and bfloat16, of ``nbytes`` in all (``n`` devices)."""
    import jax.numpy as jnp

    out: list[Spec] = []
    for i in range(8):
        dtype = np.dtype(jnp.float32 if i % 2 == 0 else jnp.bfloat16)
        rows = max(n, nbytes // 8 // dtype.itemsize // COLS // n * n)
        out.append(((f"w{i}",), (rows, COLS), dtype, True))
    return out


def small_specs(nbytes: int, n: int) -> list[Spec]:
    """6 large sharded leaves, 384 small replicated ones (1-64 KiB) and two 0-d arrays."""
    f32, i32 = np.dtype(np.float32), np.dtype(np.int32)
    count = 3 * 2 * SMALL_LAYERS
    max_kib = int(min(64, max(1, nbytes / 2 / count / 2**10)))
    kib = np.random.default_rng(0).integers(1, max_kib + 1, size=(SMALL_LAYERS, 2))
    rows = max(n, (nbytes - 3 * int(kib.sum()) * 2**10) // 4 // 6 // COLS // n * n)
    out: list[Spec] = []
    for group in (("params",), ("opt_state", "mu"), ("opt_state", "nu")):
        out += [((*group, "embed"), (rows, COLS), f32, True)]
        out += [((*group, "head", "kernel"), (rows, COLS), f32, True)]
        for i, (bias, scale) in enumerate(kib):
            out += [((*group, f"layer_{i}", "bias"), (int(bias) * 256,), f32, False)]
            out += [((*group, f"layer_{i}", "scale"), (int(scale) * 256,), f32, False)]
    return [*out, (("opt_state", "count"), (), i32, False), (("loss_scale",), (), f32, False)]


def transformer_specs(nbytes: int, n: int) -> list[Spec]:
    """compare.py's ``transformer``: a 12-layer model's parameters, AdamW's mu and nu.

    Matrices sharded on their first axis, vectors replicated, and the step count: 442
    leaves of about ``nbytes`` in all.
    """
    f32 = np.dtype(np.float32)
    shapes = param_shapes(width_for(nbytes, TRANSFORMER_LAYERS, 8 * n), TRANSFORMER_LAYERS)
    out: list[Spec] = []
    for group in (("params",), ("opt_state", "mu"), ("opt_state", "nu")):
        out += [((*group, *path), shape, f32, len(shape) == 2) for path, shape in shapes]
    return [*out, (("opt_state", "count"), (), np.dtype(np.int32), False)]


SMALL_SCALARS = {("step",): 12_345, ("opt_state", "learning_rate"): 3e-4}


class State:
    """One state at one size: made afresh per measurement, its restore target, its check.

    A fresh state per measurement: a jax array keeps the host copy that ``np.asarray``
    made of it, so a second save of the same array would copy nothing.
    """

    def __init__(
        self, name: str, nbytes: int, specs: list[Spec], scalars: dict[Any, Any] | None = None
    ) -> None:
        import jax
        import jax.numpy as jnp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        mesh = Mesh(np.array(jax.devices()), ("data",))
        sharded, replicated = PartitionSpec("data"), PartitionSpec()
        self.shardings = [NamedSharding(mesh, sharded if s[3] else replicated) for s in specs]
        self.name, self.specs, self.scalars = name, specs, dict(scalars or {})
        self.label = f"{name} {fmt_size(nbytes)}"
        self.nbytes = sum(leaf_bytes(s) for s in specs)
        self.figures: dict[str, list[float]] = {}
        self.rep_seconds: list[float] = []
        # Large leaves are made by jax.random on the device; small ones (<= 1 MiB) by
        # NumPy and put there in one call: one random op per small leaf would take XLA
        # half a minute to compile for the small state, their slices of one vector 6 s.
        self._small = [i for i, s in enumerate(specs) if leaf_bytes(s) <= POOL_MAX_BYTES]
        self._large = [i for i in range(len(specs)) if i not in self._small]

        def gen(seed: Any) -> list[Any]:
            key = jax.random.key(seed)
            return [
                jax.random.uniform(jax.random.fold_in(key, i), specs[i][1], specs[i][2])
                for i in self._large
            ]

        def same(a: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
            return jnp.all(jnp.stack([jnp.array_equal(x, y) for x, y in zip(a, b, strict=True)]))

        self._gen = jax.jit(gen, out_shardings=[self.shardings[i] for i in self._large])
        self._same = jax.jit(same)

    def fresh(self, seed: int) -> dict[str, Any]:
        """A new state with random values (on the device, ready)."""
        import jax

        rng = np.random.default_rng(seed)
        host = [
            np.asarray(rng.integers(0, 2**31 - 1, size=shape), dtype)
            if dtype.kind == "i"
            else np.asarray(rng.random(shape, np.float32), dtype)
            for _, shape, dtype, _ in (self.specs[i] for i in self._small)
        ]
        small = jax.device_put(host, [self.shardings[i] for i in self._small])
        arrays = jax.block_until_ready([*self._gen(np.uint32(seed)), *small])
        pairs = [
            (self.specs[i][0], a) for i, a in zip(self._large + self._small, arrays, strict=True)
        ]
        return nest(pairs + list(self.scalars.items()))

    def target(self) -> dict[str, Any]:
        """The restore target: ShapeDtypeStructs with the saved shardings, and the scalars."""
        import jax

        pairs = [
            (path, jax.ShapeDtypeStruct(shape, dtype, sharding=sh))
            for (path, shape, dtype, _), sh in zip(self.specs, self.shardings, strict=True)
        ]
        return nest(pairs + list(self.scalars.items()))

    def verify(self, saved: Any, restored: Any, who: str) -> None:
        """Raise unless ``restored`` has ``saved``'s structure, shardings and values."""
        import jax

        where = f"{who} restored {self.label}"
        if str(jax.tree.structure(saved)) != str(jax.tree.structure(restored)):
            raise AssertionError(f"{where} as a different tree")
        pairs = list(zip(jax.tree.leaves(saved), jax.tree.leaves(restored), strict=True))
        for w, g in pairs:
            if not isinstance(w, jax.Array):
                if np.asarray(g).item() != w:
                    raise AssertionError(f"{where}: scalar {g!r}, saved {w!r}")
            elif not isinstance(g, jax.Array) or (g.shape, g.dtype) != (w.shape, w.dtype):
                raise AssertionError(f"{where}: {g!r} for a {w.dtype}{list(w.shape)}")
            elif not g.sharding.is_equivalent_to(w.sharding, w.ndim):
                raise AssertionError(f"{where}: sharding {g.sharding}, saved {w.sharding}")
        arrays = [(w, g) for w, g in pairs if isinstance(w, jax.Array)]
        large = [(w, g) for w, g in arrays if w.nbytes > POOL_MAX_BYTES]
        # The large leaves compared on the device, the small ones (a few MiB) here.
        if (large and not bool(self._same(*zip(*large, strict=True)))) or not all(
            np.array_equal(np.asarray(w), np.asarray(g))
            for w, g in arrays
            if w.nbytes <= POOL_MAX_BYTES
        ):
            raise AssertionError(f"{where}: the values differ from the saved ones")


def free(*trees: Any) -> None:
    """Free the device memory of every jax array in ``trees`` now."""
    import jax

    for leaf in jax.tree.leaves(trees):
        if isinstance(leaf, jax.Array) and not leaf.is_deleted():
            leaf.delete()


def shards(tree: Any) -> list[Any]:
    """Every jax array's shards in ``tree``, one per unique region (``replica_id`` 0)."""
    import jax

    return [
        s.data
        for a in jax.tree.leaves(tree)
        if isinstance(a, jax.Array)
        for s in a.addressable_shards
        if s.replica_id == 0
    ]
