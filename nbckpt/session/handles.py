"""What a client call hands back: the handle of a running save and a barrier's report.

A :class:`SaveHandle` follows its save through the journal, read where the client's
reader reads (:attr:`CheckpointClient.reader`); a failed save is explained as
:class:`~nbckpt.errors.SaveFailedError` from that journal and the step on disk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbckpt.errors import ClusterGoneError, SaveFailedError
from nbckpt.formats.layout import step_dir
from nbckpt.journal import OperationRecord, ProcessRecord, failure_of, merge_events
from nbckpt.protocol import (
    Event,
    Status,
    check_optional_timeout,
)
from nbckpt.session import reads

if TYPE_CHECKING:
    from nbckpt.session.client import CheckpointClient


__all__ = ["BarrierReport", "SaveHandle"]

#: How long a failed save's wait lets the processes still running journal how they
#: ended. It returns as soon as none is running; a process dead without a word is
#: marked so by the others' reports. A survivor at a barrier met at the service looks
#: for a peer's failure only after the fast phase (up to about 2 s) and takes up to
#: 5 s more to name a peer that died; 2 s was not enough on a loaded CI machine.
_SETTLE_S = 8.0


@dataclass
class SaveHandle:
    """A save running on the engines. Its journal is the source of truth.

    Attributes
    ----------
    op
        The operation id (``<root>/.nbckpt/ops/<op>``).
    step, root
        What is being saved where.
    blocked_s
        Per process, how long ``save`` blocked the engine (the snapshot).

    Notes
    -----
    Its ``repr`` reads the journal each time until the save has ended (then the end
    is kept: it cannot change). In a notebook the handle is shown by
    :meth:`live_status`, which keeps that text current from the journal by itself,
    so an ``Out`` cell never says ``running`` under a save that has committed.
    """

    op: str
    step: int
    root: str
    blocked_s: list[float]
    client: CheckpointClient = field(repr=False)
    #: Whether a wait has already reported how this save ended.
    reported: bool = field(default=False, repr=False)
    #: How the save ended, once the journal says so (it cannot change after).
    _ended: str | None = field(default=None, init=False, repr=False)

    @property
    def reader(self) -> reads.Reader:
        """Where this save's journal is read: its client's reader (here, without one)."""
        reader: reads.Reader = getattr(self.client, "reader", reads.LOCAL)
        return reader

    def record(self) -> OperationRecord:
        """The merged journal of this save, as it stands now (running until it appears).

        On an object store a process's first events reach the bucket up to a quarter of
        a second after ``save`` returned (its journal is put whole, once per flush).
        """
        try:
            record: OperationRecord = self.reader.run(reads.READ_OPERATION, self.root, self.op)
        except FileNotFoundError:
            return merge_events(self.op, {})
        return record

    def status(self) -> str:
        """:class:`~nbckpt.protocol.Status` ``RUNNING``, ``COMMITTED`` or ``FAILED``."""
        if self._ended is not None:
            return self._ended
        status = self.record().status
        if status != Status.RUNNING:
            self._ended = status
        return status

    def done(self) -> bool:
        """Tell whether the save has committed or failed."""
        return self.status() != "running"

    def wait(self, timeout_s: float | None = None, poll_s: float = 0.05) -> OperationRecord:
        """Wait until the save commits; return its journal record.

        Raises
        ------
        SaveFailedError
            If it failed; the message names the processes and their errors.
        TimeoutError
            If ``timeout_s`` passes first (the save goes on).
        """
        timeout_s = check_optional_timeout(timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        dead_since: float | None = None
        while True:
            rec = self.record()
            if rec.status == Status.FAILED:
                # Give the other processes a moment to journal their own outcome, so
                # the error names every process that failed, not just the fastest.
                settle = time.monotonic() + _SETTLE_S
                while time.monotonic() < settle and any(
                    r.status == Status.RUNNING for r in rec.processes.values()
                ):
                    time.sleep(poll_s)
                    rec = self.record()
                self.client._acknowledge(self.op)
                self.reported = True
                job = getattr(self.client.cluster, "scheduler_job", None)
                raise _failure(rec, self.root, self.reader, job=job)
            if rec.status != Status.RUNNING:
                self.reported = True
                return rec
            dead = self.client.cluster.dead_processes()
            if 0 in dead:
                raise ClusterGoneError()
            if dead:
                # Survivors journal the failure within seconds; if they do not (all of
                # them died), say so from the controller's view.
                dead_since = dead_since or time.monotonic()
                if time.monotonic() - dead_since > 8:
                    self.client._acknowledge(self.op)
                    self.client.cluster.check_alive()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"step {self.step} ({self.op}) is still running after {timeout_s:g} s; "
                    "%ckpt_status shows where each process is"
                )
            time.sleep(poll_s)

    def _text(self, status: str) -> str:
        return f"<SaveHandle step {self.step} -> {self.root} ({self.op}): {status}>"

    def __repr__(self) -> str:
        return self._text(self.status())

    def live_status(self) -> Any:
        """Return a widget that shows this handle's ``repr``, kept current by itself.

        An ``ipywidgets.Label`` whose text follows the save's journal (a
        :class:`~nbckpt.widgets.live.LiveUpdater`, its ``live`` attribute) until the
        save has ended; the notebook shows it instead of a ``repr`` frozen at the
        moment the cell ended.
        """
        import ipywidgets

        from nbckpt.views.monitor import JournalTailer
        from nbckpt.widgets.live import LiveUpdater

        label = ipywidgets.Label(value=repr(self))

        def show(view: Any) -> None:
            if view.status != Status.RUNNING:
                self._ended = view.status
            label.value = self._text(view.status)

        label.live = None
        if self._ended is None:
            label.live = LiveUpdater(
                JournalTailer(self.root, self.op, reader=self.reader), show
            ).start()
        return label

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        # In a kernel, a save still running is shown by a label that keeps up with it;
        # elsewhere (a terminal, a finished save) the text is all there is to show.
        from nbckpt.widgets.live import kernel_loop

        if kernel_loop() is None or self.status() != Status.RUNNING:
            return None
        label = self.live_status()
        bundle = label._repr_mimebundle_(**kwargs)
        if not isinstance(bundle, dict):
            return None
        return {**bundle, "text/plain": label.value}


def _failed_event(proc: ProcessRecord) -> dict[str, Any]:
    """The last ``failed`` event a process journaled (empty if none), as the reader's."""
    return next((e for e in reversed(proc.events) if e.get("event") == Event.FAILED), {})


def _failure(
    rec: OperationRecord, root: str, reader: reads.Reader = reads.LOCAL, *, job: str | None = None
) -> SaveFailedError:
    """One error for a failed save, led by its causes rather than by who gave up.

    ``job``, the scheduler's job the engines run in (``"Slurm job 42"``), ends it: the
    handle an operator of that scheduler looks a failed node up by.

    Each ``failed`` event says, as data, whether its process failed on its own
    (``cause`` ``error``) or gave up because of another (``culprit``); an event
    without a cause, from a journal older than that field, counts as its own error.
    """
    failed = {p: r for p, r in rec.processes.items() if r.status == Status.FAILED}
    events = {p: _failed_event(r) for p, r in failed.items()}
    errors = {p: r.error or str(Status.FAILED) for p, r in failed.items()}
    account = failure_of(rec)
    clause = account.clause if account is not None else ""
    return SaveFailedError(
        f"save of step {rec.step} ({rec.op}) failed{clause}; "
        f"{_outcome(rec, root, list(events.values()), reader)}"
        + (f" (the engines run in {job})" if job else ""),
        sorted(errors),
        failures=errors,
    )


def _outcome(
    rec: OperationRecord,
    root: str,
    failed: list[dict[str, Any]],
    reader: reads.Reader = reads.LOCAL,
) -> str:
    """What a failed save left of its step on disk, in words."""
    if rec.step is None:
        return "nothing was committed"
    path = step_dir(root, rec.step)
    complete = reader.run(reads.IS_COMPLETE, path)
    if complete:
        meta = reader.run(reads.READ_METADATA, path) or {}
        finalized = any(
            e.get("event") == Event.FINALIZED for r in rec.processes.values() for e in r.events
        )
        if meta.get("op") == rec.op or finalized or any(e.get("committed") for e in failed):
            return "the step had been committed before the failure and is complete on disk"
    # A forced re-save that failed keeps the step committed before it. Journals older
    # than ``previous_kept`` do not say so, but a complete step that this save did not
    # commit can only be that one.
    if complete or any(e.get("previous_kept") for e in failed):
        return f"the previously committed step {rec.step} is untouched"
    return "nothing was committed for this step"


@dataclass
class BarrierReport:
    """When each process arrived at and left a barrier (wall times)."""

    name: str
    key: str
    entered: dict[int, float]
    left: dict[int, float]

    def table(self) -> str:
        """A text table: per process, arrival and release relative to the first arrival."""
        t0 = min(self.entered.values())
        lines = [
            f"barrier {self.name!r} (key nbckpt/{self.key})",
            "process  arrived (ms)  left (ms)  waited (ms)",
        ]
        for p in sorted(self.entered):
            a, b = self.entered[p] - t0, self.left[p] - t0
            lines.append(f"{p:>7}  {a * 1e3:>12.1f}  {b * 1e3:>9.1f}  {(b - a) * 1e3:>11.1f}")
        return "\n".join(lines)
