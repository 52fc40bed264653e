"""IPython magics: ``%load_ext nbckpt``, then ``%ckpt_cluster start -n 4`` and friends.

Each magic parses its arguments (bad ones raise ``UsageError`` with the usage line) and
calls :mod:`nbckpt.client`; there is no protocol logic here.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from nbckpt.client import CheckpointClient, SaveHandle, list_steps
from nbckpt.cluster import JaxCluster
from nbckpt.protocol import PHASES

__all__ = ["NbckptMagics", "get_client", "load_ipython_extension"]

_NO_CLUSTER = "no nbckpt cluster yet: start one with %ckpt_cluster start -n 4 --dir DIR"


def _step(text: str) -> int:
    try:
        step = int(text)
    except ValueError:
        raise UsageError(f"--step takes a whole number, got {text!r}") from None
    if step < 0:
        raise UsageError(f"--step must be 0 or more, got {step}")
    return step


def _positive(value: float, flag: str) -> float:
    if value <= 0:
        raise UsageError(f"{flag} must be positive, got {value:g}")
    return value


@magics_class
class NbckptMagics(Magics):
    """The ``%ckpt_*`` magics. One cluster and one client per IPython session."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.cluster: JaxCluster | None = None
        self.client: CheckpointClient | None = None

    def _client(self) -> CheckpointClient:
        if self.client is None:
            raise UsageError(_NO_CLUSTER)
        return self.client

    def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call the client; turn a bad value into a UsageError, let real errors raise."""
        try:
            return fn(*args, **kwargs)
        except ValueError as e:
            raise UsageError(str(e)) from None

    # -- cluster ---------------------------------------------------------------------

    @magic_arguments()
    @argument(
        "action",
        choices=["start", "stop", "status", "attach", "restart"],
        help="start a new cluster, attach to a running one, show it, stop it, or "
        "restart it with fresh engines",
    )
    @argument("-n", type=int, default=4, help="number of engines / JAX processes (start)")
    @argument("--devices-per-process", type=int, default=1, help="CPU devices per process")
    @argument("--dir", help="default checkpoint directory for the other magics")
    @argument(
        "--coordinator-host",
        default="127.0.0.1",
        help="address of process 0's coordination service (real hosts)",
    )
    @argument("--profile", help="ipyparallel profile (attach)")
    @argument("--cluster-id", help="ipyparallel cluster id (attach)")
    @line_magic
    def ckpt_cluster(self, line: str) -> None:
        """Start, attach to, show or stop the cluster of JAX processes.

        ``start`` launches N ipyparallel engines, joins them with jax.distributed
        (engine i is process i; process 0 hosts the coordination service) and makes
        ``%px`` / ``%%px`` run on all of them.
        """
        args = parse_argstring(self.ckpt_cluster, line)
        if args.action in ("start", "attach"):
            if self.cluster is not None:
                raise UsageError("a cluster is running already; %ckpt_cluster stop it first")
            if args.n < 1 or args.devices_per_process < 1:
                raise UsageError("-n and --devices-per-process must be at least 1")
            if args.action == "start":
                cluster = JaxCluster(
                    n=args.n,
                    devices_per_process=args.devices_per_process,
                    coordinator_host=args.coordinator_host,
                ).start()
            else:
                cluster = JaxCluster.attach(
                    profile=args.profile,
                    cluster_id=args.cluster_id,
                    devices_per_process=args.devices_per_process,
                    coordinator_host=args.coordinator_host,
                )
            self.cluster = cluster
            self.client = CheckpointClient(cluster, args.dir)
            px = cluster.view
            px.block = True  # %px waits for the engines and shows their output
            px.activate()
            t = cluster.timings
            took = f" in {t['ready_s']:.1f} s" if "ready_s" in t else ""
            print(
                f"{len(cluster.engine_ids)} JAX processes ready{took} "
                f"(coordinator {cluster.coordinator}); %px and %%px run on all of them"
                + (f"; checkpoints go to {self.client.directory}" if args.dir else "")
            )
        elif args.action == "stop":
            if self.cluster is None:
                raise UsageError(_NO_CLUSTER)
            seconds = self.cluster.stop()
            self.cluster = self.client = None
            print(f"cluster stopped in {seconds:.1f} s")
        elif args.action == "restart":
            if self.cluster is None:
                raise UsageError(_NO_CLUSTER)
            # A JAX process cannot rejoin a job: every engine is replaced.
            self.cluster.restart()
            self._client().handles.clear()
            self.cluster.view.block = True
            self.cluster.view.activate()
            print(
                f"{len(self.cluster.engine_ids)} fresh JAX processes ready in "
                f"{self.cluster.timings['ready_s']:.1f} s; rebuild or %ckpt_restore your state"
            )
        else:
            if self.cluster is None:
                raise UsageError(_NO_CLUSTER)
            for s in self.cluster.status():
                print(
                    f"process {s['process']}: {s['local_devices']} of {s['devices']} devices, "
                    f"host {s['host']}, pid {s['pid']}"
                )

    # -- checkpoints -----------------------------------------------------------------

    @magic_arguments()
    @argument("var", help="name of the pytree in every engine's namespace")
    @argument("--step", required=True, help="step number (a whole number, 0 or more)")
    @argument("--dir", help="checkpoint directory (default: the cluster's --dir)")
    @argument(
        "--mode",
        choices=["rename", "commit_file"],
        default="rename",
        help="finalize by renaming a temporary directory, or with a commit file",
    )
    @argument("--wait", action="store_true", help="block until the step is committed")
    @argument("--force", action="store_true", help="replace the step if it exists")
    @argument("--timeout", type=float, default=300.0, help="barrier deadline in seconds")
    @line_magic
    def ckpt_save(self, line: str) -> SaveHandle | None:
        """Save VAR from every engine as a step; returns a handle at once.

        The engines take a short snapshot and go on; the write and the commit run in
        the background. ``--wait`` blocks until the step is committed.
        """
        args = parse_argstring(self.ckpt_save, line)
        step = _step(args.step)
        _positive(args.timeout, "--timeout")
        client = self._client()
        handle: SaveHandle = self._run(
            client.save,
            args.var,
            step,
            directory=args.dir,
            mode=args.mode,
            force=args.force,
            timeout_s=args.timeout,
        )
        if args.wait:
            rec = handle.wait()
            print(
                f"step {step} committed to {handle.root} "
                f"({(rec.end or 0) - (rec.start or 0):.2f} s)"
            )
            return None
        print(
            f"saving step {step} to {handle.root} in the background "
            f"(snapshot took {max(handle.blocked_s) * 1e3:.0f} ms); %ckpt_wait waits for it"
        )
        return handle

    @line_magic
    def ckpt_wait(self, line: str) -> None:
        """Wait until every save in flight has committed (or raise its error)."""
        if line.strip():
            raise UsageError("%ckpt_wait takes no arguments")
        records = self._client().wait()
        for rec in records:
            print(f"step {rec.step} committed ({rec.op})")
        if not records:
            print("no save in flight")

    @magic_arguments()
    @argument("name", help="barrier name; the key is made unique per use")
    @argument("--timeout", type=float, default=60.0, help="deadline in seconds")
    @argument("--processes", help="comma-separated process indices, e.g. 0,2 (default all)")
    @line_magic
    def ckpt_barrier(self, line: str) -> None:
        """Wait at a coordination-service barrier on the engines and show who waited."""
        args = parse_argstring(self.ckpt_barrier, line)
        _positive(args.timeout, "--timeout")
        processes = None
        if args.processes:
            try:
                processes = sorted({int(p) for p in args.processes.split(",") if p.strip()})
            except ValueError:
                raise UsageError(
                    f"--processes takes indices like 0,2; got {args.processes!r}"
                ) from None
        report = self._run(
            self._client().barrier, args.name, timeout_s=args.timeout, processes=processes
        )
        print(report.table())

    @magic_arguments()
    @argument("var", help="name to restore into, in every engine's namespace")
    @argument("--step", default="latest", help="step number, or 'latest' (default)")
    @argument("--dir", help="checkpoint directory (default: the cluster's --dir)")
    @line_magic
    def ckpt_restore(self, line: str) -> None:
        """Restore a step into VAR on every engine, laid out on the engines' current mesh."""
        args = parse_argstring(self.ckpt_restore, line)
        step = None if args.step == "latest" else _step(args.step)
        infos = self._run(self._client().restore, args.var, step, directory=args.dir)
        print(
            f"restored step {infos[0]['step']} into {args.var!r} on {len(infos)} processes "
            f"({max(i['seconds'] for i in infos):.2f} s)"
        )

    @line_magic
    def ckpt_status(self, line: str) -> None:
        """Show the cluster's processes and the saves this notebook started."""
        if line.strip():
            raise UsageError("%ckpt_status takes no arguments")
        st = self._client().status()
        print(f"default directory: {st['directory'] or '(none)'}")
        health = st["health"]
        print("health: " + ", ".join(f"process {p} {h}" for p, h in sorted(health.items())))
        if health and health.get(0) == "dead":
            print(
                "the JAX cluster is gone (process 0 hosted the coordination service): "
                "%ckpt_cluster restart"
            )
        for e in st["engines"]:
            flying = [c["last_op"] for c in e["checkpointers"] if c["in_flight"]]
            print(
                f"process {e['process']}: host {e['host']}, pid {e['pid']}, "
                f"{'saving ' + ', '.join(flying) if flying else 'idle'}"
            )
        for s in st["saves"]:
            print(f"step {s['step']} -> {s['root']}: {s['status']} ({s['op']})")

    @line_magic
    def ckpt_ls(self, line: str) -> None:
        """List the steps in DIR (default: the cluster's --dir)."""
        directory = line.strip() or None
        if directory is None and (self.client is None or self.client.directory is None):
            raise UsageError(
                "%ckpt_ls needs a directory: %ckpt_ls DIR, or start the cluster with --dir"
            )
        root = directory if directory is not None else self._client().root()
        try:
            rows = list_steps(root)
        except FileNotFoundError as e:
            raise UsageError(str(e)) from None
        if not rows:
            print(f"no steps in {root}")
        for r in rows:
            print(f"{r['step']:>8}  {r['state']:<11}  {r['path']}  ({r['reason']})")

    @magic_arguments()
    @argument(
        "action",
        choices=["kill", "stall", "slow-io", "fail-io", "list", "clear"],
        help="what to inject (kill, stall, slow-io, fail-io), or list / clear",
    )
    @argument("--process", type=int, help="the process to act on (not for list / clear)")
    @argument("--at", choices=list(PHASES), help="the phase at which the fault fires")
    @argument("--seconds", type=float, help="how long a stall lasts")
    @argument("--factor", type=float, help="how many times slower slow-io writes")
    @line_magic
    def ckpt_fault(self, line: str) -> None:
        """Inject a fault into one process, for teaching and tests.

        ``kill`` (now, or ``--at`` a phase), ``stall --at PHASE --seconds S``,
        ``slow-io --factor F``, ``fail-io [--at PHASE]`` (an OSError); ``list`` shows
        what is armed, ``clear`` disarms everything. Faults fire at the engine's own
        phase boundaries: snapshot, prepare, barrier:tmp_ready, write,
        barrier:write_complete, finalize, barrier:commit_complete.
        """
        args = parse_argstring(self.ckpt_fault, line)
        client = self._client()
        if args.action not in ("list", "clear") and args.process is None:
            raise UsageError(f"%ckpt_fault {args.action} needs --process P")
        if args.action == "stall" and (args.at is None or not args.seconds or args.seconds <= 0):
            raise UsageError("%ckpt_fault stall needs --at PHASE and --seconds S > 0")
        if args.action == "slow-io" and (args.factor is None or args.factor < 1):
            raise UsageError("%ckpt_fault slow-io needs --factor F >= 1")
        armed = self._run(
            client.fault,
            args.action,
            args.process,
            at=args.at,
            seconds=args.seconds,
            factor=args.factor,
        )
        if args.action == "clear":
            print(f"cleared every fault on processes {', '.join(map(str, sorted(armed)))}")
            return
        for p, faults in sorted(armed.items()):
            print(f"process {p}: {', '.join(faults) if faults else 'no faults'}")

    @magic_arguments()
    @argument("dir", nargs="?", help="checkpoint directory (default: the cluster's --dir)")
    @argument("--clean", action="store_true", help="remove abandoned entries (only those)")
    @argument(
        "--verify",
        action="store_true",
        help="read every array of complete steps and check shapes and checksums",
    )
    @line_magic
    def ckpt_fsck(self, line: str) -> None:
        """Check a checkpoint directory: complete, in progress, abandoned, corrupt.

        ``--clean`` removes abandoned entries and never a complete step; ``--verify``
        recomputes every chunk's checksum recorded at save time.
        """
        from nbckpt.fsck import fsck

        args = parse_argstring(self.ckpt_fsck, line)
        root = args.dir
        if root is None:
            if self.client is None or self.client.directory is None:
                raise UsageError(
                    "%ckpt_fsck needs a directory: %ckpt_fsck DIR, or start the cluster with --dir"
                )
            root = self.client.directory
        try:
            report = fsck(root, clean=args.clean, verify=args.verify)
        except FileNotFoundError as e:
            raise UsageError(str(e)) from None
        print(report.table())


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
        raise UsageError(_NO_CLUSTER)
    client: CheckpointClient = magics.client
    return client


def load_ipython_extension(ipython: Any) -> None:
    """Register the ``%ckpt_*`` magics (``%load_ext nbckpt``)."""
    ipython.register_magics(NbckptMagics)
