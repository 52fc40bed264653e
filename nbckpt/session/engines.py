"""The engines of a running JAX job, as the notebook talks to them: calls, ``%px``, health.

:class:`Engines` is what a caller needs of a cluster once it runs: run a function on
every process (:meth:`~Engines.apply`, :meth:`~Engines.apply_each`), the view ``%px``
uses, and which processes are alive. :class:`~nbckpt.session.cluster.JaxCluster` adds
how the job starts and stops; the client (:class:`~nbckpt.session.client.CheckpointClient`)
needs only this.

The controller drops an engine within about a second of its death (0.5 s heartbeat),
so :meth:`~Engines.dead_processes` is cheap enough to poll before every call. The
engines' heartbeats over the coordination service (:meth:`~Engines.health`) also see a
process whose engine still answers the controller but left the JAX job.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from nbckpt.errors import ClusterError, ClusterGoneError, who
from nbckpt.session.rpc import AGENT, PROCESS, ask, errors_by_process, failures, remote

__all__ = ["Engines"]


class Engines:
    """The engines of one JAX job, in process order.

    Parameters
    ----------
    client
        An ipyparallel client connected to their controller (None: not running).

    Attributes
    ----------
    client
        The ipyparallel client, or None once stopped.
    engine_ids
        Engine ids in process order: engine ``engine_ids[i]`` is JAX process ``i``.
    engine_hosts
        Each process's host name, in process order.
    """

    def __init__(self, client: Any = None) -> None:
        self.client = client
        self.engine_ids: list[int] = []
        self.engine_hosts: list[str] = []
        self._view: Any = None
        self._px_active = False

    @property
    def ranks(self) -> dict[int, int]:
        """Engine id -> JAX process index."""
        return {eid: i for i, eid in enumerate(self.engine_ids)}

    @property
    def view(self) -> Any:
        """The DirectView on every engine, in rank order; the one ``%px`` uses.

        It is one object for as long as the engines stay the same: settings made on
        it (``block``) hold for the next use, which a fresh view per access would lose.
        """
        view = self._view
        if view is None or view.client is not self.client or view.targets != self.engine_ids:
            view = self._view = self.client.direct_view(targets=list(self.engine_ids))
        return view

    def activate_px(self) -> Any:
        """Make ``%px`` / ``%%px`` run on every engine, blocking; return that view.

        Blocking matters: the cell then waits for the engines, shows their output and
        raises their errors. A non-blocking ``%px`` returns at once, so an error on the
        engines goes unseen and the next cell runs on state that is not there.
        :meth:`restart` does it again on the new engines if it was done before.
        """
        view = self.view
        view.block = True
        view.activate()
        self._px_active = True
        return view

    def apply_each(
        self,
        fn: str | Callable[..., Any],
        *args: Any,
        timeout_s: float | None = 120.0,
        **kwargs: Any,
    ) -> list[tuple[bool, Any]]:
        """Run ``fn`` on every engine; per process, ``(True, result)`` or ``(False, text)``.

        ``fn`` is a function, or ``"module:function"`` to import on the engines (see
        :func:`remote`). Unlike :meth:`apply` it never raises for an engine's error, so
        a caller can keep what the other engines returned (a save goes on when one
        engine died).
        """
        self.check_alive()
        return ask(self.client, self.engine_ids, fn, *args, timeout_s=timeout_s, **kwargs)

    def apply(
        self,
        fn: str | Callable[..., Any],
        *args: Any,
        what: str,
        timeout_s: float | None = 120.0,
        **kwargs: Any,
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every engine and return results in rank order.

        ``fn`` is as for :meth:`apply_each`.

        Raises
        ------
        ClusterError
            If it raised on any engine (the message names the processes), or an engine
            did not answer within ``timeout_s``.
        """
        outcomes = self.apply_each(fn, *args, timeout_s=timeout_s, **kwargs)
        errors = failures(outcomes)
        if errors:
            raise errors_by_process(what, errors)
        return [res for _ok, res in outcomes]

    def dead_processes(self) -> list[int]:
        """The processes whose engine is gone, as the ipyparallel controller sees it.

        Every process is dead without a client (the cluster was stopped).
        """
        if self.client is None:
            return list(range(len(self.engine_ids)))
        alive = set(self.client.ids)
        return [rank for rank, eid in enumerate(self.engine_ids) if eid not in alive]

    def check_alive(self) -> None:
        """Raise if any process is dead.

        Raises
        ------
        ClusterGoneError
            Process 0 died: the whole JAX job is gone.
        ClusterError
            Some other process died; it names them.
        """
        dead = self.dead_processes()
        if 0 in dead:
            raise ClusterGoneError()
        if dead:
            raise ClusterError(
                f"{who(dead)} died; the others are alive but a JAX job cannot take a process "
                "back: run %ckpt_cluster restart, then %ckpt_restore VAR",
                dead,
            )

    def health(self) -> dict[int, str]:
        """``{process: "alive" | "dead"}`` from the controller and the engines' heartbeats."""
        dead = set(self.dead_processes())
        view = {p: "dead" if p in dead else "alive" for p in range(len(self.engine_ids))}
        if 0 in dead or len(dead) == len(view):
            return {p: "dead" for p in view}
        first = next(p for p in view if p not in dead)
        try:
            engine = self.client[self.engine_ids[first]]
            beats = engine.apply_async(remote(f"{AGENT}:health_view"))
            for p, state in beats.get(timeout=5).items():
                if state == "dead":
                    view[int(p)] = "dead"
        except Exception:  # the engines' view is extra; the controller's stands alone
            pass
        return view

    def status(self) -> list[dict[str, Any]]:
        """Each engine's report (process, devices, host, checkpointers), in rank order."""
        return self.apply(f"{AGENT}:status", what="status", timeout_s=30)

    def busy(self, processes: list[int] | None = None) -> list[int]:
        """Which of ``processes`` (None: all) run a cell or have one queued.

        The controller's queue for each engine says so.
        """
        if self.client is None or not self.engine_ids:
            return []
        asked = list(range(len(self.engine_ids))) if processes is None else processes
        queued = self.client.queue_status(targets=[self.engine_ids[p] for p in asked])
        return [p for p in asked if queued.get(self.engine_ids[p], {}).get("queue", 0)]

    def interrupt_busy(self, wait_s: float) -> list[int]:
        """Interrupt the cells engines are running, as Kernel > Interrupt does; best effort.

        A stop otherwise waits on engines busy in a ``%%px --noblock`` loop: the request
        to leave the job queues behind the loop until it times out, and the engines then
        take seconds to die. SIGINT goes through each engine's nanny; then up to
        ``wait_s`` for the cells to end. Returns the processes that were busy.
        """
        with contextlib.suppress(Exception):
            busy = self.busy()
            if busy:
                targets = [self.engine_ids[p] for p in busy]
                self.client.send_signal("SIGINT", targets=targets, block=True)
                deadline = time.monotonic() + wait_s
                while self.busy() and time.monotonic() < deadline:
                    time.sleep(0.05)
            return busy
        return []

    def leave_job(self, grace_s: float) -> None:
        """Ask every engine to leave the JAX job; wait ``grace_s`` at most, raise nothing.

        Engines may exit as the coordination service goes away; that is the end wanted,
        so their answers are not awaited past a short grace.
        """
        if self.client is not None and self.engine_ids:
            with contextlib.suppress(Exception):
                self.view.apply_async(remote(f"{PROCESS}:shutdown")).wait(timeout=grace_s)

    def forget_engines(self) -> None:
        """Drop the client and the engines (stopped): no ids, no view, ``%px`` inactive."""
        self.client = None
        self.engine_ids, self.engine_hosts = [], []
        self._view = None
        self._px_active = False
