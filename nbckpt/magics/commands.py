"""IPython magics: ``%load_ext nbckpt``, then ``%ckpt_cluster start -n 4`` and friends.

Each magic parses and checks its line with :mod:`nbckpt.magics.args` (a bad argument
raises ``UsageError`` with the usage line before anything runs), then calls
:mod:`nbckpt.session.client`; the live views it shows are kept by
:class:`nbckpt.widgets._registry.LiveViews`. There is no protocol logic here. nbckpt's
errors show as one line, without a traceback (:mod:`nbckpt.magics.errors`); ``%tb``
shows the traceback of the last one.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import line_magic, magics_class

from nbckpt.magics import args as a
from nbckpt.magics import errors as _magic_errors
from nbckpt.magics.base import NO_CLUSTER, usage_errors
from nbckpt.magics.cluster import guard_px, hosts_text, open_session
from nbckpt.magics.inspection import LINE_MAGICS, InspectionMagics
from nbckpt.magics.rollback import ROLLBACK, parse_rollback_args
from nbckpt.magics.tiers import TIER_MAGICS, TierMagics
from nbckpt.session.client import CheckpointClient, SaveHandle, announce_root
from nbckpt.session.rpc import call_key

__all__ = ["NbckptMagics", "get_client", "load_ipython_extension"]


@magics_class
class NbckptMagics(InspectionMagics, TierMagics):
    """The ``%ckpt_*`` magics. One cluster and one client per IPython session.

    The session's state (``cluster``, ``client``, ``views``) is kept by
    :class:`~nbckpt.magics.base.MagicsBase`; the magics that look (``%ckpt_status``,
    ``%ckpt_ls``, ...) are inherited from
    :class:`~nbckpt.magics.inspection.InspectionMagics`, ``%ckpt_tiers`` from
    :class:`~nbckpt.magics.tiers.TierMagics`.
    """

    # -- cluster ---------------------------------------------------------------------

    @a.CLUSTER
    @line_magic
    def ckpt_cluster(self, line: str) -> None:
        """Start, attach to, show, stop or restart the cluster of JAX processes.

        ``start`` launches N ipyparallel engines, joins them with jax.distributed
        (engine i is process i; process 0 hosts the coordination service) and makes
        ``%px`` / ``%%px`` run on all of them. ``restart`` replaces every engine (a JAX
        process cannot rejoin a job). ``start`` checks ``--dir`` before it starts any
        process, and stops what it started if it fails later; with ``--dir D`` every
        engine gets ``D`` as ``NBCKPT_DIR`` (the default root of ``AsyncCheckpointer()``
        and ``TrainingCheckpointer()`` there) and as ``CKPT_DIR`` in ``%%px`` cells.
        After a process died, ``%px`` says which one, and that ``restart`` is the way on.
        """
        args = a.parse_cluster_args(line)
        if args.action in ("start", "attach"):
            self._start(args)
            return
        if self.cluster is None:
            raise UsageError(NO_CLUSTER)
        if args.action == "stop":
            seconds = self.cluster.stop()
            self.cluster = self.client = None
            print(f"cluster stopped in {seconds:.1f} s")
        elif args.action == "restart":
            self.cluster.restart()  # activates %px on the new engines, as start does
            guard_px(self.shell, lambda: self.cluster)
            root = self._client().directory
            if root is not None:
                announce_root(self.cluster, root)
            self._client().handles.clear()
            print(
                f"{len(self.cluster.engine_ids)} fresh JAX processes ready in "
                f"{self.cluster.timings['ready_s']:.1f} s (cluster id "
                f"{self.cluster.cluster_id}); rebuild or %ckpt_restore your state"
            )
        else:
            print(f"cluster id {self.cluster.cluster_id}, coordinator {self.cluster.coordinator}")
            for s in self.cluster.status():
                print(
                    f"process {s['process']}: {s['local_devices']} of {s['devices']} devices, "
                    f"host {s['host']}, pid {s['pid']}"
                )

    def _start(self, args: a.ClusterArgs) -> None:
        if self.cluster is not None:
            raise UsageError("a cluster is running already; %ckpt_cluster stop it first")
        cluster, client = open_session(args)
        self.cluster, self.client = cluster, client
        _magic_errors.install(self.shell)  # ipyparallel's RemoteError is imported now
        guard_px(self.shell, lambda: self.cluster)
        took = f" in {cluster.timings['ready_s']:.1f} s" if "ready_s" in cluster.timings else ""
        print(
            f"{len(cluster.engine_ids)} JAX processes ready{took} on {hosts_text(cluster)} "
            + (f"in {cluster.scheduler_job} " if cluster.scheduler_job else "")
            + f"(cluster id {cluster.cluster_id}, coordinator {cluster.coordinator}); %px and "
            "%%px run on all of them"
            + (f"; checkpoints go to {self.client.directory}" if args.directory else "")
        )

    # -- checkpoints -----------------------------------------------------------------

    @a.SAVE
    @line_magic
    def ckpt_save(self, line: str) -> SaveHandle:
        """Save VAR from every engine as a step; returns its handle at once.

        The engines take a short snapshot and go on; the write and the commit run in
        the background. ``--wait`` blocks until the step is committed, then returns the
        handle too (``h = %ckpt_save state --step 1 --wait``). Unless
        ``--quiet``, a widget shows each process's phase, bytes written, barriers and
        commit, updated by itself from the journal (text bars without widgets).

        The snapshot keeps what it saves safe (a host copy; on CPU, the arrays' own
        buffers, which XLA then does not donate): the engines may donate the saved
        arrays right after.
        Every engine must save the same tree with the same options, or nothing is
        written. A step another save is writing is refused, naming it; so is a step
        older than the newest one (``%ckpt_rollback STEP`` first). With a local tier
        (``%ckpt_tiers``), ``--persistent`` sends this step to the root too. Leaves
        whose shards are at most 4 MiB (with a local tier, leaves of at most 1 MiB)
        are packed, one file per process; ``--pack-bytes 0`` stores each leaf as its
        own zarr array, so that Orbax can restore the step.
        """
        args = a.parse_save_args(line)
        client = self._client()
        with usage_errors():
            handle = client.save(
                args.var,
                args.step,
                directory=args.directory,
                mode=args.mode,
                force=args.force,
                timeout_s=args.timeout_s,
                metrics=args.metrics,
                format=args.format,
                persistent=args.persistent,
                pack_bytes=args.pack_bytes,
            )
        bars = None if args.quiet else self.views.follow(handle.root, handle.op, text=args.wait)
        if not args.wait:
            print(
                f"saving step {args.step} to {handle.root} in the background (snapshot took "
                f"{max(handle.blocked_s) * 1e3:.0f} ms); %ckpt_wait waits for it"
            )
            return handle
        try:
            rec = handle.wait()
        finally:
            if bars is not None:
                bars.close()
        took = (rec.end or 0) - (rec.start or 0)
        print(f"step {args.step} committed to {handle.root} ({took:.2f} s)")
        return handle

    @a.WAIT
    @line_magic
    def ckpt_wait(self, line: str) -> None:
        """Wait for the saves not waited for yet, and say how each ended (or raise its error)."""
        a.parse_wait_args(line)
        records = self._client().wait()
        for rec in records:
            print(f"step {rec.step} committed ({rec.op})")
        if not records:
            print("no save to wait for")

    @a.BARRIER
    @line_magic
    def ckpt_barrier(self, line: str) -> None:
        """Wait at a coordination-service barrier on the engines and show who waited.

        In a notebook, a per-process view shows when each process arrived, whom it is
        still waiting for, and when the barrier released.
        """
        args = a.parse_barrier_args(line)
        client = self._client()
        key = call_key()  # the caller picks the key, to follow the journal
        journaled = self.views.follow_barrier(client.directory, args.name, key)
        try:
            with usage_errors():
                report = client.barrier(
                    args.name, timeout_s=args.timeout_s, processes=args.processes, key=key
                )
        except BaseException:
            self.views.drop_unjournaled(key)
            raise
        if not journaled:
            self.views.show_finished_barrier(report.name, report.key, report.entered, report.left)
        print(report.table())

    @a.RESTORE
    @line_magic
    def ckpt_restore(self, line: str) -> None:
        """Restore a step into VAR on every engine, laid out on the engines' current mesh.

        If VAR already holds a tree on the engines, it is the target: its jax arrays and
        ``jax.ShapeDtypeStruct`` leaves give each leaf's shape, dtype and sharding, and
        its other leaves must keep their shape and dtype. A tree that differs from the
        saved one is refused and VAR is left as it was. Otherwise the saved layout is used.
        """
        args = a.parse_restore_args(line)
        client = self._client()
        with usage_errors():
            infos = client.restore(
                args.var,
                args.step,
                directory=args.directory,
                timeout_s=args.timeout_s,
                item=args.item,
            )
        print(
            f"restored step {infos[0]['step']} into {args.var!r} on {len(infos)} processes "
            f"({max(i['seconds'] for i in infos):.2f} s)"
        )

    @a.FAULT
    @line_magic
    def ckpt_fault(self, line: str) -> None:
        """Inject a fault into one process, for teaching and tests.

        ``kill --process P`` (now, or ``--at`` a phase), ``stall --process P --at PHASE
        --seconds S``, ``slow-io --process P --factor F``, ``fail-io --process P [--at
        PHASE]`` (an OSError, by default at write), ``preempt --process P`` (the
        SIGTERM a preemptible machine gets: a loop that checks ``reached_preemption``
        saves the agreed step on every process, then stops); ``list`` shows what is armed,
        ``clear`` disarms everything. An option a fault does not take is refused.
        Faults fire as the engine's own phases start (``--at``, listed below).
        """
        args = a.parse_fault_args(line)
        client = self._client()
        with usage_errors():
            armed = client.fault(
                args.action, args.process, at=args.at, seconds=args.seconds, factor=args.factor
            )
        if args.action == "clear":
            print(f"cleared every fault on processes {', '.join(map(str, sorted(armed)))}")
            return
        for p, faults in sorted(armed.items()):
            print(f"process {p}: {', '.join(faults) if faults else 'no faults'}")

    @a.RETENTION
    @line_magic
    def ckpt_retention(self, line: str) -> None:
        """Show or set which steps a checkpoint directory keeps, as Orbax users know it.

        After each commit the primary removes the steps no rule keeps: the newest
        ``--max-to-keep``, every multiple of ``--keep-period`` (for good), the
        ``--best`` N by a ``--metric`` recorded with ``%ckpt_save --metric
        NAME=VALUE``, and always the latest. Only steps nbckpt created are counted or
        removed, each one crash-safely. ``--interval K`` is what
        ``get_client().should_save(step)`` follows. Without options, shows the policy.
        """
        args = a.parse_retention_args(line)
        client = self._client()
        with usage_errors():
            res = client.retention(args.policy, directory=args.directory)
        print(f"{res['root']}: {res['text']}")

    @ROLLBACK
    @line_magic
    def ckpt_rollback(self, line: str) -> None:
        """Delete every complete step newer than STEP, so that training goes on from STEP.

        A save of a step older than the newest one is refused: retention would delete
        it at once, and a restore would pick the newer, abandoned step. Restore STEP,
        roll back, then save again. Only steps nbckpt created are removed, each one
        crash-safely; Orbax steps and foreign folders are left alone.
        """
        args = parse_rollback_args(line)
        with usage_errors():
            removed = self._client().rollback(args.step, directory=args.directory)
        gone = ", ".join(str(s) for s in removed) if removed else "nothing"
        print(f"rolled back to step {args.step}: removed {gone}")


# The inherited magics carry no @line_magic (it records into one registry that the next
# @magics_class empties, whichever class that is): they are registered here by name.
NbckptMagics.magics["line"].update({name: name for name in (*LINE_MAGICS, *TIER_MAGICS)})


def get_client() -> CheckpointClient:
    """Return the client behind the magics of this IPython session.

    For going past the magics in a notebook: ``get_client().cluster.view`` is the
    DirectView on every engine, ``get_client().handles`` the saves started so far.

    Raises
    ------
    UsageError
        If no cluster was started with ``%ckpt_cluster``.
    """
    from IPython.core.getipython import get_ipython

    shell = get_ipython()
    magics = shell.magics_manager.registry.get("NbckptMagics") if shell is not None else None
    if magics is None or magics.client is None:
        raise UsageError(NO_CLUSTER)
    client: CheckpointClient = magics.client
    return client


def load_ipython_extension(ipython: Any) -> None:
    """Register the ``%ckpt_*`` magics (``%load_ext nbckpt``).

    nbckpt's errors then show as one line, as a UsageError does; ``%tb`` prints the
    traceback of the last one (see :mod:`nbckpt.magics.errors`).
    """
    ipython.register_magics(NbckptMagics)
    _magic_errors.install(ipython)
