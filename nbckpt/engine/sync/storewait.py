"""A barrier's wait over the key-value store: where a waiter can notice and give up.

:class:`~nbckpt.engine.sync.barriers.Synchronizer` comes here when its barrier was not
passed at the service's own barrier (see :mod:`nbckpt.engine.sync.barriers`). Each
process increments ``<key>/count``; the one that brings it to the number of
participants sets ``<key>/release``; the others record their arrival
(``<key>/arrived/<process>``) and wait for ``release``.

The wait for ``release`` is cut into slices
(:func:`~nbckpt.engine.sync.barriers.wait_slice`: longer in a larger job, so that a
thousand waiters do not flood the service). Between slices a waiter asks the service
whether a peer recorded a failure (``nbckpt/<op>/failed/<process>``) and looks at what
it knows itself (a peer that process 0 reports dead), and gives up at once instead of
waiting out the deadline.

A waiter whose deadline passes, or that gives up early (a peer failed, died or became
unreachable), adds a large number to the count before it gives up. The count can then
never equal the number of participants, so a straggler that arrives later fails too
instead of passing a barrier the others abandoned, and "the count reached N" keeps
meaning "every participant arrived before anyone gave up". The first to give up reads
that from its own increment: if everyone had arrived it passes (the last arrival sets
``release``); if not, it sets ``release`` to say the barrier was abandoned, and by
whom. Whoever gives up after it follows that word, so every participant decides the
same way. When the deadline passes, the processes without an arrival record are the
ones named as missing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from nbckpt.errors import BarrierTimeoutError, NbckptError, PeerDeadError, PeerFailedError, who

if TYPE_CHECKING:
    from nbckpt.engine.sync.barriers import Synchronizer

__all__ = ["FOLLOW_S", "StoreWait"]

#: How long a waiter that finds the barrier abandoned by another process looks for its
#: own reason, before it reports the other's: process 0 learns of a death a beat
#: before the others, and each survivor should name the dead process itself.
FOLLOW_S = 5.0

_POISON = 1 << 20  # the service parses counts as 32-bit ints
_PASSED = "1"  # the value of ``release`` when everyone arrived
_ABANDONED = "abandoned"  # ... and its first word when someone gave up first


def _missing(expected: Sequence[int], arrived: dict[str, str]) -> list[int]:
    have = {int(k.rsplit("/", 1)[1]) for k in arrived}
    return [p for p in expected if p not in have]


class StoreWait:
    """One process's wait at one barrier, over the key-value store.

    Parameters
    ----------
    sync
        The synchronizer: its client, slice, health check and failure records.
    op, name
        The operation and the barrier's name; ``key`` is its key.
    expected
        The participants, sorted.
    deadline
        When to give up, by ``time.monotonic()``; ``timeout_s`` is what the error says.
    """

    def __init__(
        self,
        sync: Synchronizer,
        op: str,
        name: str,
        key: str,
        expected: list[int],
        deadline: float,
        timeout_s: float,
    ) -> None:
        self.sync, self.op, self.name, self.key = sync, op, name, key
        self.expected, self.deadline, self.timeout_s = expected, deadline, timeout_s

    def run(self) -> None:
        """Arrive, and wait until everyone has; raise if that will not happen.

        Raises
        ------
        BarrierTimeoutError, PeerFailedError, PeerDeadError
            As :meth:`~nbckpt.engine.sync.barriers.Synchronizer.barrier` says.
        """
        client, key, me = self.sync.client, self.key, self.sync.process_index
        count = client.key_value_increment(f"{key}/count", 1)
        if count == len(self.expected):
            client.key_value_set(f"{key}/release", _PASSED)
            return
        if count > _POISON:
            # Others gave up on this barrier already: this process came too late. Why
            # may be known here (it was cut off from the job): say that first.
            self._look()
            raise BarrierTimeoutError(key, [me], self.timeout_s)
        client.key_value_set(f"{key}/arrived/{me}", str(time.time()))
        if self._wait():
            return
        # Give late arrivals one slice to record themselves, so that only processes
        # that never came are named.
        word = client.blocking_key_value_get(f"{key}/release", self.sync.poll_s)
        if word == _PASSED:
            return
        missing = _missing(self.expected, client.key_value_dir_get(f"{key}/arrived"))
        if word is None and self._give_up(f"{who(missing)} did not arrive in time"):
            return  # the last participant arrived just before the poison
        raise BarrierTimeoutError(key, missing, self.timeout_s)

    def _wait(self) -> bool:
        """Wait until released (True) or the deadline (False); raise on a failure.

        A barrier another process abandoned cannot pass: this one then looks for its
        own reason (each survivor reports the death it saw) for up to
        :data:`FOLLOW_S`, and gives the other's if it finds none.
        """
        client, slice_s = self.sync.client, self.sync.poll_s
        abandoned: str | None = None
        follow_at = self.deadline
        while (remaining := self.deadline - time.monotonic()) > 0:
            if abandoned is None:
                word = client.blocking_key_value_get(f"{self.key}/release", min(slice_s, remaining))
                if word == _PASSED:
                    return True
                if word is not None:
                    abandoned, follow_at = word, time.monotonic() + FOLLOW_S
            else:
                time.sleep(min(slice_s, remaining))
            if abandoned is not None and time.monotonic() >= follow_at:
                self._follow(abandoned)
            try:
                self._look()
            except NbckptError as e:
                if isinstance(e, PeerDeadError) and e.service:
                    raise  # the service is lost: the count cannot be reached
                # Giving up early poisons the count as the deadline does, so that a
                # peer taken for gone cannot pass (and commit) once it comes back.
                if self._give_up(str(e)):
                    return True  # everyone had arrived after all
                raise
        if abandoned is not None:
            self._follow(abandoned)
        return False

    def _look(self) -> None:
        """Raise if a peer recorded a failure, or is known dead."""
        self.sync.check_failures(self.op)
        health: Callable[[str], None] | None = self.sync.health
        if health is not None:
            health(f"barrier {self.name}")

    def _give_up(self, reason: str) -> bool:
        """Poison the barrier; True if everyone had arrived before anyone gave up.

        The first to give up decides from its own increment, and says so in
        ``release`` when the barrier is abandoned; the later ones follow what is there.
        """
        client, key = self.sync.client, self.key
        poisons, counted = divmod(client.key_value_increment(f"{key}/count", _POISON), _POISON)
        if counted < len(self.expected):
            if poisons == 1:
                word = f"{_ABANDONED} {self.sync.process_index} {reason}"
                client.key_value_set(f"{key}/release", word)
            return False
        if poisons == 1:
            return True  # the last arrival came before any poison, and sets release
        # Everyone came, but after the first to give up or before it: its word says which.
        decided = client.blocking_key_value_get(f"{key}/release", max(1.0, 5 * self.sync.poll_s))
        return decided == _PASSED

    def _follow(self, word: str) -> None:
        """Raise what ``word`` says: another process gave up on the barrier, and why.

        The reason this process knows itself (a peer's failure, a death) comes first:
        it is most often why the other gave up.
        """
        self._look()
        _, process, reason = word.split(" ", 2)
        raise PeerFailedError(int(process), f"gave up on barrier {self.name}: {reason}")
