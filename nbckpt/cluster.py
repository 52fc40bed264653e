"""Start, attach to and stop an ipyparallel cluster whose engines form one JAX job.

Every engine is one JAX process. Its rank is its position among the engine ids, and
process 0 hosts the coordination service. The notebook never imports jax: everything
JAX runs on the engines through ``nbckpt.engine.agent``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from nbckpt.errors import NbckptError

__all__ = [
    "ENGINE_DIED",
    "ClusterError",
    "ClusterGoneError",
    "JaxCluster",
    "engine_errors",
    "errors_by_process",
]


class ClusterError(NbckptError):
    """Something went wrong on one or more engines; the message names the processes."""

    def __init__(self, message: str, processes: list[int] | None = None) -> None:
        self.processes = processes or []
        super().__init__(message)


class ClusterGoneError(ClusterError):
    """Process 0 died, and with it the coordination service and every JAX process."""

    def __init__(self) -> None:
        super().__init__(
            "the JAX cluster is gone: process 0, which hosts the coordination service, "
            "died and every JAX process ended with it; run %ckpt_cluster restart, then "
            "%ckpt_restore VAR to resume from the latest complete step",
            [0],
        )


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
    by_text: dict[str, list[int]] = {}
    for rank, text in sorted(errors.items()):
        by_text.setdefault(text, []).append(rank)
    parts = []
    for text, rs in by_text.items():
        known = [r for r in rs if r >= 0]
        if len(known) == 1:
            who = f"process {known[0]}"
        elif known:
            who = "processes " + ", ".join(map(str, known))
        else:
            who = "an engine"
        parts.append(f"{who}: {text}")
    procs = sorted(r for r in errors if r >= 0)
    return ClusterError(f"{what} failed on " + "; ".join(parts), procs)


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

    @property
    def ranks(self) -> dict[int, int]:
        """Engine id -> JAX process index."""
        return {eid: i for i, eid in enumerate(self.engine_ids)}

    @property
    def view(self) -> Any:
        """A blocking-off DirectView on every engine, in rank order."""
        return self.client.direct_view(targets=self.engine_ids)

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
        self, fn: Any, *args: Any, timeout_s: float | None = 120.0, **kwargs: Any
    ) -> list[tuple[bool, Any]]:
        """Run ``fn`` on every engine; per process, ``(True, result)`` or ``(False, text)``.

        Unlike :meth:`apply` it never raises for an engine's error, so a caller can keep
        what the other engines returned (a save goes on when one engine died).
        """
        import ipyparallel as ipp

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
        self, fn: Any, *args: Any, what: str, timeout_s: float | None = 120.0, **kwargs: Any
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every engine and return results in rank order.

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
        """Run ``jax.distributed.initialize`` on every engine at once."""
        import ipyparallel as ipp

        from nbckpt.engine import agent

        self.engine_ids = sorted(self.client.ids)[: self.n]
        t0 = time.perf_counter()
        first = self.client[self.engine_ids[0]]
        port = first.apply_sync(agent.pick_port, self.coordinator_host)
        self.coordinator = f"{self.coordinator_host}:{port}"
        pending = [
            self.client[eid].apply_async(
                agent.initialize,
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
            except ipp.error.RemoteError as e:
                errors[rank] = f"{e.ename}: {_short(e.evalue)}"
            except ipp.error.TimeoutError:
                errors[rank] = f"no answer within {timeout_s:g} s"
        if errors:
            detail = "; ".join(f"process {r}: {t}" for r, t in sorted(errors.items()))
            raise ClusterError(
                f"jax.distributed.initialize failed ({detail}); a JAX process cannot be "
                "joined twice, so stop this cluster and start a fresh one",
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
            who = ", ".join(map(str, dead))
            raise ClusterError(
                f"process(es) {who} died; the others are alive but a JAX job cannot take "
                "a process back: run %ckpt_cluster restart, then %ckpt_restore VAR",
                dead,
            )

    def health(self) -> dict[int, str]:
        """``{process: "alive" | "dead"}`` from the controller and the engines' heartbeats."""
        from nbckpt.engine import agent

        dead = set(self.dead_processes())
        view = {p: "dead" if p in dead else "alive" for p in range(len(self.engine_ids))}
        if 0 in dead or len(dead) == len(view):
            return {p: "dead" for p in view}
        first = next(p for p in view if p not in dead)
        try:
            beats = self.client[self.engine_ids[first]].apply_async(agent.health_view)
            for p, state in beats.get(timeout=5).items():
                if state == "dead":
                    view[int(p)] = "dead"
        except Exception:  # the engines' view is extra; the controller's stands alone
            pass
        return view

    def restart(self, timeout_s: float = 120.0) -> JaxCluster:
        """Stop this cluster and start a fresh one with the same settings.

        A JAX process cannot rejoin a job, so every engine is new.
        """
        self.stop()
        return self.start(timeout_s)

    def status(self) -> list[dict[str, Any]]:
        """Each engine's report (process, devices, host, checkpointers), in rank order."""
        from nbckpt.engine import agent

        return self.apply(agent.status, what="status", timeout_s=30)

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
            from nbckpt.engine import agent

            # Engines may exit as the coordination service goes away; that is the end
            # we want, so their answers are not awaited past a short grace.
            with contextlib.suppress(Exception):
                self.view.apply_async(agent.shutdown).wait(timeout=min(3.0, timeout_s))
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
        self.timings["stop_s"] = time.perf_counter() - t0
        return self.timings["stop_s"]


def _safe_info() -> dict[str, Any] | None:
    """Engine-side: report nbckpt's view of this engine without starting JAX."""
    import sys

    if "jax" not in sys.modules:
        return {"initialized": False}
    from nbckpt.engine import agent

    return agent.info()
