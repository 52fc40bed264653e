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
from typing import Any, Protocol, runtime_checkable

from nbckpt.errors import BarrierTimeoutError, NbckptError, PeerDeadError, PeerFailedError
from nbckpt.protocol import FAILED_KEY, KEY_PREFIX, barrier_key

__all__ = [
    "CoordinationServiceClient",
    "InProcessClient",
    "SignalingClient",
    "Synchronizer",
    "default_client",
    "next_sequence",
]

_POISON = 1 << 20  # the service parses counts as 32-bit ints


@runtime_checkable
class SignalingClient(Protocol):
    """The few key-value operations nbckpt needs from a coordination service."""

    @property
    def process_index(self) -> int:
        """This process's index, 0-based."""
        ...

    @property
    def process_count(self) -> int:
        """How many processes take part."""
        ...

    def key_value_set(self, key: str, value: str) -> None:
        """Set ``key`` to ``value``, overwriting any earlier value."""
        ...

    def blocking_key_value_get(self, key: str, timeout_s: float) -> str | None:
        """Return the value of ``key`` once set, or None if ``timeout_s`` passes first."""
        ...

    def key_value_dir_get(self, prefix: str) -> dict[str, str]:
        """Return every key under ``prefix/`` with its value."""
        ...

    def key_value_increment(self, key: str, by: int) -> int:
        """Atomically add ``by`` to the integer at ``key`` and return the new value."""
        ...

    def key_value_delete(self, key: str) -> None:
        """Delete ``key`` and every key under ``key/``."""
        ...


class CoordinationServiceClient:
    """A :class:`SignalingClient` over the client that ``jax.distributed`` started.

    Parameters
    ----------
    client
        ``jax._src.distributed.global_state.client``, or None to take it from there.
    process_index, process_count
        This process's index and the number of processes; from jax if omitted.
    """

    def __init__(
        self,
        client: object | None = None,
        process_index: int | None = None,
        process_count: int | None = None,
    ) -> None:
        import jax
        from jax._src.distributed import global_state

        self._client: Any = client if client is not None else global_state.client
        if self._client is None:
            raise RuntimeError(
                "jax.distributed is not initialized in this process; call "
                "jax.distributed.initialize(...) first, or use InProcessClient for a "
                "single process"
            )
        self._index = jax.process_index() if process_index is None else process_index
        self._count = jax.process_count() if process_count is None else process_count

    @property
    def process_index(self) -> int:
        """This process's index, 0-based."""
        return self._index

    @property
    def process_count(self) -> int:
        """How many processes take part."""
        return self._count

    def key_value_set(self, key: str, value: str) -> None:
        """Set ``key`` to ``value``, overwriting any earlier value."""
        self._client.key_value_set(key, value, allow_overwrite=True)

    def blocking_key_value_get(self, key: str, timeout_s: float) -> str | None:
        """Return the value of ``key`` once set, or None if ``timeout_s`` passes first."""
        try:
            value: str = self._client.blocking_key_value_get(key, max(1, int(timeout_s * 1000)))
        except RuntimeError as e:  # jax raises JaxRuntimeError (a RuntimeError)
            if "DEADLINE_EXCEEDED" in str(e):
                return None
            raise
        return value

    def key_value_dir_get(self, prefix: str) -> dict[str, str]:
        """Return every key under ``prefix/`` with its value."""
        items = self._client.key_value_dir_get(prefix.rstrip("/") + "/")
        return dict(items)

    def key_value_increment(self, key: str, by: int) -> int:
        """Atomically add ``by`` to the integer at ``key`` and return the new value."""
        return int(self._client.key_value_increment(key, by))

    def key_value_delete(self, key: str) -> None:
        """Delete ``key`` and every key under ``key/``."""
        self._client.key_value_delete(key)


class InProcessClient:
    """A :class:`SignalingClient` for one process: a dict guarded by a condition.

    It also serves tests that run several "processes" as threads of one interpreter:
    give each thread its own instance over a shared ``store``.

    Parameters
    ----------
    process_index, process_count
        The identity this client reports.
    store
        Another InProcessClient whose store to share, or None for a private one.
    """

    def __init__(
        self, process_index: int = 0, process_count: int = 1, store: InProcessClient | None = None
    ) -> None:
        self._index = process_index
        self._count = process_count
        if store is None:
            self._data: dict[str, str] = {}
            self._cond = threading.Condition()
        else:
            self._data = store._data
            self._cond = store._cond

    @property
    def process_index(self) -> int:
        """This process's index, 0-based."""
        return self._index

    @property
    def process_count(self) -> int:
        """How many processes take part."""
        return self._count

    def key_value_set(self, key: str, value: str) -> None:
        """Set ``key`` to ``value``, overwriting any earlier value."""
        with self._cond:
            self._data[key] = value
            self._cond.notify_all()

    def blocking_key_value_get(self, key: str, timeout_s: float) -> str | None:
        """Return the value of ``key`` once set, or None if ``timeout_s`` passes first."""
        with self._cond:
            self._cond.wait_for(lambda: key in self._data, timeout=timeout_s)
            return self._data.get(key)

    def key_value_dir_get(self, prefix: str) -> dict[str, str]:
        """Return every key under ``prefix/`` with its value."""
        p = prefix.rstrip("/") + "/"
        with self._cond:
            return {k: v for k, v in self._data.items() if k.startswith(p)}

    def key_value_increment(self, key: str, by: int) -> int:
        """Atomically add ``by`` to the integer at ``key`` and return the new value."""
        with self._cond:
            value = int(self._data.get(key, "0")) + by
            self._data[key] = str(value)
            self._cond.notify_all()
            return value

    def key_value_delete(self, key: str) -> None:
        """Delete ``key`` and every key under ``key/``."""
        p = key.rstrip("/") + "/"
        with self._cond:
            for k in [k for k in self._data if k == key or k.startswith(p)]:
                del self._data[k]


_default_lock = threading.Lock()
_default: SignalingClient | None = None


def default_client() -> SignalingClient:
    """Return this process's key-value client (one per process).

    The coordination service when jax runs several processes, otherwise an
    in-process client.
    """
    import jax

    global _default
    with _default_lock:
        if _default is None:
            _default = CoordinationServiceClient() if jax.process_count() > 1 else InProcessClient()
        return _default


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
        peer's failure.
    health
        Optional callable run between slices; it raises to abort the wait (for
        example when a peer is known dead).
    """

    def __init__(
        self,
        client: SignalingClient,
        *,
        poll_s: float = 0.2,
        health: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.poll_s = poll_s
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

    def gather(self, op: str, name: str, value: str, *, timeout_s: float) -> dict[int, str]:
        """Exchange one string per process; every process gets all of them.

        Raises
        ------
        BarrierTimeoutError
            If some process did not take part within ``timeout_s``.
        """
        key = barrier_key(op, name)
        self.client.key_value_set(f"{key}/value/{self.process_index}", value)
        self.barrier(op, name, timeout_s=timeout_s)
        values = self.client.key_value_dir_get(f"{key}/value")
        return {int(k.rsplit("/", 1)[1]): v for k, v in values.items()}

    def cleanup(self, op: str) -> None:
        """Delete every key of ``op`` (call only once every process is past it)."""
        # Leftover keys only cost the service a little memory.
        with contextlib.suppress(Exception):
            self.client.key_value_delete(f"{KEY_PREFIX}/{op}")
