"""Retention as Orbax users know it: max_to_keep, keep_period, best n by a metric, interval."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

from nbckpt.engine import AsyncCheckpointer
from nbckpt.formats.layout import all_steps, remove_aside, step_dir
from nbckpt.formats.retention import RetentionPolicy, StepRecord, check_metrics, should_save
from nbckpt.magics import args as a


def _recs(losses: dict[int, float | None]) -> list[StepRecord]:
    return [StepRecord(s, {} if v is None else {"loss": v}) for s, v in losses.items()]


def test_each_rule_keeps_what_it_names():
    losses = {s: float((s - 3) ** 2) for s in range(1, 10)}
    assert RetentionPolicy(max_to_keep=2).doomed(_recs(losses)) == [1, 2, 3, 4, 5, 6, 7]
    both = RetentionPolicy(max_to_keep=2, keep_period=4)
    assert both.doomed(_recs(losses)) == [1, 2, 3, 5, 6, 7]
    best = RetentionPolicy(best_n=2, best_metric="loss")  # steps 3, then 2 and 4 tie
    assert best.doomed(_recs(losses)) == [1, 2, 5, 6, 7, 8]  # 4 beats 2 (newer), 9 is latest
    high = RetentionPolicy(best_n=1, best_metric="loss", best_mode="max")
    assert high.doomed(_recs(losses)) == [1, 2, 3, 4, 5, 6, 7, 8]  # 9 has the highest loss


def test_steps_without_the_metric_are_never_ranked_away():
    recs = _recs({1: 5.0, 2: None, 3: 1.0, 4: 2.0, 5: math.nan})
    assert RetentionPolicy(best_n=1, best_metric="loss").doomed(recs) == [1, 4]


def test_no_limit_keeps_everything():
    recs = _recs({s: 1.0 for s in range(5)})
    assert RetentionPolicy().doomed(recs) == []
    assert RetentionPolicy(keep_period=2).doomed(recs) == []  # a period alone removes nothing


@settings(max_examples=300, deadline=None, database=None)
@given(
    steps=st.sets(st.integers(0, 60), max_size=25),
    keep=st.none() | st.integers(1, 6),
    period=st.none() | st.integers(1, 10),
    best=st.none() | st.integers(1, 4),
    mode=st.sampled_from(["min", "max"]),
    data=st.data(),
)
def test_policy_properties(steps, keep, period, best, mode, data):
    losses = {s: data.draw(st.none() | st.floats(-5, 5)) for s in sorted(steps)}
    policy = RetentionPolicy(
        max_to_keep=keep,
        keep_period=period,
        best_n=best,
        best_metric=None if best is None else "loss",
        best_mode=mode,
    )
    doomed = policy.doomed(_recs(losses))
    kept = sorted(set(steps) - set(doomed))
    assert set(doomed) <= set(steps) and doomed == sorted(doomed)
    if not steps:
        return
    assert max(steps) in kept  # the latest always stays
    if not policy.limits:
        assert doomed == []
    if period is not None:
        assert all(s % period != 0 for s in doomed)
    if keep is not None:
        assert all(s in kept for s in sorted(steps)[-keep:])
    if best is not None:
        ranked = [s for s in steps if losses[s] is not None]
        sign = 1 if mode == "min" else -1
        top = sorted(ranked, key=lambda s: (sign * losses[s], -s))[:best]
        assert all(s in kept for s in top)
        assert all(losses[s] is not None for s in doomed)  # unranked steps stay
        if keep is None and period is None:
            assert len(kept) <= best + 1 + (len(steps) - len(ranked))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"max_to_keep": 0}, "max_to_keep"),
        ({"keep_period": -1}, "keep_period"),
        ({"best_n": 2}, "go together"),
        ({"best_metric": "loss"}, "go together"),
        ({"best_n": 1, "best_metric": "bad name"}, "metric name"),
        ({"best_mode": "median"}, "best_mode"),
        ({"save_interval_steps": True}, "save_interval_steps"),
    ],
)
def test_a_bad_policy_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RetentionPolicy(**kwargs)


def test_metrics_are_checked():
    assert check_metrics({"loss": 1}) == {"loss": 1.0}
    for bad in ({"loss": math.nan}, {"loss": "0.3"}, {"loss": True}, {"a/b": 1.0}):
        with pytest.raises(ValueError):
            check_metrics(bad)


def test_should_save_follows_the_interval_and_never_goes_back():
    policy = RetentionPolicy(save_interval_steps=5)
    assert should_save(10, [], policy) and not should_save(11, [], policy)
    assert not should_save(10, [10], policy) and not should_save(5, [10], policy)
    assert should_save(15, [10], policy)
    assert should_save(3, [1], RetentionPolicy())


def _orbax_step(root: Path, step: int) -> Path:
    """A real Orbax checkpoint under ``root``, as a CheckpointManager-free user writes it."""
    import orbax.checkpoint as ocp

    path = root / str(step)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(path.absolute(), {"x": np.arange(4.0)})
    ckptr.wait_until_finished()
    return path


def test_a_real_root_keeps_what_the_policy_says(tmp_path):
    orbax_path = _orbax_step(tmp_path, 2)  # not nbckpt's: never counted, never removed
    ckptr = AsyncCheckpointer(tmp_path, max_to_keep=2, keep_period=4, best_n=1, best_metric="loss")
    for step in (1, *range(3, 10)):
        tree = {"w": np.full((8,), step, np.float32)}
        ckptr.save(step, tree, metrics={"loss": float((step - 3) ** 2)})
        ckptr.wait_until_finished()
    ours = [s for s in all_steps(tmp_path) if s != 2]
    assert ours == [3, 4, 8, 9]  # best (3), period (4, 8), newest two (8, 9)
    assert (orbax_path / "_METADATA").is_file()
    assert not list(tmp_path.glob("*.nbckpt-deleting"))
    assert ckptr.restore(3)["w"][0] == 3  # the best step is intact


def test_set_retention_applies_from_the_next_commit(tmp_path):
    ckptr = AsyncCheckpointer(tmp_path)
    for step in range(4):
        ckptr.save(step, {"w": np.zeros(4)})
        ckptr.wait_until_finished()
    assert all_steps(tmp_path) == [0, 1, 2, 3]
    ckptr.set_retention(RetentionPolicy(max_to_keep=1, save_interval_steps=10))
    assert not ckptr.should_save(3) and not ckptr.should_save(5) and ckptr.should_save(10)
    ckptr.save(10, {"w": np.zeros(4)})
    ckptr.wait_until_finished()
    assert all_steps(tmp_path) == [10]


def test_a_bad_metric_is_refused_before_anything_is_written(tmp_path):
    ckptr = AsyncCheckpointer(tmp_path)
    with pytest.raises(ValueError, match="finite"):
        ckptr.save(1, {"w": np.zeros(4)}, metrics={"loss": math.inf})
    assert not step_dir(tmp_path, 1).exists() and all_steps(tmp_path) == []


def test_a_crash_mid_removal_leaves_no_half_step(tmp_path):
    ckptr = AsyncCheckpointer(tmp_path)
    for step in (1, 2):
        ckptr.save(step, {"w": np.zeros(4)})
        ckptr.wait_until_finished()
    # What a crash between the rename and the delete leaves: the aside copy only.
    doomed = step_dir(tmp_path, 1).with_name("1.nbckpt-deleting")
    step_dir(tmp_path, 1).rename(doomed)
    assert all_steps(tmp_path) == [2]
    remove_aside(step_dir(tmp_path, 2))  # a later removal clears its own leftovers only
    assert doomed.exists() and all_steps(tmp_path) == []


def test_magic_lines():
    args = a.parse_save_args("state --step 3 --metric loss=0.31 --metric acc=0.9 --format orbax")
    assert args.metrics == {"loss": 0.31, "acc": 0.9} and args.format == "orbax"
    r = a.parse_retention_args("--max-to-keep 3 --keep-period 100 --best 2 --metric loss")
    assert r.policy == RetentionPolicy(max_to_keep=3, keep_period=100, best_n=2, best_metric="loss")
    assert a.parse_retention_args("").policy is None
    assert a.parse_retention_args("--keep-all").policy == RetentionPolicy()
    for bad in (
        "state --step 1 --metric loss",
        "state --step 1 --metric loss=nan",
        "state --step 1 --metric loss=1 --metric loss=2",
        "state --step 1 --metric 'a b=1'",
        "state --step 1 --format zarr",
    ):
        with pytest.raises(UsageError, match="usage: %ckpt_save"):
            a.parse_save_args(bad)
    for bad in ("--best 2", "--metric loss", "--max-to-keep 0", "--keep-all --max-to-keep 2"):
        with pytest.raises(UsageError, match="usage: %ckpt_retention"):
            a.parse_retention_args(bad)


def test_a_rollback_is_refused_until_the_newer_steps_are_pruned(tmp_path):
    from nbckpt.errors import RollbackRefusedError

    ckptr = AsyncCheckpointer(tmp_path, max_to_keep=3)
    for step in range(1, 11):
        ckptr.save(step, {"w": np.full((4,), step, np.float32)})
        ckptr.wait_until_finished()
    assert all_steps(tmp_path) == [8, 9, 10]
    # Training rolled back to step 5: a save of 6 would be deleted by retention at once,
    # and a restore would still pick the abandoned run's step 10.
    for force in (False, True):
        with pytest.raises(RollbackRefusedError, match=r"older than steps 8, 9, 10") as info:
            ckptr.save(6, {"w": np.full((4,), 60, np.float32)}, force=force)
        assert "prune_after(6)" in str(info.value) and "\n" not in str(info.value)
    assert all_steps(tmp_path) == [8, 9, 10] and not list(tmp_path.glob("6*"))
    assert ckptr.prune_after(5) == [8, 9, 10]
    for step in (6, 7):
        ckptr.save(step, {"w": np.full((4,), step * 10, np.float32)})
        ckptr.wait_until_finished()
    assert all_steps(tmp_path) == [6, 7]
    assert ckptr.restore()["w"][0] == 70  # the new run's newest step, never step 10


def test_retention_never_removes_the_step_just_committed(tmp_path):
    from nbckpt.engine.save.prune import apply_retention

    ckptr = AsyncCheckpointer(tmp_path)
    for step in (1, 2, 3):
        ckptr.save(step, {"w": np.zeros(4)})
        ckptr.wait_until_finished()
    assert apply_retention(tmp_path, RetentionPolicy(max_to_keep=1), keep=2) == [1]
    assert all_steps(tmp_path) == [2, 3]


def test_numpy_and_jax_scalar_metrics_are_numbers(tmp_path):
    import jax.numpy as jnp

    got = check_metrics(
        {"a": np.float32(0.25), "b": np.int64(2), "c": jnp.asarray(0.5), "d": np.asarray(1.5)}
    )
    assert got == {"a": 0.25, "b": 2.0, "c": 0.5, "d": 1.5}
    assert all(type(v) is float for v in got.values())
    for bad in (np.bool_(True), np.float32("nan"), jnp.zeros(2), np.array([1.0]), "1"):
        with pytest.raises(ValueError, match="finite number"):
            check_metrics({"loss": bad})
    ckptr = AsyncCheckpointer(tmp_path, best_n=1, best_metric="loss")
    for step, loss in ((1, jnp.asarray(0.1)), (2, np.float32(0.9)), (3, np.float64(0.5))):
        ckptr.save(step, {"w": np.zeros(4)}, metrics={"loss": loss})
        ckptr.wait_until_finished()
    assert all_steps(tmp_path) == [1, 3]
