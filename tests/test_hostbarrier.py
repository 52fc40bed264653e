"""The host barrier's protocol, on real Unix sockets: every participant passes, or none.

The hub and its links run here as threads of one process (each ``HostBarrier`` has
sockets of its own, as in separate processes); ``test_sync.py`` and the fault tests
meet the same barriers through real ``jax.distributed`` processes on one host.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from nbckpt.engine.sync import hostbarrier
from nbckpt.engine.sync.hostbarrier import HostBarrier

pytestmark = pytest.mark.skipif(not hostbarrier.enabled(), reason="Linux abstract sockets")

FAST_S = 0.3


@pytest.fixture
def quick_leave(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostbarrier, "_LEAVE_AFTER_S", 0.2)


def _group(count: int) -> list[HostBarrier]:
    """A hub (process 0) and ``count - 1`` links to it."""
    import socket

    name = f"nbckpt-test-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(16)
    listener.setblocking(False)
    hub = HostBarrier(name, 0, count, 0, listener)
    return [hub] + [HostBarrier(name, p, count, 0, None) for p in range(1, count)]


@pytest.fixture
def four() -> Iterator[list[HostBarrier]]:
    group = _group(4)
    yield group
    for member in group:
        member.close()


def _all_wait(group: list[HostBarrier], key: str, skip: frozenset[int] = frozenset()) -> list[bool]:
    deadline = time.monotonic() + 30
    with ThreadPoolExecutor(len(group)) as pool:
        futures = {
            i: pool.submit(m.wait, key, FAST_S, deadline)
            for i, m in enumerate(group)
            if i not in skip
        }
        return [futures[i].result(timeout=30) for i in sorted(futures)]


def test_everyone_arrives_and_everyone_passes_many_barriers_in_a_row(
    four: list[HostBarrier],
) -> None:
    for i in range(50):
        assert _all_wait(four, f"k{i}") == [True] * 4


def test_one_missing_sends_everyone_on_to_the_slow_phase_together(
    four: list[HostBarrier], quick_leave: None
) -> None:
    t0 = time.monotonic()
    assert _all_wait(four, "gone", skip=frozenset({3})) == [False] * 3
    # The hub gave its word when its fast phase ended, not at the barrier's deadline.
    assert time.monotonic() - t0 < 10
    # The one that comes late hears the same word at once.
    assert four[3].wait("gone", FAST_S, time.monotonic() + 30) is False
    # And the next barrier, with everyone, passes.
    assert _all_wait(four, "after") == [True] * 4


def test_a_link_that_waits_for_a_hub_that_never_comes_leaves_and_the_hub_agrees(
    four: list[HostBarrier], quick_leave: None
) -> None:
    # The hub is not in the barrier: its reader answers the goodbyes with S.
    assert _all_wait(four, "nohub", skip=frozenset({0})) == [False] * 3
    # The hub, coming later, goes on to the slow phase too: none passed.
    assert four[0].wait("nohub", FAST_S, time.monotonic() + 30) is False


def test_a_link_that_closes_before_it_arrives_ends_the_wait_at_once(
    four: list[HostBarrier],
) -> None:
    four[2].close()  # as a process that died
    deadline = time.monotonic() + 30
    with ThreadPoolExecutor(3) as pool:
        waits = [pool.submit(four[i].wait, "dead", 10.0, deadline) for i in (0, 1, 3)]
        t0 = time.monotonic()
        assert [w.result(timeout=30) for w in waits] == [False] * 3
    assert time.monotonic() - t0 < 5  # not the 10 s fast phase


@pytest.mark.parametrize("quitter", [1, 0], ids=["a link", "the hub"])
def test_a_process_that_gives_up_an_operation_sends_the_others_on_at_once(
    four: list[HostBarrier], quitter: int
) -> None:
    # The CI failure: process 2 sat out the fast phase at write_complete while process 1
    # had already failed the save, and was still waiting when the notebook reported.
    # A fast phase of ten minutes: only the word of the one that gave up ends it.
    deadline = time.monotonic() + 1200
    waiting = [i for i in range(4) if i != quitter]
    with ThreadPoolExecutor(3) as pool:
        early = [
            pool.submit(four[i].wait, "nbckpt/op-1/write_complete/fast", 600.0, deadline)
            for i in waiting[:2]
        ]
        time.sleep(0.2)
        four[quitter].abandon("nbckpt/op-1/")
        assert [w.result(timeout=60) for w in early] == [False, False]
        # A late arrival at another barrier of the same operation hears S at once too.
        late = four[waiting[2]].wait("nbckpt/op-1/commit/fast", 600.0, deadline)
        assert late is False
    # Another operation, even one whose id begins alike, is untouched: everyone passes.
    assert _all_wait(four, "nbckpt/op-10/write_complete/fast") == [True] * 4


def test_links_go_on_without_a_hub_that_closed(four: list[HostBarrier]) -> None:
    four[0].close()
    deadline = time.monotonic() + 30
    assert [m.wait("hubless", 10.0, deadline) for m in four[1:]] == [False] * 3


def test_two_threads_of_one_process_wait_at_two_barriers_at_once() -> None:
    group = _group(2)
    try:
        deadline = time.monotonic() + 30
        with ThreadPoolExecutor(4) as pool:
            # Process 1 waits at "a" and "b" on two threads; the hub arrives at "b"
            # first, then at "a": neither wait may hold up the other.
            a1 = pool.submit(group[1].wait, "a", 5.0, deadline)
            b1 = pool.submit(group[1].wait, "b", 5.0, deadline)
            time.sleep(0.1)
            assert group[0].wait("b", 5.0, deadline) is True
            assert group[0].wait("a", 5.0, deadline) is True
            assert a1.result(timeout=10) is True and b1.result(timeout=10) is True
    finally:
        for member in group:
            member.close()


def _wait_after(m: HostBarrier, delay: float, key: str, fast_s: float, deadline: float) -> bool:
    time.sleep(delay)
    return m.wait(key, fast_s, deadline)


def test_the_word_is_the_same_for_everyone_when_the_last_comes_at_the_fast_phase_end(
    quick_leave: None,
) -> None:
    # Races the last arrival against the hub's deadline: whatever the hub decides,
    # every participant hears the same.
    for attempt in range(10):
        group = _group(3)
        try:
            deadline = time.monotonic() + 30
            delays = (0.0, 0.0, 0.03 + 0.002 * attempt)
            with ThreadPoolExecutor(3) as pool:
                waits = [
                    pool.submit(_wait_after, m, delay, "edge", 0.05, deadline)
                    for m, delay in zip(group, delays, strict=True)
                ]
                results = [w.result(timeout=30) for w in waits]
            assert len(set(results)) == 1, results
        finally:
            for member in group:
                member.close()


def test_a_process_joins_the_hub_a_decision_names_for_its_own_job() -> None:
    name = hostbarrier.listen()
    assert name is not None
    try:
        # Not this process's socket: it cannot be the hub.
        hostbarrier.join(f"nbckpt-barrier-elsewhere-{uuid.uuid4().hex}", 0, 2, 0)
        assert hostbarrier.current(0, 2) is None
        hostbarrier.join(name, 0, 2, 0)
        hub = hostbarrier.current(0, 2)
        assert hub is not None and hub.me == hub.hub == 0
        assert hostbarrier.current(0, 3) is None  # another job's size
        # A link to it, as process 1 of the same job would make.
        link = HostBarrier(name, 1, 2, 0, None)
        try:
            deadline = time.monotonic() + 30
            with ThreadPoolExecutor(1) as pool:
                other = pool.submit(link.wait, "joined", 5.0, deadline)
                assert hub.wait("joined", 5.0, deadline) is True
                assert other.result(timeout=10) is True
        finally:
            link.close()
    finally:
        hostbarrier.join(None, 0, 2, 0)  # a decision without a hub: back to the service
    assert hostbarrier.current(0, 2) is None
