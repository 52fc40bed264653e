"""The key-value clients nbckpt signals through: the coordination service's, or a dict.

:class:`SignalingClient` is the few operations barriers, heartbeats and agreements
need; :class:`CoordinationServiceClient` adapts the client ``jax.distributed`` started,
and :class:`InProcessClient` serves a single process (and tests that play several
processes as threads).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "CoordinationServiceClient",
    "InProcessClient",
    "SignalingClient",
    "deadline_passed",
    "default_client",
]


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

    def key_value_try_get(self, key: str) -> str | None:
        """Return the value of ``key``, or None if it is not set (without waiting)."""
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

    def wait_at_barrier(
        self, key: str, timeout_s: float, process_ids: Sequence[int] | None
    ) -> bool:
        """Meet ``process_ids`` (None: all) at the service's barrier ``key``.

        Return True when every one of them arrived, False when the barrier's deadline
        passed first; a barrier whose deadline passed is over for every caller, later
        ones included. Each key is used once.
        """
        ...


def deadline_passed(error: RuntimeError) -> bool:
    """Whether jax's error from a call to the service says the call's deadline passed."""
    return "DEADLINE_EXCEEDED" in str(error)


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
            if deadline_passed(e):
                return None
            raise
        return value

    def key_value_try_get(self, key: str) -> str | None:
        """Return the value of ``key``, or None if it is not set (without waiting)."""
        try:
            value: str = self._client.key_value_try_get(key)
        except RuntimeError as e:  # jax raises JaxRuntimeError (a RuntimeError)
            if "NOT_FOUND" in str(e):
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

    def barrier_call(self) -> Callable[[str, int], None]:
        """The service's own barrier call of all processes: ``(key, timeout_ms)``.

        For a caller whose every microsecond counts (:meth:`Synchronizer.barrier
        <nbckpt.engine.sync.barriers.Synchronizer.barrier>`'s fast path): it raises
        jax's ``RuntimeError`` (:func:`deadline_passed` tells it) where
        :meth:`wait_at_barrier` returns False.
        """
        call: Callable[[str, int], None] = self._client.wait_at_barrier
        return call

    def wait_at_barrier(
        self, key: str, timeout_s: float, process_ids: Sequence[int] | None
    ) -> bool:
        """Meet ``process_ids`` (None: all) at the service's barrier ``key``.

        True when all arrived, False when its deadline passed first (for every caller).
        """
        # Sorted: every participant must name the same processes, whatever its order.
        ids = None if process_ids is None else sorted(process_ids)
        try:
            self._client.wait_at_barrier(key, max(1, int(timeout_s * 1000)), ids)
        except RuntimeError as e:  # jax raises JaxRuntimeError (a RuntimeError)
            if deadline_passed(e):
                return False
            raise
        return True


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
            self._barriers: dict[str, _Barrier] = {}
            self._cond = threading.Condition()
        else:
            self._data = store._data
            self._barriers = store._barriers
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

    def key_value_try_get(self, key: str) -> str | None:
        """Return the value of ``key``, or None if it is not set (without waiting)."""
        with self._cond:
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
            for k in [k for k in self._barriers if k == key or k.startswith(p)]:
                del self._barriers[k]

    def wait_at_barrier(
        self, key: str, timeout_s: float, process_ids: Sequence[int] | None
    ) -> bool:
        """Meet ``process_ids`` (None: all) at barrier ``key``, as the service does.

        True when all arrived, False when its deadline passed first (for every caller).
        """
        ids = frozenset(range(self._count) if process_ids is None else process_ids)
        with self._cond:
            bar = self._barriers.setdefault(key, _Barrier(ids, time.monotonic() + timeout_s))
            if bar.passed is None:
                if ids != bar.ids or self._index not in ids:
                    raise ValueError(f"barrier {key}: process {self._index} is not one of {ids}")
                bar.arrived.add(self._index)
                if bar.arrived == bar.ids:
                    bar.passed = True
                    # Nobody can come later: forget it (the waiters hold it). One that
                    # timed out is kept, for whoever comes late.
                    del self._barriers[key]
                    self._cond.notify_all()
                else:
                    self._cond.wait_for(
                        lambda: bar.passed is not None, timeout=bar.deadline - time.monotonic()
                    )
                    if bar.passed is None:
                        bar.passed = False
                        self._cond.notify_all()
            return bar.passed


@dataclass
class _Barrier:
    """One barrier of :class:`InProcessClient`: who takes part, who came, how it ended."""

    ids: frozenset[int]
    deadline: float
    arrived: set[int] = field(default_factory=set)
    passed: bool | None = None


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
