"""Dead processes, crash consistency and storage errors, on real processes and files."""

from __future__ import annotations

import gc
import importlib.util
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from nbckpt.engine import AsyncCheckpointer
from nbckpt.errors import CheckpointError
from nbckpt.formats.layout import all_steps, latest_step
from nbckpt.procgroup import ProcessGroup
from nbckpt.protocol import PHASES
from tests.conftest import _ENV

pytestmark = pytest.mark.multihost
T = "tests.mh_tasks"
REPO = Path(__file__).resolve().parent.parent


def _load_stress():
    spec = importlib.util.spec_from_file_location(
        "crash_consistency", REPO / "stress" / "crash_consistency.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Process 1 is the primary here, so that killing it at "prepare" or "finalize" kills the
# process that finalizes while the coordination service (process 0) lives on.
@pytest.mark.parametrize("phase", PHASES)
def test_killing_a_process_at_each_phase(phase, tmp_path):
    root = str(tmp_path / "root")
    marker = str(tmp_path / "died_at")
    with ProcessGroup(4, env=_ENV, recoverable=True) as group:
        group.run(f"{T}:save", root, 1, kwargs={"primary": 1})
        group.run(f"{T}:arm_kill_with_marker", 1, phase, marker)
        group.submit(f"{T}:save_and_time_failure", root, 2, kwargs={"primary": 1})
        outcomes = group.outcomes(timeout_s=60)
    died = float(Path(marker).read_text())
    assert outcomes[1][0] is False  # the victim
    for p in (0, 2, 3):
        ok, res = outcomes[p]
        assert ok and res["error"] is not None, (p, res)
        assert "process 1 died" in res["error"], res["error"]
        assert res["type"] == "CheckpointError"
        assert res["t"] - died < 5.0, f"process {p} noticed after {res['t'] - died:.1f} s"
    if phase == "barrier:commit_complete":
        # The primary had renamed step 2 into place before it died: step 2 is complete,
        # and the survivors say so rather than claim that nothing was committed.
        assert all_steps(root) == [1, 2]
        assert all("complete on disk" in r["error"] for ok, r in outcomes if ok)
        return
    assert all_steps(root) == [1] and latest_step(root) == 1
    assert all("nothing was committed" in r["error"] for ok, r in outcomes if ok)
    # The last complete step restores bit-identically (here, into this one process).
    from tests.mh_tasks import full_values

    out = AsyncCheckpointer(root).restore()
    assert np.asarray(out["params"]["w"]).tobytes() == full_values(1)["w"].tobytes()


def test_crash_consistency_randomized(tmp_path):
    stress = _load_stress()
    results = [stress.run_trial(seed, tmp_path) for seed in range(20)]
    violations = [r for r in results if r["problems"]]
    assert violations == []
    # Both victims and a spread of moments were exercised.
    assert {r["victim"] for r in results} == {0, 1}
    assert any(2 not in r["steps"] for r in results)
    assert all(1 in r["steps"] for r in results)


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    return res.returncode == 0


def test_disk_full_is_one_clear_error_and_keeps_committed_steps(tmp_path):
    import jax

    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, "3m"):
        pytest.fail("cannot mount a tmpfs here (the test needs root); see the issue note")
    try:
        ck = AsyncCheckpointer(mnt / "ckpt")
        small = {"w": jax.numpy.ones((256, 256), jax.numpy.float32)}  # 256 KiB
        ck.save(1, small)
        ck.wait_until_finished()
        big = {"w": jax.numpy.ones((1024, 1024), jax.numpy.float32)}  # 4 MiB > 3 MiB
        ck.save(2, big)
        with pytest.raises(CheckpointError) as info:
            ck.wait_until_finished()
        msg = str(info.value)
        assert "process 0" in msg and "during write" in msg
        assert "is full" in msg and str(mnt / "ckpt") in msg
        assert all_steps(mnt / "ckpt") == [1]
        restored = ck.restore(1)
        assert np.asarray(restored["w"]).tobytes() == np.ones((256, 256), np.float32).tobytes()
        # The restored value maps the step's pack: the disk stays busy while it lives.
        del restored
        gc.collect()
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_vanished_directory_is_named(tmp_path):
    import jax

    from nbckpt.engine import hooks

    root = tmp_path / "ckpt"
    ck = AsyncCheckpointer(root)
    hooks.set_hook("write", lambda _p: shutil.rmtree(root / "1.nbckpt-tmp"))
    try:
        ck.save(1, {"w": jax.numpy.ones((64, 64))})
        with pytest.raises(CheckpointError, match="vanished during the save"):
            ck.wait_until_finished()
    finally:
        hooks.clear_hooks()
    assert all_steps(root) == []
    assert os.path.isdir(root)


def test_a_stalled_live_process_is_not_taken_for_dead(tmp_path):
    """The stall of a live process is not a death: the save waits and commits."""
    root = str(tmp_path / "root")
    with ProcessGroup(4, env=_ENV, recoverable=True) as group:
        group.run(f"{T}:stall_at", "barrier:write_complete", 2, 4.0)
        t0 = time.time()
        res = group.run(f"{T}:save_and_time_failure", root, 1)
    assert all(r["error"] is None for r in res), res
    assert all(r["t"] - t0 >= 4.0 for r in res)
    assert all_steps(root) == [1]


def test_slow_io_stretches_the_slowed_process_write_and_is_journaled(group2, tmp_path):
    """``%ckpt_fault slow-io x4`` on process 1: its write phase is the longer one."""
    from nbckpt.journal import read_operation

    root = str(tmp_path / "root")
    ops = group2.run("tests.mh_truth:slow_save", root, 1, 1, 4.0)
    assert ops[0] == ops[1]
    rec = read_operation(root, ops[0])
    assert rec.status == "committed"
    started = {
        p: next(e for e in r.events if e["event"] == "write_started")
        for p, r in rec.processes.items()
    }
    assert started[1].get("fault") == "slow-io x4" and "fault" not in started[0]
    assert rec.processes[1].fault == "slow-io x4"
    write = {p: next(s for s in r.phases if s.name == "write") for p, r in rec.processes.items()}
    took = {p: s.end - s.start for p, s in write.items()}
    # Both wrote sixteen chunks of 1 MiB in the same save: the slowed one took longer.
    assert took[1] > took[0], took
    # Its progress shows steps, not 0 then all of it.
    steps = [e["bytes"] for e in rec.processes[1].events if e["event"] == "write_progress"]
    assert len(steps) > 1 and steps == sorted(set(steps))
