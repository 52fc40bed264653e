"""The read side of a checkpointer: restore a step, and tell whether one is due."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbckpt.engine.context import Context
from nbckpt.engine.options import CheckpointerOptions
from nbckpt.engine.options import check_step as _check_step
from nbckpt.engine.restore_entry import restore_agreed
from nbckpt.engine.tiers.local import LocalTier
from nbckpt.errors import CallError
from nbckpt.formats.layout import all_steps
from nbckpt.formats.retention import should_save
from nbckpt.gcpause import paused_gc
from nbckpt.storage import Location

__all__ = ["CheckpointReader"]


class CheckpointReader:
    """What :class:`~nbckpt.engine.AsyncCheckpointer` reads, and what both sides share.

    It restores steps and tells whether one is due; the checkpointer adds the saves.
    Use the checkpointer: this class exists so that each side is one place to read.

    Parameters
    ----------
    root
        The checkpoint root.
    options
        The defaults of every call.
    ctx
        The processes of the job, and the preflight that starts every operation.
    """

    def __init__(self, root: Location, options: CheckpointerOptions, ctx: Context) -> None:
        self.root: Location = root
        self.options = options
        self._ctx = ctx
        self._closed = False
        #: The local tier, when ``options.tiers`` names a local directory.
        self._tier = LocalTier(options.tiers, root) if options.tiers.local_dir else None
        #: The id of the last operation this checkpointer started (its journal folder).
        self.last_op: str | None = None
        #: The step the last restore read (with a local tier, the chosen one).
        self.last_step: int | None = None

    def _settle(self) -> None:
        """Raise if closed; a checkpointer also waits here for its save in flight."""
        if self._closed:
            raise CallError("this checkpointer is closed; create a new AsyncCheckpointer")

    @property
    def process_index(self) -> int:
        """This process's index."""
        return self._ctx.sync.process_index

    @property
    def local_tier(self) -> LocalTier | None:
        """This process's local tier (its host, directory and holdings), or None."""
        return self._tier

    @property
    def process_count(self) -> int:
        """The number of processes in the job."""
        return self._ctx.sync.process_count

    def should_save(self, step: int) -> bool:
        """Tell whether ``step`` is due for a save, as Orbax's ``should_save`` does.

        False for a step not newer than the latest complete step under the root;
        otherwise True when ``save_interval_steps`` is unset or divides ``step``. It
        reads only the root, so every process that sees it answers the same.
        """
        return should_save(_check_step(step), all_steps(self.root), self.options.retention)

    def restore(
        self,
        step: int | None = None,
        target: Any = None,
        *,
        key: str | None = None,
        timeout_s: float | None = None,
        cast: bool = False,
        item: str | None = None,
        partial: bool = False,
    ) -> Any:
        """Read a complete step back, each process reading only what it needs.

        The step may be nbckpt's or Orbax's (a ``CheckpointManager`` step, or a
        ``StandardCheckpointer`` pytree saved as ``<root>/<step>``). Every chunk of an
        nbckpt step is checked against the checksum recorded when it was saved. Orbax
        records no checksums: its data is read unchecked (the journal's ``read_done``
        says ``verified: false``), and a missing chunk is an error only where Orbax
        stored every chunk (``store_array_data_equal_to_fill_value``, its default);
        otherwise it reads as the fill value, as it does in Orbax.

        Parameters
        ----------
        step
            The step to read; None means the latest complete step (of either kind).
        target
            None to restore every leaf (jax arrays get their saved mesh layout when the
            device count allows, or are replicated otherwise); or a pytree whose
            leaves are ``jax.ShapeDtypeStruct`` with a sharding, ``jax.sharding``
            objects or ``jax.Array`` (restored as jax arrays with that sharding), or
            anything else (restored as host values; a NumPy array asks for its own
            shape and dtype). A target that leaves saved leaves out is refused unless
            ``partial`` (an Orbax step's subtree target restores that subtree, as in
            Orbax). The process count and mesh may differ from those at save time.
        key
            As for :meth:`save`.
        timeout_s
            Deadline of the agreement among the processes; this checkpointer's default
            if None.
        cast
            Allow a target whose dtype differs from the saved one (the values are
            converted); without it such a target is refused, unless it is weakly typed
            (as ``jax.eval_shape`` makes a Python number) and every value read converts
            to its dtype exactly: an int64 step into a weak int32 comes back weak.
        item
            The item of an Orbax ``CheckpointManager`` step to restore (``"params"``);
            None picks its only pytree item. nbckpt steps hold one tree: leave it None.
        partial
            Allow a target that leaves out saved leaves (only its leaves are restored);
            without it such a target is refused, naming the leaves it lacks.

        Returns
        -------
        The restored pytree, shaped like ``target`` (or as nested dicts and lists).
        Without a target, an Orbax step's jax arrays get the sharding Orbax recorded
        when the device count matches, and are replicated otherwise.

        Raises
        ------
        StepNotFoundError
            The step is not complete under the root; the message lists those that are.
        CorruptCheckpointError
            A chunk read back does not match the checksum recorded when it was saved,
            or is missing or unreadable.
        KeyError
            A target leaf is not in the step (the message names it and lists the saved
            leaves), or an Orbax step has no item ``item``.
        ValueError
            A target leaf's shape differs from the saved one, or its dtype does and
            ``cast`` is False (for a weak target: and a value read does not fit it);
            the target leaves saved leaves out and ``partial`` is False; a 64-bit leaf
            would become a jax array in a process without ``jax_enable_x64`` (it would
            be truncated); a target sharding cannot split its leaf evenly; or an Orbax
            step holds several pytree items and ``item`` is None.
        """
        return self.restore_from(
            lambda: target,
            step,
            key=key,
            timeout_s=timeout_s,
            cast=cast,
            item=item,
            partial=partial,
        )

    def restore_from(
        self,
        get_target: Callable[[], Any],
        step: int | None = None,
        *,
        key: str | None = None,
        timeout_s: float | None = None,
        cast: bool = False,
        item: str | None = None,
        partial: bool = False,
    ) -> Any:
        """:meth:`restore` into the target that ``get_target()`` returns.

        As with :meth:`save_from`, an error raised by ``get_target`` reaches the other
        processes at once.
        """
        self._settle()
        with paused_gc():
            op, step, result = restore_agreed(
                self._ctx,
                self.options,
                get_target,
                step,
                key=key,
                timeout_s=timeout_s,
                cast=cast,
                item=item,
                partial=partial,
                tier=self._tier,
            )
        self.last_op, self.last_step = op, step
        return result
