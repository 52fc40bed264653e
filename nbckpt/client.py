"""The notebook-side API that the magics call: save, restore, barrier, wait, status, ls.

Every call runs on all engines of a :class:`~nbckpt.cluster.JaxCluster`. ``save``
returns a :class:`SaveHandle` as soon as the engines have taken their snapshot; the
commit goes on in the engines' background threads, and the handle follows it through
the journal. Nothing here imports jax.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbckpt.cluster import (
    ENGINE_DIED,
    ClusterError,
    ClusterGoneError,
    JaxCluster,
    errors_by_process,
)
from nbckpt.inventory import classify
from nbckpt.journal import OperationRecord, read_operation
from nbckpt.layout import Mode, is_complete, step_dir

__all__ = ["BarrierReport", "CheckpointClient", "SaveFailedError", "SaveHandle", "list_steps"]


class SaveFailedError(ClusterError):
    """A save failed on one or more processes; nothing was committed for its step."""


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


def _engine_save(
    var: str,
    step: int,
    root: str,
    mode: Mode,
    force: bool,
    timeout_s: float,
    acknowledged: tuple[str, ...],
    key: str,
) -> dict[str, Any]:
    ns = globals()
    if var not in ns:
        raise NameError(f"name {var!r} is not defined on this engine; build it with %%px first")
    from nbckpt.engine import agent

    return agent.save(
        ns[var],
        step,
        root,
        mode=mode,
        force=force,
        timeout_s=timeout_s,
        acknowledged=acknowledged,
        key=key,
    )


def _engine_restore(var: str, root: str, step: int | None, key: str) -> dict[str, Any]:
    ns = globals()
    from nbckpt.engine import agent

    tree, info = agent.restore(root, step, ns.get(var), key=key)
    ns[var] = tree
    return info


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
    """

    op: str
    step: int
    root: str
    blocked_s: list[float]
    client: CheckpointClient = field(repr=False)
    #: Whether a wait has already reported how this save ended.
    reported: bool = field(default=False, repr=False)

    def record(self) -> OperationRecord:
        """The merged journal of this save, as it stands now."""
        return read_operation(self.root, self.op)

    def status(self) -> str:
        """``"running"``, ``"committed"`` or ``"failed"``."""
        return self.record().status

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
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        dead_since: float | None = None
        while True:
            rec = self.record()
            if rec.status == "failed":
                # Give the other processes a moment to journal their own outcome, so
                # the error names every process that failed, not just the fastest.
                settle = time.monotonic() + 2.0
                while time.monotonic() < settle and any(
                    r.status == "running" for r in rec.processes.values()
                ):
                    time.sleep(poll_s)
                    rec = self.record()
                self.client._acknowledge(self.op)
                self.reported = True
                raise _failure(rec, self.root)
            if rec.status != "running":
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

    def __repr__(self) -> str:
        return f"<SaveHandle step {self.step} -> {self.root} ({self.op}): {self.status()}>"


_CONSEQUENCE = re.compile(r"^process(es)? [\d, ]+ (failed|died)")


def _failure(rec: OperationRecord, root: str) -> SaveFailedError:
    """One error for a failed save, led by its causes rather than by who gave up."""
    errors = {p: r.error or "failed" for p, r in rec.processes.items() if r.status == "failed"}

    def failed_at(p: int) -> float:
        times = [
            float(e.get("t", 0.0)) for e in rec.processes[p].events if e.get("event") == "failed"
        ]
        return min(times, default=float("inf"))

    # A process whose error only reports a peer's failure or death gave up; the others
    # failed on their own. If all of them only report (a peer died), the first speaks.
    causes = [p for p in errors if not _CONSEQUENCE.match(errors[p])]
    if not causes:
        causes = [min(errors, key=failed_at)]
    by_text: dict[str, list[int]] = {}
    for p in sorted(causes):
        by_text.setdefault(errors[p], []).append(p)
    what = "; ".join(
        f"{'process' if len(ps) == 1 else 'processes'} {', '.join(map(str, ps))}: {text}"
        for text, ps in by_text.items()
    )
    others = sorted(set(errors) - set(causes))
    then = (
        f" (then {'process' if len(others) == 1 else 'processes'} "
        f"{', '.join(map(str, others))} gave up)"
        if others
        else ""
    )
    committed = rec.step is not None and is_complete(step_dir(root, rec.step))
    outcome = (
        "the step had been committed before the failure and is complete on disk"
        if committed
        else "nothing was committed for this step"
    )
    return SaveFailedError(
        f"save of step {rec.step} ({rec.op}) failed on {what}{then}; {outcome}", sorted(errors)
    )


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
        A started or attached :class:`~nbckpt.cluster.JaxCluster`.
    directory
        Default checkpoint root for calls that do not name one.
    """

    def __init__(
        self, cluster: JaxCluster, directory: str | os.PathLike[str] | None = None
    ) -> None:
        self.cluster = cluster
        self.directory = None if directory is None else os.path.abspath(directory)
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
            return os.path.abspath(directory)
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
        mode: Mode = "rename",
        force: bool = False,
        timeout_s: float = 300.0,
    ) -> SaveHandle:
        """Start saving the engines' variable ``var`` as ``step``; return at once.

        Raises
        ------
        ClusterError
            If an engine refused (unknown variable, existing step, unwritable root,
            unsupported leaf, or the previous save's failure); it names the processes.
        """
        root = self.root(directory)
        acknowledged = tuple(sorted(self._acknowledged))
        # The engines' own deadline (timeout_s) bounds their blocking part; the margin
        # lets their error, rather than a client timeout, come back.
        outcomes = self.cluster.apply_each(
            _interactive(_engine_save),
            var,
            step,
            root,
            mode,
            force,
            timeout_s,
            acknowledged,
            _call_key(),
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

    def pending(self) -> list[SaveHandle]:
        """The saves that have not committed or failed yet."""
        return [h for h in self.handles if not h.done()]

    def wait(self, timeout_s: float | None = None) -> list[OperationRecord]:
        """Wait for every save not reported yet; return their records.

        A save that committed before this call is reported too, so ``%ckpt_save``
        followed by ``%ckpt_wait`` always says how the save ended.

        Raises
        ------
        SaveFailedError
            For the first save that failed (after waiting for all of them).
        """
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
        self, var: str, step: int | None = None, *, directory: str | os.PathLike[str] | None = None
    ) -> list[dict[str, Any]]:
        """Restore ``step`` (None: latest) into the engines' variable ``var``.

        If ``var`` already holds a tree on the engines, its jax arrays' shardings (the
        current mesh) are the target; otherwise the saved layout is used.
        """
        root = self.root(directory)
        # A large restore may take long; the engines' barriers carry the deadlines.
        return self.cluster.apply(
            _interactive(_engine_restore),
            var,
            root,
            step,
            _call_key(),
            what=f"restore of {var!r}",
            timeout_s=None,
        )

    def barrier(
        self,
        name: str,
        *,
        timeout_s: float = 60.0,
        processes: list[int] | None = None,
        key: str | None = None,
    ) -> BarrierReport:
        """Wait at a coordination-service barrier on the engines; report the timings.

        ``key`` (default: a fresh one) makes the use unique; with a default directory
        the barrier is journaled as ``<time>-barrier-<key>-<name>``, so a caller that
        picks the key can follow it while it waits.
        """
        from nbckpt.engine import agent

        n = len(self.cluster.engine_ids)
        if processes is not None:
            bad = [p for p in processes if not 0 <= p < n]
            if bad:
                raise ValueError(f"no process {bad[0]}: this cluster has processes 0..{n - 1}")
            targets = [self.cluster.engine_ids[p] for p in processes]
        else:
            targets = self.cluster.engine_ids
        import ipyparallel as ipp

        view = self.cluster.client.direct_view(targets=targets)
        try:
            results = view.apply_async(
                agent.barrier,
                name,
                timeout_s=timeout_s,
                processes=processes,
                root=self.directory,
                key=key or _call_key(),
            ).get(timeout=timeout_s + 30)
        except (ipp.error.RemoteError, ipp.error.CompositeError) as e:
            from nbckpt.cluster import engine_errors

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

        from nbckpt.engine import agent

        n = len(self.cluster.engine_ids)
        if kind in ("list", "clear"):
            res = self.cluster.apply(agent.fault, kind, what=f"fault {kind}", timeout_s=30)
            return dict(enumerate(res))
        if process is None or not 0 <= process < n:
            raise ValueError(f"--process must be one of 0..{n - 1}, got {process}")
        self.cluster.check_alive()
        engine = self.cluster.client[self.cluster.engine_ids[process]]
        ar = engine.apply_async(agent.fault, kind, at=at, seconds=seconds, factor=factor)
        try:
            armed = ar.get(timeout=30)
        except (ipp.error.EngineError, ipp.error.RemoteError) as e:
            died = isinstance(e, ipp.error.EngineError) or getattr(e, "ename", "") == "EngineError"
            if kind == "kill" and at is None and died:
                return {process: ["killed"]}  # the answer we asked for
            from nbckpt.cluster import engine_errors

            raise engine_errors(e, self.cluster.ranks, f"fault {kind}") from None
        return {process: list(armed)}

    def status(self) -> dict[str, Any]:
        """The engines' reports, their health and the saves this notebook started."""
        health = self.cluster.health()
        alive = [p for p, h in health.items() if h == "alive"]
        engines = []
        if alive and 0 in alive:
            from nbckpt.engine import agent

            view = self.cluster.client.direct_view(
                targets=[self.cluster.engine_ids[p] for p in alive]
            )
            engines = list(view.apply_async(agent.status).get(timeout=30))
        return {
            "health": health,
            "engines": engines,
            "saves": [
                {"op": h.op, "step": h.step, "root": h.root, "status": h.status()}
                for h in self.handles
            ],
            "directory": self.directory,
        }

    def ls(self, directory: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
        """The steps under a root (default: this client's directory); see :func:`list_steps`."""
        return list_steps(self.root(directory))


def list_steps(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """List every entry of a root with its state (see :mod:`nbckpt.inventory`).

    Raises
    ------
    FileNotFoundError
        If ``root`` is not a directory.
    """
    path = Path(root).absolute()
    if not path.is_dir():
        raise FileNotFoundError(f"no directory {path}; check the path, or save there first")
    return [
        {"step": e.step, "state": e.state, "path": str(path / e.path), "reason": e.reason}
        for e in classify(path)
    ]
