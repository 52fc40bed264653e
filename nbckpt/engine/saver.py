"""The save side of a checkpointer: start a save, and follow the one in flight.

:class:`CheckpointSaver` is :class:`~nbckpt.engine.AsyncCheckpointer`'s save side, as
:class:`~nbckpt.engine.reader.CheckpointReader` is its read side; the checkpointer adds
its options, retention and preemption. The work is :func:`start_save`'s (plan,
preflight, snapshot) and :class:`InFlight`'s (the save in the background).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from nbckpt.engine.context import Context
from nbckpt.engine.options import CheckpointerOptions
from nbckpt.engine.reader import CheckpointReader
from nbckpt.engine.save.hostmem import HostBuffers
from nbckpt.engine.save.inflight import InFlight
from nbckpt.engine.save.start import start_save
from nbckpt.gcpause import paused_gc
from nbckpt.protocol import Mode
from nbckpt.storage import Location

__all__ = ["CheckpointSaver"]


class CheckpointSaver(CheckpointReader):
    """What :class:`~nbckpt.engine.AsyncCheckpointer` saves, on top of what it reads.

    Use the checkpointer: this class exists so that each side is one place to read.

    Parameters
    ----------
    root, options, ctx
        As :class:`~nbckpt.engine.reader.CheckpointReader` takes them.
    """

    def __init__(self, root: Location, options: CheckpointerOptions, ctx: Context) -> None:
        super().__init__(root, options, ctx)
        self._inflight = InFlight(ctx.sync, ctx.health)
        self._buffers = HostBuffers(keep=options.keep_host_buffers)

    def save(
        self,
        step: int,
        tree: Any,
        *,
        force: bool = False,
        key: str | None = None,
        mode: Mode | None = None,
        timeout_s: float | None = None,
        metrics: Mapping[str, Any] | None = None,
        format: str | None = None,
        persistent: bool | None = None,
        pack_bytes: int | None = None,
    ) -> None:
        """Start saving ``tree`` as ``step``; return once the snapshot is safe.

        The snapshot keeps every shard this process writes safe from what comes
        next (a host copy; on CPU devices the shard's own buffer, held so that XLA
        does not donate it), so the arrays may be donated, deleted or changed as
        soon as this returns. ``None`` and empty containers are recorded with the
        tree, so positions never shift.

        Parameters
        ----------
        step
            A non-negative int; the step directory is ``<root>/<step>``.
        tree
            A pytree whose leaves are ``jax.Array`` (sharded across processes,
            replicated, or mixed), NumPy arrays or Python numbers. NumPy arrays and
            process-local jax arrays must hold the same values on every process: the
            primary writes them.
        force
            Replace ``step`` if it is already committed (rename mode only: the old step
            stays complete until the new one commits).
        key
            A string unique to this call and the same on every process (a driver such
            as the notebook client passes one). Without it, calls are matched across
            processes by their order, so every process must make the same calls. A key
            this process used for an earlier save or restore is refused (``ValueError``).
        mode, timeout_s, format, pack_bytes
            Override this checkpointer's defaults for this save (``format`` and
            ``pack_bytes``: see :class:`CheckpointerOptions`; ``pack_bytes=0`` stores
            every leaf as its own zarr array, which Orbax can restore).
        metrics
            Numbers to record with the step (``{"loss": 0.31}``), by which retention
            keeps the best steps (``best_n``, ``best_metric``): Python numbers, NumPy
            scalars or 0-d NumPy or jax arrays (stored as floats).
        persistent
            With a local tier (``local_dir``): whether this step also goes to the root.
            None follows ``persistent_every``; True forces it (before a risky change,
            say). Without a local tier every save goes to the root.

        Raises
        ------
        StepExistsError
            ``step`` is already committed and ``force`` is False (also when another job
            committed it while this save was writing: that step is kept).
        StepBusyError
            Another job's save is writing ``step`` (the message names it).
        RollbackRefusedError
            ``step`` is older than the newest step; :meth:`prune_after` rolls back.
        DisagreementError
            The processes differ in the tree or an option (the message says where).
        ForeignEntryError
            ``<root>/<step>`` holds a directory nbckpt did not create.
        CommitRefusedError
            ``force`` in commit-file mode for a committed step.
        RootNotWritableError
            Some process cannot write the root; nothing was written.
        TypeError
            A leaf, its dtype or a key cannot be stored (the message names the leaf);
            nothing was written.
        ValueError
            The tree cannot be flattened, or two leaves would get the same name on disk
            (also when they differ only in case), or a name is over 255 bytes or
            reserved by the step directory; nothing was written.
        PeerFailedError
            Another process could not start this save (its error is the reason).
        PeerDeadError
            A process died or became unreachable before the save started, or this
            process lost the coordination service earlier (it cannot rejoin the job).
        CheckpointError
            The previous save failed in the background (raised once).
        """
        self.save_from(
            lambda: tree,
            step,
            force=force,
            key=key,
            mode=mode,
            timeout_s=timeout_s,
            metrics=metrics,
            format=format,
            persistent=persistent,
            pack_bytes=pack_bytes,
        )

    def save_from(
        self,
        get_tree: Callable[[], Any],
        step: int,
        *,
        force: bool = False,
        key: str | None = None,
        mode: Mode | None = None,
        timeout_s: float | None = None,
        metrics: Mapping[str, Any] | None = None,
        format: str | None = None,
        persistent: bool | None = None,
        pack_bytes: int | None = None,
    ) -> None:
        """:meth:`save` the tree that ``get_tree()`` returns.

        An error raised by ``get_tree`` (a variable missing on this process, say) is
        shared with the other processes at once, so none of them waits for this one.
        """
        t_requested = time.time()
        self._settle()
        with paused_gc():
            job = start_save(
                self._ctx,
                self.options,
                get_tree,
                step,
                force=force,
                key=key,
                mode=mode,
                timeout_s=timeout_s,
                metrics=metrics,
                format=format,
                t_requested=t_requested,
                tier=self._tier,
                persistent=persistent,
                pack_bytes=pack_bytes,
                buffers=self._buffers,
            )
        self.last_op = job.op
        self._inflight.start(job)

    def wait_until_finished(self) -> None:
        """Block until the save in flight, if any, is committed or failed.

        Raises
        ------
        CheckpointError
            If that save failed (the error is then cleared), or if this process lost
            the coordination service while it waited: the save then cannot finish, and
            this process cannot rejoin the job.
        """
        self._inflight.wait()

    def check_for_errors(self) -> None:
        """Raise the error of a failed background save, once; return otherwise."""
        self._inflight.raise_error()

    def in_flight(self) -> bool:
        """Tell whether a save is still running in the background."""
        return self._inflight.running()

    @property
    def _thread(self) -> Any:
        # The save's thread, for tests that wait on it without raising its error.
        return self._inflight.thread

    def _settle(self) -> None:
        super()._settle()
        self.wait_until_finished()
