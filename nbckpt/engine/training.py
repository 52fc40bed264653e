"""The training loop's checkpointer: when to save, what to keep, when to stop.

One object a loop holds, from ``%%px`` cells or a plain script, over an
:class:`~nbckpt.engine.AsyncCheckpointer` (``.checkpointer``)::

    with TrainingCheckpointer("/ckpt", save=SavePolicy(every_steps=100), max_to_keep=3) as tc:
        state = tc.restore_or(init_state)          # the newest step, or init_state()
        for step in range(tc.next_step, steps):
            state, loss = train_step(state, batch)
            tc.save(step, state, metrics={"loss": loss})   # saves only when a rule says so
            if tc.stopping:                         # a preemption's agreed step is saved
                break

:class:`SavePolicy` says when a step is saved: every N steps, every T seconds, and at
the step every process agrees on once any of them is told to stop (see
:mod:`nbckpt.engine.sync.preemption`); any rule that fires saves. Retention is the
checkpointer's own (``max_to_keep``, ``keep_period``, ``best_n``...). Orbax v1's
``training.Checkpointer`` with its save-decision and preservation policies is the
model.

Every process must take the same decision at the same step. Step rules and the
preemption step are agreed by construction; a time rule is not (clocks and speeds
differ), so with ``every_seconds`` the primary decides and publishes its decision for
each step through the key-value store: one round trip per step, only then.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nbckpt.engine.checkpointer import AsyncCheckpointer
from nbckpt.engine.options import check_step
from nbckpt.engine.sync.barriers import default_client
from nbckpt.errors import BarrierTimeoutError, StepNotFoundError
from nbckpt.formats.layout import all_steps
from nbckpt.storage import Location

__all__ = ["SavePolicy", "TrainingCheckpointer"]

#: Decisions kept in the key-value store behind the newest one: a process lagging
#: further than this behind the primary in a lockstep job would be a bug of its own.
_KEPT_DECISIONS = 64


@dataclass(frozen=True, kw_only=True)
class SavePolicy:
    """When a training loop saves a step: whenever any of the rules given says so.

    Parameters
    ----------
    every_steps
        Save the steps that this divides (0, N, 2N, ...).
    every_seconds
        Save a step once this long has passed since the last save (or the start),
        as the primary's clock says.
    on_preemption
        Save the agreed step once any process is told to stop, then stop.
    """

    every_steps: int | None = None
    every_seconds: float | None = None
    on_preemption: bool = True

    def __post_init__(self) -> None:
        n = self.every_steps
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"every_steps must be a whole number of at least 1, got {n!r}")
        s = self.every_seconds
        if s is not None and (
            isinstance(s, bool) or not isinstance(s, int | float) or not math.isfinite(s) or s <= 0
        ):
            raise ValueError(f"every_seconds must be a finite number above 0, got {s!r}")


class TrainingCheckpointer:
    """Save a training loop's state by policy, keep what retention says, stop when told.

    Parameters
    ----------
    root
        The checkpoint root (see :class:`~nbckpt.engine.AsyncCheckpointer`); None, the
        cluster's ``--dir``, set on every engine by ``%ckpt_cluster start --dir D``.
    save
        When to save; by default only on preemption (pass ``every_steps`` or
        ``every_seconds`` for regular saves).
    **options
        Everything else :class:`~nbckpt.engine.AsyncCheckpointer` takes: retention
        (``max_to_keep``, ``keep_period``, ``best_n``, ``best_metric``, ``best_mode``),
        ``mode``, ``format``, ``timeout_s``, ``primary``, ``client``,
        ``preemption_grace_s``.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Location | None = None,
        *,
        save: SavePolicy | None = None,
        **options: Any,
    ) -> None:
        self.policy = save if save is not None else SavePolicy()
        if not isinstance(self.policy, SavePolicy):
            raise TypeError(f"save must be a SavePolicy, got {type(self.policy).__name__}")
        #: The checkpointer underneath, for anything this class does not say.
        self.checkpointer = AsyncCheckpointer(root, **options)
        client = options.get("client")
        self._client = client if client is not None else default_client()
        # Decisions of the time rule are published per root and step.
        tag = hashlib.sha256(str(self.checkpointer.root).encode()).hexdigest()[:16]
        self._prefix = f"nbckpt/train/{tag}"
        self._decided: tuple[int, bool] | None = None
        self._last_save = time.monotonic()
        self._stopping = False
        steps = all_steps(self.checkpointer.root)
        self._latest = steps[-1] if steps else None

    # -- where to start -----------------------------------------------------------------

    @property
    def latest_step(self) -> int | None:
        """The newest complete step under the root (when opened, or saved since).

        With a local tier, :meth:`restore_or` sets it to the step it restored.
        """
        return self._latest

    @property
    def next_step(self) -> int:
        """The step a loop resumes at: one past :attr:`latest_step`, or 0."""
        return 0 if self._latest is None else self._latest + 1

    def restore_or(self, init: Callable[[], Any], **restore: Any) -> Any:
        """Return the newest step restored into ``init()``'s layout, or ``init()`` itself.

        ``init()`` is the target: its leaves give the shapes, dtypes and shardings
        (``jax.eval_shape`` would drop the shardings), and its structure the tree. With
        a local tier (``local_dir``), the newest step the live hosts hold whole may be
        newer than the root's: that one is restored, and :attr:`next_step` follows it.
        Keywords go to :meth:`AsyncCheckpointer.restore` (``cast``, ``partial``,
        ``timeout_s``).
        """
        state = init()
        if self.checkpointer.local_tier is not None:
            # The hosts may hold newer steps than the root: the fastest tier decides.
            try:
                restored = self.checkpointer.restore(None, state, **restore)
            except StepNotFoundError:
                return state
            self._latest = self.checkpointer.last_step
            return restored
        if self._latest is None:
            return state
        return self.checkpointer.restore(self._latest, state, **restore)

    # -- each step ----------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        """Tell whether ``step`` is to be saved; the same answer on every process."""
        step = check_step(step)
        p = self.policy
        due = p.every_steps is not None and step % p.every_steps == 0
        if p.every_seconds is not None:
            due = self._time_rule(step) or due
        if p.on_preemption and self.checkpointer.reached_preemption(step):
            self._stopping = True
            due = True
        return due and (self._latest is None or step > self._latest)

    def save(self, step: int, state: Any, *, metrics: Mapping[str, Any] | None = None) -> bool:
        """Save ``state`` as ``step`` if :meth:`should_save` says so; return whether.

        A save for a preemption is waited for (it must be durable before the process
        goes); the others run in the background as :meth:`AsyncCheckpointer.save`'s do.
        """
        if not self.should_save(step):
            if self._stopping:  # the agreed step was saved already: it must be durable
                self.checkpointer.wait_until_finished()
            return False
        self.checkpointer.save(step, state, metrics=metrics)
        self._latest = step
        self._last_save = time.monotonic()
        if self._stopping:
            self.checkpointer.wait_until_finished()
        return True

    @property
    def stopping(self) -> bool:
        """True once the step agreed after a preemption notice is saved: stop the loop."""
        return self._stopping

    def _time_rule(self, step: int) -> bool:
        """The primary's decision for ``step``, taken once and the same everywhere."""
        if self._decided is not None and self._decided[0] == step:
            return self._decided[1]
        decision = self._decide(step)
        self._decided = (step, decision)
        return decision

    def _decide(self, step: int) -> bool:
        client, options = self._client, self.checkpointer.options
        if client.process_count == 1:
            return self._elapsed()
        key = f"{self._prefix}/{step}"
        if client.process_index == options.primary:
            decision = self._elapsed()
            client.key_value_set(key, "1" if decision else "0")
            if step >= _KEPT_DECISIONS:
                client.key_value_delete(f"{self._prefix}/{step - _KEPT_DECISIONS}")
            return decision
        got = client.blocking_key_value_get(key, options.timeout_s)
        if got is None:
            raise BarrierTimeoutError(key, [options.primary], options.timeout_s)
        return got == "1"

    def _elapsed(self) -> bool:
        limit = self.policy.every_seconds
        return limit is not None and time.monotonic() - self._last_save >= limit

    # -- the end ------------------------------------------------------------------------

    def wait_until_finished(self) -> None:
        """Block until the save in flight is committed (or raise its error)."""
        self.checkpointer.wait_until_finished()

    def close(self) -> None:
        """Wait for the save in flight, then stop accepting calls."""
        self.checkpointer.close()

    def __enter__(self) -> TrainingCheckpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
