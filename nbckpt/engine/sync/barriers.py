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
dead is looked for before it. A job whose processes all run on one host meets there
instead, at the host's hub (:mod:`nbckpt.engine.sync.hostbarrier`), which keeps the
same promise in a fifth of the time.

A barrier not passed there goes on over the key-value store, where a waiter can notice
a peer's failure or death and give up, and every participant still decides the same
way: see :mod:`nbckpt.engine.sync.storewait`.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from nbckpt.engine.sync import hostbarrier
from nbckpt.engine.sync.clients import (
    CoordinationServiceClient,
    InProcessClient,
    SignalingClient,
    deadline_passed,
    default_client,
)
from nbckpt.engine.sync.storewait import StoreWait
from nbckpt.errors import BarrierTimeoutError, PeerFailedError
from nbckpt.protocol import FAILED_KEY, KEY_PREFIX, barrier_key

__all__ = [
    "CoordinationServiceClient",
    "InProcessClient",
    "SignalingClient",
    "Synchronizer",
    "claim_key",
    "default_client",
    "next_sequence",
    "wait_slice",
]

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


#: The callers' keys each client has used, by kind of call (see :func:`claim_key`).
_claimed_keys: weakref.WeakKeyDictionary[object, set[tuple[str, str]]] = weakref.WeakKeyDictionary()


def claim_key(client: object, kind: str, key: str) -> None:
    """Take the caller's ``key`` for one call of ``kind`` (``"save or restore"``, say).

    A key names a call's records at the coordination service, which outlive the call:
    a second call under the same key would meet the first one's arrivals and decision
    there and go on with them (a save then reported done on one process while the
    others waited for it). So each key serves one call of a process, that is of its
    ``client`` (one per process; a simulated job runs many processes in one).

    Raises
    ------
    ValueError
        If ``client`` was used with ``key`` for an earlier call of ``kind``. Every
        process makes the same calls, so every process refuses it alike, before any
        exchange.
    """
    with _sequence_lock:
        used = _claimed_keys.setdefault(client, set())
        if (kind, key) in used:
            raise ValueError(
                f"key {key!r} was already used by an earlier {kind} of this process: a key "
                "names one call (its records at the coordination service outlive it); "
                "give each call a key of its own"
            )
        used.add((kind, key))


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
        # Bound once: the fast path of barrier() calls the service with nothing between.
        self._service_barrier = (
            client.barrier_call() if isinstance(client, CoordinationServiceClient) else None
        )
        self._me, self._count = client.process_index, client.process_count
        self.poll_s = wait_slice(client.process_count) if poll_s is None else poll_s
        self.health = health
        self.fast_s = fast_s

    @property
    def fast_s(self) -> float:
        """How long a barrier first waits at the service's own barrier; 0: not at all."""
        return self._fast_s

    @fast_s.setter
    def fast_s(self, value: float) -> None:
        self._fast_s = value
        # Kept in the unit the service takes, for the fast path (see barrier()).
        self._fast_ms = max(1, int(value * 1000)) if value > 0 else 0

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
        # Peers waiting at this host's hub would sit out its fast phase before they
        # looked for the record above: the hub sends them on to look now.
        host = hostbarrier.current(self._me, self._count)
        if host is not None:
            with contextlib.suppress(Exception):
                host.abandon(f"{KEY_PREFIX}/{op}/")

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
        if process_ids is not None and self.client.process_index not in process_ids:
            me = self.client.process_index
            raise ValueError(f"process {me} is not among the barrier's processes {process_ids}")
        # The fast path calls the service's own barrier directly, and touches nothing
        # it need not (no call into another module, the key spelled out, the timeout
        # kept in milliseconds): a barrier is a round trip of half a millisecond, and
        # what the code touches after the process slept in the call measurably added
        # to it (4 processes on 2 cores, 15 rounds of 200 paired with the service's own
        # call: 1.06-1.08x through two layers of calls, 1.02-1.07x with the call bound
        # once, and the same body as a plain function as slow: not the instructions).
        if self.health is not None:
            # A peer already known dead is looked for first: this process then gives
            # up before it counts anywhere, so the barrier cannot pass without it.
            self.health(f"barrier {name}")
            left = deadline - time.monotonic()
        else:
            left = timeout_s
        # The service ends the fast barrier up to a second after its deadline.
        if self._fast_ms and left >= self._fast_s + 1.0:
            call = self._service_barrier
            host = hostbarrier.current(self._me, self._count) if process_ids is None else None
            if host is not None:
                if host.wait(f"{KEY_PREFIX}/{op}/{name}/fast", self._fast_s, deadline):
                    return  # met on this host (see nbckpt.engine.sync.hostbarrier)
            elif call is not None and process_ids is None:
                try:
                    call(f"{KEY_PREFIX}/{op}/{name}/fast", self._fast_ms)  # barrier_key's
                    return
                except RuntimeError as e:  # jax raises JaxRuntimeError (a RuntimeError)
                    if not deadline_passed(e):
                        raise
            elif self.client.wait_at_barrier(
                f"{barrier_key(op, name)}/fast", self._fast_s, process_ids
            ):
                return
        key = barrier_key(op, name)
        expected = sorted(range(self.process_count) if process_ids is None else process_ids)
        StoreWait(self, op, name, key, expected, deadline, timeout_s).run()

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
        decision, see :meth:`await_value`). The source's own value never leaves it: it
        meets the others and reads theirs, a round trip to the service fewer.

        Raises
        ------
        BarrierTimeoutError
            If some process did not take part within ``timeout_s``.
        """
        if self.process_index != source:
            self._post(op, name, value, timeout_s)
            return None
        self.barrier(op, name, timeout_s=timeout_s)
        values = self._values(barrier_key(op, name))
        values[source] = value
        return values

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
