"""The notebook-side API that the magics call: save, restore, barrier, wait, status, fault.

Every call runs on all engines of a :class:`~nbckpt.session.cluster.JaxCluster`. ``save``
returns a :class:`SaveHandle` as soon as the engines have taken their snapshot; the
commit goes on in the engines' background threads, and the handle follows it through
the journal. Nothing here imports jax or :mod:`nbckpt.engine`: engine functions are
named (``"nbckpt.engine.remote.agent:save_var"``) and imported on the engines.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbckpt import storage
from nbckpt.errors import ClusterGoneError, SaveFailedError, by_process, who
from nbckpt.formats.layout import Mode, step_dir
from nbckpt.formats.retention import RetentionPolicy, check_metrics
from nbckpt.journal import OperationRecord, ProcessRecord, merge_events
from nbckpt.protocol import (
    DEFAULT_BARRIER_TIMEOUT_S,
    DEFAULT_SAVE_TIMEOUT_S,
    Cause,
    Event,
    Status,
    check_timeout,
)
from nbckpt.session import reads
from nbckpt.session.cluster import (
    AGENT,
    ENGINE_DIED,
    JaxCluster,
    engine_errors,
    errors_by_process,
    remote,
)

__all__ = [
    "BarrierReport",
    "CheckpointClient",
    "SaveFailedError",
    "SaveHandle",
    "resolve_operation",
]


def _call_key() -> str:
    """A fresh id for one collective call, sent to every engine.

    Engines match the parts of one call by this id rather than by counting calls,
    so a call that failed on only some engines cannot put them out of step.
    """
    return uuid.uuid4().hex[:16]


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


def _timeout(value: float | None, what: str = "timeout_s") -> float | None:
    """Check a timeout before anything is sent; None stays None (no limit)."""
    return None if value is None else check_timeout(value, what)


@dataclass
class SaveHandle:
    """A save running on the engines. Its journal is the source of truth.

    Attributes
    ----------
    op
        The operation id (``<root>/.nbckpt/ops/<op>``).
    step, root
        What is being saved where.
    blocked_s
        Per process, how long ``save`` blocked the engine (the snapshot).

    Notes
    -----
    Its ``repr`` reads the journal each time until the save has ended (then the end
    is kept: it cannot change). In a notebook the handle is shown by
    :meth:`live_status`, which keeps that text current from the journal by itself,
    so an ``Out`` cell never says ``running`` under a save that has committed.
    """

    op: str
    step: int
    root: str
    blocked_s: list[float]
    client: CheckpointClient = field(repr=False)
    #: Whether a wait has already reported how this save ended.
    reported: bool = field(default=False, repr=False)
    #: How the save ended, once the journal says so (it cannot change after).
    _ended: str | None = field(default=None, init=False, repr=False)

    def record(self) -> OperationRecord:
        """The merged journal of this save, as it stands now (running until it appears).

        On an object store a process's first events reach the bucket up to a quarter of
        a second after ``save`` returned (its journal is put whole, once per flush).
        """
        try:
            record: OperationRecord = reads.run(reads.READ_OPERATION, self.root, self.op)
        except FileNotFoundError:
            return merge_events(self.op, {})
        return record

    def status(self) -> str:
        """:class:`~nbckpt.protocol.Status` ``RUNNING``, ``COMMITTED`` or ``FAILED``."""
        if self._ended is not None:
            return self._ended
        status = self.record().status
        if status != Status.RUNNING:
            self._ended = status
        return status

    def done(self) -> bool:
        """Tell whether the save has committed or failed."""
        return self.status() != "running"

    def wait(self, timeout_s: float | None = None, poll_s: float = 0.05) -> OperationRecord:
        """Wait until the save commits; return its journal record.

        Raises
        ------
        SaveFailedError
            If it failed; the message names the processes and their errors.
        TimeoutError
            If ``timeout_s`` passes first (the save goes on).
        """
        timeout_s = _timeout(timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        dead_since: float | None = None
        while True:
            rec = self.record()
            if rec.status == Status.FAILED:
                # Give the other processes a moment to journal their own outcome, so
                # the error names every process that failed, not just the fastest.
                settle = time.monotonic() + 2.0
                while time.monotonic() < settle and any(
                    r.status == Status.RUNNING for r in rec.processes.values()
                ):
                    time.sleep(poll_s)
                    rec = self.record()
                self.client._acknowledge(self.op)
                self.reported = True
                raise _failure(rec, self.root)
            if rec.status != Status.RUNNING:
                self.reported = True
                return rec
            dead = self.client.cluster.dead_processes()
            if 0 in dead:
                raise ClusterGoneError()
            if dead:
                # Survivors journal the failure within seconds; if they do not (all of
                # them died), say so from the controller's view.
                dead_since = dead_since or time.monotonic()
                if time.monotonic() - dead_since > 8:
                    self.client._acknowledge(self.op)
                    self.client.cluster.check_alive()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"step {self.step} ({self.op}) is still running after {timeout_s:g} s; "
                    "%ckpt_status shows where each process is"
                )
            time.sleep(poll_s)

    def _text(self, status: str) -> str:
        return f"<SaveHandle step {self.step} -> {self.root} ({self.op}): {status}>"

    def __repr__(self) -> str:
        return self._text(self.status())

    def live_status(self) -> Any:
        """Return a widget that shows this handle's ``repr``, kept current by itself.

        An ``ipywidgets.Label`` whose text follows the save's journal (a
        :class:`~nbckpt.widgets.live.LiveUpdater`, its ``live`` attribute) until the
        save has ended; the notebook shows it instead of a ``repr`` frozen at the
        moment the cell ended.
        """
        import ipywidgets

        from nbckpt.views.monitor import JournalTailer
        from nbckpt.widgets.live import LiveUpdater

        label = ipywidgets.Label(value=repr(self))

        def show(view: Any) -> None:
            if view.status != Status.RUNNING:
                self._ended = view.status
            label.value = self._text(view.status)

        label.live = None
        if self._ended is None:
            label.live = LiveUpdater(JournalTailer(self.root, self.op), show).start()
        return label

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        # In a kernel, a save still running is shown by a label that keeps up with it;
        # elsewhere (a terminal, a finished save) the text is all there is to show.
        from nbckpt.widgets.live import kernel_loop

        if kernel_loop() is None or self.status() != Status.RUNNING:
            return None
        label = self.live_status()
        bundle = label._repr_mimebundle_(**kwargs)
        if not isinstance(bundle, dict):
            return None
        return {**bundle, "text/plain": label.value}


def _failed_event(proc: ProcessRecord) -> dict[str, Any]:
    """The last ``failed`` event a process journaled (empty if none), as the reader's."""
    return next((e for e in reversed(proc.events) if e.get("event") == Event.FAILED), {})


def _failure(rec: OperationRecord, root: str) -> SaveFailedError:
    """One error for a failed save, led by its causes rather than by who gave up.

    Each ``failed`` event says, as data, whether its process failed on its own
    (``cause`` ``error``) or gave up because of another (``culprit``); an event
    without a cause, from a journal older than that field, counts as its own error.
    """
    failed = {p: r for p, r in rec.processes.items() if r.status == Status.FAILED}
    events = {p: _failed_event(r) for p, r in failed.items()}
    errors = {p: r.error or str(Status.FAILED) for p, r in failed.items()}
    causes = {p: errors[p] for p in failed if events[p].get("cause", Cause.ERROR) == Cause.ERROR}
    if not causes:
        # Every process gave up because of one that journaled nothing (it died, or
        # never arrived); the first to notice says what happened to it.
        first = min(failed, key=lambda p: float(events[p].get("t", float("inf"))))
        causes = {first: errors[first]}
    others = sorted(set(errors) - set(causes))
    then = f" (then {who(others)} gave up)" if others else ""
    return SaveFailedError(
        f"save of step {rec.step} ({rec.op}) failed on {by_process(causes)}{then}; "
        f"{_outcome(rec, root, list(events.values()))}",
        sorted(errors),
        causes=errors,
    )


def _outcome(rec: OperationRecord, root: str, failed: list[dict[str, Any]]) -> str:
    """What a failed save left of its step on disk, in words."""
    if rec.step is None:
        return "nothing was committed"
    path = step_dir(root, rec.step)
    complete = reads.run(reads.IS_COMPLETE, path)
    if complete:
        meta = reads.run(reads.READ_METADATA, path) or {}
        finalized = any(
            e.get("event") == Event.FINALIZED for r in rec.processes.values() for e in r.events
        )
        if meta.get("op") == rec.op or finalized or any(e.get("committed") for e in failed):
            return "the step had been committed before the failure and is complete on disk"
    # A forced re-save that failed keeps the step committed before it. Journals older
    # than ``previous_kept`` do not say so, but a complete step that this save did not
    # commit can only be that one.
    if complete or any(e.get("previous_kept") for e in failed):
        return f"the previously committed step {rec.step} is untouched"
    return "nothing was committed for this step"


@dataclass
class BarrierReport:
    """When each process arrived at and left a barrier (wall times)."""

    name: str
    key: str
    entered: dict[int, float]
    left: dict[int, float]

    def table(self) -> str:
        """A text table: per process, arrival and release relative to the first arrival."""
        t0 = min(self.entered.values())
        lines = [
            f"barrier {self.name!r} (key nbckpt/{self.key})",
            "process  arrived (ms)  left (ms)  waited (ms)",
        ]
        for p in sorted(self.entered):
            a, b = self.entered[p] - t0, self.left[p] - t0
            lines.append(f"{p:>7}  {a * 1e3:>12.1f}  {b * 1e3:>9.1f}  {(b - a) * 1e3:>11.1f}")
        return "\n".join(lines)


class CheckpointClient:
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
    ) -> SaveHandle:
        """Start saving the engines' variable ``var`` as ``step``; return at once.

        ``metrics`` are numbers recorded with the step (``{"loss": 0.31}``), by which
        :meth:`retention` may keep the best steps; ``format`` is ``"nbckpt"`` (zarr
        arrays that Orbax reads too) or ``"orbax"`` (Orbax's own OCDBT layout).

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
        self.cluster.check_alive()  # a dead engine: one clear line, before anything is sent
        acknowledged = tuple(sorted(self._acknowledged))
        # The engines' own deadline (timeout_s) bounds their blocking part; the margin
        # lets their error, rather than a client timeout, come back.
        outcomes = self.cluster.apply_each(
            _interactive(_in_namespace),
            f"{AGENT}:save_var",
            (var, step, root),
            {
                "mode": mode,
                "force": force,
                "timeout_s": timeout_s,
                "acknowledged": acknowledged,
                "key": _call_key(),
                "metrics": checked,
                "format": format,
            },
            timeout_s=timeout_s + 60,
        )
        errors = {rank: res for rank, (ok, res) in enumerate(outcomes) if not ok}
        results = [res for ok, res in outcomes if ok]
        # An engine that died after its snapshot (a kill at an early phase) does not
        # stop the save: the others go on, and the journal and the handle report it.
        if errors and (not results or any(t != ENGINE_DIED for t in errors.values())):
            raise errors_by_process(f"save of {var!r} as step {step}", errors)
        handle = SaveHandle(
            op=results[0]["op"],
            step=step,
            root=root,
            blocked_s=[r["blocked_s"] for r in results],
            client=self,
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
        timeout_s = _timeout(timeout_s)
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
                "key": _call_key(),
                "timeout_s": timeout_s,
                "item": item,
                "acknowledged": tuple(sorted(self._acknowledged)),
            },
            what=f"restore of {var!r}",
            timeout_s=None,
        )

    def retention(
        self,
        policy: RetentionPolicy | None = None,
        *,
        directory: str | os.PathLike[str] | None = None,
    ) -> dict[str, Any]:
        """Set the retention policy of a root on every engine (None: only read it).

        The primary applies it after each commit from then on, removing only steps
        nbckpt created. Returns ``{"policy": ..., "text": ..., "root": ...}`` as
        process 0 holds it.
        """
        self.cluster.check_alive()
        root = self.root(directory)
        fields = None if policy is None else policy.as_dict()
        results = self.cluster.apply(
            f"{AGENT}:set_retention", root, fields, what="retention policy", timeout_s=60
        )
        return dict(results[0])

    def should_save(self, step: int, *, directory: str | os.PathLike[str] | None = None) -> bool:
        """Tell whether ``step`` is due for a save under the root's retention policy.

        False if the root already holds a complete step at or after ``step``; otherwise
        True when the policy's ``save_interval_steps`` is unset or divides ``step``.
        """
        self.cluster.check_alive()
        root = self.root(directory)
        answers = self.cluster.apply(
            f"{AGENT}:should_save", root, step, what="should_save", timeout_s=60
        )
        return bool(answers[0])

    def rollback(self, step: int, *, directory: str | os.PathLike[str] | None = None) -> list[int]:
        """Delete the root's complete steps newer than ``step``, so training goes on from it.

        A save of a step older than the newest one is refused (retention would delete
        it, and a restore would pick the newer step); this is the way back. Only steps
        nbckpt created are removed, each crash-safely. Returns the removed steps.
        """
        self.cluster.check_alive()
        root = self.root(directory)
        removed = self.cluster.apply(
            f"{AGENT}:rollback", root, step, what="rollback", timeout_s=120
        )
        return [int(s) for s in removed[0]]

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
        import ipyparallel as ipp

        timeout_s = check_timeout(timeout_s, "timeout_s")
        n = len(self.cluster.engine_ids)
        if processes is not None:
            if not processes:
                raise ValueError("processes is empty: name at least one process, or none for all")
            bad = [p for p in processes if not 0 <= p < n]
            if bad:
                raise ValueError(f"no process {bad[0]}: this cluster has processes 0..{n - 1}")
            targets = [self.cluster.engine_ids[p] for p in processes]
        else:
            targets = self.cluster.engine_ids
        self.cluster.check_alive()  # a dead engine: one clear line, before anything is sent
        view = self.cluster.client.direct_view(targets=targets)
        try:
            results = view.apply_async(
                remote(f"{AGENT}:barrier"),
                name,
                timeout_s=timeout_s,
                processes=processes,
                root=self.directory,
                key=key or _call_key(),
            ).get(timeout=timeout_s + 30)
        except (ipp.error.RemoteError, ipp.error.EngineError) as e:  # CompositeError too
            raise engine_errors(e, self.cluster.ranks, f"barrier {name!r}") from None
        return BarrierReport(
            name=name,
            key=results[0]["key"],
            entered={r["process"]: r["entered"] for r in results},
            left={r["process"]: r["left"] for r in results},
        )

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

        ``kill``, ``stall``, ``slow-io`` and ``fail-io`` act on ``process`` only; ``list``
        and ``clear`` on every process. Returns the faults armed, per process. A ``kill``
        without ``at`` kills the process at once.
        """
        import ipyparallel as ipp

        fault = remote(f"{AGENT}:fault")
        n = len(self.cluster.engine_ids)
        if kind in ("list", "clear"):
            res = self.cluster.apply(fault, kind, what=f"fault {kind}", timeout_s=30)
            return dict(enumerate(res))
        if process is None or not 0 <= process < n:
            raise ValueError(f"--process must be one of 0..{n - 1}, got {process}")
        self.cluster.check_alive()
        engine = self.cluster.client[self.cluster.engine_ids[process]]
        ar = engine.apply_async(fault, kind, at=at, seconds=seconds, factor=factor)
        try:
            armed = ar.get(timeout=30)
        except (ipp.error.EngineError, ipp.error.RemoteError) as e:
            died = isinstance(e, ipp.error.EngineError) or getattr(e, "ename", "") == "EngineError"
            if kind == "kill" and at is None and died:
                return {process: ["killed"]}  # the answer we asked for
            raise engine_errors(e, self.cluster.ranks, f"fault {kind}") from None
        return {process: list(armed)}

    def status(self) -> dict[str, Any]:
        """The engines' reports, their health and the saves this notebook started."""
        health = self.cluster.health()
        alive = [p for p, h in health.items() if h == "alive"]
        engines = []
        if alive and 0 in alive:
            view = self.cluster.client.direct_view(
                targets=[self.cluster.engine_ids[p] for p in alive]
            )
            try:
                engines = list(view.apply_async(remote(f"{AGENT}:status")).get(timeout=30))
            except Exception:  # an engine died meanwhile: the health line says which
                engines = []
        return {
            "health": health,
            "engines": engines,
            "saves": [
                {"op": h.op, "step": h.step, "root": h.root, "status": h.status()}
                for h in self.handles
            ],
            "directory": self.directory,
        }


def resolve_operation(
    op: str | None, directory: str | None, client: CheckpointClient | None
) -> tuple[str, str]:
    """Find one journaled operation: return its ``(root, op)``.

    Parameters
    ----------
    op
        An operation id, or the path of its journal folder ``<root>/.nbckpt/ops/<op>``
        (which names its root too). None: ``client``'s last save, else the newest
        operation in the directory.
    directory
        The checkpoint root (default: ``client``'s directory).
    client
        The session's client, if a cluster was started.

    Raises
    ------
    ValueError
        If no directory is known, it holds no operation, or it has no ``op`` (the
        message lists the latest three).
    """
    folder = None if op is None else Path(op).expanduser()
    if folder is not None and folder.is_dir() and folder.parent.name == "ops":
        folder = folder.absolute()
        return str(folder.parents[2]), folder.name
    if directory is not None:
        root = str(storage.location(directory))
    elif op is None and client is not None and client.handles:
        return client.handles[-1].root, client.handles[-1].op
    elif client is not None and client.directory is not None:
        root = client.directory
    else:
        raise ValueError("which checkpoint directory? pass --dir D (or start the cluster)")
    known: list[str] = reads.run(reads.LIST_OPERATIONS, root)
    if op is None:
        if not known:
            raise ValueError(f"no journaled operations in {root}")
        op = known[-1]
    # An op is a folder name: nothing that could lead out of the journal's folder.
    if op in (".", "..") or "/" in op or "\\" in op or "\0" in op or op not in known:
        latest = ", ".join(known[-3:]) or "none"
        raise ValueError(f"no operation {op!r} in {root}; latest: {latest}")
    return root, op
