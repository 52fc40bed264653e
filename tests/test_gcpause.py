"""The collector pause around a save's snapshot and a restore (nbckpt.gcpause)."""

import gc
import threading

import jax
import numpy as np
import pytest

from nbckpt.engine import AsyncCheckpointer, hooks
from nbckpt.gcpause import paused_gc


@pytest.fixture(autouse=True)
def _collector_on():
    hooks.clear_hooks()
    gc.enable()
    yield
    hooks.clear_hooks()
    gc.enable()


def test_a_pause_nests_and_resumes_the_collector_once_the_outermost_ends():
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_program_that_turned_the_collector_off_keeps_it_off():
    gc.disable()
    with paused_gc():
        pass
    assert not gc.isenabled()


def test_overlapping_pauses_on_two_threads_resume_after_the_last():
    first_in, second_done = threading.Event(), threading.Event()

    def other():
        with paused_gc():
            first_in.set()
            second_done.wait(5)

    t = threading.Thread(target=other)
    t.start()
    first_in.wait(5)
    with paused_gc():
        pass
    assert not gc.isenabled(), "the other thread's pause still runs"
    second_done.set()
    t.join(5)
    assert gc.isenabled()


def test_the_snapshot_and_the_restore_run_paused_and_the_background_write_does_not(tmp_path):
    seen = {}
    hooks.set_hook("snapshot", lambda _p: seen.setdefault("snapshot", gc.isenabled()))
    hooks.set_hook("write", lambda _p: seen.setdefault("write", gc.isenabled()))
    state = {"w": jax.numpy.arange(16.0), "n": np.arange(4)}
    ck = AsyncCheckpointer(tmp_path)
    ck.save(1, state)
    assert gc.isenabled(), "the collector runs again once save() returns"
    ck.wait_until_finished()

    def target():
        seen["restore"] = gc.isenabled()
        return state

    out = ck.restore_from(target, 1)
    assert gc.isenabled()
    assert seen == {"snapshot": False, "write": True, "restore": False}
    assert np.array_equal(out["w"], state["w"])
