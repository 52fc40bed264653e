"""The states people train, for ``benchmarks/compare.py``: a transformer and AdamW.

Built inside each JAX process of the benchmark (see ``_workers.build``). A
transformer-like state is what a real optimizer checkpoint holds: the parameters
(a token embedding, per layer the attention and MLP matrices, their biases and two
layer norms, a final norm) and AdamW's ``mu`` and ``nu`` of the same shapes, plus a
step count. Matrices are sharded on their first axis over every device (FSDP); the
vectors (biases, norm scales) are small and replicated, as they are in training. The
model width is picked so the state comes out at about the size asked for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

#: Layers of the ``transformer`` state: 3 x (1 + 12 x 12 + 2) + 1 = 442 leaves (params, mu,
#: nu: embedding, 12 per layer, final norm; and the step count).
TRANSFORMER_LAYERS = 12
#: Layers of the ``many`` state: 3 x (1 + 12 x 111 + 2) + 1 = 4,006 leaves.
MANY_LAYERS = 111
#: The embedding has this many rows per unit of model width (a vocabulary of 8 d).
_VOCAB_PER_WIDTH = 8


def _layer_shapes(d: int) -> dict[str, tuple[int, ...]]:
    """One transformer block: four matrices, their biases, two layer norms."""
    return {
        "attn_qkv": (d, 3 * d),
        "attn_qkv_bias": (3 * d,),
        "attn_out": (d, d),
        "attn_out_bias": (d,),
        "mlp_in": (d, 4 * d),
        "mlp_in_bias": (4 * d,),
        "mlp_out": (4 * d, d),
        "mlp_out_bias": (d,),
        "ln1_scale": (d,),
        "ln1_bias": (d,),
        "ln2_scale": (d,),
        "ln2_bias": (d,),
    }


def nest(pairs: Iterable[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    """A nested dict from (path, value) pairs."""
    tree: dict[str, Any] = {}
    for path, value in pairs:
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return tree


def param_shapes(d: int, layers: int) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    """Every parameter of the model of width ``d``: its path and its shape, in order."""
    out: list[tuple[tuple[str, ...], tuple[int, ...]]] = [(("embed",), (_VOCAB_PER_WIDTH * d, d))]
    for i in range(layers):
        out += [((f"layer_{i:03d}", k), s) for k, s in _layer_shapes(d).items()]
    return [*out, (("final_norm", "scale"), (d,)), (("final_norm", "bias"), (d,))]


def width_for(nbytes: int, layers: int, multiple: int) -> int:
    """The model width whose float32 state (params, mu, nu) is about ``nbytes``."""
    per_d2 = 3 * 4 * (12 * layers + _VOCAB_PER_WIDTH)  # bytes per d**2
    d = int(math.sqrt(max(1, nbytes) / per_d2))
    return max(multiple, d // multiple * multiple)


def tree_transformer(
    nbytes: int, layers: int, random: Callable[[tuple[int, ...], Any, Any, int], Any]
) -> dict[str, Any]:
    """A transformer's parameters and AdamW state of about ``nbytes``.

    ``random(shape, dtype, sharding, seed)`` makes one jax array.
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    n = jax.device_count()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    fsdp = NamedSharding(mesh, PartitionSpec("data"))
    repl = NamedSharding(mesh, PartitionSpec())
    d = width_for(nbytes, layers, 8 * n)
    seeds = iter(range(1_000_000))

    def array(shape: tuple[int, ...]) -> Any:
        sharding = fsdp if len(shape) == 2 else repl
        return random(shape, np.float32, sharding, next(seeds))

    def params_like() -> dict[str, Any]:
        return nest((path, array(shape)) for path, shape in param_shapes(d, layers))

    return adam_like(params_like, random((), np.int32, repl, next(seeds)))


def adam_like(params_like: Callable[[], dict[str, Any]], count: Any) -> dict[str, Any]:
    """A training state: parameters, and Adam's ``mu`` and ``nu`` of the same shapes.

    ``params_like()`` makes one tree of parameters (new values each call).
    """
    return {
        "params": params_like(),
        "opt_state": {"mu": params_like(), "nu": params_like(), "count": count},
    }
