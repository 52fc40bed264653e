"""The barrier protocol over the in-process client, with threads as processes.

tests/test_multihost.py runs the same protocol over the real coordination service.
"""

import threading
import time

import pytest

from nbckpt.engine.sync.barriers import InProcessClient, Synchronizer
from nbckpt.errors import BarrierTimeoutError, PeerDeadError, PeerFailedError


def _syncs(n, poll_s=0.05):
    store = InProcessClient(0, n)
    return [Synchronizer(InProcessClient(i, n, store=store), poll_s=poll_s) for i in range(n)]


def _run(n, fn, poll_s=0.05):
    syncs = _syncs(n, poll_s)
    results = [None] * n

    def target(i):
        try:
            results[i] = fn(i, syncs[i])
        except Exception as e:
            results[i] = e

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_everyone_passes():
    def fn(i, s):
        time.sleep(0.01 * i)
        s.barrier("op", "b", timeout_s=5)
        return "ok"

    assert _run(4, fn) == ["ok"] * 4


def test_timeout_names_the_missing_processes():
    def fn(i, s):
        if i in (1, 3):
            return "skipped"
        s.barrier("op", "b", timeout_s=0.3)
        return "passed"

    res = _run(4, fn)
    for i in (0, 2):
        assert isinstance(res[i], BarrierTimeoutError)
        assert res[i].missing == [1, 3]
        assert "processes 1, 3 did not arrive" in str(res[i])


def test_straggler_after_timeout_fails_too():
    def fn(i, s):
        if i == 2:
            time.sleep(0.6)  # arrives after the others gave up
        s.barrier("op", "b", timeout_s=0.2)
        return "passed"

    res = _run(3, fn)
    assert all(isinstance(r, BarrierTimeoutError) for r in res), res
    assert res[2].missing == [2]
    assert res[0].missing == [2]


def test_peer_failure_aborts_waiters_before_the_deadline():
    def fn(i, s):
        if i == 1:
            s.signal_failure("op", "OSError: disk full (during write)")
            return "failed"
        t0 = time.monotonic()
        try:
            s.barrier("op", "b", timeout_s=30)
        except PeerFailedError as e:
            return (e.process, time.monotonic() - t0)
        return "passed"

    res = _run(3, fn)
    for i in (0, 2):
        process, waited = res[i]
        assert process == 1
        assert waited < 2


def test_a_peer_taken_for_gone_cannot_pass_once_it_comes_back():
    # Processes 0 and 1 give up on process 2 (its heartbeats stopped: cut off, say);
    # when it comes back and arrives, it must not pass the barrier they abandoned.
    def fn(i, s):
        if i == 2:
            time.sleep(0.5)
            s.barrier("op", "b", timeout_s=5)
            return "passed"

        def gone(phase):
            raise PeerDeadError([2], phase, 3.0, unreachable={2: "unreachable"})

        s.health = gone
        try:
            s.barrier("op", "b", timeout_s=5)
        except PeerDeadError as e:
            return str(e)
        return "passed"

    res = _run(3, fn)
    for i in (0, 1):
        assert res[i].startswith("process 2 became unreachable: no heartbeat for 3.0 s"), res[i]
        assert "check the network between the hosts" in res[i]
    assert isinstance(res[2], BarrierTimeoutError), res[2]


def test_subset_barrier_and_gather_and_broadcast():
    def fn(i, s):
        if i in (0, 2):
            s.barrier("op", "sub", timeout_s=5, process_ids=[0, 2])
        got = s.gather("op", "g", f"v{i}", timeout_s=5)
        b = s.broadcast("op", "bc", "hello" if i == 1 else None, source=1, timeout_s=5)
        return got, b

    res = _run(3, fn)
    for got, b in res:
        assert got == {0: "v0", 1: "v1", 2: "v2"}
        assert b == "hello"


def test_not_a_participant_is_refused():
    s = _syncs(2)[0]
    with pytest.raises(ValueError, match="not among"):
        s.barrier("op", "b", timeout_s=1, process_ids=[1])


def test_cleanup_removes_the_operation_keys():
    s = _syncs(1)[0]
    s.barrier("op", "b", timeout_s=1)
    s.cleanup("op")
    assert s.client.key_value_dir_get("nbckpt/op") == {}
