"""What every process of a save must agree on, and the one line that says who differs.

Every process posts its *plan* in the preflight: the options it was given (format,
mode, force, primary, deadline, metrics, retention) and the structure of its tree (each
leaf's name, dtype, shape and kind, never its values). A process that saved another
format, mode or tree would otherwise see its shards dropped or its directory "vanish"
under it; with the plans compared before anyone writes, every process fails alike.

A plan names every leaf, so a job of a thousand processes and thousands of leaves cannot
send every plan to every process, nor even to one: each process posts a digest of its
plan, and the primary reads them all and publishes its *decision*
(:func:`decision_of`). Only when the digests differ does one process of each group post
its whole plan, to say what differs.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nbckpt.engine.arrays.tree import Leaf, dtype_name
from nbckpt.errors import who

__all__ = ["decision_of", "describe_leaves", "disagreement", "plan_digest", "save_plan"]

#: How many differing leaves one message names.
_SHOWN = 3


def _describe(leaf: Leaf) -> str:
    value = leaf.value
    if leaf.kind not in ("jax", "numpy"):
        # A Python scalar (its type), or a node with no array (what it stands for).
        what = value if isinstance(value, str) else type(value).__name__
        return f"{what} {leaf.kind}"
    shape = getattr(value, "shape", None)
    shape = np.shape(value) if shape is None else shape
    dtype = getattr(value, "dtype", None)
    dtype = dtype if dtype is not None else np.asarray(value).dtype
    impl = getattr(leaf, "key_impl", None)  # a typed PRNG key: its implementation too
    return _array_text(np.dtype(dtype), tuple(int(d) for d in shape), leaf.kind, impl)


@functools.lru_cache(maxsize=4096)
def _array_text(dtype: np.dtype[Any], shape: tuple[int, ...], kind: str, impl: str | None) -> str:
    """``float32[8, 4] jax``: made once for each, a state's leaves having a few dozen."""
    return f"{dtype_name(dtype)}{list(shape)} {kind}" + (f" key<{impl}>" if impl else "")


def describe_leaves(leaves: Sequence[Leaf]) -> dict[str, str]:
    """Each leaf's name and a short description: ``{"params.w": "float32[8, 4] jax"}``."""
    return {leaf.name: _describe(leaf) for leaf in leaves}


def _split(values: Mapping[int, Any]) -> str:
    """``'orbax' on process 1, None on processes 0, 2``."""
    groups: dict[str, list[int]] = {}
    for p, v in sorted(values.items()):
        groups.setdefault(repr(v) if not isinstance(v, str) else v, []).append(p)
    return ", ".join(f"{v} on {who(ps)}" for v, ps in groups.items())


def _leaf_differences(trees: Mapping[int, Mapping[str, str]]) -> list[str]:
    names = sorted(set().union(*(set(t) for t in trees.values())))
    found = []
    for name in names:
        values = {p: t.get(name, "absent") for p, t in trees.items()}
        if len(set(values.values())) > 1:
            found.append(f"leaf {name!r}: {_split(values)}")
    return found


def disagreement(plans: Mapping[int, Mapping[str, Any]]) -> str | None:
    """Say, in one line, what the processes' plans differ in; None if they agree."""
    if len(plans) < 2:
        return None
    parts = []
    keys = sorted(set().union(*(set(p) for p in plans.values())) - {"leaves"})
    for key in keys:
        values = {p: plan.get(key) for p, plan in plans.items()}
        if len({repr(v) for v in values.values()}) > 1:
            parts.append(f"{key}: {_split(values)}")
    leaves = _leaf_differences({p: plan.get("leaves") or {} for p, plan in plans.items()})
    if leaves:
        more = f" (and {len(leaves) - _SHOWN} more leaves)" if len(leaves) > _SHOWN else ""
        parts.append("; ".join(leaves[:_SHOWN]) + more)
    return "; ".join(parts) if parts else None


def save_plan(leaves: Sequence[Leaf], **options: Any) -> dict[str, Any]:
    """The plan a process posts for a save: ``options`` (JSON-able) and its leaves."""
    return {**options, "leaves": describe_leaves(leaves)}


def plan_digest(plan: Mapping[str, Any]) -> str:
    """A short digest of ``plan``: equal plans, equal digests, on every process."""
    text = json.dumps(plan, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def decision_of(answers: Mapping[int, Mapping[str, Any]], primary: int) -> dict[str, Any]:
    """What the primary publishes once it has read every process's preflight answer.

    ``answers`` are the processes' answers (``problem``, ``host``, and ``plan`` as a
    digest, ``tier``, ``local`` (:func:`~nbckpt.engine.sync.hostbarrier.host_key`); the
    primary's also ``op``, ``step`` and ``hub``). The decision carries the operation id
    and step, where each process runs (each host named once), the local tiers' posts,
    the processes grouped by plan digest (empty unless every process posted one), the
    first problem found, in process order, as ``[process, problem]``, and the host
    barrier's hub (:mod:`~nbckpt.engine.sync.hostbarrier`): the primary's, if every
    process posted the same ``local``, else None.
    """
    order = sorted(answers)
    names = sorted({str(a["host"]) for a in answers.values() if a.get("host")})
    index = {name: i for i, name in enumerate(names)}
    groups: dict[str, list[int]] = {}
    for p in order:
        if answers[p].get("plan"):
            groups.setdefault(str(answers[p]["plan"]), []).append(p)
    problem = next(([p, answers[p]["problem"]] for p in order if answers[p].get("problem")), None)
    # The host barrier's hub, only where every process runs where the primary does.
    where = {answers[p].get("local") for p in order}
    hub = answers[primary].get("hub") if len(where) == 1 and None not in where else None
    return {
        "op": answers[primary]["op"],
        "step": answers[primary].get("step"),
        "processes": order,
        "hosts": names,
        "host_of": [index.get(str(answers[p].get("host")), -1) for p in order],
        "tiers": {
            str(p): answers[p]["tier"] for p in order if isinstance(answers[p].get("tier"), dict)
        },
        "plans": groups if sum(map(len, groups.values())) == len(order) else {},
        "problem": problem,
        "hub": hub,
    }
