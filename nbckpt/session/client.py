"""The notebook-side API that the magics call: save, restore, barrier, wait, status, fault.

Every call runs on all engines of a :class:`~nbckpt.session.cluster.JaxCluster`. ``save``
returns a :class:`SaveHandle` as soon as the engines have taken their snapshot; the
commit goes on in the engines' background threads, and the handle follows it through
the journal. Nothing here imports jax or :mod:`nbckpt.engine`: engine functions are
named (``"nbckpt.engine.remote.agent:save_var"``) and imported on the engines.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from nbckpt import storage
from nbckpt.errors import SaveFailedError
from nbckpt.formats.layout import Mode
from nbckpt.formats.retention import check_metrics
from nbckpt.journal import OperationRecord
from nbckpt.protocol import (
    DEFAULT_BARRIER_TIMEOUT_S,
    DEFAULT_SAVE_TIMEOUT_S,
    check_optional_timeout,
    check_timeout,
)
from nbckpt.protocol.reads import STATUS
from nbckpt.session import reads
from nbckpt.session.cluster import JaxCluster
from nbckpt.session.faults import arm_fault
from nbckpt.session.handles import BarrierReport, SaveHandle
from nbckpt.session.policies import RootPolicies
from nbckpt.session.rpc import (
    AGENT,
    ENGINE_DIED,
    call_key,
    engine_errors,
    errors_by_process,
    remote,
)

__all__ = [
    "BarrierReport",
    "CheckpointClient",
    "SaveFailedError",
    "SaveHandle",
    "announce_root",
]


def _interactive(fn: Any) -> Any:
    """Mark ``fn`` so that, on an engine, its globals are the engine's namespace."""
    import ipyparallel as ipp

    return ipp.interactive(fn)


def _in_namespace(ref: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Engine-side: call ``module:function`` with the engine's namespace first.

    Sent through :func:`_interactive`, so ``globals()`` is the namespace ``%px`` code
    runs in. Arguments come as a tuple and a dict so that none of their names can
    clash with those of :meth:`JaxCluster.apply_each` (``timeout_s``).
    """
    import importlib

    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)(globals(), *args, **kwargs)


def _targets(engine_ids: list[int], processes: list[int] | None) -> list[int]:
    """The engines a barrier for ``processes`` (None: all) runs on; checked first."""
    if processes is None:
        return list(engine_ids)
    if not processes:
        raise ValueError("processes is empty: name at least one process, or none for all")
    n = len(engine_ids)
    bad = [p for p in processes if not 0 <= p < n]
    if bad:
        raise ValueError(f"no process {bad[0]}: this cluster has processes 0..{n - 1}")
    return [engine_ids[p] for p in processes]


def _start_on_engines(
    cluster: JaxCluster, args: tuple[str, int, str], options: dict[str, Any]
) -> list[dict[str, Any]]:
    """Start a save of ``(var, step, root)`` on every engine; return their answers.

    An engine that died after its snapshot (a kill at an early phase) does not stop
    the save: the others go on, and the journal and the handle report it. Any other
    refusal raises (a ClusterError naming the processes).
    """
    var, step, _root = args
    cluster.check_alive()  # a dead engine: one clear line, before anything is sent
    # The engines' own deadline (timeout_s) bounds their blocking part; the margin
    # lets their error, rather than a client timeout, come back.
    outcomes = cluster.apply_each(
        _interactive(_in_namespace),
        f"{AGENT}:save_var",
        args,
        {**options, "key": call_key()},
        timeout_s=options["timeout_s"] + 60,
    )
    errors = {rank: res for rank, (ok, res) in enumerate(outcomes) if not ok}
    results = [res for ok, res in outcomes if ok]
    if errors and (not results or any(t != ENGINE_DIED for t in errors.values())):
        raise errors_by_process(f"save of {var!r} as step {step}", errors)
    return results


def announce_root(cluster: JaxCluster, root: str) -> None:
    """Tell every engine the cluster's root: ``NBCKPT_DIR``, and ``CKPT_DIR`` in ``%px``.

    ``AsyncCheckpointer()`` and ``TrainingCheckpointer()`` on an engine then save where
    ``%ckpt_watch`` and the sidebar look.
    """
    outcomes = cluster.apply_each(
        _interactive(_in_namespace), f"{AGENT}:set_directory", (root,), {}, timeout_s=30
    )
    errors = {rank: res for rank, (ok, res) in enumerate(outcomes) if not ok}
    if errors:
        raise errors_by_process(f"telling the engines the root {root}", errors)


def _run_barrier(
    cluster: JaxCluster,
    name: str,
    timeout_s: float,
    processes: list[int] | None,
    root: str | None,
    key: str | None,
) -> BarrierReport:
    """:meth:`CheckpointClient.barrier`, on ``cluster``, its arguments checked."""
    import ipyparallel as ipp

    targets = _targets(cluster.engine_ids, processes)
    cluster.check_alive()  # a dead engine: one clear line, before anything is sent
    view = cluster.client.direct_view(targets=targets)
    try:
        results = view.apply_async(
            remote(f"{AGENT}:barrier"),
            name,
            timeout_s=timeout_s,
            processes=processes,
            root=root,
            key=key or call_key(),
        ).get(timeout=timeout_s + 30)
    except (ipp.error.RemoteError, ipp.error.EngineError) as e:  # CompositeError too
        raise engine_errors(e, cluster.ranks, f"barrier {name!r}") from None
    return BarrierReport(
        name=name,
        key=results[0]["key"],
        entered={r["process"]: r["entered"] for r in results},
        left={r["process"]: r["left"] for r in results},
    )


def _engine_reports(cluster: JaxCluster, health: dict[int, str]) -> list[Any]:
    """The engines' status reports, when process 0 is alive (else none).

    Asked of each engine's service, which answers while a cell keeps the engine busy;
    ``busy`` says whether one does (the controller's queue for that engine).
    """
    alive = [p for p, h in health.items() if h == "alive"]
    if not alive or 0 not in alive:
        return []
    engines = []
    try:
        if cluster.relay is not None:
            engines = [cluster.relay.ask(p, STATUS) for p in alive]
        else:
            view = cluster.client.direct_view(targets=[cluster.engine_ids[p] for p in alive])
            engines = list(view.apply_async(remote(f"{AGENT}:status")).get(timeout=30))
        busy = set(cluster.busy(alive))
    except Exception:  # an engine died meanwhile: the health line says which
        return engines
    for p, report in zip(alive, engines, strict=False):
        report["busy"] = p in busy
    return engines


class CheckpointClient(RootPolicies):
    """Drive checkpoints on every engine of a cluster from the notebook.

    Parameters
    ----------
    cluster
        A started or attached :class:`~nbckpt.session.cluster.JaxCluster`.
    directory
        Default checkpoint root for calls that do not name one.
    """

    def __init__(
        self, cluster: JaxCluster, directory: str | os.PathLike[str] | None = None
    ) -> None:
        self.cluster = cluster
        self.directory = None if directory is None else str(storage.location(directory))
        self.handles: list[SaveHandle] = []
        self._acknowledged: set[str] = set()

    @property
    def reader(self) -> reads.Reader:
        """Where this client's reads of checkpoint records run: its cluster's reader."""
        reader: reads.Reader = getattr(self.cluster, "reader", reads.LOCAL)
        return reader

    def _acknowledge(self, op: str) -> None:
        self._acknowledged.add(op)

    def root(self, directory: str | os.PathLike[str] | None = None) -> str:
        """Return the checkpoint root to use: ``directory``, or the default one.

        Raises
        ------
        ValueError
            If neither is set.
        """
        if directory is not None:
            return str(storage.location(directory))
        if self.directory is None:
            raise ValueError(
                "no checkpoint directory: pass --dir, or start the cluster with --dir D"
            )
        return self.directory

    def save(
        self,
        var: str,
        step: int,
        *,
        directory: str | os.PathLike[str] | None = None,
        mode: Mode | None = None,
        force: bool = False,
        timeout_s: float = DEFAULT_SAVE_TIMEOUT_S,
        metrics: Mapping[str, float] | None = None,
        format: str = "nbckpt",
        persistent: bool | None = None,
        pack_bytes: int | None = None,
    ) -> SaveHandle:
        """Start saving the engines' variable ``var`` as ``step``; return at once.

        ``metrics`` are numbers recorded with the step (``{"loss": 0.31}``), by which
        :meth:`retention` may keep the best steps; ``format`` is ``"nbckpt"`` (zarr
        arrays, and the leaves whose shards are each of at most ``pack_bytes`` packed
        in one file per process; None: 4 MiB, 0: none, so that Orbax reads the step
        too) or
        ``"orbax"`` (Orbax's own OCDBT layout).
        ``persistent=True`` sends a step to the root whatever the local tier's
        ``persistent_every`` says (None: as it says; see :meth:`tiers`).

        Raises
        ------
        ValueError
            If ``timeout_s`` is not a positive number of seconds, or a metric is not a
            finite number under a valid name (nothing is sent).
        ClusterError
            If an engine refused (unknown variable, existing step, unwritable root,
            unsupported leaf, or the previous save's failure); it names the processes.
        """
        timeout_s = check_timeout(timeout_s, "timeout_s")
        root = self.root(directory)
        storage.commit_mode(storage.location(root), mode)  # refuses rename on a bucket
        checked = check_metrics(metrics)  # NumPy and jax scalars become Python floats
        results = _start_on_engines(
            self.cluster,
            (var, step, root),
            {
                "mode": mode,
                "force": force,
                "timeout_s": timeout_s,
                "acknowledged": tuple(sorted(self._acknowledged)),
                "metrics": checked,
                "format": format,
                "persistent": persistent,
                # Only when asked for: an engine of an older nbckpt takes the rest.
                **({} if pack_bytes is None else {"pack_bytes": pack_bytes}),
            },
        )
        blocked = [r["blocked_s"] for r in results]
        handle = SaveHandle(
            op=results[0]["op"], step=step, root=root, blocked_s=blocked, client=self
        )
        self.handles.append(handle)
        return handle

    def wait(self, timeout_s: float | None = None) -> list[OperationRecord]:
        """Wait for every save not reported yet; return their records.

        A save that committed before this call is reported too, so ``%ckpt_save``
        followed by ``%ckpt_wait`` always says how the save ended.

        Raises
        ------
        ValueError
            If ``timeout_s`` is given and not a positive number of seconds.
        SaveFailedError
            For the first save that failed (after waiting for all of them).
        """
        timeout_s = check_optional_timeout(timeout_s)
        records, first_error = [], None
        for handle in [h for h in self.handles if not h.reported]:
            try:
                records.append(handle.wait(timeout_s))
            except SaveFailedError as e:
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        return records

    def restore(
        self,
        var: str,
        step: int | None = None,
        *,
        directory: str | os.PathLike[str] | None = None,
        timeout_s: float = DEFAULT_SAVE_TIMEOUT_S,
        item: str | None = None,
    ) -> list[dict[str, Any]]:
        """Restore ``step`` (None: latest) into the engines' variable ``var``.

        If ``var`` already holds a tree on the engines, it is the target: its jax arrays
        and ``jax.ShapeDtypeStruct`` leaves give each leaf's shape, dtype and sharding
        (the current mesh), and its other leaves must keep their shape and dtype; a tree
        that differs from the saved one is refused and ``var`` is left as it was.
        Otherwise the saved layout is used. ``timeout_s``
        is the engines' deadline for each of their waits on one another. ``item``
        names the item of an Orbax ``CheckpointManager`` step that holds several.

        Raises
        ------
        ValueError
            If ``timeout_s`` is not a positive number of seconds (nothing is sent).
        """
        timeout_s = check_timeout(timeout_s, "timeout_s")
        self.cluster.check_alive()  # a dead engine: one clear line, before anything is sent
        root = self.root(directory)
        # Reading a large step may take long, so the client sets no deadline of its
        # own: the engines' waits carry theirs, and a dead engine answers at once.
        return self.cluster.apply(
            _interactive(_in_namespace),
            f"{AGENT}:restore_var",
            (var, root, step),
            {
                "key": call_key(),
                "timeout_s": timeout_s,
                "item": item,
                "acknowledged": tuple(sorted(self._acknowledged)),
            },
            what=f"restore of {var!r}",
            timeout_s=None,
        )

    def barrier(
        self,
        name: str,
        *,
        timeout_s: float = DEFAULT_BARRIER_TIMEOUT_S,
        processes: list[int] | None = None,
        key: str | None = None,
    ) -> BarrierReport:
        """Wait at a coordination-service barrier on the engines; report the timings.

        ``key`` (default: a fresh one) makes the use unique; with a default directory
        the barrier is journaled as ``<time>-barrier-<key>-<name>``, so a caller that
        picks the key can follow it while it waits.

        Raises
        ------
        ValueError
            If ``timeout_s`` is not a positive number of seconds, or ``processes`` is
            empty or names a process this cluster does not have (nothing is sent).
        """
        timeout_s = check_timeout(timeout_s, "timeout_s")
        return _run_barrier(self.cluster, name, timeout_s, processes, self.directory, key)

    def fault(
        self,
        kind: str,
        process: int | None = None,
        *,
        at: str | None = None,
        seconds: float | None = None,
        factor: float | None = None,
    ) -> dict[int, list[str]]:
        """Arm (or list, or clear) a fault; see :mod:`nbckpt.engine.faults`.

        ``kill``, ``stall``, ``slow-io``, ``fail-io`` and ``preempt`` (SIGTERM, sent
        through the engine's nanny so that it reaches a busy engine) act on ``process``
        only; ``list``
        and ``clear`` on every process. Returns the faults armed, per process. A ``kill``
        without ``at`` kills the process at once.
        """
        return arm_fault(self.cluster, kind, process, at=at, seconds=seconds, factor=factor)

    def status(self) -> dict[str, Any]:
        """The engines' reports, their health and the saves this notebook started."""
        health = self.cluster.health()
        engines = _engine_reports(self.cluster, health)
        return {
            "health": health,
            "engines": engines,
            "saves": [
                {"op": h.op, "step": h.step, "root": h.root, "status": h.status()}
                for h in self.handles
            ],
            "directory": self.directory,
        }
