"""The engine-side end of the notebook client: plain functions run on each engine.

``nbckpt.session.client`` calls these through ipyparallel; each one works on this process's
own checkpointers and returns small JSON-able dicts. This module knows nothing of
IPython or ipyparallel: the client resolves names in the engine's namespace and
passes the values in.
"""

from __future__ import annotations

import os
import time
from typing import Any

from nbckpt import storage
from nbckpt.engine import faults
from nbckpt.engine.checkpointer import AsyncCheckpointer
from nbckpt.engine.sync import health
from nbckpt.engine.sync.barriers import (
    Synchronizer,
    claim_key,
    default_client,
    next_sequence,
)
from nbckpt.engine.sync.process import info, initialize, pick_port, shutdown  # re-exported
from nbckpt.errors import CheckpointError
from nbckpt.formats.retention import RetentionPolicy
from nbckpt.journal import JournalWriter
from nbckpt.protocol import (
    DEFAULT_BARRIER_TIMEOUT_S,
    DEFAULT_SAVE_TIMEOUT_S,
    DIR_ENV,
    DIR_NAME,
    PROCESS_PLACEHOLDER,
    Event,
    Kind,
    Mode,
    barrier_op_id,
    barrier_phase,
    check_name,
    check_timeout,
    parse_op_id,
)

__all__ = [
    "barrier",
    "fault",
    "health_view",
    "info",
    "initialize",
    "pick_port",
    "restore_var",
    "rollback",
    "save_var",
    "set_retention",
    "set_tiers",
    "should_save",
    "shutdown",
    "status",
]

#: One checkpointer per root in this process, whatever the options of each call: it
#: runs one save at a time, so two saves to one root can never overlap.
_checkpointers: dict[str, AsyncCheckpointer] = {}


def _checkpointer(root: str) -> AsyncCheckpointer:
    path = str(storage.location(root))
    ckptr = _checkpointers.get(path)
    if ckptr is None:
        ckptr = _checkpointers[path] = AsyncCheckpointer(path)
    return ckptr


def _settle(ckptr: AsyncCheckpointer, acknowledged: tuple[str, ...]) -> None:
    """Wait for the previous save; drop its error if the notebook already showed it."""
    try:
        ckptr.wait_until_finished()
    except CheckpointError as e:
        if e.op not in acknowledged:
            raise


def _lookup(namespace: dict[str, Any], var: str) -> Any:
    if var not in namespace:
        raise NameError(f"name {var!r} is not defined on this engine; build it with %%px first")
    return namespace[var]


def save_var(
    namespace: dict[str, Any],
    var: str,
    step: int,
    root: str,
    *,
    mode: Mode | None = None,
    force: bool = False,
    timeout_s: float = DEFAULT_SAVE_TIMEOUT_S,
    acknowledged: tuple[str, ...] = (),
    key: str | None = None,
    metrics: dict[str, float] | None = None,
    format: str | None = None,
    persistent: bool | None = None,
    pack_bytes: int | None = None,
) -> dict[str, Any]:
    """Start saving ``namespace[var]``; return once the snapshot is safe.

    A variable missing on this process fails the save on every process at once (no
    one waits out the deadline for it). ``acknowledged`` lists failed operations whose
    error the notebook has shown already, so they are not raised a second time here.
    ``key`` is the caller's unique id of this call; ``metrics``, ``format``,
    ``pack_bytes`` and ``persistent`` (True: to the root too, whatever
    ``persistent_every`` says) are as for ``AsyncCheckpointer.save``.
    """
    timeout_s = check_timeout(timeout_s, "timeout_s")
    ckptr = _checkpointer(root)
    _settle(ckptr, acknowledged)
    t0 = time.perf_counter()
    ckptr.save_from(
        lambda: _lookup(namespace, var),
        step,
        force=force,
        key=key,
        mode=mode,
        timeout_s=timeout_s,
        metrics=metrics,
        format=format,
        persistent=persistent,
        pack_bytes=pack_bytes,
    )
    return {
        "process": ckptr.process_index,
        "op": ckptr.last_op,
        "blocked_s": time.perf_counter() - t0,
        "root": str(ckptr.root),
        "step": step,
    }


def set_retention(root: str, policy: dict[str, Any] | None) -> dict[str, Any]:
    """Give ``root``'s checkpointer a retention policy (None: keep its own); return it.

    ``policy`` holds :class:`~nbckpt.formats.retention.RetentionPolicy`'s fields. It applies
    from the next commit on, and lasts as long as this process.
    """
    ckptr = _checkpointer(root)
    if policy is not None:
        ckptr.set_retention(RetentionPolicy(**policy))
    current = ckptr.options.retention
    return {"policy": current.as_dict(), "text": current.describe(), "root": str(ckptr.root)}


def set_tiers(root: str, tiers: dict[str, Any] | None) -> dict[str, Any]:
    """Give ``root``'s checkpointer a local tier (None: keep its own); report it.

    ``tiers`` holds ``AsyncCheckpointer.set_tiers``'s keywords: ``local_dir`` (None
    turns the tier off; ``{process}`` in it becomes this process's index, so that
    processes on one machine can each be a host of their own), ``local_replicas``,
    ``persistent_every`` and ``local_keep``. It applies from the next save on, after
    the save in flight. Returns this process's ``process``, its tier's ``host`` id
    (None without a tier), its ``local_dir``, its ``options`` and its host's
    ``holdings`` (step, as a string -> ``processes`` and ``held``).
    """
    ckptr = _checkpointer(root)
    if tiers is not None:
        fields = dict(tiers)
        local = fields.get("local_dir")
        if local is not None:
            fields["local_dir"] = str(local).replace(PROCESS_PLACEHOLDER, str(ckptr.process_index))
        ckptr.set_tiers(**fields)
    tier = ckptr.local_tier
    options = ckptr.options.tiers
    return {
        "process": ckptr.process_index,
        "host": None if tier is None else tier.host,
        "local_dir": None if tier is None else str(tier.local_root.parents[1]),
        "options": {
            "local_dir": options.local_dir,
            "local_replicas": options.local_replicas,
            "persistent_every": options.persistent_every,
            "local_keep": options.local_keep,
        },
        "holdings": {} if tier is None else {str(s): h for s, h in tier.holdings().items()},
    }


def rollback(
    root: str, step: int, *, key: str | None = None, timeout_s: float = DEFAULT_SAVE_TIMEOUT_S
) -> list[int]:
    """Delete ``root``'s complete nbckpt steps newer than ``step``; return them.

    Every process calls it (see ``AsyncCheckpointer.prune_after``); a save in flight
    to that root finishes first. ``key`` is the caller's unique id of this call.
    """
    timeout = check_timeout(timeout_s, "timeout_s")
    return _checkpointer(root).prune_after(step, timeout_s=timeout, key=key)


def should_save(root: str, step: int) -> bool:
    """Tell whether ``step`` is due for a save under ``root``'s policy (see the checkpointer)."""
    return _checkpointer(root).should_save(step)


def restore_var(
    namespace: dict[str, Any],
    var: str,
    root: str,
    step: int | None,
    *,
    key: str | None = None,
    timeout_s: float = DEFAULT_SAVE_TIMEOUT_S,
    cast: bool = False,
    item: str | None = None,
    acknowledged: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Restore ``step`` (None: the latest) into ``namespace[var]``.

    The value ``var`` holds now, if any, is the target: its jax arrays and
    ``jax.ShapeDtypeStruct`` leaves give the shape, dtype and sharding (the engines'
    current mesh) each leaf comes back with; its other leaves come back as host values
    and must keep their shape and dtype. Without one the saved layout is used. A leaf
    whose shape or dtype differs from the saved one is refused (unless ``cast``), and
    ``var`` is then left as it was. The same checkpointer as the root's saves does the
    reading, so a save in flight to that root finishes first; its failure is raised
    here unless the notebook already reported it (``acknowledged``), as for the next
    save.
    """
    import jax

    timeout_s = check_timeout(timeout_s, "timeout_s")
    like = namespace.get(var)

    def target() -> Any:
        if like is None:
            return None
        return jax.tree.map(_target_leaf, like)

    ckptr = _checkpointer(root)
    _settle(ckptr, acknowledged)
    t0 = time.perf_counter()
    tree = ckptr.restore_from(target, step, key=key, timeout_s=timeout_s, cast=cast, item=item)
    jax.block_until_ready(tree)
    namespace[var] = tree  # only now: a refused restore leaves ``var`` as it was
    parsed = parse_op_id(ckptr.last_op) if ckptr.last_op else None
    return {
        "process": ckptr.process_index,
        "op": ckptr.last_op,
        "seconds": time.perf_counter() - t0,
        "step": parsed.step if parsed is not None else step,
    }


def _target_leaf(x: Any) -> Any:
    """What one leaf of a variable asks a restore for (see :func:`restore_var`)."""
    import jax
    import numpy as np

    if isinstance(x, jax.Array):
        # Shape and dtype too, not only the sharding: a dtype other than the saved one
        # must be refused, not silently replaced.
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    if isinstance(x, jax.ShapeDtypeStruct | np.ndarray | np.generic):
        return x  # a NumPy leaf asks for host values of its own shape and dtype
    return ...


def barrier(
    name: str,
    *,
    timeout_s: float = DEFAULT_BARRIER_TIMEOUT_S,
    processes: list[int] | None = None,
    root: str | None = None,
    key: str | None = None,
) -> dict[str, Any]:
    """Wait at a user barrier across the processes; report when this one arrived and left.

    The key is ``nbckpt/barrier-<id>/<name>``, where ``<id>`` is the caller's ``key``
    or else a sequence number: unique per use, so the same name can be used again.
    With ``root`` the barrier is journaled like a save, as operation kind ``barrier``.
    """
    check_name(name)
    timeout_s = check_timeout(timeout_s, "timeout_s")
    sync = Synchronizer(default_client())
    if processes is not None:
        n = sync.process_count
        if not processes or any(not 0 <= p < n for p in processes):
            raise ValueError(f"processes must be indices in 0..{n - 1}, got {processes}")
    if key is not None:
        if not key.isalnum():  # the journal's op id is split at the first "-" after it
            raise ValueError(f"barrier key must be letters and digits, got {key!r}")
        claim_key(sync.client, "barrier", key)
        ident = key
    else:
        subset = "" if processes is None else "p" + ".".join(map(str, processes))
        ident = f"{next_sequence(processes)}{subset}"
    op = f"{Kind.BARRIER}-{ident}"
    journal = None
    if root is not None:
        # The journal folder needs one name on every process: the first participant
        # stamps it and the others read it.
        source = min(processes) if processes else 0
        proposed = barrier_op_id(ident, name) if sync.process_index == source else None
        journal_op = sync.broadcast(op, "journal", proposed, source=source, timeout_s=timeout_s)
        journal = JournalWriter(
            root, journal_op, sync.process_index, Kind.BARRIER, 0, sync.process_count
        )
        count = len(processes) if processes else sync.process_count
        journal.emit(Event.REQUESTED, process_count=count, name=name)
        journal.emit(Event.BARRIER_ENTER, name=name)
    entered = time.time()
    try:
        sync.barrier(op, name, timeout_s=timeout_s, process_ids=processes)
    except BaseException as e:
        if journal is not None:
            journal.emit(Event.FAILED, error=str(e), phase=barrier_phase(name))
        raise
    left = time.time()
    if journal is not None:
        journal.emit(Event.BARRIER_EXIT, name=name)
        journal.emit(Event.COMMITTED)
        journal.close()
    return {"process": sync.process_index, "entered": entered, "left": left, "key": f"{op}/{name}"}


def set_directory(namespace: dict[str, Any], root: str) -> str:
    """Make ``root`` this engine's default: ``NBCKPT_DIR``, and ``CKPT_DIR`` in ``%px``.

    A training loop in ``%%px`` then saves where the notebook watches
    (``AsyncCheckpointer()``, ``TrainingCheckpointer()``, or ``CKPT_DIR``), rather
    than to a path pushed by hand.
    """
    os.environ[DIR_ENV] = root
    namespace[DIR_NAME] = root
    return root


def health_view() -> dict[int, str]:
    """This process's view of who is alive, from the key-value heartbeats."""
    return health.monitor_for(default_client()).view()


def status() -> dict[str, Any]:
    """Report this process: its checkpointers (root, last operation, in flight), faults.

    Asked through the engine's service (:mod:`nbckpt.engine.remote.relay`), so it
    answers while a cell keeps the engine busy.
    """
    out = info()
    out["health"] = health_view()
    out["faults"] = faults.list_faults()
    out["checkpointers"] = [
        {"root": path, "last_op": c.last_op, "in_flight": c.in_flight()}
        for path, c in _checkpointers.items()
    ]
    return out


def fault(
    kind: str, *, at: str | None = None, seconds: float | None = None, factor: float | None = None
) -> list[str]:
    """Arm a fault in this process (see :mod:`nbckpt.engine.faults`); return all armed.

    ``kind`` is one of :data:`nbckpt.engine.faults.KINDS`.
    """
    return faults.arm(kind, at=at, seconds=seconds, factor=factor)
