"""The preflight: every process checks, before anyone writes, that an operation can go.

Each process posts what it found wrong (or nothing) to the primary over the key-value
store; the primary reads them all, with its operation id, and publishes one decision.
Every process then raises the same error, so a bad root, an existing or foreign step,
or a tree one process cannot save never leaves a half-started save, nor peers waiting
out their deadline.

A save's preflight also settles three things before anything is written: every
process posts its plan (options and tree structure) and a mismatch fails them all
(:mod:`nbckpt.engine.save.agreement`); a step older than the newest one is refused (a
rollback goes through ``prune_after``); and the primary claims the step's working
directory, so that another job saving the same step is refused at once
(:mod:`nbckpt.engine.save.ownership`). A save that does not start gives its claim back.
"""

from __future__ import annotations

import json
import socket
import uuid
from typing import Any

from nbckpt.engine.save import ownership
from nbckpt.engine.save.advice import reason
from nbckpt.engine.save.agreement import decision_of, disagreement, plan_digest
from nbckpt.engine.save.commit import CommitStrategy
from nbckpt.engine.save.prune import records
from nbckpt.engine.sync import hostbarrier
from nbckpt.engine.sync.barriers import Synchronizer, claim_key, next_sequence
from nbckpt.errors import (
    CommitRefusedError,
    DisagreementError,
    ForeignEntryError,
    PeerFailedError,
    RollbackRefusedError,
    RootNotWritableError,
    StepBusyError,
    StepExistsError,
    StepNotFoundError,
    StorageError,
)
from nbckpt.formats.layout import all_steps, is_complete, latest_step, step_dir
from nbckpt.pools import LazyPool
from nbckpt.protocol import Kind, Status, barrier_key, new_op_id, parse_op_id
from nbckpt.storage import Location

__all__ = ["Preflight"]

#: Drops the keys of the primary's earlier operations at the service, off the path of
#: the one starting (a round trip each: 1-2 ms of every save and restore on 2 cores).
_dropping = LazyPool(1, "nbckpt-drop-keys")


def _probe_writable(root: Location, process: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    probe = root / f".nbckpt-probe-{process}-{uuid.uuid4().hex[:8]}"
    probe.write_bytes(b"")
    probe.unlink()


def _raise_problem(root: Location, process: int, problem: dict[str, Any]) -> None:
    """Raise, on every process alike, the error one process's preflight found."""
    kind = problem.get("kind")
    if kind == "root":
        raise RootNotWritableError(str(root), process, problem["reason"])
    if kind == "exists":
        raise StepExistsError(problem["path"])
    if kind == "foreign":
        raise ForeignEntryError(problem["path"])
    if kind == "replace_in_place":
        raise CommitRefusedError(problem["path"])
    if kind == "store":
        raise PeerFailedError(process, f"{problem['reason']}; nothing was saved or restored")
    if kind == "busy":
        raise StepBusyError(problem["path"], problem.get("owner") or {})
    if kind == "rollback":
        raise RollbackRefusedError(str(root), problem["at"], problem["newer"])
    if kind == "missing":
        raise StepNotFoundError(str(root), problem.get("wanted"), all_steps(root))
    raise PeerFailedError(process, str(problem.get("reason", Status.FAILED)))


class Preflight:
    """The agreement that starts every save and restore of one checkpointer.

    Parameters
    ----------
    sync
        The synchronizer of the checkpointer's processes.
    root
        The checkpoint root.
    primary
        The process that creates directories and picks the operation id.
    """

    def __init__(self, sync: Synchronizer, root: Location, primary: int) -> None:
        self.sync = sync
        self.root = root
        self.primary = primary
        self._stale_keys: list[str] = []
        #: The working directory this process (the primary) claimed in the last agreement.
        self._claimed: Location | None = None
        #: The host name of each process, as the last agreement gathered them.
        self.hosts: dict[int, str] = {}
        #: What each process's local tier posted in the last agreement (see ``extra``).
        self.extras: dict[int, dict[str, Any]] = {}

    def _problem(
        self,
        kind: str,
        step: int | None,
        local: BaseException | None,
        strategy: CommitStrategy | None,
        force: bool,
        op: str,
        missing_ok: bool = False,
    ) -> dict[str, Any]:
        """What this process found wrong, as JSON-able data (the primary adds the step)."""
        if local is not None:
            return {"kind": "local", "reason": reason(local, self.root)}
        try:
            found = self._check(kind, step, strategy, force, op)
            if missing_ok and found.get("kind") == "missing":
                return {"step": None}  # the local tier may have it
            return found
        except StorageError as e:
            # The store failed a request: shared like any problem, so that every process
            # fails at once instead of waiting for this one.
            return {"kind": "store", "reason": str(e)}

    def _check(
        self, kind: str, step: int | None, strategy: CommitStrategy | None, force: bool, op: str
    ) -> dict[str, Any]:
        is_primary = self.sync.process_index == self.primary
        if kind == Kind.SAVE:
            # No strategy: a save that goes to the local tier only (nothing to claim).
            assert step is not None
            try:
                _probe_writable(self.root, self.sync.process_index)
            except StorageError:
                raise
            except OSError as e:
                return {"kind": "root", "reason": e.strerror or str(e)}
            if is_primary and strategy is not None:
                return self._save_problem(step, strategy, force, op)
        elif is_primary:
            found = latest_step(self.root) if step is None else step
            if found is None or not is_complete(step_dir(self.root, found)):
                return {"kind": "missing", "wanted": step}
            return {"step": found}
        return {}

    def _save_problem(
        self, step: int, strategy: CommitStrategy, force: bool, op: str
    ) -> dict[str, Any]:
        """Primary: why this save must not start; else claim its working directory."""
        found = strategy.problem(self.root, step, force)
        if found:
            return found
        # Only the steps above this one are read: none, on the usual path.
        later = [s for s in all_steps(self.root) if s > step]
        newer = [r.step for r in records(self.root, later)] if later else []
        if newer:
            # A save below the newest step would be deleted by retention at once, and a
            # restore of the latest would still pick the abandoned run's step. Only
            # nbckpt's steps count: Orbax's in the same root are not this run's.
            return {"kind": "rollback", "at": step, "newer": newer}
        work = strategy.work_dir(self.root, step)
        record = ownership.owner_record(op, strategy.mode, step)
        refused = ownership.claim(self.root, step, work, record)
        if refused:
            return refused
        self._claimed = work
        return {}

    def agree(
        self,
        kind: Kind,
        step: int | None,
        timeout_s: float,
        local: BaseException | None,
        *,
        strategy: CommitStrategy | None = None,
        force: bool = False,
        key: str | None = None,
        plan: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        missing_ok: bool = False,
    ) -> tuple[str, int | None]:
        """Check on every process and agree on an op id; return it and the step.

        For a restore of the latest step (``step`` None), the step is the primary's
        choice. ``local`` is an error this process met before the operation (its
        tree, its target): it is shared, then raised here as the caller raised it.
        ``plan`` (a save's options and tree structure, see
        :mod:`nbckpt.engine.save.agreement`) must be the same on every process.
        ``extra`` (the local tier's host, peer address and holdings) rides along to
        every process's :attr:`extras`. With ``missing_ok``, a restore whose step the
        root lacks agrees on step None instead of failing: the local tier decides.
        """
        if key is not None:
            claim_key(self.sync.client, "save or restore", key)
        seq = f"key-{key}" if key is not None else f"seq{next_sequence()}"
        me = self.sync.process_index
        # The primary names the operation first: its claim on the step records it.
        op = new_op_id(kind, step if step is not None else 0)
        self._claimed = None
        problem = self._problem(kind, step, local, strategy, force, op, missing_ok)
        # The host rides along, so that every process knows, alike, which ones share a
        # host (a restore plans its reads of replicated leaves by it).
        mine: dict[str, Any] = {
            "problem": problem,
            "host": socket.gethostname(),
            "local": hostbarrier.host_key() or None,
        }
        if plan is not None and local is None:
            mine["plan"] = plan_digest(plan)
        if extra is not None:
            mine["tier"] = extra
        if me == self.primary:
            step = problem.pop("step", step)
            if kind != Kind.SAVE:
                op = new_op_id(kind, step if step is not None else 0)
            mine["op"] = op
            mine["step"] = step
            mine["hub"] = hostbarrier.listen()
        try:
            decision = self._decide(seq, mine, timeout_s)
        except BaseException:
            self.release(op)
            raise
        # Everyone has passed the keys of earlier operations: the primary drops them.
        if me == self.primary and self._stale_keys:
            stale, self._stale_keys = self._stale_keys, []
            _dropping.get().submit(self._drop, stale)
        self._stale_keys.append(seq)
        # Every process reads the same decision: they meet at the hub, or none does.
        hostbarrier.join(decision.get("hub"), me, self.sync.process_count, self.primary)
        names = decision["hosts"]
        self.hosts = {
            p: names[i]
            for p, i in zip(decision["processes"], decision["host_of"], strict=True)
            if i >= 0
        }
        self.extras = {int(p): tier for p, tier in decision["tiers"].items()}
        try:
            if local is not None:
                raise local
            if len(decision["plans"]) > 1:
                raise DisagreementError(self._disagreement(seq, decision["plans"], plan, timeout_s))
            if decision["problem"]:
                _raise_problem(self.root, *decision["problem"])
        except BaseException:
            # Nothing was written but the claim: give the step back.
            self.release(op)
            raise
        op = str(decision["op"])
        self._stale_keys.append(op)
        return op, decision["step"]

    def _drop(self, stale: list[str]) -> None:
        for op in stale:
            self.sync.cleanup(op)  # never raises: a key left costs the service a little

    def _decide(self, seq: str, mine: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Every process's answer goes to the primary; its decision comes back to all."""
        answers = self.sync.gather_at(
            seq, "preflight", json.dumps(mine), source=self.primary, timeout_s=timeout_s
        )
        if answers is None:
            got = self.sync.await_value(seq, "decision", source=self.primary, timeout_s=timeout_s)
            decision: dict[str, Any] = json.loads(got)
            return decision
        decision = decision_of({p: json.loads(v) for p, v in answers.items()}, self.primary)
        self.sync.client.key_value_set(barrier_key(seq, "decision"), json.dumps(decision))
        return decision

    def _disagreement(
        self, seq: str, groups: dict[str, list[int]], plan: dict[str, Any] | None, timeout_s: float
    ) -> str:
        """Say what the plans differ in: the first process of each group posts its plan."""
        firsts = {min(ps): ps for ps in groups.values()}
        me = self.sync.process_index
        if me in firsts and plan is not None:
            self.sync.client.key_value_set(barrier_key(seq, f"plan/{me}"), json.dumps(plan))
        plans: dict[int, Any] = {}
        for first, ps in firsts.items():
            got = self.sync.await_value(seq, f"plan/{first}", source=first, timeout_s=timeout_s)
            full = json.loads(got)
            plans.update({p: full for p in ps})
        return disagreement(plans) or "their plans differ"

    def renamed(self, op: str, step: int) -> str:
        """``op`` named for ``step`` instead, alike on every process (its keys dropped later).

        A restore whose local tier chose another step than the root's names its
        operation after the step it reads.
        """
        parsed = parse_op_id(op)
        if parsed is None or parsed.step == step:
            return op
        new = f"{op.rsplit('-', 1)[0]}-{step}"
        self._stale_keys.append(new)
        return new

    def release(self, op: str) -> None:
        """Give back the working directory this process claimed for ``op``, if it did."""
        if self._claimed is not None:
            ownership.release(self._claimed, op)
            self._claimed = None
