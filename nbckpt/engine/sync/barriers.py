"""Barriers and agreement over the coordination service's key-value store.

``jax.distributed`` starts a coordination service on process 0 and a client in every
process. nbckpt synchronizes only through that key-value store, never through device
collectives, because a collective has no deadline and cannot tell who is missing.

A barrier ``nbckpt/<op>/<name>`` works in two round trips on the fast path: each
process increments ``.../count``; the one that brings it to the number of participants
sets ``.../release``; the others wait for ``release`` with a blocking get. The wait is
cut into short slices so that, between slices, a waiter can notice that a peer
recorded a failure (``nbckpt/<op>/failed/<process>``) and give up at once instead of
waiting out the deadline. A waiter that is still waiting after one slice records its
arrival (``.../arrived/<process>``); when the deadline passes, the processes without
an arrival record are the ones named as missing.

A waiter whose deadline passes, or that gives up early (a peer failed, died or became
unreachable), adds a large number to the count before it gives up. The count can then
never equal the number of participants, so a straggler that arrives later fails too
instead of passing a barrier the others abandoned; and if the count shows that
everyone had in fact arrived, the waiter passes. Either way every participant decides
the same way, and "the count reached N" keeps meaning "every participant arrived".
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
from nbckpt.errors import BarrierTimeoutError, NbckptError, PeerDeadError, PeerFailedError
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
        Optional callable run between slices; it raises to abort the wait (for
        example when a peer is known dead).
    """

    def __init__(
        self,
        client: SignalingClient,
        *,
        poll_s: float | None = None,
        health: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.poll_s = wait_slice(client.process_count) if poll_s is None else poll_s
        self.health = health

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
        expected = sorted(range(self.process_count) if process_ids is None else process_ids)
        me = self.process_index
        if me not in expected:
            raise ValueError(f"process {me} is not among the barrier's processes {expected}")
        key = barrier_key(op, name)
        deadline = time.monotonic() + timeout_s
        count = self.client.key_value_increment(f"{key}/count", 1)
        if count == len(expected):
            self.client.key_value_set(f"{key}/release", "1")
            return
        if count > _POISON:
            # Others gave up on this barrier already: this process came too late. Why
            # may be known here (it was cut off from the job): say that first.
            self.check_failures(op)
            if self.health is not None:
                self.health(f"barrier {name}")
            raise BarrierTimeoutError(key, [me], timeout_s)
        announced = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if (
                self.client.blocking_key_value_get(f"{key}/release", min(self.poll_s, remaining))
                is not None
            ):
                return
            if not announced:
                self.client.key_value_set(f"{key}/arrived/{me}", str(time.time()))
                announced = True
            try:
                self.check_failures(op)
                if self.health is not None:
                    self.health(f"barrier {name}")
            except NbckptError as e:
                if isinstance(e, PeerDeadError) and e.service:
                    raise  # the service is lost: the count cannot be reached
                # Giving up early poisons the count as the deadline does, so that a
                # peer taken for gone cannot pass (and commit) once it comes back.
                poisoned = self.client.key_value_increment(f"{key}/count", _POISON)
                if poisoned % _POISON >= len(expected):
                    return  # everyone had arrived after all
                raise
        # Give late arrivals one slice to record themselves, so that only processes
        # that never came are named.
        if self.client.blocking_key_value_get(f"{key}/release", self.poll_s) is not None:
            return
        poisoned = self.client.key_value_increment(f"{key}/count", _POISON)
        if poisoned % _POISON >= len(expected):
            return  # the last participant arrived just before the poison
        arrived = self.client.key_value_dir_get(f"{key}/arrived")
        raise BarrierTimeoutError(key, _missing(expected, arrived), timeout_s)

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
