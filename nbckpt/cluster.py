"""Start, attach to and stop an ipyparallel cluster whose engines form one JAX job.

Every engine is one JAX process. Its rank is its position among the engine ids, and
process 0 hosts the coordination service. The notebook never imports jax, nor any of
``nbckpt.engine``: engine functions are sent by name (:func:`remote`) and imported on
the engines, as :mod:`nbckpt.procgroup` does for its workers.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nbckpt.errors import ClusterError, ClusterGoneError, by_process, who

__all__ = [
    "AGENT",
    "ENGINE_DIED",
    "PROCESS",
    "ClusterError",
    "ClusterGoneError",
    "JaxCluster",
    "call",
    "engine_errors",
    "errors_by_process",
    "remote",
]

#: The engine-side modules the notebook calls into, by name only.
AGENT = "nbckpt.engine.agent"
PROCESS = "nbckpt.engine.process"


def call(ref: str, *args: Any, **kwargs: Any) -> Any:
    """Import ``module:function`` here and call it; meant to run on an engine.

    Parameters
    ----------
    ref
        ``"package.module:function"``, importable where this runs.
    """
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)(*args, **kwargs)


def remote(ref: str) -> Callable[..., Any]:
    """Return a callable to send to engines that runs ``module:function`` there.

    Sending the function object itself would import its module, and with it jax and
    tensorstore, into the notebook's kernel; this sends only its name. ipyparallel
    pickles :func:`call` by reference to this module, which needs no jax.
    """
    return functools.partial(call, ref)


def _short(text: str) -> str:
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else str(text)


#: How an engine's death reads in an error.
ENGINE_DIED = "EngineError: the engine died (its process exited)"


def _error_text(exc: BaseException) -> str:
    """One line for one engine's error (a RemoteError, or an EngineError on death)."""
    ename = getattr(exc, "ename", None)
    text = (
        f"{ename}: {_short(getattr(exc, 'evalue', ''))}"
        if ename
        else (f"{type(exc).__name__}: {_short(str(exc))}")
    )
    return ENGINE_DIED if "died while running" in text or ename == "EngineError" else text


def errors_by_process(what: str, errors: dict[int, str]) -> ClusterError:
    """One :class:`ClusterError` for per-process error texts, grouping equal texts.

    ``-1`` stands for an engine that could not be matched to a process.
    """
    procs = sorted(r for r in errors if r >= 0)
    return ClusterError(f"{what} failed on {by_process(errors)}", procs)


def engine_errors(exc: BaseException, ranks: dict[int, int], what: str) -> ClusterError:
    """Turn an ipyparallel error into one :class:`ClusterError` that names processes.

    Parameters
    ----------
    exc
        A ``CompositeError``, ``RemoteError`` or ``EngineError`` from ipyparallel.
    ranks
        Engine id -> JAX process index.
    what
        What was being done, for the message (``"save"``, ``"barrier"``, ...).
    """
    import ipyparallel as ipp

    if isinstance(exc, ipp.error.CompositeError):
        items = [(e[3].get("engine_id"), f"{e[0]}: {_short(e[1])}") for e in exc.elist]
        items = [(eid, ENGINE_DIED if "died while running" in t else t) for eid, t in items]
    else:
        eid = (getattr(exc, "engine_info", None) or {}).get("engine_id")
        items = [(eid, _error_text(exc))]
    errors: dict[int, str] = {}
    for n, (eid, text) in enumerate(items):
        rank = ranks.get(eid, -1) if eid is not None else -1
        errors[rank if rank >= 0 else -1 - n] = text
    return errors_by_process(what, errors)


@dataclass
class JaxCluster:
    """An ipyparallel cluster whose engines are joined by ``jax.distributed``.

    Parameters
    ----------
    n
        Number of engines (JAX processes) to start.
    devices_per_process
        CPU devices per process (``jax_num_cpu_devices``).
    coordinator_host
        Address process 0's coordination service binds to and every engine dials;
        127.0.0.1 for a cluster on this machine, the host's address for real hosts.
    recoverable
        Keep survivors alive when a process dies (``jax_enable_recoverability``).
    profile
        ipyparallel profile (where its connection files live).
    """

    n: int = 4
    devices_per_process: int = 1
    coordinator_host: str = "127.0.0.1"
    recoverable: bool = True
    profile: str | None = None
    cluster: Any = None
    client: Any = None
    engine_ids: list[int] = field(default_factory=list)
    coordinator: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    _view: Any = field(default=None, init=False, repr=False)
    _px_active: bool = field(default=False, init=False, repr=False)

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

    def start(self, timeout_s: float = 120.0) -> JaxCluster:
        """Start the controller and ``n`` engines, then join them into one JAX job.

        The controller listens on 127.0.0.1 with a 0.5 s heartbeat, so engines register
        in about 3 s instead of about 7.
        """
        import ipyparallel as ipp

        if self.n < 1:
            raise ValueError(f"a cluster needs at least one engine, got n={self.n}")
        t0 = time.perf_counter()
        kwargs: dict[str, Any] = {
            "n": self.n,
            "controller_ip": "127.0.0.1",
            "controller_args": ["--HeartMonitor.period=500"],
            "log_level": 40,
        }
        if self.profile:
            kwargs["profile"] = self.profile
        self.cluster = ipp.Cluster(**kwargs)
        try:
            self.client = self.cluster.start_and_connect_sync()
            self.client.wait_for_engines(self.n, timeout=timeout_s)
            self.timings["engines_s"] = time.perf_counter() - t0
            self._join(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.timings["ready_s"] = time.perf_counter() - t0
        return self

    @classmethod
    def attach(
        cls,
        *,
        profile: str | None = None,
        cluster_id: str | None = None,
        devices_per_process: int = 1,
        coordinator_host: str = "127.0.0.1",
        timeout_s: float = 120.0,
    ) -> JaxCluster:
        """Connect to a running ipyparallel cluster; join its engines if not done yet.

        Engines that already run JAX must have been joined by nbckpt (or by your own
        ``jax.distributed.initialize`` with ranks in engine-id order).
        """
        import ipyparallel as ipp

        client = ipp.Client(profile=profile, cluster_id=cluster_id or None, timeout=timeout_s)
        self = cls(
            n=len(client.ids),
            devices_per_process=devices_per_process,
            coordinator_host=coordinator_host,
            profile=profile,
            client=client,
        )
        if self.n == 0:
            raise ClusterError("the ipyparallel cluster has no engines; start some first")
        self.engine_ids = sorted(client.ids)
        states = self.apply(_safe_info, what="probe", timeout_s=timeout_s)
        if not any(s is not None and s.get("initialized") for s in states):
            self._join(timeout_s)
        return self

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
        import ipyparallel as ipp

        if isinstance(fn, str):
            fn = remote(fn)
        self.check_alive()
        pending = [self.client[eid].apply_async(fn, *args, **kwargs) for eid in self.engine_ids]
        out: list[tuple[bool, Any]] = []
        for ar in pending:
            try:
                out.append((True, ar.get(timeout=timeout_s)))
            except (ipp.error.RemoteError, ipp.error.EngineError) as e:
                out.append((False, _error_text(e)))
            except ipp.error.TimeoutError:
                out.append((False, f"no answer within {timeout_s} s"))
        return out

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
        errors = {rank: res for rank, (ok, res) in enumerate(outcomes) if not ok}
        if errors:
            raise errors_by_process(what, errors)
        return [res for _ok, res in outcomes]

    def _join(self, timeout_s: float) -> None:
        """Prepare every engine as one JAX process of the job, all at once.

        Each runs :func:`nbckpt.engine.process.initialize`, the same setup a
        :class:`~nbckpt.procgroup.ProcessGroup` worker runs.
        """
        import ipyparallel as ipp

        self.engine_ids = sorted(self.client.ids)[: self.n]
        t0 = time.perf_counter()
        first = self.client[self.engine_ids[0]]
        # Picked on process 0's engine: the port must be free where the service binds.
        port = first.apply_sync(remote(f"{PROCESS}:pick_port"), self.coordinator_host)
        self.coordinator = f"{self.coordinator_host}:{port}"
        pending = [
            self.client[eid].apply_async(
                remote(f"{PROCESS}:initialize"),
                rank,
                len(self.engine_ids),
                self.coordinator,
                devices_per_process=self.devices_per_process,
                bind_address=self.coordinator,
                recoverable=self.recoverable,
                timeout_s=int(timeout_s),
            )
            for rank, eid in enumerate(self.engine_ids)
        ]
        errors: dict[int, str] = {}
        for rank, ar in enumerate(pending):
            try:
                ar.get(timeout=timeout_s)
            except (ipp.error.RemoteError, ipp.error.EngineError) as e:
                errors[rank] = _error_text(e)
            except ipp.error.TimeoutError:
                errors[rank] = f"no answer within {timeout_s:g} s"
        if errors:
            raise ClusterError(
                f"jax.distributed.initialize failed on {by_process(errors)}; a JAX process "
                "cannot be joined twice, so stop this cluster and start a fresh one",
                sorted(errors),
            )
        self.timings["jax_init_s"] = time.perf_counter() - t0

    def dead_processes(self) -> list[int]:
        """The processes whose engine is gone, as the ipyparallel controller sees it.

        The controller drops an engine within about a second of its death (0.5 s
        heartbeat), so this is cheap enough to poll.
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

    def restart(self, timeout_s: float = 120.0) -> JaxCluster:
        """Stop this cluster and start a fresh one with the same settings.

        A JAX process cannot rejoin a job, so every engine is new. If ``%px`` was
        activated (:meth:`activate_px`), it is activated on the new engines the same
        way, so ``%px`` after a restart behaves as after a start.
        """
        px = self._px_active
        self.stop()
        self.start(timeout_s)
        if px:
            self.activate_px()
        return self

    def status(self) -> list[dict[str, Any]]:
        """Each engine's report (process, devices, host, checkpointers), in rank order."""
        return self.apply(f"{AGENT}:status", what="status", timeout_s=30)

    def stop(self, timeout_s: float = 10.0) -> float:
        """Leave the JAX job on every engine, then stop engines and controller.

        Returns
        -------
        float
            Seconds it took.
        """
        t0 = time.perf_counter()
        # Teardown goes on whatever state the engines are in: each step is best effort.
        if self.client is not None and self.engine_ids:
            # Engines may exit as the coordination service goes away; that is the end
            # we want, so their answers are not awaited past a short grace.
            with contextlib.suppress(Exception):
                self.view.apply_async(remote(f"{PROCESS}:shutdown")).wait(
                    timeout=min(3.0, timeout_s)
                )
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.stop_cluster_sync()
        elif self.client is not None:
            with contextlib.suppress(Exception):
                self.client.shutdown(targets="all", hub=False, block=False)
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
        self.client = None
        self.cluster = None
        self.engine_ids = []
        self._view = None
        self._px_active = False
        self.timings["stop_s"] = time.perf_counter() - t0
        return self.timings["stop_s"]


def _safe_info() -> dict[str, Any] | None:
    """Engine-side: report nbckpt's view of this engine without starting JAX."""
    import sys

    if "jax" not in sys.modules:
        return {"initialized": False}
    from nbckpt.engine import process

    return process.info()
