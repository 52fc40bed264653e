"""Barriers and agreement over the coordination service's key-value store.

``jax.distributed`` starts a coordination service on process 0 and a client in every
process. nbckpt synchronizes only through that key-value store, never through device
collectives, because a collective has no deadline and cannot tell who is missing.

A barrier ``nbckpt/<op>/<name>`` first meets the others at the service's own barrier
``.../fast``: one round trip, as fast as ``wait_at_barrier`` itself. The service ends
that barrier for every waiter at once when its short deadline (:data:`FAST_S`) passes,
and at once for anyone who comes later, so either every participant passes it or none
does. Until then a waiter cannot look for a peer's failure (the service's barrier
cannot be left early), which is why the fast barrier is short; a peer already known
dead is looked for before it.

A barrier not passed there goes on over the key-value store, where a waiter can give
up: each process increments ``.../count``; the one that brings it to the number of
participants sets ``.../release``; the others record their arrival
(``.../arrived/<process>``) and wait for ``release`` with a blocking get. The wait is
cut into short slices so that, between slices, a waiter can notice that a peer
recorded a failure (``nbckpt/<op>/failed/<process>``) and give up at once instead of
waiting out the deadline. When the deadline passes, the processes without an arrival
record are the ones named as missing.

A waiter whose deadline passes, or that gives up early (a peer failed, died or became
unreachable), adds a large number to the count before it gives up. The count can then
never equal the number of participants, so a straggler that arrives later fails too
instead of passing a barrier the others abandoned, and "the count reached N" keeps
meaning "every participant arrived before anyone gave up". The first to give up reads
that from its own increment: if everyone had arrived it passes (the last arrival sets
``release``); if not, it sets ``release`` to say the barrier was abandoned, and by
whom. Whoever gives up after it follows that word, so every participant decides the
same way.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Sequence

from nbckpt.engine.sync.clients import (
    CoordinationServiceClient,
    InProcessClient,
    SignalingClient,
    default_client,
)
from nbckpt.errors import BarrierTimeoutError, NbckptError, PeerDeadError, PeerFailedError, who
from nbckpt.protocol import FAILED_KEY, KEY_PREFIX, barrier_key

__all__ = [
    "CoordinationServiceClient",
    "InProcessClient",
    "SignalingClient",
    "Synchronizer",
    "default_client",
    "next_sequence",
    "wait_slice",
]

_POISON = 1 << 20  # the service parses counts as 32-bit ints
_PASSED = "1"  # the value of ``release`` when everyone arrived
_ABANDONED = "abandoned"  # ... and its first word when someone gave up first

FAST_S = 1.0
"""How long a barrier waits at the service's own barrier before it goes on over the
key-value store. The service checks barrier deadlines once a second, so the wait ends
within about a second after this; a barrier with less time than ``FAST_S + 1`` left
skips it, to keep its deadline."""


def wait_slice(process_count: int) -> float:
    """How long one slice of a wait lasts in a job of ``process_count`` processes.

    Between slices a waiter asks the service whether a peer failed; a thousand
    waiters asking five times a second kept the service (simulated on two cores) from
    answering the barrier itself. So the slice grows with the job, keeping the checks
    of all waiters together at about a thousand a second: 0.2 s up to 200 processes,
    1 s from 1,000. A failure is noticed a slice after it is recorded at the latest.
    """
    return min(1.0, max(0.2, process_count / 1000))


_sequences: dict[tuple[int, ...] | None, itertools.count[int]] = {}
_sequence_lock = threading.Lock()


def next_sequence(processes: Sequence[int] | None = None) -> int:
    """Return this process's next operation number among ``processes`` (None: all).

    Every process numbers its collective operations the same way as long as all of
    them issue the same operations in the same order, which nbckpt requires anyway;
    the number keys the agreement on an operation's id. Operations among a subset of
    processes are numbered apart, so that processes outside the subset stay in step.
    """
    scope = None if processes is None else tuple(sorted(processes))
    with _sequence_lock:
        counter = _sequences.setdefault(scope, itertools.count())
        return next(counter)


def _missing(expected: Sequence[int], arrived: dict[str, str]) -> list[int]:
    have = {int(k.rsplit("/", 1)[1]) for k in arrived}
    return [p for p in expected if p not in have]


class Synchronizer:
    """Barriers, failure signals and agreement among the processes of an operation.

    Parameters
    ----------
    client
        The key-value client.
    poll_s
        Length of one wait slice: the longest a waiter goes without checking for a
        peer's failure; by default :func:`wait_slice` of the job's size.
    health
        Optional callable run before a barrier and between slices; it raises to abort
        the wait (for example when a peer is known dead).
    fast_s
        How long a barrier first waits at the service's own barrier (see the module's
        docstring); 0 goes straight to the key-value store.
    """

    def __init__(
        self,
        client: SignalingClient,
        *,
        poll_s: float | None = None,
        health: Callable[[str], None] | None = None,
        fast_s: float = FAST_S,
    ) -> None:
        self.client = client
        self.poll_s = wait_slice(client.process_count) if poll_s is None else poll_s
        self.health = health
        self.fast_s = fast_s

    @property
    def process_index(self) -> int:
        """This process's index."""
        return self.client.process_index

    @property
    def process_count(self) -> int:
        """How many processes take part."""
        return self.client.process_count

    def signal_failure(self, op: str, reason: str) -> None:
        """Tell the other processes of ``op`` that this one failed (best effort)."""
        # The service may be gone too; the caller's own error is what gets raised.
        with contextlib.suppress(Exception):
            self.client.key_value_set(f"{barrier_key(op, FAILED_KEY)}/{self.process_index}", reason)

    def check_failures(self, op: str) -> None:
        """Raise :class:`PeerFailedError` if another process of ``op`` failed."""
        failed = self.client.key_value_dir_get(barrier_key(op, FAILED_KEY))
        others = {int(k.rsplit("/", 1)[1]): v for k, v in failed.items()}
        others.pop(self.process_index, None)
        if others:
            first = min(others)
            raise PeerFailedError(first, others[first], failures=others)

    def barrier(
        self, op: str, name: str, *, timeout_s: float, process_ids: Sequence[int] | None = None
    ) -> None:
        """Wait until every participant reaches barrier ``nbckpt/<op>/<name>``.

        Parameters
        ----------
        op, name
            Together they form the barrier's key; it must be unique per use.
        timeout_s
            The deadline, in seconds.
        process_ids
            The participants; all processes if None. The caller must be among them.

        Raises
        ------
        BarrierTimeoutError
            The deadline passed; the error names the processes that had not arrived.
        PeerFailedError
            Another process of ``op`` recorded a failure while this one waited.
        """
        deadline = time.monotonic() + timeout_s
        me = self.process_index
        if process_ids is not None and me not in process_ids:
            raise ValueError(f"process {me} is not among the barrier's processes {process_ids}")
        key = barrier_key(op, name)
        if self._meet_fast(key, name, process_ids, deadline):
            return
        expected = sorted(range(self.process_count) if process_ids is None else process_ids)
        count = self.client.key_value_increment(f"{key}/count", 1)
        if count == len(expected):
            self.client.key_value_set(f"{key}/release", _PASSED)
            return
        if count > _POISON:
            # Others gave up on this barrier already: this process came too late. Why
            # may be known here (it was cut off from the job): say that first.
            self.check_failures(op)
            if self.health is not None:
                self.health(f"barrier {name}")
            raise BarrierTimeoutError(key, [me], timeout_s)
        self.client.key_value_set(f"{key}/arrived/{me}", str(time.time()))
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            release = self.client.blocking_key_value_get(
                f"{key}/release", min(self.poll_s, remaining)
            )
            if release is not None:
                self._follow(release, op, name)
                return
            try:
                self.check_failures(op)
                if self.health is not None:
                    self.health(f"barrier {name}")
            except NbckptError as e:
                if isinstance(e, PeerDeadError) and e.service:
                    raise  # the service is lost: the count cannot be reached
                # Giving up early poisons the count as the deadline does, so that a
                # peer taken for gone cannot pass (and commit) once it comes back.
                if self._give_up(key, len(expected), str(e)):
                    return  # everyone had arrived after all
                raise
        # Give late arrivals one slice to record themselves, so that only processes
        # that never came are named.
        release = self.client.blocking_key_value_get(f"{key}/release", self.poll_s)
        if release == _PASSED:
            return
        missing = _missing(expected, self.client.key_value_dir_get(f"{key}/arrived"))
        if release is None and self._give_up(
            key, len(expected), f"{who(missing)} did not arrive in time"
        ):
            return  # the last participant arrived just before the poison
        raise BarrierTimeoutError(key, missing, timeout_s)

    def _meet_fast(
        self, key: str, name: str, process_ids: Sequence[int] | None, deadline: float
    ) -> bool:
        """Meet the others at the service's own barrier; True if everyone came in time.

        A peer already known dead is looked for first. This process then gives up
        before it counts anywhere, so the barrier cannot pass without it.
        """
        if self.health is not None:
            self.health(f"barrier {name}")
        # The service ends the fast barrier up to a second after its deadline.
        if self.fast_s <= 0 or deadline - time.monotonic() < self.fast_s + 1.0:
            return False
        return self.client.wait_at_barrier(f"{key}/fast", self.fast_s, process_ids)

    def _give_up(self, key: str, expected: int, reason: str) -> bool:
        """Poison barrier ``key``; True if everyone had arrived before anyone gave up.

        The first to give up decides from its own increment, and says so in
        ``release`` when the barrier is abandoned; the later ones follow what is there.
        """
        poisons, counted = divmod(self.client.key_value_increment(f"{key}/count", _POISON), _POISON)
        if counted < expected:
            if poisons == 1:
                word = f"{_ABANDONED} {self.process_index} {reason}"
                self.client.key_value_set(f"{key}/release", word)
            return False
        if poisons == 1:
            return True  # the last arrival came before any poison, and sets release
        # Everyone came, but after the first to give up or before it: its word says which.
        release = self.client.blocking_key_value_get(f"{key}/release", max(1.0, 5 * self.poll_s))
        return release == _PASSED

    def _follow(self, release: str, op: str, name: str) -> None:
        """Pass if ``release`` says everyone arrived; raise if someone gave up first.

        The reason this process knows itself (a peer's failure, a death) comes first:
        it is most often why the other gave up.
        """
        if release == _PASSED:
            return
        self.check_failures(op)
        if self.health is not None:
            self.health(f"barrier {name}")
        _, process, reason = release.split(" ", 2)
        raise PeerFailedError(int(process), f"gave up on barrier {name}: {reason}")

    def broadcast(
        self, op: str, name: str, value: str | None, *, source: int, timeout_s: float
    ) -> str:
        """Publish ``value`` from process ``source`` and return it on every process.

        Raises
        ------
        BarrierTimeoutError
            If ``source`` did not publish within ``timeout_s``.
        """
        key = barrier_key(op, name)
        if self.process_index == source:
            if value is None:
                raise ValueError("the source process must provide a value")
            self.client.key_value_set(key, value)
            return value
        got = self.client.blocking_key_value_get(key, timeout_s)
        if got is None:
            raise BarrierTimeoutError(key, [source], timeout_s)
        return got

    def await_value(self, op: str, name: str, *, source: int, timeout_s: float) -> str:
        """Wait for the value process ``source`` sets at ``nbckpt/<op>/<name>``.

        The wait is sliced like a barrier's, so that a peer's failure or death ends it.

        Raises
        ------
        BarrierTimeoutError
            If ``source`` did not set it within ``timeout_s``.
        PeerFailedError
            Another process of ``op`` recorded a failure while this one waited.
        """
        key = barrier_key(op, name)
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            got = self.client.blocking_key_value_get(key, min(self.poll_s, remaining))
            if got is not None:
                return got
            self.check_failures(op)
            if self.health is not None:
                self.health(f"barrier {name}")
        raise BarrierTimeoutError(key, [source], timeout_s)

    def gather_at(
        self, op: str, name: str, value: str, *, source: int, timeout_s: float
    ) -> dict[int, str] | None:
        """Send one string per process to ``source``: it gets them all, the others None.

        One read of N values, where :meth:`gather` makes N of them: what a job of a
        thousand processes can afford for its agreements (the source then publishes a
        decision, see :meth:`await_value`).

        Raises
        ------
        BarrierTimeoutError
            If some process did not take part within ``timeout_s``.
        """
        key = self._post(op, name, value, timeout_s)
        return self._values(key) if self.process_index == source else None

    def gather(self, op: str, name: str, value: str, *, timeout_s: float) -> dict[int, str]:
        """Exchange one string per process; every process gets all of them.

        Raises
        ------
        BarrierTimeoutError
            If some process did not take part within ``timeout_s``.
        """
        return self._values(self._post(op, name, value, timeout_s))

    def _post(self, op: str, name: str, value: str, timeout_s: float) -> str:
        """Post this process's ``value`` under ``op``/``name``, then meet the others there."""
        key = barrier_key(op, name)
        self.client.key_value_set(f"{key}/value/{self.process_index}", value)
        self.barrier(op, name, timeout_s=timeout_s)
        return key

    def _values(self, key: str) -> dict[int, str]:
        values = self.client.key_value_dir_get(f"{key}/value")
        return {int(k.rsplit("/", 1)[1]): v for k, v in values.items()}

    def cleanup(self, op: str) -> None:
        """Delete every key of ``op`` (call only once every process is past it)."""
        # Leftover keys only cost the service a little memory.
        with contextlib.suppress(Exception):
            self.client.key_value_delete(f"{KEY_PREFIX}/{op}")
