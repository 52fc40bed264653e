"""The training loop's checkpointer: save policies, retention, resume, preemption."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from nbckpt.engine import AsyncCheckpointer, SavePolicy, TrainingCheckpointer
from nbckpt.formats.layout import all_steps
from nbckpt.procgroup import ProcessGroup
from tests.test_preemption import _expected_w, _wait_for_steps

T = "tests.mh_training"


@pytest.mark.parametrize(
    "bad",
    [
        {"every_steps": 0},
        {"every_steps": 2.5},
        {"every_steps": True},
        {"every_seconds": 0},
        {"every_seconds": float("nan")},
        {"every_seconds": "10"},
    ],
)
def test_a_bad_policy_is_refused_in_one_line(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=f"{next(iter(bad))} must be"):
        SavePolicy(**bad)  # type: ignore[arg-type]


def test_a_policy_must_be_a_save_policy(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="SavePolicy"):
        TrainingCheckpointer(tmp_path, save={"every_steps": 3})  # type: ignore[arg-type]


def test_step_rule_retention_and_resume_in_one_process(tmp_path: Path) -> None:
    import jax.numpy as jnp

    def init() -> dict[str, object]:
        return {"w": jnp.zeros(4), "n": np.int64(0)}

    def run(steps: int) -> list[int]:
        saved = []
        with TrainingCheckpointer(tmp_path, save=SavePolicy(every_steps=3), max_to_keep=2) as tc:
            state = tc.restore_or(init)
            assert int(state["n"]) == max(tc.next_step - 1, 0)
            for step in range(tc.next_step, tc.next_step + steps):
                state = {"w": state["w"] + 1, "n": np.int64(step)}
                if tc.save(step, state):
                    saved.append(step)
        return saved

    assert run(8) == [0, 3, 6]
    assert all_steps(tmp_path) == [3, 6]  # max_to_keep=2
    assert run(6) == [9, 12]  # resumed at 7: no step saved twice, none refused
    assert all_steps(tmp_path) == [9, 12]
    with AsyncCheckpointer(tmp_path) as ckptr:
        restored = ckptr.restore(12)
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.full(4, 13.0))


def test_time_rule_in_one_process(tmp_path: Path) -> None:
    with TrainingCheckpointer(tmp_path, save=SavePolicy(every_seconds=0.05)) as tc:
        saved = []
        for step in range(4):
            time.sleep(0.06)  # each step outlasts the interval: each is due
            if tc.save(step, {"x": np.arange(3) + step}):
                saved.append(step)
    assert saved == [0, 1, 2, 3]
    with TrainingCheckpointer(tmp_path, save=SavePolicy(every_seconds=3600)) as tc:
        assert not any(tc.save(step, {"x": np.arange(3)}) for step in range(4, 8))


@pytest.mark.multihost
def test_processes_at_different_speeds_take_the_primarys_time_decisions(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ckpt"
    with ProcessGroup(2, recoverable=True) as group:
        kwargs = {"every_seconds": 0.1, "every_steps": 5, "pauses": (0.0, 0.03)}
        results = group.run(f"{T}:loop", str(root), 12, kwargs=kwargs)
    assert results[0]["saved"] == results[1]["saved"]  # or a save would have hung
    assert {0, 5, 10} <= set(results[0]["saved"])
    assert all_steps(root) == results[0]["saved"]


@pytest.mark.multihost
def test_a_preempted_loop_saves_the_agreed_step_and_stops(tmp_path: Path) -> None:
    root, progress = tmp_path / "ckpt", tmp_path / "progress"
    progress.mkdir()
    group = ProcessGroup(2, recoverable=True)
    try:
        kwargs = {"every_steps": 1000, "pauses": (0.02,), "progress": str(progress)}
        group.submit(f"{T}:loop", str(root), 100_000, kwargs=kwargs)
        _wait_for_steps(progress, 2, 3)
        os.kill(group.pids[1], signal.SIGTERM)
        results = group.collect("loop", timeout_s=120)
    finally:
        group.close(timeout_s=30)
    assert group.returncodes == [0, 0]
    assert all(r["stopped"] for r in results)
    agreed = {r["last"] for r in results}
    assert len(agreed) == 1
    step = agreed.pop()
    assert all(r["saved"] == [0, step] for r in results)
    assert all_steps(root) == [0, step]
    with AsyncCheckpointer(root) as ckptr:
        restored = ckptr.restore(step)
    np.testing.assert_array_equal(np.asarray(restored["w"]), _expected_w(step, 2))


@pytest.mark.multihost
def test_a_loop_with_a_local_tier_resumes_from_the_newest_local_step(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    local = [str(tmp_path / f"host{i}") for i in range(4)]
    kw = {"every_steps": 1, "local": local, "persistent_every": 3}
    with ProcessGroup(4) as group:
        first = group.run(f"{T}:loop", root, 6, kwargs=kw, timeout_s=240)
    assert [r["saved"] for r in first] == [list(range(6))] * 4
    assert all_steps(root) == [0, 3]  # steps 4 and 5 live in the local tier only
    shutil.rmtree(local[2])  # a host was replaced
    with ProcessGroup(4) as group:
        second = group.run(f"{T}:loop", root, 2, kwargs=kw, timeout_s=240)
    # Resumed from local step 5 (host 2's shards from its neighbour), not the root's 3.
    assert [r["start"] for r in second] == [6] * 4
    assert [r["saved"] for r in second] == [[6, 7]] * 4
