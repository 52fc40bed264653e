"""Preemption: a SIGTERM to any process of a training job saves one agreed step on all.

The agreement itself is checked with threads over one in-process key-value store (every
interleaving of notice and steps is easy to set up there); the real counterpart runs
four real JAX processes in a training loop and signals one of them, process 0 too.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nbckpt.engine import AsyncCheckpointer
from nbckpt.engine.sync.barriers import InProcessClient
from nbckpt.engine.sync.preemption import NOTICE_KEY, PreemptionWatch
from nbckpt.errors import BarrierTimeoutError
from nbckpt.formats.layout import all_steps
from nbckpt.journal import list_operations, merge_events, read_operation
from nbckpt.procgroup import ProcessGroup
from nbckpt.views.answers import op_label
from nbckpt.views.monitor import view_state
from nbckpt.widgets.text import what_of

T = "tests.mh_preempt"


def _watches(
    n: int, grace_s: float = 3600.0, ended: list[int] | None = None
) -> list[PreemptionWatch]:
    store = InProcessClient(0, n)
    end = (ended if ended is not None else []).append
    return [
        PreemptionWatch(store if p == 0 else InProcessClient(p, n, store), grace_s=grace_s, end=end)
        for p in range(n)
    ]


def _until(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_the_agreed_step_is_the_first_one_no_process_has_passed() -> None:
    watches = _watches(3)
    at = {0: 7, 1: 9, 2: 8}  # processes of one job are rarely at the same step
    try:
        for p, w in enumerate(watches):
            assert w.reached(at[p]) is False  # before any notice: a flag, no message
        watches[1].notify("test")
        _until(lambda: all(w.noticed for w in watches))
        answers = {p: [w.reached(s) for s in range(at[p] + 1, 12)] for p, w in enumerate(watches)}
        # Every process says True first at step 10: one past the furthest (9).
        assert {p: a.index(True) + at[p] + 1 for p, a in answers.items()} == dict.fromkeys(at, 10)
        assert all(w.notice and w.notice["process"] == 1 for w in watches)
    finally:
        for w in watches:
            w.stop()


def test_a_process_that_first_checks_after_the_notice_reports_the_step_it_is_at() -> None:
    watches = _watches(2)
    try:
        assert not any(watches[0].reached(s) for s in range(5))
        watches[0].notify("test")
        _until(lambda: watches[0].noticed)
        # Process 1 checks for the first time at step 7, the notice already waiting:
        # step 7 is passed (False), and the agreed step is one past it.
        assert watches[1].reached(7) is False
        assert [watches[0].reached(s) for s in range(5, 9)] == [False, False, False, True]
        assert watches[1].reached(8) is True
    finally:
        for w in watches:
            w.stop()


#: How many steps apart the loops of one job may drift: their collectives keep them close.
_DRIFT = 2


def _race(pauses_us: list[int], told: int, notice_after_us: int) -> None:
    """Processes train in near lockstep while one is told; check every answer given.

    Process ``p`` sleeps ``pauses_us[p]`` per step, and checks at every step; no loop
    gets more than :data:`_DRIFT` steps ahead of the slowest, as the collectives of a
    real training step see to. A notice at once may come before a process's first
    check.
    """
    n = len(pauses_us)
    watches = _watches(n)
    answered: dict[int, dict[int, bool]] = {p: {} for p in range(n)}
    done = [-1] * n  # the last step each loop finished; a stopped loop holds nobody
    pace = threading.Condition()

    def loop(p: int) -> None:
        for step in itertools.count():
            behind = step - 1 - _DRIFT
            with pace:
                assert pace.wait_for(lambda: min(done) >= behind, timeout=30)  # noqa: B023
            answered[p][step] = watches[p].reached(step)
            with pace:
                done[p] = 10**9 if answered[p].get(step) else step
                pace.notify_all()
            if answered[p].get(step):
                return
            time.sleep(pauses_us[p] / 1e6)

    threads = [threading.Thread(target=loop, args=(p,)) for p in range(n)]
    for t in threads:
        t.start()
    time.sleep(notice_after_us / 1e6)
    watches[told].notify("test")
    for t in threads:
        t.join(timeout=60)
    try:
        agreed = watches[0].agreed()
        assert all(w.agreed() == agreed for w in watches)
        for p in range(n):
            # True first at the agreed step, and never before it, on every process.
            assert answered[p].get(agreed) is True, (p, agreed, pauses_us)
            assert not any(v for step, v in answered[p].items() if step < agreed)
    finally:
        for w in watches:
            w.stop()


@given(
    st.integers(2, 5).flatmap(
        lambda n: st.tuples(
            st.lists(st.sampled_from([0, 0, 50, 300]), min_size=n, max_size=n),
            st.integers(0, n - 1),
            st.integers(0, 3000),
        )
    )
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_process_answers_true_first_at_the_same_step(
    case: tuple[list[int], int, int],
) -> None:
    # Whatever the paces, who is told and when (before some first check, too):
    # no process answers True before the agreed step, and every one answers True at
    # it (the report and the answer take one lock; a first check records its step
    # before the watcher starts).
    _race(*case)


def test_a_process_that_never_reports_fails_the_agreement_by_the_deadline() -> None:
    ended: list[int] = []
    watches = _watches(2, grace_s=0.5, ended=ended)
    try:
        watches[0].reached(3)
        watches[1].stop()  # process 1 is gone: nothing reports for it
        watches[0].client.key_value_set(NOTICE_KEY, '{"process": 1, "reason": "test"}')
        _until(lambda: watches[0].noticed)
        with pytest.raises(BarrierTimeoutError, match="process 1"):
            watches[0].reached(4)
        _until(lambda: ended == [143])  # and the deadline ends it: nothing was committed
    finally:
        watches[0].stop()


def test_the_views_say_a_save_was_the_agreed_preemption_step() -> None:
    told = {"process": 2, "host": "h2", "reason": "SIGTERM", "time": 1.0, "agreed": 57}
    events = {
        p: [
            {"event": "requested", "t": 1.0 + p, "kind": "save", "step": 57, "process_count": 2}
            | ({"preemption": told} if p == 1 else {}),
        ]
        for p in (0, 1)
    }
    rec = merge_events("op57", events)
    assert rec.preemption == told
    said = " (preemption: process 2 told by SIGTERM)"
    assert op_label(rec.kind, rec.step, rec.name, rec.preemption) == "save 57" + said
    assert what_of(view_state(rec)) == "save of step 57" + said
    plain = merge_events("op58", {0: [{"event": "requested", "t": 1.0, "step": 58}]})
    assert plain.preemption is None and what_of(view_state(plain)) == "save of step 58"


def _wait_for_steps(progress: Path, n: int, at_least: int, timeout_s: float = 120) -> None:
    def done() -> bool:
        marks = [progress / str(p) for p in range(n)]
        return all(m.exists() and int(m.read_text() or -1) >= at_least for m in marks)

    _until(done, timeout_s)


def _expected_w(step: int, n: int) -> np.ndarray:
    w = np.arange(8 * n, dtype=np.float32)
    for _ in range(step + 1):
        w = w * np.float32(0.5) + np.float32(1.0)
    return w


@pytest.mark.multihost
@pytest.mark.parametrize("told", [2, 0])
def test_sigterm_to_one_of_four_training_processes_saves_one_step_on_all(
    tmp_path: Path, told: int
) -> None:
    root, progress = tmp_path / "ckpt", tmp_path / "progress"
    progress.mkdir()
    group = ProcessGroup(4, recoverable=True)
    try:
        group.submit(f"{T}:train", str(root), str(progress), kwargs={"grace_s": 60})
        _wait_for_steps(progress, 4, 5)
        os.kill(group.pids[told], signal.SIGTERM)
        results = group.collect("train", timeout_s=120)
    finally:
        group.close(timeout_s=30)
    assert group.returncodes == [0, 0, 0, 0]  # the told process too: it left cleanly
    steps = {r["step"] for r in results}
    assert len(steps) == 1 and None not in steps, results
    step = steps.pop()
    assert step >= 5
    assert all(r["notice"]["process"] == told for r in results)
    assert all(r["notice"]["reason"] == "SIGTERM" for r in results)
    assert all_steps(root) == [step]
    (op,) = list_operations(root)
    rec = read_operation(root, op)
    assert rec.status == "committed" and rec.preemption is not None
    assert (rec.preemption["process"], rec.preemption["agreed"]) == (told, step)
    assert op_label(rec.kind, rec.step, rec.name, rec.preemption) == (
        f"save {step} (preemption: process {told} told by SIGTERM)"
    )
    # Each process journaled that it may stop, and the views say it.
    assert all(
        [e["event"] for e in rec.processes[p].events][-1] == "preemption_saved" for p in range(4)
    )
    notes = [v.note for v in view_state(rec).processes]
    assert notes == ["the agreed preemption step is committed: this process stops"] * 4
    with AsyncCheckpointer(root) as ckptr:
        restored = ckptr.restore(step)
    assert int(restored["step"]) == step
    np.testing.assert_array_equal(np.asarray(restored["w"]), _expected_w(step, 4))


def _told_loop_that_ignores_it(tmp_path: Path, grace_s: float) -> ProcessGroup:
    """One process training without saving on notice, once SIGTERM has been sent it."""
    progress = tmp_path / "progress"
    progress.mkdir()
    group = ProcessGroup(1)
    try:
        kwargs = {"grace_s": grace_s, "save_on_notice": False}
        group.submit(f"{T}:train", str(tmp_path / "ckpt"), str(progress), kwargs=kwargs)
        _wait_for_steps(progress, 1, 2)
        os.kill(group.pids[0], signal.SIGTERM)
    except BaseException:
        group.close(timeout_s=10)
        raise
    return group


@pytest.mark.multihost
def test_a_loop_that_ignores_the_notice_is_ended_at_the_deadline(tmp_path: Path) -> None:
    group = _told_loop_that_ignores_it(tmp_path, grace_s=1.0)
    try:
        ((ok, error),) = group.outcomes(timeout_s=60)
    finally:
        group.close(timeout_s=10)
    assert not ok and "code 143" in error  # nothing agreed was committed: "killed"
    assert group.returncodes == [143]


@pytest.mark.multihost
def test_a_second_sigterm_ends_the_process_at_once(tmp_path: Path) -> None:
    group = _told_loop_that_ignores_it(tmp_path, grace_s=600.0)
    try:
        time.sleep(0.5)
        assert group.alive() == [True]  # the first one is a notice, not a death
        os.kill(group.pids[0], signal.SIGTERM)
        ((ok, _),) = group.outcomes(timeout_s=60)
    finally:
        group.close(timeout_s=10)
    assert not ok
    assert group.returncodes == [-signal.SIGTERM]
