"""The barrier protocol over the in-process client, with threads as processes.

tests/test_multihost.py runs the same protocol over the real coordination service.
"""

import random
import threading
import time

import pytest

from nbckpt.engine.sync.barriers import InProcessClient, Synchronizer, claim_key
from nbckpt.engine.sync.clients import CoordinationServiceClient
from nbckpt.errors import BarrierTimeoutError, PeerDeadError, PeerFailedError
from nbckpt.protocol import barrier_key


def _syncs(n, poll_s=0.05):
    store = InProcessClient(0, n)
    return [Synchronizer(InProcessClient(i, n, store=store), poll_s=poll_s) for i in range(n)]


def _run(n, fn, poll_s=0.05):
    return _run_on(_syncs(n, poll_s), fn)


def _run_on(syncs, fn):
    n = len(syncs)
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
        # Well before the 30 s deadline: given up on the failure, not waited out (the
        # bound leaves room for a loaded machine; it is not a speed requirement).
        assert waited < 10


def test_a_peer_taken_for_gone_cannot_pass_once_it_comes_back():
    # Processes 0 and 1 give up on process 2 (its heartbeats stopped: cut off, say)
    # while they wait; when it comes back and arrives, it must not pass the barrier
    # they abandoned.
    syncs = _syncs(3)
    t0 = time.monotonic()

    def gone(phase):
        if time.monotonic() - t0 > 0.3:
            raise PeerDeadError([2], phase, 3.0, unreachable={2: "unreachable"})

    for s in syncs:
        s.fast_s = 0  # straight to the key-value store, where a wait can give up

    def fn(i, s):
        if i == 2:
            time.sleep(0.6)
            s.barrier("op", "b", timeout_s=5)
            return "passed"
        s.health = gone
        try:
            s.barrier("op", "b", timeout_s=5)
        except PeerDeadError as e:
            return str(e)
        return "passed"

    res = _run_on(syncs, fn)
    for i in (0, 1):
        assert res[i].startswith("process 2 became unreachable: no heartbeat for 3.0 s"), res[i]
        assert "check the network between the hosts" in res[i]
    assert isinstance(res[2], BarrierTimeoutError), res[2]
    # The first to give up left its word for anyone still waiting.
    word = syncs[0].client.key_value_try_get("nbckpt/op/b/release")
    assert word.startswith("abandoned ") and "process 2 became unreachable" in word


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


def test_gather_at_brings_every_value_to_the_source_whose_own_stays_with_it():
    syncs = _syncs(3)
    res = _run_on(syncs, lambda i, s: s.gather_at("op", "g", f"v{i}", source=1, timeout_s=5))
    assert res == [None, {0: "v0", 1: "v1", 2: "v2"}, None]
    key = barrier_key("op", "g")
    # One round trip fewer for the source: the others post, it reads.
    assert sorted(syncs[0].client.key_value_dir_get(f"{key}/value")) == [
        f"{key}/value/0",
        f"{key}/value/2",
    ]


def test_not_a_participant_is_refused():
    s = _syncs(2)[0]
    with pytest.raises(ValueError, match="not among"):
        s.barrier("op", "b", timeout_s=1, process_ids=[1])


def test_cleanup_removes_the_operation_keys():
    s = _syncs(1)[0]
    s.barrier("op", "b", timeout_s=1)
    s.cleanup("op")
    assert s.client.key_value_dir_get("nbckpt/op") == {}


def test_arrivals_in_time_meet_at_the_fast_barrier_alone():
    syncs = _syncs(3)

    def fn(i, s):
        s.barrier("op", "b", timeout_s=5)
        return "ok"

    assert _run_on(syncs, fn) == ["ok"] * 3
    # No key-value round trip was needed: no count, no release.
    assert syncs[0].client.key_value_dir_get("nbckpt/op/b") == {}
    # And nothing is kept of it: a long single-process job runs thousands of barriers.
    assert syncs[0].client._barriers == {}


def test_a_straggler_past_the_fast_barrier_meets_the_others_over_the_store():
    syncs = _syncs(3)
    for s in syncs:
        s.fast_s = 0.1

    def fn(i, s):
        if i == 2:
            time.sleep(0.4)
        s.barrier("op", "b", timeout_s=5)
        return "ok"

    assert _run_on(syncs, fn) == ["ok"] * 3
    assert syncs[0].client.key_value_try_get("nbckpt/op/b/count") == "3"


def test_a_peer_known_dead_is_named_before_the_fast_barrier():
    syncs = _syncs(2)

    def gone(phase):
        raise PeerDeadError([1], phase, 3.0)

    syncs[0].health = gone
    t0 = time.monotonic()
    with pytest.raises(PeerDeadError):
        syncs[0].barrier("op", "b", timeout_s=30)
    assert time.monotonic() - t0 < syncs[0].fast_s
    # It gave up before it counted anywhere: the other cannot pass, and names it.
    with pytest.raises(BarrierTimeoutError) as err:
        syncs[1].barrier("op", "b", timeout_s=2.5)
    assert err.value.missing == [0]


@pytest.mark.parametrize("seed", range(12))
def test_every_process_decides_the_same_way_whenever_one_gives_up(seed):
    # Arrivals spread around the fast barrier's deadline, while process 0 gives up
    # (it takes process 2 for dead) at a random moment: either all pass, or none does.
    rng = random.Random(seed)
    delays = [rng.uniform(0, 0.3) for _ in range(3)]
    give_up_at = time.monotonic() + rng.uniform(0, 0.4)
    syncs = _syncs(3, poll_s=0.02)
    for s in syncs:
        s.fast_s = 0.1

    def impatient(phase):
        if time.monotonic() > give_up_at:
            raise PeerDeadError([2], phase, 3.0)

    syncs[0].health = impatient

    def fn(i, s):
        time.sleep(delays[i])
        try:
            s.barrier("op", "b", timeout_s=1.2)
        except (PeerDeadError, BarrierTimeoutError) as e:
            return type(e).__name__
        return "passed"

    res = _run_on(syncs, fn)
    assert res.count("passed") in (0, 3), (delays, res)


def test_each_survivor_names_the_death_it_saw_when_another_gave_up_first():
    # Process 0 learns of a death a beat before the others (it watches the beats) and
    # abandons the barrier first; process 1 still reports the death itself, not
    # "process 0 gave up".
    syncs = _syncs(3)
    t0 = time.monotonic()

    def dead_after(delay):
        def health(phase):
            if time.monotonic() - t0 > delay:
                raise PeerDeadError([2], phase, 3.0)

        return health

    syncs[0].health, syncs[1].health = dead_after(0.2), dead_after(0.6)
    for s in syncs:
        s.fast_s = 0

    def fn(i, s):
        if i == 2:
            return "dead"
        try:
            s.barrier("op", "b", timeout_s=30)
        except (PeerDeadError, PeerFailedError) as e:
            return type(e).__name__
        return "passed"

    assert _run_on(syncs, fn) == ["PeerDeadError", "PeerDeadError", "dead"]


class _WentToStoreError(Exception):
    """The barrier went on over the key-value store."""


class _ServiceCalls:
    """jax's client, as far as the barrier's fast path sees it: it records each call.

    Any key-value call raises :class:`_WentToStoreError`. The real service's fast barrier,
    and a straggler past it, are tested in ``test_multihost.py``
    (``test_barrier_meets_at_the_service_then_waits_over_the_store``).
    """

    def __init__(self, expired: bool = False) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.expired = expired

    def wait_at_barrier(self, *args: object) -> None:
        self.calls.append(args)
        if self.expired:
            raise RuntimeError("DEADLINE_EXCEEDED: Barrier timed out")

    def __getattr__(self, name: str) -> object:
        def store(*args: object, **kwargs: object) -> None:
            raise _WentToStoreError(name)

        return store


def test_the_fast_path_calls_the_service_with_the_barriers_key_and_timeout():
    service = _ServiceCalls()
    sync = Synchronizer(CoordinationServiceClient(service, 0, 2))
    sync.barrier("op", "b", timeout_s=30)
    sync.fast_s = 0.25
    sync.barrier("op", "c", timeout_s=30)
    assert service.calls == [
        (barrier_key("op", "b") + "/fast", 1000),
        (barrier_key("op", "c") + "/fast", 250),
    ]
    with pytest.raises(_WentToStoreError):  # too little time left for the fast barrier
        sync.barrier("op", "d", timeout_s=1.2)
    sync.fast_s = 0
    with pytest.raises(_WentToStoreError):
        sync.barrier("op", "e", timeout_s=30)
    assert len(service.calls) == 2


def test_a_fast_barrier_past_its_deadline_goes_on_over_the_store():
    service = _ServiceCalls(expired=True)
    sync = Synchronizer(CoordinationServiceClient(service, 0, 2))
    with pytest.raises(_WentToStoreError):
        sync.barrier("op", "b", timeout_s=30)
    assert service.calls == [(barrier_key("op", "b") + "/fast", 1000)]


def test_a_callers_key_serves_one_call_of_each_kind_per_process():
    me, peer = InProcessClient(0, 2), InProcessClient(1, 2)
    claim_key(me, "save or restore", "onecall")
    claim_key(me, "barrier", "onecall")  # another kind of call: its records are named apart
    claim_key(peer, "save or restore", "onecall")  # another (simulated) process
    with pytest.raises(ValueError, match=r"key 'onecall' was already used by an earlier save"):
        claim_key(me, "save or restore", "onecall")
