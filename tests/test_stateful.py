"""A stateful test of one root: saves, forced re-saves, retention, rollbacks, crashes, fsck.

Hypothesis drives one single-process :class:`AsyncCheckpointer` over real files, and a
model says which steps must be complete and what each holds. After every rule: every
step the model holds restores bit-identically, no other step is complete or half there,
fsck finds nothing corrupt, and the foreign file and folder put in the root at the start
are untouched.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nbckpt.engine import AsyncCheckpointer, hooks
from nbckpt.errors import CheckpointError, RollbackRefusedError, StepExistsError
from nbckpt.formats.fsck import fsck
from nbckpt.formats.inventory import classify
from nbckpt.formats.layout import all_steps, parse_step
from nbckpt.formats.retention import RetentionPolicy, StepRecord
from nbckpt.protocol import PHASES

STEPS = st.integers(min_value=0, max_value=8)
SEEDS = st.integers(min_value=0, max_value=1000)
MODES = st.sampled_from(["rename", "commit_file"])
#: A foreign step-named folder: never nbckpt's, so never written, cleaned or listed.
FOREIGN_STEP = "99"
T = "tests.mh_owner"


def values(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((6, 5)).astype(np.float32),
        "n": np.arange(4, dtype=np.int64) * seed,
        "s": seed,
    }


def _same(got: dict[str, Any], want: dict[str, Any]) -> bool:
    if set(got) != set(want) or got["s"] != want["s"]:
        return False
    return all(
        np.asarray(got[k]).dtype == want[k].dtype
        and np.asarray(got[k]).tobytes() == want[k].tobytes()
        for k in ("w", "n")
    )


Outcome = tuple[str | None, bool]
"""What a save ended with: its error's class name (None if committed), and whether the
error says the step was committed all the same."""


class InProcess:
    """Runs the machine's calls on one checkpointer of this process."""

    def __init__(self, root: Path) -> None:
        self.ckptr = AsyncCheckpointer(root)

    def save(
        self, step: int, seed: int, mode: str, force: bool, phase: str | None, victim: int = 0
    ) -> Outcome:
        def boom(_phase: str) -> None:
            raise OSError(5, f"injected at {_phase}")

        if phase is not None:
            hooks.set_hook(phase, boom)
        try:
            self.ckptr.save(step, values(seed), mode=mode, force=force)  # type: ignore[arg-type]
            self.ckptr.wait_until_finished()
        except CheckpointError as e:
            return type(e).__name__, e.committed
        except (RollbackRefusedError, StepExistsError) as e:
            return type(e).__name__, False
        finally:
            hooks.clear_hooks()
        return None, False

    def prune_after(self, step: int) -> list[int]:
        return self.ckptr.prune_after(step)

    def set_retention(self, policy: RetentionPolicy) -> None:
        self.ckptr.set_retention(policy)

    def restores(self, step: int, seed: int) -> bool:
        return _same(self.ckptr.restore(step), values(seed))

    def close(self) -> None:
        self.ckptr.close()


class OneRoot(RuleBasedStateMachine):
    """One root, one job, and the model of what the root must hold."""

    #: Makes the job that runs the calls (one process here; a group in a subclass).
    jobs: Any = InProcess

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="nbckpt-stateful-"))
        (self.root / "notes.txt").write_text("the user's")
        (self.root / "data").mkdir()
        (self.root / "data" / "keep.bin").write_bytes(b"\x00\x01")
        (self.root / FOREIGN_STEP).mkdir()
        (self.root / FOREIGN_STEP / "x").write_text("not a checkpoint")
        self.job = type(self).jobs(self.root)
        self.policy = RetentionPolicy()
        #: step -> seed of every step that must be complete.
        self.model: dict[int, int] = {}

    def teardown(self) -> None:
        hooks.clear_hooks()
        try:
            self.job.close()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- what the model expects ------------------------------------------------------

    def _refusal(self, step: int, force: bool) -> str | None:
        if step in self.model and not force:
            return "StepExistsError"
        if self.model and step < max(self.model):
            return "RollbackRefusedError"
        return None

    def _committed(self, step: int, seed: int, *, retention: bool = True) -> None:
        self.model[step] = seed
        if retention:
            recs = [StepRecord(s, {}) for s in self.model]
            for s in self.policy.doomed(recs):
                if s != step:
                    del self.model[s]

    # -- rules -------------------------------------------------------------------------

    @rule(step=STEPS, seed=SEEDS, mode=MODES)
    def save(self, step: int, seed: int, mode: str) -> None:
        refused = self._refusal(step, force=False)
        error, _ = self.job.save(step, seed, mode, False, None)
        assert error == refused, (error, refused)
        if refused is None:
            self._committed(step, seed)

    @precondition(lambda self: bool(self.model))
    @rule(seed=SEEDS)
    def force_resave_newest(self, seed: int) -> None:
        step = max(self.model)
        assert self.job.save(step, seed, "rename", True, None) == (None, False)
        self._committed(step, seed)

    @precondition(lambda self: len(self.model) > 1)
    @rule(seed=SEEDS, data=st.data())
    def force_resave_older_is_refused(self, seed: int, data: st.DataObject) -> None:
        step = data.draw(st.sampled_from(sorted(self.model)[:-1]))
        error, _ = self.job.save(step, seed, "rename", True, None)
        assert error == "RollbackRefusedError", error

    @rule(max_to_keep=st.one_of(st.none(), st.integers(min_value=1, max_value=3)))
    def set_retention(self, max_to_keep: int | None) -> None:
        self.policy = RetentionPolicy(max_to_keep=max_to_keep)
        self.job.set_retention(self.policy)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def roll_back(self, data: st.DataObject) -> None:
        to = data.draw(st.integers(min_value=0, max_value=max(self.model)))
        assert self.job.prune_after(to) == sorted(s for s in self.model if s > to)
        self.model = {s: v for s, v in self.model.items() if s <= to}

    @rule(
        seed=SEEDS,
        phase=st.sampled_from(PHASES),
        mode=MODES,
        again=st.booleans(),
        victim=st.integers(min_value=0, max_value=1),
    )
    def crash_at(self, seed: int, phase: str, mode: str, again: bool, victim: int) -> None:
        """A save that fails at ``phase``: a new step, or a forced re-save of the newest."""
        force = again and bool(self.model)
        if force:
            step, mode = max(self.model), "rename"
        else:
            step = max(self.model) + 1 if self.model else 0
        if phase == "finalize":
            victim = 0  # only the primary finalizes
        error, committed = self.job.save(step, seed, mode, force, phase, victim)
        assert error == "CheckpointError", error
        if phase == "barrier:commit_complete":
            # Past the finalize: committed, and the error says so; retention did not run.
            assert committed
            self._committed(step, seed, retention=False)
        else:
            assert not committed

    @rule()
    def fsck_clean(self) -> None:
        report = fsck(self.root, clean=True, stale_after_s=0)
        kept = {e.path for e in report.entries if e.state in ("complete", "corrupt", "foreign")}
        assert not kept & set(report.removed), report.table()
        abandoned = {e.path for e in report.entries if e.state == "abandoned"}
        assert set(report.removed) <= abandoned, report.table()
        assert not {str(s) for s in self.model} & set(report.removed), report.table()

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def every_committed_step_is_whole_and_nothing_else_is_a_step(self) -> None:
        assert all_steps(self.root) == sorted(self.model)
        for step, seed in self.model.items():
            assert self.job.restores(step, seed), step
        states = {e.path: e.state for e in classify(self.root)}
        assert "corrupt" not in states.values(), states
        complete = {p for p, s in states.items() if s == "complete"}
        assert complete == {str(s) for s in self.model}, states
        for name in states:
            number = parse_step(name)
            if number is not None and name != FOREIGN_STEP and number not in self.model:
                # Only an uncommitted commit-file attempt of ours goes by a step's name.
                assert states[name] in ("abandoned", "in_progress"), states

    @invariant()
    def what_nbckpt_did_not_create_is_untouched(self) -> None:
        assert (self.root / "notes.txt").read_text() == "the user's"
        assert (self.root / "data" / "keep.bin").read_bytes() == b"\x00\x01"
        assert (self.root / FOREIGN_STEP / "x").read_text() == "not a checkpoint"
        assert states_of(self.root).get(FOREIGN_STEP) == "foreign"


def states_of(root: Path) -> dict[str, str]:
    return {e.path: e.state for e in classify(root)}


OneRoot.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestOneRoot = OneRoot.TestCase


class InGroup:
    """Runs the machine's calls on every process of a real two-process JAX job."""

    group: Any = None

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.group.run(f"{T}:sm_open", self.root)

    def _agreed(self, fn: str, *args: Any) -> Any:
        results = self.group.run(f"{T}:{fn}", self.root, *args, timeout_s=120)
        assert all(r == results[0] for r in results), (fn, args, results)
        return results[0]

    def save(
        self, step: int, seed: int, mode: str, force: bool, phase: str | None, victim: int = 0
    ) -> Outcome:
        error, committed = self._agreed("sm_save", step, seed, mode, force, phase, victim)
        return error, committed

    def prune_after(self, step: int) -> list[int]:
        return list(self._agreed("sm_prune", step))

    def set_retention(self, policy: RetentionPolicy) -> None:
        self._agreed("sm_retention", policy.max_to_keep)

    def restores(self, step: int, seed: int) -> bool:
        return bool(self._agreed("sm_restores", step, seed))

    def close(self) -> None:
        self.group.run(f"{T}:sm_close", self.root)


class TwoProcesses(OneRoot):
    """The same machine over a two-process job (every call made on both processes).

    A crash at ``write`` on one process makes the other give up with chunk writes in
    flight; :func:`nbckpt.engine.save.writer.write_shards` settles them before it raises,
    so none lands in the next save's claim of that step (this machine found that).
    """

    jobs = InGroup


@pytest.mark.multihost
def test_two_processes(group2: Any) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    InGroup.group = group2
    try:
        run_state_machine_as_test(
            TwoProcesses,
            settings=settings(
                max_examples=5,
                stateful_step_count=8,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    finally:
        InGroup.group = None
